//! HTTP/3 over QUIC, with a real client (aioquic): QUIC handshakes computed by the
//! crypto engine on the coroutine bridge, as TCP ones are.

mod common;

use std::process::Command;

use common::*;
use terminus_testkit::{runs_here, Need};

/// Whether aioquic is installed (`.ci/run` installs it); else the skip is shown.
fn aioquic() -> bool {
    let found = Command::new("python3")
        .args(["-c", "import aioquic.asyncio.client"])
        .status()
        .is_ok_and(|s| s.success());
    runs_here(
        Need::PythonPackages,
        found,
        "python3 -m pip install 'aioquic>=1.2,<2'",
    )
}

/// `count` QUIC handshakes in a row with ALPN h3, each then closed; prints how many
/// completed and the ALPN of the last.
const HANDSHAKES: &str = r#"
import asyncio, ssl, sys
from aioquic.asyncio.client import connect
from aioquic.quic.configuration import QuicConfiguration

async def one(port):
    config = QuicConfiguration(is_client=True, alpn_protocols=["h3"],
                               verify_mode=ssl.CERT_NONE, server_name="localhost")
    async with connect("127.0.0.1", port, configuration=config) as client:
        await client.ping()
        return client._quic.tls.alpn_negotiated

async def main(port, count):
    done, alpn = 0, None
    for _ in range(count):
        alpn = await asyncio.wait_for(one(port), 10)
        done += 1
    print(done, alpn)

asyncio.run(main(int(sys.argv[1]), int(sys.argv[2])))
"#;

/// A server with HTTP/3 on its one listener, a certificate of `key`, on `backend`.
fn h3_server(dir: &TestDir, key: KeyKind, backend: &str) -> (Server, u16) {
    let pair = make_cert(&dir.0, "k", key, &["localhost"]);
    dir.write("www/index.html", "over h3\n");
    let port = free_port();
    let conf = dir.write(
        "terminus.toml",
        format!(
            "listen = [{{ address = \"127.0.0.1:{port}\", http3 = true }}]\nworkers = 1\n[crypto]\nbackend = \"{backend}\"\n[[server]]\nnames = [\"localhost\"]\nroot = \"{}\"\n[[server.certificate]]\ncert = \"{}\"\nkey = \"{}\"\n",
            dir.path("www").display(),
            pair.cert.display(),
            pair.key.display()
        ),
    );
    let server = Server::start_with(
        &["--config", conf.to_str().unwrap(), "--admin", "127.0.0.1:0"],
        false,
    );
    (server, port)
}

/// Every QUIC handshake's signature and key exchange are computed by the engine (its
/// requests counted on the pinned backend), none by the bridge's synchronous fallback,
/// for RSA and ECDSA certificates.
#[test]
fn quic_handshakes_are_computed_by_the_engine_with_no_synchronous_fallback() {
    if !aioquic() {
        return;
    }
    let script = TestDir::new("h3-script");
    let client = script.write("handshakes.py", HANDSHAKES);
    for (key, sign) in [
        (KeyKind::Rsa(2048), "rsa_sign"),
        (KeyKind::EcdsaP256, "ecdsa_sign"),
    ] {
        let dir = TestDir::new("h3-handshakes");
        let (server, port) = h3_server(&dir, key, "scalar");
        let out = run(Command::new("python3")
            .arg(&client)
            .arg(port.to_string())
            .arg("5"));
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success() && text.trim() == "5 h3",
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
    }
}
