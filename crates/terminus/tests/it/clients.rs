//! Real TLS clients against a spawned terminus: curl (HTTP/1.1 and HTTP/2), openssl
//! s_client (TLS 1.2 and 1.3, RSA and ECDSA), Python's ssl module, SNI virtual hosts.

use std::process::Command;
use std::sync::OnceLock;

use crate::harness::*;

struct Fixture {
    _dir: TestDir,
    rsa: CertPair,
    ecdsa: CertPair,
    root: std::path::PathBuf,
}

fn fixture() -> &'static Fixture {
    static F: OnceLock<Fixture> = OnceLock::new();
    F.get_or_init(|| {
        let dir = TestDir::new("clients");
        let rsa = make_cert(&dir.0, "rsa", KeyKind::Rsa(2048), &["localhost"]);
        let ecdsa = make_cert(&dir.0, "ecdsa", KeyKind::EcdsaP256, &["localhost"]);
        dir.write("www/index.html", "<h1>hello from terminus</h1>\n");
        dir.write("www/0kb.bin", "");
        let root = dir.path("www");
        Fixture {
            _dir: dir,
            rsa,
            ecdsa,
            root,
        }
    })
}

fn both_certs_server(extra: &[&str]) -> Server {
    let f = fixture();
    let mut args = vec![
        "--cert",
        f.rsa.cert.to_str().unwrap(),
        "--key",
        f.rsa.key.to_str().unwrap(),
        "--cert",
        f.ecdsa.cert.to_str().unwrap(),
        "--key",
        f.ecdsa.key.to_str().unwrap(),
        "--root",
        f.root.to_str().unwrap(),
        "--workers",
        "2",
        "--admin",
        "127.0.0.1:0",
    ];
    args.extend_from_slice(extra);
    ServerBuilder::flags(&args).start()
}

#[test]
fn embedded_default_serves_builtin_page_with_self_signed_certs() {
    let server = ServerBuilder::flags(&[]).start();
    let fps: Vec<&String> = server
        .stdout_lines
        .iter()
        .filter(|l| l.contains("SHA256 Fingerprint="))
        .collect();
    assert_eq!(fps.len(), 2, "{:?}", server.stdout_lines);
    assert!(fps.iter().any(|l| l.contains(" rsa ")) && fps.iter().any(|l| l.contains(" ecdsa ")));
    let out = curl(&server, &[], "/");
    assert!(out.status.success());
    assert!(String::from_utf8_lossy(&out.stdout).contains("terminus is serving HTTPS"));
    assert_eq!(status(&server, &[], "/nope"), 404);
    // The served certificates are the ones whose fingerprints were printed.
    for (sigalg, kind) in [
        ("ecdsa_secp256r1_sha256", " ecdsa "),
        ("rsa_pss_rsae_sha256", " rsa "),
    ] {
        let printed = fps.iter().find(|l| l.contains(kind)).unwrap();
        let served = served_fingerprint(&server, &["-sigalgs", sigalg]);
        assert!(
            printed.ends_with(&format!("SHA256 Fingerprint={served}")),
            "{kind}: served {served}, printed {printed}"
        );
        // Valid for about 397 days from a day ago: within what browsers accept (398).
        let dir = TestDir::new("validity");
        let pem = dir.write("c.pem", served_pem(&server, &["-sigalgs", sigalg]));
        let expires_within = |days: u64| {
            let secs = (days * 24 * 3600).to_string();
            !std::process::Command::new("openssl")
                .args(["x509", "-noout", "-checkend", &secs, "-in"])
                .arg(&pem)
                .output()
                .unwrap()
                .status
                .success()
        };
        assert!(!expires_within(395) && expires_within(397), "{kind}");
    }
}

#[test]
fn curl_http1_and_http2() {
    let server = both_certs_server(&[]);
    for (flag, version) in [("--http1.1", "1.1"), ("--http2", "2")] {
        let out = curl(
            &server,
            &[flag, "-w", "\n%{http_version} %{http_code}"],
            "/index.html",
        );
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(text.contains("hello from terminus"), "{text}");
        assert!(
            text.trim_end().ends_with(&format!("{version} 200")),
            "{text}"
        );
    }
    // Keep-alive: several requests on one connection.
    let url = server.url("/index.html");
    let out = run(curl_command(&server, "localhost").args([
        "-o",
        "/dev/null",
        "-o",
        "/dev/null",
        "-w",
        "%{num_connects} ",
        &url,
        &url,
    ]));
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        "1 0",
        "second request reuses the connection"
    );
}

/// The version checks rustls leaves to the server (RFC 7507, RFC 8446 section 4.2.1):
/// a client that says it fell back to TLS 1.2 from a higher version gets
/// inappropriate_fallback, one below TLS 1.2 gets protocol_version; a TLS 1.2 client
/// without the signal still gets TLS 1.2, and nothing reaches the engine for a refusal.
#[test]
fn downgrades_get_the_alerts_the_rfcs_name() {
    let server = both_certs_server(&[]);
    let fell_back = s_client(&server, &["-tls1_2", "-fallback_scsv"]);
    assert!(
        fell_back.contains("alert inappropriate fallback"),
        "{fell_back}"
    );
    // OpenSSL's default security level will not offer TLS 1.1 at all.
    let old = s_client(&server, &["-tls1_1", "-cipher", "DEFAULT@SECLEVEL=0"]);
    assert!(old.contains("alert protocol version"), "{old}");
    let plain12 = s_client(&server, &["-tls1_2"]);
    assert!(plain12.contains("Protocol version: TLSv1.2"), "{plain12}");
    assert_eq!(
        server.metric("terminus_crypto_requests_total", &["op=\"rsa_sign\""])
            + server.metric("terminus_crypto_requests_total", &["op=\"ecdsa_sign\""]),
        1.0,
        "only the accepted handshake signed"
    );
}

/// One handshake from a rustls client offering `groups` (the first with a key share,
/// unless `share` names another) over `versions`: what was negotiated, and whether the
/// server asked for another share.
fn rustls_handshake(
    server: &Server,
    versions: &[&str],
    groups: &[&str],
    share: Option<rustls::NamedGroup>,
) -> (rustls::NamedGroup, rustls::HandshakeKind) {
    use rustls::client::{ClientSessionMemoryCache, ClientSessionStore, Resumption};
    use rustls::pki_types::ServerName;
    let name = ServerName::try_from("localhost").unwrap();
    let config = terminus_load::tls::client_config(&terminus_load::TlsChoice {
        versions: versions.iter().map(|v| v.to_string()).collect(),
        groups: groups.iter().map(|g| g.to_string()).collect(),
        trust: terminus_load::Trust::Insecure,
        ..Default::default()
    })
    .unwrap();
    let mut config = (*config).clone();
    if let Some(group) = share {
        // rustls sends its first key share for the group it last negotiated with a server
        // (its "kx hint"), while supported_groups keeps the configured order.
        let cache = ClientSessionMemoryCache::new(4);
        cache.set_kx_hint(name.clone(), group);
        config.resumption = Resumption::store(std::sync::Arc::new(cache));
    }
    let mut conn = rustls::ClientConnection::new(std::sync::Arc::new(config), name).unwrap();
    let mut tcp = std::net::TcpStream::connect(server.addr).unwrap();
    tcp.set_read_timeout(Some(std::time::Duration::from_secs(10)))
        .unwrap();
    while conn.is_handshaking() {
        conn.complete_io(&mut tcp)
            .unwrap_or_else(|e| panic!("{versions:?} {groups:?}: {e}"));
    }
    (
        conn.negotiated_key_exchange_group().unwrap().name(),
        conn.handshake_kind().unwrap(),
    )
}

/// The post-quantum hybrid X25519MLKEM768 (issue 16): negotiated with a client that offers
/// it, through the engine's own queue; a client that lists it first but sent only an
/// X25519 share gets a HelloRetryRequest for it (rustls's server takes the client's first
/// group both support, then asks for its share: RFC 8446 section 4.1.1 lets it); TLS 1.2
/// and clients without it get X25519, as before.
#[test]
fn the_post_quantum_hybrid_is_negotiated_when_the_client_offers_it() {
    use rustls::{HandshakeKind::*, NamedGroup};
    let server = both_certs_server(&[]);
    let hybrid = NamedGroup::X25519MLKEM768;
    // (versions, groups offered, key share sent if not the first's, negotiated, kind)
    type Case = (
        &'static [&'static str],
        &'static [&'static str],
        Option<NamedGroup>,
        NamedGroup,
        rustls::HandshakeKind,
    );
    let cases: [Case; 5] = [
        (&["1.3"], &["x25519mlkem768"], None, hybrid, Full),
        (&["1.3"], &["x25519mlkem768", "x25519"], None, hybrid, Full),
        (
            &["1.3"],
            &["x25519mlkem768", "x25519"],
            Some(NamedGroup::X25519),
            hybrid,
            FullWithHelloRetryRequest,
        ),
        (
            &["1.2"],
            &["x25519mlkem768", "x25519"],
            None,
            NamedGroup::X25519,
            Full,
        ),
        (&["1.3"], &[], None, NamedGroup::X25519, Full),
    ];
    for (versions, groups, share, group, kind) in cases {
        assert_eq!(
            rustls_handshake(&server, versions, groups, share),
            (group, kind),
            "{versions:?} {groups:?} share {share:?}"
        );
    }
    let text = s_client(&server, &["-tls1_3"]);
    assert!(text.contains("Server Temp Key: X25519"), "{text}");
    // One engine request per hybrid handshake (TLS 1.3 generates and agrees in one), none
    // of them counted as plain X25519, no errors.
    let m = server.metrics();
    assert_eq!(
        metric_sum(
            &m,
            "terminus_crypto_requests_total",
            &["op=\"x25519mlkem768\""]
        ),
        3.0,
        "{m}"
    );
    assert_eq!(
        metric_sum(&m, "terminus_crypto_requests_total", &["op=\"x25519\""]),
        4.0,
        "TLS 1.2 (two requests), the classical client's and s_client's"
    );
    assert_eq!(metric_sum(&m, "terminus_crypto_errors_total", &[]), 0.0);
}

#[test]
fn s_client_each_version_and_key_type() {
    each_version_and_key_type("scalar");
}

#[test]
fn s_client_each_version_and_key_type_multibuffer() {
    if !crate::harness::ifma() {
        return;
    }
    each_version_and_key_type("multibuffer");
}

fn each_version_and_key_type(backend: &str) {
    let server = both_certs_server(&["--crypto-backend", backend]);
    let cases = [
        (
            ["-tls1_3", "-sigalgs", "rsa_pss_rsae_sha256"],
            "TLSv1.3",
            "Signature type: RSA-PSS",
        ),
        (
            ["-tls1_3", "-sigalgs", "ecdsa_secp256r1_sha256"],
            "TLSv1.3",
            "Signature type: ECDSA",
        ),
        (
            ["-tls1_2", "-sigalgs", "RSA+SHA256"],
            "TLSv1.2",
            "Signature type: RSA",
        ),
        (
            ["-tls1_2", "-sigalgs", "ECDSA+SHA256"],
            "TLSv1.2",
            "Signature type: ECDSA",
        ),
    ];
    for (args, version, sig) in cases {
        let text = s_client(&server, &args);
        assert!(
            text.contains(&format!("Protocol version: {version}")),
            "{args:?}: {text}"
        );
        assert!(text.contains(sig), "{args:?}: {text}");
    }
    // Every signature and key exchange went through the engine.
    assert_eq!(
        server.metric("terminus_crypto_requests_total", &["op=\"rsa_sign\""]),
        2.0
    );
    assert_eq!(
        server.metric("terminus_crypto_requests_total", &["op=\"ecdsa_sign\""]),
        2.0
    );
    assert_eq!(
        server.metric("terminus_handshakes_total", &["version=\"TLSv1.2\""]),
        2.0
    );
    assert_eq!(
        server.metric("terminus_handshakes_total", &["version=\"TLSv1.3\""]),
        2.0
    );
    assert_eq!(
        server.metric("terminus_crypto_sync_fallbacks_total", &[]),
        0.0
    );
}

#[test]
fn certificate_follows_client_capabilities() {
    let server = both_certs_server(&[]);
    // Offers only ECDSA signature schemes: gets the ECDSA certificate.
    let text = s_client(
        &server,
        &["-sigalgs", "ecdsa_secp256r1_sha256:ecdsa_secp384r1_sha384"],
    );
    assert!(text.contains("Signature type: ECDSA"), "{text}");
    // Offers only RSA schemes: gets the RSA certificate.
    let text = s_client(
        &server,
        &["-sigalgs", "rsa_pss_rsae_sha256:rsa_pkcs1_sha256"],
    );
    assert!(text.contains("Signature type: RSA"), "{text}");
    // TLS 1.2 client with only ECDHE-RSA suites, though it could verify ECDSA: RSA.
    let text = s_client(
        &server,
        &["-tls1_2", "-cipher", "ECDHE-RSA-AES128-GCM-SHA256"],
    );
    assert!(
        text.contains("Ciphersuite: ECDHE-RSA-AES128-GCM-SHA256"),
        "{text}"
    );
    // Each group goes through the engine.
    for (group, op) in [("P-256", "p256"), ("P-384", "p384"), ("X25519", "x25519")] {
        let before = server.metric("terminus_crypto_requests_total", &[&format!("op=\"{op}\"")]);
        let text = s_client(&server, &["-groups", group]);
        assert!(
            text.contains("Protocol version: TLSv1.3"),
            "{group}: {text}"
        );
        let after = server.metric("terminus_crypto_requests_total", &[&format!("op=\"{op}\"")]);
        assert_eq!(after - before, 1.0, "{group}");
    }
}

#[test]
fn sni_chooses_the_virtual_server_and_its_requests_cannot_leave_it() {
    let dir = TestDir::new("sni");
    let a = make_cert(&dir.0, "a", KeyKind::EcdsaP256, &["a.test"]);
    let wild = make_cert(&dir.0, "wild", KeyKind::Rsa(2048), &["*.example.com"]);
    let fallback = make_cert(&dir.0, "fallback", KeyKind::EcdsaP256, &["fallback.test"]);
    dir.write("a/index.html", "site A\n");
    dir.write("wild/index.html", "site wildcard\n");
    dir.write("fallback/index.html", "site fallback\n");
    let conf = dir.write(
        "terminus.toml",
        format!(
            r#"
listen = ["127.0.0.1:0"]
workers = 1

[[server]]
names = ["a.test"]
root = "a"
[[server.certificate]]
cert = "{}"
key = "{}"

[[server]]
names = ["*.example.com"]
root = "wild"
[[server.certificate]]
cert = "{}"
key = "{}"

[[server]]
names = ["fallback.test"]
default = true
root = "fallback"
[[server.certificate]]
cert = "{}"
key = "{}"
"#,
            a.cert.display(),
            a.key.display(),
            wild.cert.display(),
            wild.key.display(),
            fallback.cert.display(),
            fallback.key.display()
        ),
    );
    let server = ServerBuilder::config(&conf).start();
    for (sni, cn) in [
        (Some("a.test"), "CN = a.test"),
        (Some("www.example.com"), "CN = *.example.com"),
        (Some("deep.www.example.com"), "CN = fallback.test"),
        (Some("unknown.org"), "CN = fallback.test"),
        (None, "CN = fallback.test"),
    ] {
        let text = match sni {
            Some(name) => s_client(&server, &["-servername", name]),
            None => s_client(&server, &["-noservername"]),
        };
        assert!(text.contains(cn), "{sni:?}: {text}");
    }
    for (host, body) in [
        ("a.test", "site A"),
        ("x.example.com", "site wildcard"),
        ("other.test", "site fallback"),
    ] {
        let out = curl_host(&server, host, &[], "/");
        assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), body, "{host}");
    }
    // Without SNI (curl sends none to an IP address) the handshake is the default
    // server's, and so are its requests: a Host naming another configured server is
    // misdirected (421), an unknown one is the default's.
    for (host, code, body) in [
        ("a.test", 421, ""),
        ("x.example.com:443", 421, ""),
        ("fallback.test", 200, "site fallback"),
        ("nowhere.test", 200, "site fallback"),
    ] {
        for version in ["--http1.1", "--http2"] {
            let out = run(Command::new("curl")
                .args([
                    "-sk",
                    version,
                    "-w",
                    "\n%{http_code}",
                    "-H",
                    &format!("Host: {host}"),
                ])
                .arg(format!("https://127.0.0.1:{}/", server.port())));
            let text = String::from_utf8_lossy(&out.stdout);
            let (got, status) = text.trim().rsplit_once('\n').unwrap_or(("", text.trim()));
            assert_eq!(status, code.to_string(), "Host: {host} {version}: {text}");
            if code == 200 {
                assert_eq!(got.trim(), body, "Host: {host} {version}");
            }
        }
    }
    // With SNI, a request for another configured server on the same connection (h2
    // coalescing, or a Host that disagrees) is misdirected too, either HTTP version.
    for version in ["--http1.1", "--http2"] {
        let out = curl_host(
            &server,
            "a.test",
            &[
                version,
                "-o",
                "/dev/null",
                "-w",
                "%{http_code}",
                "-H",
                "Host: x.example.com",
            ],
            "/",
        );
        assert_eq!(String::from_utf8_lossy(&out.stdout), "421", "{version}");
    }
}

#[test]
fn python_ssl_verifies_and_fetches() {
    let f = fixture();
    let server = both_certs_server(&[]);
    let script = r#"
import socket, ssl, sys
port, cafile = int(sys.argv[1]), sys.argv[2]
for version in (ssl.TLSVersion.TLSv1_2, ssl.TLSVersion.TLSv1_3):
    ctx = ssl.create_default_context(cafile=cafile)
    ctx.minimum_version = ctx.maximum_version = version
    ctx.set_alpn_protocols(["http/1.1"])
    with socket.create_connection(("127.0.0.1", port)) as raw:
        with ctx.wrap_socket(raw, server_hostname="localhost") as tls:
            tls.sendall(b"GET /index.html HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
            data = b""
            while True:
                chunk = tls.recv(65536)
                if not chunk:
                    break
                data += chunk
            print(tls.version(), data.split(b"\r\n")[0].decode(), b"hello from terminus" in data)
"#;
    let out = run(Command::new("python3").args([
        "-c",
        script,
        &server.port().to_string(),
        f.ecdsa.cert.to_str().unwrap(),
    ]));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(text.contains("TLSv1.2 HTTP/1.1 200 OK True"), "{text}");
    assert!(text.contains("TLSv1.3 HTTP/1.1 200 OK True"), "{text}");
}

#[test]
fn malformed_tls_gets_an_alert_and_others_are_served() {
    use std::io::{Read, Write};
    let server = both_certs_server(&[]);
    let mut sock = std::net::TcpStream::connect(server.addr).unwrap();
    sock.set_read_timeout(Some(std::time::Duration::from_secs(5)))
        .unwrap();
    // A complete handshake record holding a 4-byte ClientHello that cannot be decoded.
    sock.write_all(b"\x16\x03\x01\x00\x08\x01\x00\x00\x04\xff\xff\xff\xff")
        .unwrap();
    let mut reply = Vec::new();
    sock.read_to_end(&mut reply)
        .expect("the server closes the connection");
    assert!(reply.len() >= 7, "expected an alert record, got {reply:?}");
    assert_eq!(reply[0], 0x15, "record type alert");
    assert_eq!(reply[5], 2, "fatal alert");
    // Not TLS at all, nor HTTP (plain HTTP gets nginx's 400 page instead: acme.rs).
    let mut sock = std::net::TcpStream::connect(server.addr).unwrap();
    sock.set_read_timeout(Some(std::time::Duration::from_secs(5)))
        .unwrap();
    sock.write_all(b"\x05\x00\x00\x00\x00garbage\r\n\r\n")
        .unwrap();
    // A fatal alert and a close, not a 5 s read timeout: a hang would leave `reply`
    // empty and `read_to_end` failing.
    let mut reply = Vec::new();
    sock.read_to_end(&mut reply)
        .expect("the server closes the connection");
    assert_eq!(
        reply.get(..1),
        Some(&[0x15u8][..]),
        "record type alert: {reply:?}"
    );
    assert_eq!(reply.get(5), Some(&2), "fatal alert: {reply:?}");
    assert_eq!(status(&server, &[], "/index.html"), 200);
    // After its alert the server reads what the client still sends until the client
    // closes (a bounded lingering close), and counts the failure then.
    drop(sock);
    eventually(
        std::time::Duration::from_secs(5),
        "both failures counted",
        || {
            server.metric(
                "terminus_handshake_failures_total",
                &["reason=\"tls_error\""],
            ) >= 2.0
        },
    );
}

/// A TLS 1.3 ClientHello offering X25519 (its share the base point) and AES-128-GCM,
/// padded with `padding` bytes (RFC 7685), cut into records of at most 16 KiB.
fn padded_client_hello(padding: usize) -> Vec<u8> {
    fn ext(id: u16, body: &[u8]) -> Vec<u8> {
        let mut e = id.to_be_bytes().to_vec();
        e.extend((body.len() as u16).to_be_bytes());
        e.extend_from_slice(body);
        e
    }
    let mut share = vec![0, 36, 0, 0x1d, 0, 32, 9];
    share.resize(share.len() + 31, 0);
    let mut exts = [
        ext(43, &[2, 3, 4]),
        ext(10, &[0, 2, 0, 0x1d]),
        ext(13, &[0, 4, 8, 4, 4, 3]),
        ext(51, &share),
    ]
    .concat();
    // The extensions block's length is 16 bits: a longer padding spills into a second one.
    let mut left = padding;
    while left > 0 {
        let n = left.min(60_000);
        exts.extend(ext(21, &vec![0; n]));
        left -= n;
    }
    let mut body = vec![3, 3];
    body.extend([7; 32]);
    body.push(32);
    body.extend([1; 32]);
    body.extend([0, 2, 0x13, 0x01, 1, 0]);
    body.extend(((exts.len() as u32).min(0xffff) as u16).to_be_bytes());
    body.extend(exts);
    let mut hello = vec![1];
    hello.extend(&(body.len() as u32).to_be_bytes()[1..]);
    hello.extend(body);
    hello
        .chunks(16384)
        .flat_map(|chunk| {
            let mut record = vec![22, 3, 1];
            record.extend((chunk.len() as u16).to_be_bytes());
            record.extend_from_slice(chunk);
            record
        })
        .collect()
}

/// A ClientHello spread over several records is read whole (rustls takes up to 64 KiB,
/// processed a record at a time), and one over that gets decode_error and a clean close,
/// not a reset that would lose the alert (issue 16).
#[test]
fn client_hellos_over_a_record_are_read_and_oversized_ones_refused_with_an_alert() {
    use std::io::{Read, Write};
    let server = both_certs_server(&[]);
    let exchange = |padding: usize| -> Vec<u8> {
        let mut sock = std::net::TcpStream::connect(server.addr).unwrap();
        sock.set_read_timeout(Some(std::time::Duration::from_secs(5)))
            .unwrap();
        // Record by record, as a client sends a long hello: the server refuses an
        // oversized one before it is all sent, and a reset would fail these writes.
        for record in padded_client_hello(padding).chunks(16389) {
            sock.write_all(record)
                .expect("the server reads what the client sends");
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        let mut reply = vec![0; 5];
        sock.read_exact(&mut reply).expect("an answer, not a reset");
        let len = u16::from_be_bytes([reply[3], reply[4]]) as usize;
        reply.resize(5 + len, 0);
        sock.read_exact(&mut reply[5..]).unwrap();
        reply
    };
    for padding in [20_000, 45_000] {
        let reply = exchange(padding);
        assert_eq!(
            (reply[0], reply[5]),
            (22, 2),
            "{padding}: a ServerHello: {reply:?}"
        );
    }
    let reply = exchange(150_000);
    assert_eq!(reply, [21, 3, 3, 0, 2, 2, 50], "fatal decode_error");
}

#[test]
fn malformed_http_gets_400() {
    let server = both_certs_server(&[]);
    let out = run(Command::new("sh").arg("-c").arg(format!(
        "printf 'BLAH\\x01 / WHAT\\r\\n\\r\\n' | timeout 10 openssl s_client -connect {} -quiet -alpn http/1.1 2>/dev/null",
        server.addr
    )));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.starts_with("HTTP/1.1 400"), "{text}");
    assert_eq!(status(&server, &[], "/index.html"), 200);
}

#[test]
fn resumption_is_on_by_default_and_off_on_request() {
    let dir = TestDir::new("resume");
    let sess = dir.path("session.pem");
    let sess_s = sess.to_str().unwrap();
    for (flags, expect_reuse) in [(&[][..], true), (&["--no-resumption"][..], false)] {
        let server = both_certs_server(flags);
        for version in ["-tls1_2", "-tls1_3"] {
            let _ = std::fs::remove_file(&sess);
            // TLS 1.3 tickets arrive after the handshake and before the answer to a
            // request: s_client stays (-ign_eof) until the server closes after answering.
            let first = run(Command::new("sh").arg("-c").arg(format!(
                "printf 'GET /index.html HTTP/1.1\\r\\nHost: localhost\\r\\nConnection: close\\r\\n\\r\\n' | openssl s_client -connect {} {version} -ign_eof -sess_out {sess_s} 2>&1",
                server.addr
            )));
            assert!(String::from_utf8_lossy(&first.stdout).contains("HTTP/1.1 200"));
            if !expect_reuse && !sess.exists() {
                // Nothing was offered to resume (s_client saves only resumable sessions).
                continue;
            }
            let plain = run(Command::new("sh").arg("-c").arg(format!(
                "openssl s_client -connect {} {version} -sess_in {sess_s} < /dev/null 2>&1 | grep -E '^(Reused|New),'",
                server.addr
            )));
            let line = String::from_utf8_lossy(&plain.stdout);
            let expected = if expect_reuse { "Reused," } else { "New," };
            assert!(line.starts_with(expected), "{flags:?} {version}: {line:?}");
        }
    }
}

#[test]
fn tls_versions_can_be_restricted() {
    let f = fixture();
    let dir = TestDir::new("versions");
    dir.write("www/index.html", "hi\n");
    let conf = Config::new(&dir, &f.ecdsa)
        .before(
            r#"[tls]
versions = ["1.3"]
"#,
        )
        .write(&dir);
    let server = ServerBuilder::config(&conf).start();
    assert!(s_client(&server, &["-tls1_3"]).contains("Protocol version: TLSv1.3"));
    let text = s_client(&server, &["-tls1_2"]);
    assert!(
        !text.contains("Protocol version"),
        "TLS 1.2 accepted: {text}"
    );
    assert!(text.contains("alert protocol version"), "{text}");
}

#[test]
fn cipher_suites_can_be_restricted() {
    let f = fixture();
    let dir = TestDir::new("suites");
    dir.write("www/index.html", "hi\n");
    let conf = Config::new(&dir, &f.ecdsa)
        .before(
            r#"[tls]
cipher_suites = ["TLS13_AES_256_GCM_SHA384", "TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384"]
"#,
        )
        .write(&dir);
    let server = ServerBuilder::config(&conf).start();
    // (client options, suite the server must choose or None to refuse)
    let cases: [(&[&str], Option<&str>); 6] = [
        (&["-tls1_3"], Some("TLS_AES_256_GCM_SHA384")),
        (
            &["-tls1_3", "-ciphersuites", "TLS_AES_128_GCM_SHA256"],
            None,
        ),
        (
            &["-tls1_3", "-ciphersuites", "TLS_CHACHA20_POLY1305_SHA256"],
            None,
        ),
        (&["-tls1_2"], Some("ECDHE-ECDSA-AES256-GCM-SHA384")),
        (
            &["-tls1_2", "-cipher", "ECDHE-ECDSA-AES128-GCM-SHA256"],
            None,
        ),
        (
            &["-tls1_2", "-cipher", "ECDHE-ECDSA-CHACHA20-POLY1305"],
            None,
        ),
    ];
    for (args, expect) in cases {
        let text = s_client(&server, args);
        match expect {
            Some(suite) => assert!(
                text.contains(&format!("Ciphersuite: {suite}")),
                "{args:?}: {text}"
            ),
            None => {
                assert!(!text.contains("Ciphersuite:"), "{args:?} accepted: {text}");
                assert!(text.contains("alert handshake failure"), "{args:?}: {text}");
            }
        }
    }
}

/// The server's order decides by default (AES-128-GCM first), the client's where
/// `tls.prefer_server_ciphers = false`; TLS 1.3 and 1.2 alike.
#[test]
fn the_server_chooses_the_suite_unless_told_otherwise() {
    let f = fixture();
    let client_prefers_256: [(&[&str], &str, &str); 2] = [
        (
            &[
                "-tls1_3",
                "-ciphersuites",
                "TLS_AES_256_GCM_SHA384:TLS_AES_128_GCM_SHA256",
            ],
            "TLS_AES_128_GCM_SHA256",
            "TLS_AES_256_GCM_SHA384",
        ),
        (
            &[
                "-tls1_2",
                "-cipher",
                "ECDHE-ECDSA-AES256-GCM-SHA384:ECDHE-ECDSA-AES128-GCM-SHA256",
            ],
            "ECDHE-ECDSA-AES128-GCM-SHA256",
            "ECDHE-ECDSA-AES256-GCM-SHA384",
        ),
    ];
    for (setting, server_order) in [("", true), ("prefer_server_ciphers = false\n", false)] {
        let dir = TestDir::new("order");
        dir.write("www/index.html", "hi\n");
        let conf = Config::new(&dir, &f.ecdsa)
            .before(&format!("[tls]\n{setting}"))
            .write(&dir);
        let server = ServerBuilder::config(&conf).start();
        for (args, ours, theirs) in client_prefers_256 {
            let text = s_client(&server, args);
            let expect = if server_order { ours } else { theirs };
            assert!(
                text.contains(&format!("Ciphersuite: {expect}")),
                "{setting:?} {args:?}: {text}"
            );
        }
    }
}

#[test]
fn access_log_records_requests() {
    let f = fixture();
    let dir = TestDir::new("accesslog");
    let log = dir.path("access.log");
    let conf = dir.write(
        "t.toml",
        format!(
            "listen = [\"127.0.0.1:0\"]\n[log]\naccess = \"{}\"\n[[server]]\nnames = [\"localhost\"]\nroot = \"{}\"\n[[server.certificate]]\ncert = \"{}\"\nkey = \"{}\"\n",
            log.display(),
            f.root.display(),
            f.ecdsa.cert.display(),
            f.ecdsa.key.display()
        ),
    );
    let server = ServerBuilder::config(&conf).start();
    assert_eq!(status(&server, &[], "/index.html"), 200);
    assert_eq!(status(&server, &[], "/nope"), 404);
    let text = log_when(&log, |t| t.lines().count() >= 2);
    assert!(text.contains("\"GET /index.html HTTP/2.0\" 200"), "{text}");
    assert!(text.contains("\"GET /nope HTTP/2.0\" 404"), "{text}");
    assert!(text.contains("127.0.0.1:"), "{text}");
}

#[test]
fn pin_puts_worker_i_on_cpu_i() {
    let server = both_certs_server(&["--pin"]);
    let pid = server.child.id();
    // "listening" is printed once the workers are spawned; each names and pins itself
    // as it starts, so look until both have.
    let pinned = || -> Vec<(String, String)> {
        let mut found = Vec::new();
        for task in std::fs::read_dir(format!("/proc/{pid}/task")).unwrap() {
            let task = task.unwrap().path();
            let comm = std::fs::read_to_string(task.join("comm")).unwrap_or_default();
            if let Some(i) = comm.trim().strip_prefix("worker-") {
                let status = std::fs::read_to_string(task.join("status")).unwrap_or_default();
                let allowed = status
                    .lines()
                    .find_map(|l| l.strip_prefix("Cpus_allowed_list:"))
                    .unwrap_or("")
                    .trim()
                    .to_owned();
                found.push((i.to_owned(), allowed));
            }
        }
        found.sort();
        found
    };
    let expected = vec![
        ("0".to_owned(), "0".to_owned()),
        ("1".to_owned(), "1".to_owned()),
    ];
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while pinned() != expected {
        assert!(
            std::time::Instant::now() < deadline,
            "workers not pinned: {:?}",
            pinned()
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}
