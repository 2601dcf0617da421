//! HTTP/3 over QUIC, with a real client (aioquic): QUIC handshakes computed by the
//! crypto engine on the coroutine bridge, as TCP ones are.

use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use crate::harness::*;

/// Whether aioquic is installed (`.ci/run` installs it); else the skip is shown.
pub(crate) fn aioquic() -> bool {
    python_imports(
        "aioquic.asyncio.client",
        "python3 -m pip install 'aioquic>=1.2,<2'",
    )
}

/// Whether curl_cffi (curl with HTTP/3, from PyPI) is installed; else the skip is shown.
pub(crate) fn curl_cffi() -> bool {
    python_imports("curl_cffi", "python3 -m pip install 'curl_cffi>=0.7,<1'")
}

/// Requests over one HTTP/3-only session of curl (curl_cffi's: ngtcp2 and nghttp3):
/// each argument `METHOD:PATH[:BODY BYTES]`; prints per request its status, the HTTP
/// version curl used (30: HTTP/3), the body's length and SHA-256.
pub(crate) const CURL_H3: &str = r#"
import sys, hashlib
from curl_cffi import requests, CurlHttpVersion
port = int(sys.argv[1])
with requests.Session(http_version=CurlHttpVersion.V3ONLY, verify=False, timeout=30) as s:
    for spec in sys.argv[2:]:
        method, path, *size = spec.split(":")
        body = bytes(i % 256 for i in range(int(size[0]))) if size else None
        r = s.request(method, f"https://localhost:{port}{path}", data=body)
        print(method, path, r.status_code, r.http_version, len(r.content), hashlib.sha256(r.content).hexdigest())
"#;

/// `count` QUIC handshakes in a row with ALPN h3, each then closed; prints how many
/// completed and the ALPN of the last, then the serial number of the last certificate
/// the server showed.
const HANDSHAKES: &str = r#"
import asyncio, ssl, sys
from aioquic.asyncio.client import connect
from aioquic.quic.configuration import QuicConfiguration

async def one(port):
    config = QuicConfiguration(is_client=True, alpn_protocols=["h3"],
                               verify_mode=ssl.CERT_NONE, server_name="localhost")
    async with connect("127.0.0.1", port, configuration=config) as client:
        await client.ping()
        return client._quic.tls.alpn_negotiated, client._quic.tls._peer_certificate.serial_number

async def main(port, count):
    done, alpn, serial = 0, None, None
    for _ in range(count):
        alpn, serial = await asyncio.wait_for(one(port), 10)
        done += 1
    print(done, alpn)
    print(format(serial, "x"))

asyncio.run(main(int(sys.argv[1]), int(sys.argv[2])))
"#;

/// GETs each path over one HTTP/3 connection (`sleep:S` waits S seconds instead);
/// prints per path its status, length and SHA-256.
const GETS: &str = r#"
import asyncio, ssl, sys, hashlib
from aioquic.asyncio.client import connect
from aioquic.asyncio.protocol import QuicConnectionProtocol
from aioquic.h3.connection import H3_ALPN, H3Connection
from aioquic.h3.events import HeadersReceived, DataReceived
from aioquic.quic.configuration import QuicConfiguration

class Client(QuicConnectionProtocol):
    def __init__(self, *a, **k):
        super().__init__(*a, **k)
        self.h3 = H3Connection(self._quic)
        self.waiters = {}
    def quic_event_received(self, event):
        for ev in self.h3.handle_event(event):
            st = self.waiters.get(getattr(ev, "stream_id", None))
            if st is None:
                continue
            if isinstance(ev, HeadersReceived):
                st["headers"] = ev.headers
            elif isinstance(ev, DataReceived):
                st["body"] += ev.data
            if getattr(ev, "stream_ended", False) and not st["done"].done():
                st["done"].set_result(None)
    async def get(self, path):
        sid = self._quic.get_next_available_stream_id()
        self.h3.send_headers(sid, [(b":method", b"GET"), (b":scheme", b"https"),
            (b":authority", b"localhost"), (b":path", path.encode())], end_stream=True)
        st = {"headers": None, "body": b"", "done": self._loop.create_future()}
        self.waiters[sid] = st
        self.transmit()
        await st["done"]
        return st

def config(ticket=None):
    return QuicConfiguration(is_client=True, alpn_protocols=H3_ALPN, verify_mode=ssl.CERT_NONE,
                             server_name="localhost", session_ticket=ticket)

async def take_tickets(port):
    """The session tickets a first connection is given (it GETs /index.html)."""
    tickets = []
    async with connect("127.0.0.1", port, configuration=config(), create_protocol=Client,
                       session_ticket_handler=tickets.append) as client:
        await asyncio.wait_for(client.get("/index.html"), 10)
        await asyncio.sleep(0.3)
    return tickets

async def main(port, paths):
    async with connect("127.0.0.1", port, configuration=config(), create_protocol=Client) as client:
        for path in paths:
            if path.startswith("sleep:"):
                await asyncio.sleep(float(path[6:]))
                continue
            st = await asyncio.wait_for(client.get(path), 30)
            status = dict(st["headers"]).get(b":status", b"?").decode()
            print(path, status, len(st["body"]), hashlib.sha256(st["body"]).hexdigest())

if __name__ == "__main__":
    asyncio.run(main(int(sys.argv[1]), sys.argv[2:]))
"#;

/// Takes a session ticket on a first HTTP/3 connection, then resumes with it sending a
/// GET as 0-RTT data, the ticket made to allow early data whatever the server said (so
/// the client tries); prints what the ticket allowed, then whether the second handshake
/// resumed, whether the server accepted the early data, and the GET's status and body.
/// Needs GETS beside it as gets.py (its client, `config` and `take_tickets`).
const EARLY: &str = r#"
import asyncio, sys, dataclasses
from aioquic.asyncio.client import connect
from gets import Client, config, take_tickets

async def main(port):
    tickets = await take_tickets(port)
    print("ticket allows early data:", tickets[-1].max_early_data_size)
    ticket = dataclasses.replace(tickets[-1], max_early_data_size=0xffffffff)
    async with connect("127.0.0.1", port, configuration=config(ticket), create_protocol=Client,
                       wait_connected=False) as client:
        st = await asyncio.wait_for(client.get("/index.html"), 10)
        tls = client._quic.tls
        print("resumed:", tls.session_resumed, "early data accepted:", tls.early_data_accepted,
              "status:", dict(st["headers"])[b":status"].decode(), "body:", st["body"].decode().strip())

asyncio.run(main(int(sys.argv[1])))
"#;

/// With 0-RTT on: takes tickets on a first HTTP/3 connection, then resumes with each,
/// sending one request as 0-RTT data: a GET with the first ticket, a POST with the
/// second, then a GET with the first again (a replay of a spent session). Prints, per
/// request, whether the handshake resumed, whether the server accepted the early data,
/// the status, and the `early-data` field the upstream (app.py `/headers`) was sent.
/// Needs GETS beside it as gets.py (its client, `config` and `take_tickets`).
const EARLY_ON: &str = r#"
import asyncio, json, sys
from aioquic.asyncio.client import connect
from gets import Client, config, take_tickets

async def request(client, method, path):
    sid = client._quic.get_next_available_stream_id()
    head = [(b":method", method.encode()), (b":scheme", b"https"),
            (b":authority", b"localhost"), (b":path", path.encode())]
    client.h3.send_headers(sid, head, end_stream=(method == "GET"))
    if method != "GET":
        client.h3.send_data(sid, b"not to be repeated", end_stream=True)
    st = {"headers": None, "body": b"", "done": client._loop.create_future()}
    client.waiters[sid] = st
    client.transmit()
    await st["done"]
    return st

async def main(port):
    tickets = await take_tickets(port)
    print("tickets:", len(tickets), "allow early data:", tickets[0].max_early_data_size)
    for ticket, method in [(tickets[0], "GET"), (tickets[1], "POST"), (tickets[0], "GET")]:
        async with connect("127.0.0.1", port, configuration=config(ticket), create_protocol=Client,
                           wait_connected=False) as client:
            st = await asyncio.wait_for(request(client, method, "/app/headers"), 10)
            tls = client._quic.tls
            head = dict(st["headers"])
            status = head[b":status"].decode()
            seen = "-"
            if status == "200":
                seen = dict(json.loads(st["body"])["headers"]).get("early-data", "none")
            else:
                seen += " page names terminus: " + str(b"terminus" in st["body"])
            print(method, "resumed:", tls.session_resumed, "early:", tls.early_data_accepted,
                  "status:", status, "server:", head.get(b"server", b"-").decode(),
                  "upstream saw early-data:", seen)

asyncio.run(main(int(sys.argv[1])))
"#;

/// With 0-RTT on: takes a ticket, then resumes with it sending a GET as 0-RTT data and
/// sends nothing more (its Finished never leaves); prints the GET's status once the
/// answer is in, then stays 3 s. Needs GETS beside it as gets.py.
const EARLY_STALL: &str = r#"
import asyncio, sys
from aioquic.asyncio.client import connect
from gets import Client, config, take_tickets

async def main(port):
    tickets = await take_tickets(port)
    async with connect("127.0.0.1", port, configuration=config(tickets[0]), create_protocol=Client,
                       wait_connected=False) as client:
        answer = asyncio.ensure_future(client.get("/index.html"))
        await asyncio.sleep(0)
        client._transport.sendto = lambda *a, **k: None
        st = await asyncio.wait_for(answer, 10)
        print("early:", client._quic.tls.early_data_accepted, "status:", dict(st["headers"])[b":status"].decode())
        await asyncio.sleep(3)

asyncio.run(main(int(sys.argv[1])))
"#;

/// A server with HTTP/3 on its one listener, a certificate of `key`, on `backend`.
fn h3_server(dir: &TestDir, key: KeyKind, backend: &str) -> (Server, u16) {
    h3_server_with(dir, key, backend, "")
}

/// [`h3_server`] with `http3` lines (`[http3]`'s keys).
fn h3_server_with(dir: &TestDir, key: KeyKind, backend: &str, http3: &str) -> (Server, u16) {
    h3_server_full(dir, key, backend, http3, "", 1)
}

/// [`h3_server_with`], `more` appended to the file (after the server), on `workers`.
fn h3_server_full(
    dir: &TestDir,
    key: KeyKind,
    backend: &str,
    http3: &str,
    more: &str,
    workers: usize,
) -> (Server, u16) {
    let config = H3Config {
        key,
        backend,
        http3,
        in_server: "",
        more,
        workers,
    };
    h3_server_on(dir, "127.0.0.1", config)
}

/// Every QUIC handshake's signature and key exchange are computed by the engine (its
/// requests counted on the pinned backend), none by the bridge's synchronous fallback,
/// for RSA and ECDSA certificates; their histograms name the key that signed.
#[test]
fn quic_handshakes_are_computed_by_the_engine_with_no_synchronous_fallback() {
    if !aioquic() {
        return;
    }
    let script = TestDir::new("h3-script");
    let client = script.write("handshakes.py", HANDSHAKES);
    for (key, sign, key_type) in [
        (KeyKind::Rsa(2048), "rsa_sign", "rsa"),
        (KeyKind::EcdsaP256, "ecdsa_sign", "ecdsa"),
    ] {
        let dir = TestDir::new("h3-handshakes");
        let (server, port) = h3_server(&dir, key, "scalar");
        let out = run(Command::new("python3")
            .arg(&client)
            .arg(port.to_string())
            .arg("5"));
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success() && text.lines().next() == Some("5 h3"),
            "{sign}: {text} {}\n{}",
            String::from_utf8_lossy(&out.stderr),
            server.stderr()
        );
        assert_eq!(server.metric("terminus_quic_handshakes_total", &[]), 5.0);
        assert_eq!(
            server.metric("terminus_quic_handshake_failures_total", &[]),
            0.0
        );
        assert_eq!(
            server.metric("terminus_crypto_sync_fallbacks_total", &[]),
            0.0,
            "a QUIC handshake step ran off the bridge"
        );
        let signed = server.metric(
            "terminus_crypto_requests_total",
            &[&format!("op=\"{sign}\""), "backend=\"scalar\""],
        );
        assert_eq!(signed, 5.0, "{sign}");
        // Their handshake histograms are labelled with the key that signed, as TCP's.
        let full = server.metric(
            "terminus_handshake_duration_seconds_count",
            &[&format!("key_type=\"{key_type}\""), "mode=\"full\""],
        );
        assert_eq!(full, 5.0, "{key_type}");
    }
}

/// Files of several sizes come whole over HTTP/3 (aioquic's client, one connection, the
/// bodies' SHA-256 against the files'), and a missing one is a 404 from the same
/// responder as TCP's.
#[test]
fn files_of_several_sizes_are_served_whole_over_http3() {
    if !aioquic() {
        return;
    }
    let dir = TestDir::new("h3-files");
    let (server, port) = h3_server(&dir, KeyKind::EcdsaP256, "auto");
    let mut expected = Vec::new();
    for (name, size) in [("empty.bin", 0usize), ("1k.bin", 1024), ("3m.bin", 3 << 20)] {
        let bytes: Vec<u8> = (0..size).map(|i| (i * 7 + i / 251) as u8).collect();
        dir.write(&format!("www/{name}"), &bytes);
        let digest = openssl_sha256(&bytes);
        expected.push(format!("/{name} 200 {size} {digest}"));
    }
    let script = dir.write("gets.py", GETS);
    let out = run(Command::new("python3")
        .arg(&script)
        .arg(port.to_string())
        .args(["/empty.bin", "/1k.bin", "/3m.bin", "/missing"]));
    let text = String::from_utf8_lossy(&out.stdout);
    let lines: Vec<&str> = text.lines().collect();
    assert!(
        out.status.success() && lines.len() == 4,
        "{text}\n{}\n{}",
        String::from_utf8_lossy(&out.stderr),
        server.stderr()
    );
    for (line, want) in lines.iter().zip(&expected) {
        assert_eq!(line, want);
    }
    assert!(lines[3].starts_with("/missing 404 "), "{}", lines[3]);
    assert_eq!(
        server.metric("terminus_crypto_sync_fallbacks_total", &[]),
        0.0
    );
    // Counted as HTTP/3's, as TCP's responses are by their protocol.
    let h3 = |code: &str| {
        server.metric(
            "terminus_http_responses_total",
            &[&format!("code=\"{code}\""), "protocol=\"h3\""],
        )
    };
    assert_eq!((h3("2xx"), h3("4xx")), (3.0, 1.0));
    assert_eq!(
        server.metric("terminus_http_responses_total", &["protocol=\"h2\""]),
        0.0
    );
}

/// TCP responses (HTTP/1.1 and h2, by curl) on a listener with `http3` say where HTTP/3
/// is (`Alt-Svc: h3=":PORT"; ma=86400`) and are counted by their protocol, and a listener
/// without it says nothing.
#[test]
fn tcp_responses_on_an_http3_listener_carry_alt_svc_and_their_protocol_s_count_and_others_no_alt_svc(
) {
    let dir = TestDir::new("h3-alt-svc");
    let (server, port) = h3_server(&dir, KeyKind::EcdsaP256, "scalar");
    let headers = |port: u16, version: &str| {
        let out = run(Command::new("curl").args([
            "-sk",
            version,
            "-o",
            "/dev/null",
            "-D",
            "-",
            &format!("https://localhost:{port}/index.html"),
        ]));
        String::from_utf8_lossy(&out.stdout).to_ascii_lowercase()
    };
    for version in ["--http1.1", "--http2"] {
        let head = headers(port, version);
        assert!(
            head.contains(&format!("alt-svc: h3=\":{port}\"; ma=86400")),
            "{version}: {head}"
        );
    }
    // Each response counted by its protocol.
    for protocol in ["http/1.1", "h2"] {
        let label = format!("protocol=\"{protocol}\"");
        let counted = server.metric("terminus_http_responses_total", &[&label]);
        assert_eq!(counted, 1.0, "{protocol}");
    }
    drop(server);
    let plain = ServerBuilder::flags(&[]).start();
    let head = headers(plain.port(), "--http1.1");
    assert!(
        head.starts_with("http/1.1 ") && !head.contains("alt-svc"),
        "{head}"
    );
}

/// `count` QUIC handshakes at once from quinn's client (fast enough to outrun one
/// server worker, which Python's aioquic is not), each connection then closed; how many
/// completed.
fn quic_storm(port: u16, count: usize) -> usize {
    quic_storm_with(port, count, None)
}

/// [`quic_storm`], the client offering only `group` where given.
fn quic_storm_with(
    port: u16,
    count: usize,
    group: Option<&'static dyn rustls::crypto::SupportedKxGroup>,
) -> usize {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async move {
        let endpoint = quinn_client(group);
        let server: std::net::SocketAddr = ([127, 0, 0, 1], port).into();
        let handles: Vec<_> = (0..count)
            .map(|_| {
                let endpoint = endpoint.clone();
                tokio::spawn(async move {
                    let connecting = endpoint.connect(server, "localhost").ok()?;
                    let conn = tokio::time::timeout(Duration::from_secs(20), connecting)
                        .await
                        .ok()?
                        .ok()?;
                    conn.close(0u32.into(), b"done");
                    Some(())
                })
            })
            .collect();
        let mut done = 0;
        for handle in handles {
            if let Ok(Some(())) = handle.await {
                done += 1;
            }
        }
        endpoint.wait_idle().await;
        done
    })
}

/// `limits.connections_per_client` counts QUIC connections with TCP's: with one allowed,
/// a second QUIC connection from the address is closed with H3_EXCESSIVE_LOAD once its
/// handshake is done, the first is untouched, and once the first has closed a new one
/// stays.
#[test]
fn connections_per_client_closes_the_quic_connection_too_many_and_spares_the_first() {
    let dir = TestDir::new("h3-per-client");
    let (server, port) = h3_server_full(
        &dir,
        KeyKind::EcdsaP256,
        "scalar",
        "",
        "[limits]\nconnections_per_client = 1\n",
        1,
    );
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async move {
        let endpoint = quinn_client(None);
        let addr: std::net::SocketAddr = ([127, 0, 0, 1], port).into();
        let connect = || async {
            endpoint
                .connect(addr, "localhost")
                .unwrap()
                .await
                .expect("the handshake completes")
        };
        // Closed by the server within `within`: its error code.
        let closed_within = |conn: quinn::Connection, within: Duration| async move {
            match tokio::time::timeout(within, conn.closed()).await {
                Ok(quinn::ConnectionError::ApplicationClosed(close)) => {
                    Some(u64::from(close.error_code))
                }
                Ok(other) => panic!("closed otherwise: {other}"),
                Err(_) => None,
            }
        };
        let first = connect().await;
        let second = connect().await;
        assert_eq!(
            closed_within(second, Duration::from_secs(5)).await,
            Some(0x107),
            "H3_EXCESSIVE_LOAD"
        );
        assert!(first.close_reason().is_none(), "the first is untouched");
        first.close(0u32.into(), b"done");
        // The server sees the first close, then a new connection is counted alone.
        let mut kept = false;
        for _ in 0..20 {
            if closed_within(connect().await, Duration::from_millis(500))
                .await
                .is_none()
            {
                kept = true;
                break;
            }
        }
        assert!(kept, "a new connection stays once the first has closed");
    });
    assert!(server.metric("terminus_limited_connections_total", &[]) >= 1.0);
}

/// A quinn client endpoint offering h3 (and only `group` where given), with no
/// resumption, trusting any certificate; to be made within a tokio runtime.
fn quinn_client(group: Option<&'static dyn rustls::crypto::SupportedKxGroup>) -> quinn::Endpoint {
    let mut provider = rustls::crypto::aws_lc_rs::default_provider();
    if let Some(group) = group {
        provider.kx_groups = vec![group];
    }
    let mut crypto = rustls::ClientConfig::builder_with_provider(Arc::new(provider))
        .with_protocol_versions(&[&rustls::version::TLS13])
        .unwrap()
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(AnyCertificate))
        .with_no_client_auth();
    crypto.alpn_protocols = vec![b"h3".to_vec()];
    crypto.resumption = rustls::client::Resumption::disabled();
    let config = quinn::ClientConfig::new(Arc::new(
        quinn::crypto::rustls::QuicClientConfig::try_from(crypto).unwrap(),
    ));
    let mut endpoint = quinn::Endpoint::client("127.0.0.1:0".parse().unwrap()).unwrap();
    endpoint.set_default_client_config(config);
    endpoint
}

/// The storm's client trusts any certificate: it measures the server, not PKI.
#[derive(Debug)]
struct AnyCertificate;

impl rustls::client::danger::ServerCertVerifier for AnyCertificate {
    fn verify_server_cert(
        &self,
        _: &rustls::pki_types::CertificateDer<'_>,
        _: &[rustls::pki_types::CertificateDer<'_>],
        _: &rustls::pki_types::ServerName<'_>,
        _: &[u8],
        _: rustls::pki_types::UnixTime,
    ) -> Result<rustls::client::danger::ServerCertVerified, rustls::Error> {
        Ok(rustls::client::danger::ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        _: &[u8],
        _: &rustls::pki_types::CertificateDer<'_>,
        _: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        Ok(rustls::client::danger::HandshakeSignatureValid::assertion())
    }

    fn verify_tls13_signature(
        &self,
        _: &[u8],
        _: &rustls::pki_types::CertificateDer<'_>,
        _: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        Ok(rustls::client::danger::HandshakeSignatureValid::assertion())
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        rustls::crypto::aws_lc_rs::default_provider()
            .signature_verification_algorithms
            .supported_schemes()
    }
}

/// A storm of 256 concurrent QUIC handshakes on the multibuffer backend fills the
/// engine's RSA batches as TCP's do (at least 4 signatures a batch on average): each
/// QUIC handshake is counted in flight from its first packet and suspends on the bridge.
/// Needs AVX-512 IFMA (a visible skip elsewhere).
#[test]
fn a_storm_of_quic_handshakes_fills_multibuffer_batches() {
    if !ifma() {
        return;
    }
    let _alone = exclusive();
    let dir = TestDir::new("h3-storm");
    let (server, port) = h3_server(&dir, KeyKind::Rsa(2048), "multibuffer");
    let done = quic_storm(port, 256);
    assert_eq!(done, 256, "{}", server.stderr());
    let labels = ["op=\"rsa_sign\"", "backend=\"multibuffer\""];
    let signed = server.metric("terminus_crypto_batch_size_sum", &labels);
    let batches = server.metric("terminus_crypto_batch_size_count", &labels);
    assert_eq!(signed, 256.0);
    assert!(
        signed / batches >= 4.0,
        "{signed} signatures in {batches} batches: QUIC handshakes are not batched"
    );
    assert_eq!(
        server.metric("terminus_crypto_sync_fallbacks_total", &[]),
        0.0
    );
}

/// With `retry = "always"` every new connection is sent a Retry first, and aioquic's
/// handshakes complete after proving their address.
#[test]
fn retry_always_makes_every_connection_prove_its_address_and_handshakes_complete() {
    if !aioquic() {
        return;
    }
    let dir = TestDir::new("h3-retry");
    let (server, port) = h3_server_with(&dir, KeyKind::EcdsaP256, "scalar", "retry = \"always\"");
    let client = dir.write("handshakes.py", HANDSHAKES);
    let out = run(Command::new("python3")
        .arg(&client)
        .arg(port.to_string())
        .arg("3"));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && text.lines().next() == Some("3 h3"),
        "{text} {}",
        server.stderr()
    );
    assert_eq!(server.metric("terminus_quic_retries_total", &[]), 3.0);
    assert_eq!(server.metric("terminus_quic_handshakes_total", &[]), 3.0);
}

/// A flood of Initials above `max_handshakes` is refused, the rest served, and an
/// HTTP/3 connection established before the flood stays up through it and is served
/// after it (its second request).
#[test]
fn a_flood_of_initials_above_the_limit_is_refused_and_an_established_connection_is_served() {
    if !aioquic() {
        return;
    }
    let _alone = exclusive();
    let dir = TestDir::new("h3-flood");
    dir.write("www/1k.bin", vec![7u8; 1024]);
    let (server, port) = h3_server_with(
        &dir,
        KeyKind::Rsa(2048),
        "scalar",
        "retry = \"never\"\nmax_handshakes = 4",
    );
    let script = dir.write("gets.py", GETS);
    let established = Command::new("python3")
        .arg(&script)
        .arg(port.to_string())
        .args(["/1k.bin", "sleep:3", "/1k.bin"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // Established before the flood: its handshake counted.
    eventually(
        Duration::from_secs(10),
        "the established connection",
        || server.metric("terminus_quic_handshakes_total", &[]) >= 1.0,
    );
    let done = quic_storm(port, 256);
    let refused = server.metric("terminus_quic_refused_total", &[]);
    let out = established.wait_with_output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    let lines: Vec<&str> = text.lines().collect();
    assert!(
        out.status.success()
            && lines.len() == 2
            && lines.iter().all(|l| l.starts_with("/1k.bin 200 1024 ")),
        "{text} {}\n{done} of the flood completed\n{}",
        String::from_utf8_lossy(&out.stderr),
        server.stderr()
    );
    assert!(refused >= 1.0, "no Initial refused");
    assert!(done >= 4, "{done} handshakes completed");
    // Every client turned away was refused (a retransmitted Initial may be refused
    // again).
    assert!(
        refused >= (256 - done) as f64,
        "{done} completed, {refused} refused"
    );
    assert_eq!(
        server.metric("terminus_quic_handshake_failures_total", &[]),
        0.0
    );
}

/// A ClientHello carrying an X25519MLKEM768 key share (over 1,200 bytes) spans two
/// Initial packets: the first packet processed on the bridge holds half of it, and the
/// rest, arriving as a second datagram, is answered on the bridge too (the hybrid key
/// exchange and the signature by the engine, nothing synchronous).
#[test]
fn a_client_hello_over_two_initials_is_answered_on_the_bridge() {
    let dir = TestDir::new("h3-mlkem");
    let (server, port) = h3_server(&dir, KeyKind::EcdsaP256, "scalar");
    let done = quic_storm_with(
        port,
        4,
        Some(rustls::crypto::aws_lc_rs::kx_group::X25519MLKEM768),
    );
    assert_eq!(done, 4, "{}", server.stderr());
    assert_eq!(
        server.metric(
            "terminus_crypto_requests_total",
            &["op=\"x25519mlkem768\"", "backend=\"scalar\""]
        ),
        4.0
    );
    assert_eq!(
        server.metric("terminus_crypto_sync_fallbacks_total", &[]),
        0.0
    );
    assert_eq!(server.metric("terminus_quic_handshakes_total", &[]), 4.0);
}

/// `[http3]` settings that cannot work, and `http3` on a plain listener, are refused at
/// their line by `terminus check`.
#[test]
fn http3_settings_that_cannot_work_are_refused_at_their_line() {
    let dir = TestDir::new("h3-config");
    for (text, says, line) in [
        (
            "[http3]\nretry = \"sometimes\"\n",
            "is not a Retry policy",
            2,
        ),
        (
            "[http3]\nmax_handshakes = 0\n",
            "would refuse every QUIC connection",
            2,
        ),
        (
            "listen = [{ address = \"127.0.0.1:0\", plain = \"redirect\", http3 = true }]\n",
            "http3 is for TLS listeners",
            1,
        ),
    ] {
        check_refuses(&dir, text, says, line);
    }
}

/// Requests over HTTP/3 to a proxied route, as the HTTP/1.1 keep-alive upstream (app.py)
/// parses them. Each argument `METHOD PATH [CONTENT-LENGTH|- [FRAME|FRAME...]]` is one
/// request on one connection (`new` starts a new connection); DATA frames are text,
/// separated by `|`, with `\r\n` written for CRLF. Prints per request its status (or `reset 0xCODE` where the
/// server reset the stream), its body's length, and its body (over 1,000 bytes, its
/// SHA-256).
/// Needs GETS beside it as gets.py.
const PROXIED: &str = r#"
import asyncio, hashlib, sys
from aioquic.asyncio.client import connect
from aioquic.quic.events import StreamReset
from gets import Client, config

class Resets(Client):
    def quic_event_received(self, event):
        if isinstance(event, StreamReset):
            st = self.waiters.get(event.stream_id)
            if st is not None and not st["done"].done():
                st["reset"] = event.error_code
                st["done"].set_result(None)
        super().quic_event_received(event)

async def request(client, spec):
    method, path, *rest = spec.split(" ", 3)
    head = [(b":method", method.encode()), (b":scheme", b"https"),
            (b":authority", b"localhost"), (b":path", path.encode())]
    frames = []
    if rest and rest[0] != "-":
        head.append((b"content-length", rest[0].encode()))
    if rest:
        frames = [f.replace("\\r\\n", "\r\n").encode() for f in rest[1].split("|")] if len(rest) > 1 else []
    sid = client._quic.get_next_available_stream_id()
    st = {"headers": None, "body": b"", "done": client._loop.create_future(), "reset": None}
    client.waiters[sid] = st
    client.h3.send_headers(sid, head, end_stream=not frames)
    for i, f in enumerate(frames):
        client.h3.send_data(sid, f, end_stream=(i == len(frames) - 1))
    client.transmit()
    await asyncio.wait_for(st["done"], 10)
    if st["reset"] is not None:
        return f"reset {st['reset']:#x}"
    status = dict(st["headers"])[b":status"].decode()
    body = st["body"]
    text = body.decode(errors="replace").strip() if len(body) <= 1000 else hashlib.sha256(body).hexdigest()
    return f"{status} {len(body)} {text}"

async def main(port, specs):
    groups = [[]]
    for spec in specs:
        if spec == "new":
            groups.append([])
        else:
            groups[-1].append(spec)
    for group in groups:
        async with connect("127.0.0.1", port, configuration=config(), create_protocol=Resets) as client:
            for spec in group:
                print(spec.split(" ")[1], await request(client, spec), flush=True)

asyncio.run(main(int(sys.argv[1]), sys.argv[2:]))
"#;

/// An HTTP/3 server with one worker whose `/app/` route goes to `app` (HTTP/1.1, kept
/// alive), and the port.
fn h3_proxy(dir: &TestDir, app: &App) -> (Server, u16) {
    h3_server_full(
        dir,
        KeyKind::EcdsaP256,
        "scalar",
        "",
        &format!("[[server.route]]\npath = \"/app/\"\nupstream = \"app\"\n[[upstream]]\nname = \"app\"\nservers = [\"{}\"]\n", app.addr()),
        1,
    )
}

/// Runs [`PROXIED`] with `specs` against `port`; its lines.
fn proxied(dir: &TestDir, port: u16, specs: &[&str]) -> Vec<String> {
    dir.write("gets.py", GETS);
    let script = dir.write("proxied.py", PROXIED);
    let out = run(Command::new("python3")
        .arg(&script)
        .arg(port.to_string())
        .args(specs));
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::to_owned)
        .collect()
}

/// Requests over HTTP/3 to a proxied route reach a keep-alive HTTP/1.1 upstream (app.py)
/// whole and framed as they came: a 100,000-byte answer comes back whole, a GET that
/// ends with its headers goes with no body framing (neither `Transfer-Encoding` nor
/// `Content-Length`, as from HTTP/2), and a POST's body with its length; an empty DATA
/// frame in the middle of a body (which h3 reports as it reports the end) cuts nothing,
/// with a content-length or without.
#[test]
fn a_proxied_request_over_http3_is_answered_by_a_keep_alive_upstream_framed_as_sent() {
    if !aioquic() {
        return;
    }
    let app = App::start("a");
    let dir = TestDir::new("h3-proxy");
    let (server, port) = h3_proxy(&dir, &app);
    let lines = proxied(
        &dir,
        port,
        &[
            "GET /app/bytes?n=100000",
            "GET /app/headers",
            "POST /app/sha256 5 hello",
            "POST /app/sha256 6 abc||def",
            "POST /app/sha256 - abc||def",
        ],
    );
    let context = format!("{lines:#?}\n{}", server.stderr());
    let pattern: Vec<u8> = (0..100_000u32).map(|i| (i % 256) as u8).collect();
    let want = format!(
        "/app/bytes?n=100000 200 100000 {}",
        openssl_sha256(&pattern)
    );
    assert_eq!(lines[0], want, "{context}");
    let seen: serde_json::Value =
        serde_json::from_str(lines[1].splitn(4, ' ').nth(3).unwrap()).expect(&context);
    let framing: Vec<&str> = seen["headers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|h| h[0].as_str().unwrap())
        .filter(|name| ["transfer-encoding", "content-length"].contains(name))
        .collect();
    assert!(
        framing.is_empty(),
        "a GET went framed: {framing:?}\n{context}"
    );
    let hello = openssl_sha256(b"hello");
    assert_eq!(
        lines[2],
        format!("/app/sha256 200 {} {hello} 5", hello.len() + 3),
        "{context}"
    );
    let abcdef = openssl_sha256(b"abcdef");
    for line in &lines[3..] {
        assert_eq!(
            *line,
            format!("/app/sha256 200 {} {abcdef} 6", abcdef.len() + 3),
            "{context}"
        );
    }
}

/// RFC 9114 section 4.1.2: an HTTP/3 request whose DATA disagree with its content-length
/// is malformed. Three POSTs declaring 5 bytes, to a keep-alive HTTP/1.1 upstream: one
/// DATA frame of `hello` followed by a whole second request, the same in two frames, and
/// 5 declared but 3 sent; each stream is reset with H3_MESSAGE_ERROR (0x10e), and the
/// request in the body never reaches the upstream: clients on a new QUIC connection get
/// their own answers, and the upstream's log of the requests it parsed has no
/// `/SMUGGLED`.
#[test]
fn an_http3_body_that_disagrees_with_its_content_length_is_reset_and_smuggles_nothing() {
    if !aioquic() {
        return;
    }
    let app = App::start("a");
    let dir = TestDir::new("h3-smuggle");
    let (server, port) = h3_proxy(&dir, &app);
    let smuggled = "GET /app/SMUGGLED HTTP/1.1\\r\\nHost: x\\r\\n\\r\\n";
    let lines = proxied(
        &dir,
        port,
        &[
            &format!("POST /app/sha256 5 hello{smuggled}"),
            &format!("POST /app/sha256 5 hello|{smuggled}"),
            "POST /app/sha256 5 hel",
            "new",
            "GET /app/whoami",
            "GET /app/whoami",
            "GET /app/seen",
        ],
    );
    let context = format!("{lines:#?}\n{}", server.stderr());
    assert_eq!(lines.len(), 6, "{context}");
    for line in &lines[..3] {
        assert_eq!(line, "/app/sha256 reset 0x10e", "{context}");
    }
    assert_eq!(lines[3], "/app/whoami 200 1 a", "{context}");
    assert_eq!(lines[4], "/app/whoami 200 1 a", "{context}");
    assert!(!lines[5].contains("SMUGGLED"), "{context}");
}

/// QUIC's TLS configuration is built once, but its certificates are the current site's:
/// after new certificate files and a SIGHUP, a new HTTP/3 handshake shows the new
/// certificate (as ACME's renewals reach QUIC too).
#[test]
fn a_reload_s_new_certificate_is_shown_to_new_quic_handshakes() {
    if !aioquic() {
        return;
    }
    let dir = TestDir::new("h3-reload");
    let (server, port) = h3_server(&dir, KeyKind::EcdsaP256, "scalar");
    let client = dir.write("handshakes.py", HANDSHAKES);
    let serial = || {
        let out = run(Command::new("python3")
            .arg(&client)
            .arg(port.to_string())
            .arg("1"));
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(out.status.success(), "{text} {}", server.stderr());
        text.lines()
            .nth(1)
            .unwrap_or_default()
            .trim()
            .to_ascii_lowercase()
    };
    let cert_serial = |dir: &TestDir| {
        let out = run(Command::new("openssl")
            .args(["x509", "-noout", "-serial", "-in"])
            .arg(dir.path("k.pem")));
        let text = String::from_utf8_lossy(&out.stdout).to_ascii_lowercase();
        text.trim()
            .trim_start_matches("serial=")
            .trim_start_matches('0')
            .to_owned()
    };
    let before = serial();
    assert_eq!(before, cert_serial(&dir));
    // New files in place of the old ones, then a reload.
    make_cert(&dir.0, "k", KeyKind::EcdsaP256, &["localhost"]);
    let renewed = cert_serial(&dir);
    assert_ne!(renewed, before);
    server.signal("HUP");
    eventually(
        Duration::from_secs(10),
        "the new certificate over QUIC",
        || serial() == renewed,
    );
}

/// A client that closes its connection in the middle of a large download leaves nothing
/// behind: the response's task, blocked on a full send window, is told the connection
/// is gone and ends, and the connection (counted open until its last request's task is
/// done) stops counting as open.
#[test]
fn a_client_gone_mid_download_frees_its_connection() {
    if !aioquic() {
        return;
    }
    let dir = TestDir::new("h3-abort");
    dir.write("www/big.bin", vec![1u8; 8 << 20]);
    let (server, port) = h3_server(&dir, KeyKind::EcdsaP256, "scalar");
    let script = dir.write(
        "abort.py",
        r#"
import asyncio, ssl, sys
from aioquic.asyncio.client import connect
from aioquic.asyncio.protocol import QuicConnectionProtocol
from aioquic.h3.connection import H3_ALPN, H3Connection
from aioquic.h3.events import DataReceived
from aioquic.quic.configuration import QuicConfiguration

class Client(QuicConnectionProtocol):
    def __init__(self, *a, **k):
        super().__init__(*a, **k)
        self.h3 = H3Connection(self._quic)
        self.first = self._loop.create_future()
    def quic_event_received(self, event):
        for ev in self.h3.handle_event(event):
            if isinstance(ev, DataReceived) and not self.first.done():
                self.first.set_result(None)

async def main(port):
    config = QuicConfiguration(is_client=True, alpn_protocols=H3_ALPN,
                               verify_mode=ssl.CERT_NONE, server_name="localhost")
    async with connect("127.0.0.1", port, configuration=config, create_protocol=Client) as client:
        sid = client._quic.get_next_available_stream_id()
        client.h3.send_headers(sid, [(b":method", b"GET"), (b":scheme", b"https"),
            (b":authority", b"localhost"), (b":path", b"/big.bin")], end_stream=True)
        client.transmit()
        await asyncio.wait_for(client.first, 10)
        client.close()
    print("closed")

asyncio.run(main(int(sys.argv[1])))
"#,
    );
    let out = run(Command::new("python3").arg(&script).arg(port.to_string()));
    assert!(
        String::from_utf8_lossy(&out.stdout).trim() == "closed",
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    eventually(
        Duration::from_secs(10),
        "the connection no longer open",
        || server.metric("terminus_connections_open", &[]) == 0.0,
    );
}

/// A client whose address changes (a new UDP port, as after a NAT rebinding) keeps its
/// connection with two workers: the kernel gives its datagrams from the new port to
/// either worker's socket, and the one that does not own the connection hands them to
/// the one that does (connection IDs name their worker), instead of dropping them or
/// answering with a stateless reset. Rebinds until at least 3 were handed over (each
/// rebind reaches the other worker about half the time); every request is answered.
#[test]
fn a_client_whose_address_changes_keeps_its_connection_across_workers() {
    let dir = TestDir::new("h3-rebind");
    let (server, port) = h3_server_full(&dir, KeyKind::EcdsaP256, "scalar", "", "", 2);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let (rebinds, handed) = runtime.block_on(async {
        let endpoint = quinn_client(None);
        let server_addr: std::net::SocketAddr = ([127, 0, 0, 1], port).into();
        let conn = endpoint
            .connect(server_addr, "localhost")
            .unwrap()
            .await
            .expect("QUIC handshake");
        let (mut driver, mut requests) = h3::client::new(h3_quinn::Connection::new(conn))
            .await
            .unwrap();
        tokio::spawn(async move { std::future::poll_fn(|cx| driver.poll_close(cx)).await });
        let mut rebinds = 0;
        loop {
            let request = http::Request::get(format!("https://localhost:{port}/index.html"))
                .body(())
                .unwrap();
            let get = async {
                let mut stream = requests.send_request(request).await?;
                stream.finish().await?;
                let response = stream.recv_response().await?;
                let mut body = Vec::new();
                while let Some(mut chunk) = stream.recv_data().await? {
                    use bytes::Buf;
                    while chunk.has_remaining() {
                        let part = chunk.chunk();
                        body.extend_from_slice(part);
                        let n = part.len();
                        chunk.advance(n);
                    }
                }
                Ok::<_, Box<dyn std::error::Error + Send + Sync>>((response.status(), body))
            };
            let (status, body) = tokio::time::timeout(Duration::from_secs(10), get)
                .await
                .unwrap_or_else(|_| panic!("no answer after {rebinds} rebinds"))
                .unwrap_or_else(|e| panic!("after {rebinds} rebinds: {e}"));
            assert_eq!((status.as_u16(), &body[..]), (200, &b"over h3\n"[..]));
            let handed = server.metric("terminus_quic_handed_over_total", &[]);
            if handed >= 3.0 || rebinds == 40 {
                break (rebinds, handed);
            }
            endpoint
                .rebind(std::net::UdpSocket::bind("127.0.0.1:0").unwrap())
                .unwrap();
            rebinds += 1;
        }
    });
    assert!(
        handed >= 3.0,
        "{handed} datagrams handed over in {rebinds} rebinds\n{}",
        server.stderr()
    );
    assert_eq!(server.metric("terminus_quic_handshakes_total", &[]), 1.0);
}

/// `terminus load --http3` speaks HTTP/3 to a real HTTP/3 server: with a new connection
/// per request, every request it reports is one QUIC handshake the server counted, and
/// keep-alive requests share their connections; options it cannot combine with HTTP/3
/// are refused by name.
#[test]
fn terminus_load_over_http3_makes_the_handshakes_and_requests_it_reports() {
    let dir = TestDir::new("h3-load");
    let (server, port) = h3_server(&dir, KeyKind::EcdsaP256, "scalar");
    let url = format!("https://localhost:{port}/index.html");
    let fresh = load(&[
        &url,
        "-k",
        "--http3",
        "-d",
        "1s",
        "-c",
        "2",
        "--new-connection",
    ]);
    let requests = fresh["requests"].as_u64().unwrap();
    assert!(requests > 20, "{fresh:#}");
    assert_eq!(fresh["errors_total"].as_u64(), Some(0), "{fresh:#}");
    assert_eq!(fresh["http"], "HTTP/3");
    assert_eq!(fresh["handshakes"].as_u64(), Some(requests));
    assert_eq!(
        server.metric("terminus_quic_handshakes_total", &[]),
        requests as f64
    );
    let kept = load(&[&url, "-k", "--http3", "-d", "1s", "-c", "2"]);
    assert!(kept["requests"].as_u64().unwrap() > 100, "{kept:#}");
    assert_eq!(kept["handshakes"].as_u64(), Some(2), "{kept:#}");
    assert_eq!(
        server.metric("terminus_quic_handshakes_total", &[]),
        requests as f64 + 2.0
    );
    let plain = format!("http://localhost:{port}/index.html");
    for (args, says) in [
        ([url.as_str(), "--resume"], "--http3 with --resume"),
        ([url.as_str(), "--batch-kx"], "--http3 with --batch-kx"),
        ([url.as_str(), "--rtt=5ms"], "--http3 with --rtt"),
        (
            [plain.as_str(), "--threads=1"],
            "--http3 needs an https:// target",
        ),
    ] {
        let out = run(Command::new(terminus_bin())
            .args(["load", "-k", "--http3", "-d", "1s", "-c", "1"])
            .args(args));
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success() && stderr.contains(says), "{stderr}");
    }
}

/// 0-RTT is off (as nginx's `ssl_early_data` and HAProxy's `allow-0rtt` are by default):
/// the server's session tickets allow no early data, and a client that sends a GET as
/// 0-RTT anyway (its ticket forced to allow it) resumes, sees its early data refused,
/// and has the GET answered once the handshake is done. Both with stateless tickets
/// (the default, with which rustls never takes early data) and with a session cache
/// (with which it would, were 0-RTT on).
#[test]
fn zero_rtt_is_refused_by_default_and_the_request_is_answered_after_the_handshake() {
    if !aioquic() {
        return;
    }
    for (name, tls) in [
        ("tickets", ""),
        (
            "cache",
            "[tls]\nsession_tickets = false\nsession_cache = 1000\n",
        ),
    ] {
        let dir = TestDir::new(&format!("h3-0rtt-{name}"));
        let (server, port) = h3_server_full(&dir, KeyKind::EcdsaP256, "scalar", "", tls, 1);
        dir.write("gets.py", GETS);
        let script = dir.write("early.py", EARLY);
        let out = run(Command::new("python3").arg(&script).arg(port.to_string()));
        let text = String::from_utf8_lossy(&out.stdout);
        assert_eq!(
            text.trim(),
            "ticket allows early data: None\nresumed: True early data accepted: False status: 200 body: over h3",
            "with {name}: {}\n{}",
            String::from_utf8_lossy(&out.stderr),
            server.stderr()
        );
    }
}

/// With `[http3] early_data = true`, a resumed client's 0-RTT GET is served before the
/// handshake completes, the upstream told `Early-Data: 1` (RFC 8470 section 5.1); a
/// 0-RTT POST is answered 425 Too Early without reaching the upstream, the `Server` of
/// its server (`Server = ""`: none, and a page that names no server) as every answer;
/// and a session resumes once: offered again (as a replayed ClientHello would), it gets
/// a full handshake, its early data refused and its GET served after the handshake,
/// unmarked. A config that turns 0-RTT on without the session cache it needs names the
/// line.
#[test]
fn zero_rtt_when_on_serves_safe_requests_early_refuses_others_with_425_and_is_taken_once() {
    if !aioquic() {
        return;
    }
    let dir = TestDir::new("h3-0rtt-on");
    let app = App::start("app");
    let routes = format!(
        "[[server.route]]\npath = \"/app/\"\nupstream = \"app\"\n[[upstream]]\nname = \"app\"\nservers = [\"{}\"]\n",
        app.addr()
    );
    let config = H3Config {
        key: KeyKind::EcdsaP256,
        backend: "scalar",
        http3: "early_data = true",
        in_server: "headers = { Server = \"\" }",
        more: &routes,
        workers: 1,
    };
    let (server, port) = h3_server_on(&dir, "127.0.0.1", config);
    dir.write("gets.py", GETS);
    let script = dir.write("early_on.py", EARLY_ON);
    let out = run(Command::new("python3").arg(&script).arg(port.to_string()));
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        text.trim(),
        "tickets: 2 allow early data: 4294967295\n\
         GET resumed: True early: True status: 200 server: - upstream saw early-data: 1\n\
         POST resumed: True early: True status: 425 server: - upstream saw early-data: - page names terminus: False\n\
         GET resumed: False early: False status: 200 server: - upstream saw early-data: none",
        "{}\n{}",
        String::from_utf8_lossy(&out.stderr),
        server.stderr()
    );
    let h3 = |class: &str| {
        server.metric(
            "terminus_http_responses_total",
            &[&format!("code=\"{class}\""), "protocol=\"h3\""],
        )
    };
    assert_eq!((h3("2xx"), h3("4xx")), (3.0, 1.0));
    // The POST never reached the upstream; the two GETs did.
    assert_eq!(server.metric("terminus_upstream_requests_total", &[]), 2.0);
    // Four handshakes completed: the early ones are counted when the client's Finished
    // arrives, after their requests were answered.
    eventually(Duration::from_secs(5), "four QUIC handshakes", || {
        server.metric("terminus_quic_handshakes_total", &[]) == 4.0
    });

    let bad = TestDir::new("h3-0rtt-no-cache");
    let pair = make_cert(&bad.0, "k", KeyKind::EcdsaP256, &["localhost"]);
    let text = format!(
        "listen = [{{ address = \"127.0.0.1:{}\", http3 = true }}]\n[tls]\nsession_cache = 0\n[http3]\nearly_data = true\n[[server]]\nnames = [\"localhost\"]\n[[server.certificate]]\ncert = \"{}\"\nkey = \"{}\"\n",
        free_port(),
        pair.cert.display(),
        pair.key.display()
    );
    check_refuses(&bad, &text, "early_data needs the session cache", 5);
}

/// A connection that took 0-RTT but whose Finished never comes is served its early GET,
/// then closed at `timeouts.handshake` and counted once as a failed handshake (not
/// again on every turn of its driver while it drains), its handshake never counted.
#[test]
fn an_early_connection_whose_finished_never_comes_is_closed_at_the_handshake_timeout_once() {
    if !aioquic() {
        return;
    }
    let dir = TestDir::new("h3-0rtt-stall");
    let (server, port) = h3_server_full(
        &dir,
        KeyKind::EcdsaP256,
        "scalar",
        "early_data = true",
        "[timeouts]\nhandshake = \"1s\"\n",
        1,
    );
    dir.write("gets.py", GETS);
    let script = dir.write("early_stall.py", EARLY_STALL);
    let out = run(Command::new("python3").arg(&script).arg(port.to_string()));
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        text.trim(),
        "early: True status: 200",
        "{}\n{}",
        String::from_utf8_lossy(&out.stderr),
        server.stderr()
    );
    // The client stayed 3 s: past the 1 s timeout and the draining that follows.
    assert_eq!(
        (
            server.metric("terminus_quic_handshakes_total", &[]),
            server.metric("terminus_quic_handshake_failures_total", &[])
        ),
        (1.0, 1.0)
    );
}

/// A second, independent HTTP/3 client (curl over ngtcp2 and nghttp3, from curl_cffi)
/// gets files of several sizes whole, and a POST with a 1 MiB body to a static file is
/// answered 405, its body stopped with H3_NO_ERROR (RFC 9114 section 4.1.2, which curl
/// takes as the end of a whole exchange), the session's next request served.
#[test]
fn curl_over_http3_gets_files_whole_and_a_post_body_is_stopped_once_answered() {
    if !curl_cffi() {
        return;
    }
    let dir = TestDir::new("h3-curl");
    let (server, port) = h3_server(&dir, KeyKind::Rsa(2048), "scalar");
    let mut expected = Vec::new();
    for (name, size) in [("empty.bin", 0usize), ("1k.bin", 1024), ("5m.bin", 5 << 20)] {
        let bytes: Vec<u8> = (0..size).map(|i| (i * 13 + i / 509) as u8).collect();
        dir.write(&format!("www/{name}"), &bytes);
        expected.push(format!(
            "GET /{name} 200 30 {size} {}",
            openssl_sha256(&bytes)
        ));
    }
    let index = openssl_sha256(b"over h3\n");
    expected.push(format!("GET /index.html 200 30 8 {index}"));
    let script = dir.write("curl_h3.py", CURL_H3);
    let out = run(Command::new("python3")
        .arg(&script)
        .arg(port.to_string())
        .args([
            "GET:/empty.bin",
            "GET:/1k.bin",
            "GET:/5m.bin",
            "POST:/index.html:1048576",
            "GET:/index.html",
        ]));
    let text = String::from_utf8_lossy(&out.stdout);
    let lines: Vec<&str> = text.lines().collect();
    assert!(
        out.status.success() && lines.len() == 5,
        "{text}\n{}\n{}",
        String::from_utf8_lossy(&out.stderr),
        server.stderr()
    );
    assert_eq!(&lines[..3], &expected[..3]);
    assert!(
        lines[3].starts_with("POST /index.html 405 30 "),
        "{}",
        lines[3]
    );
    assert_eq!(lines[4], expected[3]);
    // One connection for the whole session.
    assert_eq!(server.metric("terminus_quic_handshakes_total", &[]), 1.0);
}

/// The admission bound (`limits.handshake_queue`) holds for QUIC handshakes as for TCP
/// ones: a storm of 300 concurrent RSA-2048 QUIC handshakes on the scalar backend, far
/// beyond what a 20 ms bound lets one worker take on, has some refused at their
/// ClientHello (counted as `overload_at_hello`), and those taken on complete.
#[test]
fn the_admission_bound_refuses_quic_handshakes_beyond_it() {
    let _alone = exclusive();
    let dir = TestDir::new("h3-bound");
    let (server, port) = h3_server_full(
        &dir,
        KeyKind::Rsa(2048),
        "scalar",
        "",
        "[limits]\nhandshake_queue = \"20ms\"\n",
        1,
    );
    let done = quic_storm(port, 300);
    let refused = server.metric(
        "terminus_handshakes_refused_total",
        &["cause=\"overload_at_hello\""],
    );
    assert!(refused > 0.0, "none of 300 refused; {done} completed");
    assert!(done > 0, "none completed, {refused} refused");
    assert_eq!(
        server.metric("terminus_quic_handshakes_total", &[]),
        done as f64
    );
}

/// On a wildcard address (0.0.0.0) each QUIC datagram is answered from the address it
/// was sent to: a client reaching 127.0.0.2 gets its answers from 127.0.0.2 (from
/// 127.0.0.1, the kernel's choice, it would take them for another server's).
#[test]
fn a_wildcard_listener_answers_from_the_address_each_client_reached() {
    let dir = TestDir::new("h3-wildcard");
    let config = H3Config {
        key: KeyKind::EcdsaP256,
        backend: "scalar",
        http3: "",
        in_server: "",
        more: "",
        workers: 1,
    };
    let (server, port) = h3_server_on(&dir, "0.0.0.0", config);
    let report = load(&[
        &format!("https://localhost:{port}/index.html"),
        "--address",
        "127.0.0.2",
        "-k",
        "--http3",
        "-c",
        "2",
        "-d",
        "1s",
        "--timeout",
        "3s",
    ]);
    assert!(
        report["requests"].as_u64().unwrap() > 100 && report["errors_total"] == 0,
        "{report:#}\n{}",
        server.stderr()
    );
}
