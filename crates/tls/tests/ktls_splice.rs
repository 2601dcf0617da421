//! The splice primitive against a TCP echo upstream, on a real kernel TLS socket: a rustls
//! client sends 100 MB through terminus's kTLS socket, `splice_bidirectional` moves it to
//! an echo server and back, and the client checks that what came back is what it sent.
//! Once more with the client's first bytes sent with its Finished, so that terminus's
//! record layer opens them before the kernel takes over and the relay must send them
//! first.
//!
//! kTLS needs a kernel with `tls`; the outer test runs the inner one inside the guest
//! kernel of `tests/ktls-guest/run` (a counted skip where none can start, a failure where the guest is required).

use std::io::{self, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use rustls::{ClientConfig, ClientConnection, RootCertStore, ServerConfig};
use sha2::{Digest, Sha256};
use terminus_engine::{
    BackendKind, Engine, EngineMetrics, FlushPolicy, HandshakeContext, ScalarBackend,
};
use terminus_tls::ktls::{offload, splice_bidirectional, Offload};
use terminus_tls::{handshake, read_client_hello, KernelSupport, SendMethod, TrafficCounters};
use tokio::io::AsyncWriteExt;

#[test]
fn splice_moves_100_mb_through_kernel_tls_in_the_guest() {
    let me = std::env::current_exe().unwrap();
    let Some(out) = terminus_testkit::in_ktls_guest(
        me,
        &["--ignored", "--exact", "--nocapture", "inside_guest_splice"],
        Path::new(env!("CARGO_MANIFEST_DIR")),
    ) else {
        return;
    };
    let stderr = String::from_utf8_lossy(&out.stderr);
    let stdout = String::from_utf8_lossy(&out.stdout);
    println!("{stdout}");
    assert!(
        out.status.success() && stdout.contains("spliced intact"),
        "{stdout}{stderr}"
    );
}

#[test]
#[ignore = "needs kernel TLS: run inside the guest by splice_moves_100_mb_through_kernel_tls_in_the_guest"]
fn inside_guest_splice() {
    for (version, size, early) in [
        (&rustls::version::TLS13, 100 << 20, false),
        (&rustls::version::TLS12, 16 << 20, false),
        (&rustls::version::TLS13, 1 << 20, true),
    ] {
        let before = tls_stat();
        let (up, down, spliced) = relay(version, size, early);
        let after = tls_stat();
        assert_eq!((up, down), (size as u64, size as u64));
        // Bytes rustls decrypted before the hand-off go to the upstream by write; the
        // echo comes back by splice all the same.
        assert_eq!(spliced, size as u64, "bytes counted as spliced");
        assert!(
            after.0 > before.0 && after.1 > before.1,
            "tls_stat {before:?} -> {after:?}"
        );
        let how = if early {
            ", the first with the client's Finished,"
        } else {
            ""
        };
        println!("{version:?}: {size} bytes each way{how} spliced intact");
    }
}

/// TlsTxSw, TlsRxSw.
fn tls_stat() -> (u64, u64) {
    let text = std::fs::read_to_string("/proc/net/tls_stat").unwrap();
    let get = |name: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(name))
            .map(|v| v.trim().parse().unwrap())
            .unwrap()
    };
    (get("TlsTxSw"), get("TlsRxSw"))
}

fn configs(
    version: &'static rustls::SupportedProtocolVersion,
) -> (Arc<ServerConfig>, Arc<ClientConfig>) {
    let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
    let cert = rcgen::CertificateParams::new(vec!["localhost".into()])
        .unwrap()
        .self_signed(&key)
        .unwrap();
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let mut server = ServerConfig::builder_with_provider(provider.clone())
        .with_protocol_versions(&[version])
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(
            vec![cert.der().clone()],
            PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der())),
        )
        .unwrap();
    server.enable_secret_extraction = true;
    let mut roots = RootCertStore::empty();
    roots
        .add(CertificateDer::from(cert.der().to_vec()))
        .unwrap();
    let client = ClientConfig::builder_with_provider(provider)
        .with_protocol_versions(&[version])
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    (Arc::new(server), Arc::new(client))
}

/// Client <-TLS-> kTLS socket <-splice-> echo upstream. Returns the bytes
/// `splice_bidirectional` moved each way and the bytes counted as spliced. `early`: the
/// client's first bytes ride with its Finished (TLS 1.3).
fn relay(
    version: &'static rustls::SupportedProtocolVersion,
    size: usize,
    early: bool,
) -> (u64, u64, u64) {
    let (server_config, client_config) = configs(version);
    let echo = TcpListener::bind("127.0.0.1:0").unwrap();
    let echo_addr = echo.local_addr().unwrap();
    std::thread::spawn(move || echo_once(echo));
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let client = std::thread::spawn(move || client(addr, client_config, size, early));

    let (sock, _) = listener.accept().unwrap();
    sock.set_nonblocking(true).unwrap();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let local = tokio::task::LocalSet::new();
    let (up, down, spliced) = local.block_on(&runtime, async move {
        let counters = Arc::new(TrafficCounters::default());
        let sock = tokio::net::TcpStream::from_std(sock).unwrap();
        // terminus's own handshake driver, so that what the client sent with its
        // Finished (`early`) is left for the hand-off as it is in the server.
        let engine = Engine::new(
            Box::new(ScalarBackend),
            FlushPolicy::default(),
            Arc::new(EngineMetrics::new(BackendKind::Scalar)),
        );
        let ctx = HandshakeContext::starting_now();
        let hello = read_client_hello(&sock, &engine, &counters).await.unwrap();
        let done = handshake(&sock, hello, server_config, &engine, &ctx, &counters)
            .await
            .unwrap();
        let support = KernelSupport::probe();
        let mut ktls = match offload(&support, sock, done, counters.clone()).await {
            Offload::Kernel(k) => k,
            Offload::Userspace { why, .. } => panic!("kernel TLS not available: {why}"),
            Offload::Failed(e) => panic!("hand-off failed: {e}"),
        };
        ktls.write_all(b"go").await.unwrap();
        let upstream = tokio::net::TcpStream::connect(echo_addr).await.unwrap();
        let (up, down, ended) =
            splice_bidirectional(&mut ktls, &upstream, Duration::from_secs(60)).await;
        ended.unwrap();
        (up, down, counters.sent_by(SendMethod::Splice))
    });
    let (sent, received) = client.join().unwrap();
    assert_eq!(sent, received, "what came back differs from what was sent");
    (up, down, spliced)
}

fn echo_once(listener: TcpListener) {
    let (mut s, _) = listener.accept().unwrap();
    let mut buf = vec![0u8; 1 << 16];
    loop {
        match s.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => s.write_all(&buf[..n]).unwrap(),
        }
    }
    let _ = s.shutdown(Shutdown::Write);
}

/// Sends `size` bytes and reads the echo at the same time (a non-blocking loop, so
/// neither direction waits on the other); ends with close_notify and waits for the
/// server's. Returns the sha256 of what was sent and of what came back.
fn client(
    addr: SocketAddr,
    config: Arc<ClientConfig>,
    size: usize,
    early: bool,
) -> (Vec<u8>, Vec<u8>) {
    let mut sock = TcpStream::connect(addr).unwrap();
    let mut conn = ClientConnection::new(config, "localhost".try_into().unwrap()).unwrap();
    let block: Vec<u8> = (0..1 << 16)
        .map(|i: u32| (i.wrapping_mul(2654435761) >> 13) as u8)
        .collect();
    let (mut sent_hash, mut received_hash) = (Sha256::new(), Sha256::new());
    let mut sent = 0usize;
    if early {
        // Written before the handshake ends: rustls sends it right after the Finished.
        let first = &block[..1000];
        sent = conn.writer().write(first).unwrap();
        assert_eq!(sent, first.len());
        sent_hash.update(first);
    }
    while conn.is_handshaking() {
        conn.complete_io(&mut sock).unwrap();
    }
    let mut go = [0u8; 2];
    let mut got = 0;
    while got < 2 {
        conn.complete_io(&mut sock).unwrap();
        match conn.reader().read(&mut go[got..]) {
            Ok(n) => got += n,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
            Err(e) => panic!("{e}"),
        }
    }
    assert_eq!(&go, b"go");
    sock.set_nonblocking(true).unwrap();
    let (mut received, mut closed, mut peer_closed) = (0usize, false, false);
    let mut buf = vec![0u8; 1 << 16];
    while !(peer_closed && closed && !conn.wants_write()) {
        let mut progress = false;
        if sent < size && !conn.wants_write() {
            let chunk = &block[sent % block.len()..];
            let chunk = &chunk[..chunk.len().min(size - sent)];
            let n = conn.writer().write(chunk).unwrap();
            sent_hash.update(&chunk[..n]);
            sent += n;
            progress |= n > 0;
        }
        if sent == size && !closed {
            conn.send_close_notify();
            closed = true;
        }
        while conn.wants_write() {
            match conn.write_tls(&mut sock) {
                Ok(_) => progress = true,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) => panic!("client write: {e}"),
            }
        }
        match conn.read_tls(&mut sock) {
            Ok(0) => peer_closed = true,
            Ok(_) => {
                conn.process_new_packets().unwrap();
                progress = true;
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
            Err(e) => panic!("client read: {e}"),
        }
        loop {
            match conn.reader().read(&mut buf) {
                Ok(0) => {
                    peer_closed = true;
                    break;
                }
                Ok(n) => {
                    received_hash.update(&buf[..n]);
                    received += n;
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) => panic!("client: {e}"),
            }
        }
        if !progress {
            std::thread::sleep(Duration::from_micros(200));
        }
    }
    assert_eq!(received, size, "bytes echoed back");
    (
        sent_hash.finalize().to_vec(),
        received_hash.finalize().to_vec(),
    )
}
