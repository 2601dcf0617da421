//! The two handshake stages (ClientHello, then the handshake) against a real rustls client
//! over loopback TCP: what the handshake context records, and that a failure keeps its
//! source across rustls (a failing crypto backend is not the client's TLS error).

use std::future::Future;
use std::io::{Read, Write};
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::thread;

use rustls::pki_types::ServerName;
use rustls::{ClientConfig, ClientConnection, RootCertStore, StreamOwned};
use terminus_engine::{
    scalar, Backend, BackendKind, CryptoError, CryptoOp, CryptoOutput, Engine, EngineMetrics,
    FlushPolicy, HandshakeContext, Job, KeyAlgorithm, OpKind, ScalarBackend, Tenant,
};
use terminus_tls::{
    handshake, read_client_hello, selfsigned, ErrorSource, HandshakeError, LoadedCert, SniResolver,
    TlsSettings, TrafficCounters, VirtualHostCerts,
};

/// Answers key exchanges with the scalar code and signatures as told: a backend fault
/// injected where the real backends cannot be made to fail on demand.
struct Faulty {
    sign: fn(CryptoOp) -> Result<CryptoOutput, CryptoError>,
}

impl Backend for Faulty {
    fn kind(&self) -> BackendKind {
        BackendKind::Scalar
    }
    fn max_batch(&self, _: OpKind) -> usize {
        1
    }
    fn dispatch(&self, batch: Vec<Job>) -> Pin<Box<dyn Future<Output = ()> + '_>> {
        for job in batch {
            let (op, reply) = job.into_parts();
            let answer = match op.kind() {
                OpKind::RsaSign | OpKind::EcdsaSign => (self.sign)(op),
                _ => scalar::compute(op),
            };
            reply.complete(answer);
        }
        Box::pin(std::future::ready(()))
    }
}

fn engine(backend: Box<dyn Backend>) -> Engine {
    let metrics = Arc::new(EngineMetrics::new(BackendKind::Scalar));
    Engine::new(backend, FlushPolicy::default(), metrics)
}

/// A rustls client that trusts `certs`, connects, handshakes as `localhost` (the server's
/// chain and signature verified as any client would) and reports how it ended.
fn client(addr: SocketAddr, certs: &[LoadedCert]) -> thread::JoinHandle<Result<(), String>> {
    let mut roots = RootCertStore::empty();
    for cert in certs {
        roots.add(cert.certified.cert[0].clone()).unwrap();
    }
    thread::spawn(move || {
        let config = ClientConfig::builder()
            .with_root_certificates(roots)
            .with_no_client_auth();
        let conn =
            ClientConnection::new(Arc::new(config), ServerName::try_from("localhost").unwrap())
                .unwrap();
        let tcp = std::net::TcpStream::connect(addr).unwrap();
        tcp.set_read_timeout(Some(std::time::Duration::from_secs(10)))
            .unwrap();
        let mut tls = StreamOwned::new(conn, tcp);
        tls.write_all(b"ping").map_err(|e| e.to_string())?;
        tls.flush().map_err(|e| e.to_string())?;
        let mut byte = [0u8; 1];
        tls.read_exact(&mut byte).map_err(|e| e.to_string())
    })
}

/// Runs both stages for one client connection on `engine`.
fn serve_one(
    engine: Engine,
) -> (
    Result<(), HandshakeError>,
    HandshakeContext,
    Result<(), String>,
) {
    let certs = selfsigned::generate(&["localhost".to_owned()]).unwrap();
    let mut host = VirtualHostCerts::default();
    for cert in &certs {
        host.insert(cert.clone());
    }
    let resolver = Arc::new(SniResolver::new(vec![(vec!["localhost".into()], host)], 0));
    let config = TlsSettings::default().server_config(resolver).unwrap();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let local = tokio::task::LocalSet::new();
    let (result, ctx, client) = local.block_on(&rt, async move {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let client = client(listener.local_addr().unwrap(), &certs);
        let (socket, _) = listener.accept().await.unwrap();
        let counters = TrafficCounters::default();
        let mut ctx = HandshakeContext::starting_now();
        let result = async {
            let hello = read_client_hello(&socket, &engine, &counters).await?;
            let sni = hello.client_hello().server_name().map(Arc::from);
            ctx.hello(sni, Tenant::named("t1"));
            let done = handshake(&socket, hello, config, &engine, &ctx, &counters).await?;
            // Let the client finish: read its data, answer one plaintext byte.
            let mut stream = terminus_tls::TlsStream::new(
                socket,
                done.conn,
                &done.pending,
                Arc::new(TrafficCounters::default()),
            )?;
            use tokio::io::{AsyncReadExt, AsyncWriteExt};
            let mut buf = [0u8; 4];
            stream.read_exact(&mut buf).await?;
            stream.write_all(b"!").await?;
            stream.flush().await?;
            Ok::<_, HandshakeError>(())
        }
        .await;
        (result, ctx, client)
    });
    (result, ctx, client.join().unwrap())
}

#[test]
fn the_context_records_host_tenant_and_every_crypto_request() {
    let (result, ctx, client) = serve_one(engine(Box::new(ScalarBackend)));
    result.unwrap();
    client.unwrap();
    assert_eq!(ctx.host(), Some("localhost"));
    assert_eq!(ctx.tenant().name(), Some("t1"));
    // The client offers ECDSA, so the ECDSA certificate signed.
    assert_eq!(ctx.signed_with(), Some(KeyAlgorithm::EcdsaP256));
    let t = ctx.timeline();
    let hello = t.client_hello.expect("ClientHello time");
    let finished = t.finished.expect("finished time");
    assert!(t.accepted <= hello && hello <= finished);
    let kinds: Vec<OpKind> = t.crypto.iter().map(|e| e.kind).collect();
    assert_eq!(kinds, [OpKind::X25519, OpKind::EcdsaSign], "{:?}", t.crypto);
    for e in &t.crypto {
        let (dispatched, batch) = e.dispatched.expect("dispatched");
        assert!(hello <= e.queued && e.queued <= dispatched && dispatched <= e.answered);
        assert!(e.answered <= finished);
        assert_eq!(batch, 1);
        assert!(e.ok);
    }
    assert!(!t.flights.is_empty());
    assert!(t.flights.iter().all(|f| f.bytes > 0 && f.at <= finished));
}

#[test]
fn a_failing_backend_is_the_backends_fault_not_the_clients() {
    let (result, ctx, client) = serve_one(engine(Box::new(Faulty {
        sign: |_| Err(CryptoError::SignFailed),
    })));
    let err = result.expect_err("the handshake cannot complete without a signature");
    assert!(
        matches!(err, HandshakeError::Crypto(CryptoError::SignFailed)),
        "{err:?}"
    );
    assert_eq!(err.source(), ErrorSource::CryptoBackend);
    assert!(client.is_err(), "the client saw the handshake fail");
    let t = ctx.timeline();
    assert!(t
        .crypto
        .iter()
        .any(|e| !e.ok && e.kind == OpKind::EcdsaSign));
    assert!(t.finished.is_none());
}

#[test]
fn a_wrong_answer_from_the_engine_is_an_internal_error() {
    let (result, _, client) = serve_one(engine(Box::new(Faulty {
        sign: |_| Ok(CryptoOutput::Shared(zeroize::Zeroizing::new(vec![0; 32]))),
    })));
    let err = result.expect_err("a key exchange result is no signature");
    assert!(
        matches!(
            err,
            HandshakeError::Crypto(CryptoError::WrongOutput(OpKind::EcdsaSign))
        ),
        "{err:?}"
    );
    assert_eq!(err.source(), ErrorSource::Internal);
    assert!(client.is_err());
}

#[test]
fn a_malformed_client_hello_is_the_clients_fault_and_gets_an_alert() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let local = tokio::task::LocalSet::new();
    local.block_on(&rt, async {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let client = thread::spawn(move || {
            let mut tcp = std::net::TcpStream::connect(addr).unwrap();
            // A whole handshake record holding a 4-byte ClientHello that cannot be decoded.
            tcp.write_all(&[22, 3, 1, 0, 4, 1, 0, 0, 0]).unwrap();
            let mut reply = Vec::new();
            let _ = tcp.read_to_end(&mut reply);
            reply
        });
        let (socket, _) = listener.accept().await.unwrap();
        let engine = engine(Box::new(ScalarBackend));
        let err = read_client_hello(&socket, &engine, &TrafficCounters::default())
            .await
            .err()
            .expect("a malformed ClientHello is refused");
        assert!(matches!(err, HandshakeError::Tls(_)), "{err:?}");
        assert_eq!(err.source(), ErrorSource::Client);
        drop(socket);
        let reply = client.join().unwrap();
        assert_eq!(reply.first(), Some(&21), "an alert record: {reply:?}");
        assert_eq!(reply.get(5), Some(&2), "a fatal alert: {reply:?}");
    });
}
