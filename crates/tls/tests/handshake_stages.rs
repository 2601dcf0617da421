//! The two handshake stages (ClientHello, then the handshake) against a real rustls client
//! over loopback TCP: what the handshake context records, and that a failure keeps its
//! source across rustls (a failing crypto backend is not the client's TLS error).

use std::io::{Read, Write};
use std::net::SocketAddr;
use std::sync::Arc;
use std::thread;

use rustls::pki_types::ServerName;
use rustls::{ClientConfig, ClientConnection, RootCertStore, StreamOwned};
use terminus_admission::tenant::{Admission, Arrival, Class, Hold, TenantAccount, Tenants};
use terminus_capacity::AcuCosts;
use terminus_engine::cost::Operation;
use terminus_engine::{
    scalar, Backend, BackendKind, CryptoError, CryptoOp, CryptoOutput, Engine, EngineMetrics,
    FlushPolicy, HandshakeContext, Job, KeyAlgorithm, OpKind, ScalarBackend,
};
use terminus_error::{Classify, Source};
use terminus_tls::{
    handshake, read_client_hello, selfsigned, HandshakeError, LoadedCert, SniResolver, TlsSettings,
    TrafficCounters, VirtualHostCerts,
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
    fn dispatch(&self, batch: Vec<Job>) {
        for job in batch {
            let (op, reply) = job.into_parts();
            let answer = match op.kind() {
                OpKind::RsaSign | OpKind::EcdsaSign => (self.sign)(op),
                _ => scalar::compute(op),
            };
            reply.complete(answer);
        }
    }
}

fn engine(backend: Box<dyn Backend>) -> Engine {
    let metrics = Arc::new(EngineMetrics::new(BackendKind::Scalar));
    Engine::new(backend, FlushPolicy::default(), metrics)
}

/// Roots that trust `certs`, as a client of the test server needs.
fn roots(certs: &[LoadedCert]) -> RootCertStore {
    let mut roots = RootCertStore::empty();
    for cert in certs {
        roots.add(cert.certified.cert[0].clone()).unwrap();
    }
    roots
}

/// A rustls client that trusts `certs`, connects, handshakes as `localhost` (the server's
/// chain and signature verified as any client would) and reports how it ended.
fn client(addr: SocketAddr, certs: &[LoadedCert]) -> Result<(), String> {
    let config = ClientConfig::builder()
        .with_root_certificates(roots(certs))
        .with_no_client_auth();
    let conn = ClientConnection::new(Arc::new(config), ServerName::try_from("localhost").unwrap())
        .unwrap();
    let tcp = std::net::TcpStream::connect(addr).unwrap();
    tcp.set_read_timeout(Some(std::time::Duration::from_secs(10)))
        .unwrap();
    let mut tls = StreamOwned::new(conn, tcp);
    tls.write_all(b"ping").map_err(|e| e.to_string())?;
    tls.flush().map_err(|e| e.to_string())?;
    let mut byte = [0u8; 1];
    tls.read_exact(&mut byte).map_err(|e| e.to_string())
}

/// [`client`], its request written before the handshake ends: rustls sends it right
/// after its Finished, in the same write, so it reaches the server with the Finished.
/// Returns the byte the server answered.
fn client_sending_with_its_finished(addr: SocketAddr, certs: &[LoadedCert]) -> Result<u8, String> {
    let config = ClientConfig::builder()
        .with_root_certificates(roots(certs))
        .with_no_client_auth();
    let mut conn =
        ClientConnection::new(Arc::new(config), ServerName::try_from("localhost").unwrap())
            .unwrap();
    conn.writer()
        .write_all(b"ping")
        .map_err(|e| e.to_string())?;
    let tcp = std::net::TcpStream::connect(addr).unwrap();
    tcp.set_read_timeout(Some(std::time::Duration::from_secs(10)))
        .unwrap();
    let mut tls = StreamOwned::new(conn, tcp);
    tls.flush().map_err(|e| e.to_string())?;
    let mut byte = [0u8; 1];
    tls.read_exact(&mut byte).map_err(|e| e.to_string())?;
    Ok(byte[0])
}

/// What the server side of [`serve_one`] saw once the handshake was done.
#[derive(Debug)]
struct Served {
    /// Bytes read with the record that completed the handshake, which rustls did not
    /// see and the record layer was given.
    pending: usize,
    /// The first plaintext the record layer gave: the clients' 4-byte request.
    request: [u8; 4],
}

/// Runs both stages for one connection of `client` (on its own thread) on `engine`;
/// the handshake is charged to a tenant of its own, returned last.
fn serve_one<T: Send + 'static>(
    engine: Engine,
    client: fn(SocketAddr, &[LoadedCert]) -> T,
) -> (
    Result<Served, HandshakeError>,
    HandshakeContext,
    T,
    Arc<TenantAccount>,
) {
    let certs = selfsigned::generate(&["localhost".to_owned()]).unwrap();
    let mut host = VirtualHostCerts::default();
    for cert in &certs {
        host.insert(cert.clone());
    }
    let resolver = Arc::new(SniResolver::new(vec![(vec!["localhost".into()], host)], 0));
    let tickets = Arc::new(terminus_fleet::tickets::Ticketer::local(Default::default()));
    let config = TlsSettings::default()
        .server_config(resolver, tickets)
        .unwrap();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let local = tokio::task::LocalSet::new();
    // A tenant of its own: the tests run at once and share TENANTS.
    let n = NEXT_TENANT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let tenant = TENANTS.account(&format!("t{n}"), None);
    let charged = tenant.clone();
    let (result, ctx, client) = local.block_on(&rt, async move {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let client = thread::spawn(move || client(addr, &certs));
        let (socket, _) = listener.accept().await.unwrap();
        let counters = TrafficCounters::default();
        let mut ctx = HandshakeContext::starting_now();
        let result = async {
            let hello = read_client_hello(&socket, &engine, &counters).await?;
            let sni = hello.client_hello().server_name().map(Arc::from);
            ctx.hello(sni, hello.first_byte());
            ctx.charge_to(admitted(&charged));
            let done = handshake(&socket, hello, config, &engine, &ctx, &counters).await?;
            let pending = done.pending.len();
            // Let the client finish: read its request, answer one plaintext byte. A
            // request the record layer never opens would leave both sides waiting until
            // the client's read timeout: fail sooner, saying so.
            let mut stream = terminus_tls::SecureStream::after(
                socket,
                done,
                Arc::new(TrafficCounters::default()),
            )?;
            use tokio::io::{AsyncReadExt, AsyncWriteExt};
            let mut request = [0u8; 4];
            tokio::time::timeout(
                std::time::Duration::from_secs(5),
                stream.read_exact(&mut request),
            )
            .await
            .map_err(|_| {
                std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    "no request came out of the record layer within 5 s",
                )
            })??;
            stream.write_all(b"!").await?;
            stream.flush().await?;
            Ok::<_, HandshakeError>(Served { pending, request })
        }
        .await;
        (result, ctx, client)
    });
    (result, ctx, client.join().unwrap(), tenant)
}

/// rustls is not offered the records after the one that completes the handshake: the
/// request that came with the Finished is the record layer's to open (rustls given it
/// would decrypt it itself, and the handshake would end in a state the driver refuses).
/// The request's record was read with the Finished and handed over (`pending`), it comes
/// out of the record layer as the plaintext the client wrote, and the answer reaches the
/// client.
#[test]
fn a_request_sent_with_the_finished_is_read_by_the_record_layer() {
    let (result, ctx, client, _) = serve_one(
        engine(Box::new(ScalarBackend)),
        client_sending_with_its_finished,
    );
    let served = result.unwrap();
    assert!(ctx.timeline().finished.is_some());
    // At least the request's record: 4 bytes, the content type, a 16-byte tag, a header.
    assert!(
        served.pending >= 5 + 4 + 1 + 16,
        "the request did not come with the Finished: {served:?}"
    );
    assert_eq!(&served.request, b"ping", "the record layer's plaintext");
    assert_eq!(client, Ok(b'!'), "the answer, as the client read it");
}

#[test]
fn the_context_records_host_tenant_and_every_crypto_request() {
    let (result, ctx, client, tenant) = serve_one(engine(Box::new(ScalarBackend)), client);
    result.unwrap();
    client.unwrap();
    assert_eq!(ctx.host(), Some("localhost"));
    assert!(ctx.payer().is_some(), "admitted");
    assert!(tenant.name().starts_with('t'), "{}", tenant.name());
    // The client offers ECDSA, so the ECDSA certificate signed.
    assert_eq!(ctx.signed_with(), Some(KeyAlgorithm::EcdsaP256));
    let t = ctx.timeline();
    let hello = t.client_hello.expect("ClientHello time");
    let finished = t.finished.expect("finished time");
    let first_byte = t.first_byte.expect("first byte time");
    let admitted = t.admitted.expect("admission time");
    assert!(t.accepted <= first_byte && first_byte <= hello);
    assert!(hello <= admitted && admitted <= finished);
    // TLS 1.3: one wait, for the client's Finished, after the server's flight.
    assert_eq!(t.client_waits.len(), 1, "{:?}", t.client_waits);
    let (waited, replied) = t.client_waits[0];
    assert!(t.flights[0].at <= waited && waited <= replied && replied <= finished);
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
    // Charged to the tenant at the cost table's figures, exactly.
    let usage = tenant.usage();
    let costs = TENANTS.costs();
    let expected = costs.of(Operation::X25519).0 + costs.of(Operation::EcdsaP256).0;
    assert!(
        (usage.acu[Class::Unmetered as usize] - expected).abs() < 1e-6,
        "{:?} charged, {expected} expected",
        usage.acu
    );
    let ops: Vec<(Operation, u64)> = Operation::ALL
        .into_iter()
        .zip(usage.ops)
        .filter(|(_, n)| *n > 0)
        .collect();
    assert_eq!(ops, [(Operation::EcdsaP256, 1), (Operation::X25519, 1)]);
}

static NEXT_TENANT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// The tests' tenants, charged by a scalar core's costs.
static TENANTS: std::sync::LazyLock<Tenants> =
    std::sync::LazyLock::new(|| Tenants::new(AcuCosts::unmeasured(1)));

/// Admits one handshake to `tenant` (which has no quota: at once).
fn admitted(tenant: &Arc<TenantAccount>) -> Hold {
    let arrival = Arrival {
        estimate: 1.0,
        cheap: false,
        idle: true,
    };
    match tenant.admit(std::time::Instant::now(), arrival) {
        Admission::Now(hold) => hold,
        _ => panic!("a tenant without a quota admits at once"),
    }
}

#[test]
fn a_failing_backend_is_the_backends_fault_not_the_clients() {
    let (result, ctx, client, _) = serve_one(
        engine(Box::new(Faulty {
            sign: |_| Err(CryptoError::SignFailed),
        })),
        client,
    );
    let err = result.expect_err("the handshake cannot complete without a signature");
    assert!(
        matches!(err, HandshakeError::Crypto(CryptoError::SignFailed)),
        "{err:?}"
    );
    assert_eq!(Classify::source(&err), Source::CryptoBackend);
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
    let (result, _, client, _) = serve_one(
        engine(Box::new(Faulty {
            sign: |_| Ok(CryptoOutput::Shared(zeroize::Zeroizing::new(vec![0; 32]))),
        })),
        client,
    );
    let err = result.expect_err("a key exchange result is no signature");
    assert!(
        matches!(
            err,
            HandshakeError::Crypto(CryptoError::WrongOutput(OpKind::EcdsaSign))
        ),
        "{err:?}"
    );
    assert_eq!(Classify::source(&err), Source::Internal);
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
        assert_eq!(Classify::source(&err), Source::Client);
        drop(socket);
        let reply = client.join().unwrap();
        assert_eq!(reply.first(), Some(&21), "an alert record: {reply:?}");
        assert_eq!(reply.get(5), Some(&2), "a fatal alert: {reply:?}");
    });
}

/// Clients driven record by record (issue 16). Records rustls 0.23 refuses without
/// queueing an alert still get one, never a bare close: each such client handshakes up to
/// the point where it would answer the server's flight and sends the offending records
/// instead. And a KeyUpdate asking for the server's, sent in the middle of a request, is
/// answered before the request is complete.
mod hand_driven_clients {
    use super::*;
    use aws_lc_rs::{aead, hkdf};
    use std::sync::Mutex;

    fn record(typ: u8, payload: &[u8]) -> Vec<u8> {
        let len = (payload.len() as u16).to_be_bytes();
        [&[typ, 3, 3, len[0], len[1]][..], payload].concat()
    }

    /// A client of `version` only, trusting `certs`, for `localhost`.
    fn client_of(
        version: &'static rustls::SupportedProtocolVersion,
        certs: &[LoadedCert],
    ) -> ClientConnection {
        let config = ClientConfig::builder_with_protocol_versions(&[version])
            .with_root_certificates(roots(certs))
            .with_no_client_auth();
        ClientConnection::new(Arc::new(config), ServerName::try_from("localhost").unwrap()).unwrap()
    }

    /// Sends the ClientHello and reads the server's flight until `answering` says the
    /// client has all of it; what the client would answer is not sent.
    fn until_answering(
        conn: &mut ClientConnection,
        tcp: &mut std::net::TcpStream,
        answering: fn(&ClientConnection) -> bool,
    ) {
        while conn.wants_write() {
            conn.write_tls(tcp).unwrap();
        }
        while !answering(conn) {
            assert!(conn.read_tls(tcp).unwrap() > 0, "the server's flight");
            conn.process_new_packets().unwrap();
        }
    }

    /// Everything the server sends until it closes.
    fn reply(tcp: &mut std::net::TcpStream) -> Vec<u8> {
        let mut reply = Vec::new();
        let _ = tcp.read_to_end(&mut reply);
        reply
    }

    fn connect(addr: SocketAddr) -> std::net::TcpStream {
        let tcp = std::net::TcpStream::connect(addr).unwrap();
        tcp.set_read_timeout(Some(std::time::Duration::from_secs(10)))
            .unwrap();
        tcp
    }

    /// The TLS 1.2 ClientKeyExchange (in the clear) split across two records with an
    /// application data record between: RFC 8446 section 5.1 (and 5246 6.2.1) owes a
    /// fatal unexpected_message, which terminus sends in the clear.
    fn interleaved_tls12(addr: SocketAddr, certs: &[LoadedCert]) -> String {
        let mut conn = client_of(&rustls::version::TLS12, certs);
        let mut tcp = connect(addr);
        until_answering(&mut conn, &mut tcp, |c| c.wants_write());
        let mut answer = Vec::new();
        conn.write_tls(&mut answer).unwrap();
        assert_eq!(answer[0], 22, "the ClientKeyExchange record comes first");
        let len = u16::from_be_bytes([answer[3], answer[4]]) as usize;
        let (head, tail) = answer[5..5 + len].split_at(len / 2);
        let sent = [record(22, head), record(23, b"data"), record(22, tail)].concat();
        tcp.write_all(&sent).unwrap();
        match reply(&mut tcp)[..] {
            [21, 3, 3, 0, 2, level, description] => format!(
                "alert {level} {:?}",
                rustls::AlertDescription::from(description)
            ),
            ref other => format!("not one plaintext alert: {other:?}"),
        }
    }

    #[derive(Debug, Default)]
    struct Secrets(Mutex<Vec<(String, Vec<u8>)>>);

    impl rustls::KeyLog for Secrets {
        fn log(&self, label: &str, _client_random: &[u8], secret: &[u8]) {
            let mut secrets = self.0.lock().unwrap();
            secrets.push((label.to_owned(), secret.to_vec()));
        }
    }

    /// HKDF-Expand-Label (RFC 8446 section 7.1) with an empty context.
    fn expand_label(secret: &hkdf::Prk, label: &str, len: usize) -> Vec<u8> {
        struct Len(usize);
        impl hkdf::KeyType for Len {
            fn len(&self) -> usize {
                self.0
            }
        }
        let label = format!("tls13 {label}");
        let info = [
            &(len as u16).to_be_bytes()[..],
            &[label.len() as u8],
            label.as_bytes(),
            &[0],
        ];
        let mut out = vec![0; len];
        secret
            .expand(&info, Len(len))
            .unwrap()
            .fill(&mut out)
            .unwrap();
        out
    }

    /// `inner` sealed as the client's first record under its handshake traffic secret
    /// with TLS_AES_128_GCM_SHA256 (RFC 8446 sections 5.2 and 7.3: sequence number 0).
    fn sealed_first_record(secret: &[u8], inner: &[u8]) -> Vec<u8> {
        let prk = hkdf::Prk::new_less_safe(hkdf::HKDF_SHA256, secret);
        let key = aead::UnboundKey::new(&aead::AES_128_GCM, &expand_label(&prk, "key", 16));
        let nonce = aead::Nonce::try_assume_unique_for_key(&expand_label(&prk, "iv", 12));
        let len = ((inner.len() + 16) as u16).to_be_bytes();
        let header = [23, 3, 3, len[0], len[1]];
        let mut body = inner.to_vec();
        aead::LessSafeKey::new(key.unwrap())
            .seal_in_place_append_tag(nonce.unwrap(), aead::Aad::from(header), &mut body)
            .unwrap();
        [&header[..], &body].concat()
    }

    /// In place of the client's Finished, a TLS 1.3 record whose inner plaintext is all
    /// padding (content type 0): RFC 8446 section 5.4 owes unexpected_message, sealed
    /// with the server's keys, which rustls keeps to itself when it fails; the client
    /// gets it in the clear.
    fn all_padding_tls13(addr: SocketAddr, certs: &[LoadedCert]) -> String {
        let provider = rustls::crypto::CryptoProvider {
            cipher_suites: vec![rustls::crypto::aws_lc_rs::cipher_suite::TLS13_AES_128_GCM_SHA256],
            ..rustls::crypto::aws_lc_rs::default_provider()
        };
        let secrets = Arc::new(Secrets::default());
        let mut config = ClientConfig::builder_with_provider(Arc::new(provider))
            .with_protocol_versions(&[&rustls::version::TLS13])
            .unwrap()
            .with_root_certificates(roots(certs))
            .with_no_client_auth();
        config.key_log = secrets.clone();
        let mut conn =
            ClientConnection::new(Arc::new(config), ServerName::try_from("localhost").unwrap())
                .unwrap();
        let mut tcp = connect(addr);
        until_answering(&mut conn, &mut tcp, |c| !c.is_handshaking());
        let secret = secrets
            .0
            .lock()
            .unwrap()
            .iter()
            .find(|(label, _)| label == "CLIENT_HANDSHAKE_TRAFFIC_SECRET")
            .map(|(_, secret)| secret.clone())
            .expect("the client's handshake secret");
        tcp.write_all(&sealed_first_record(&secret, &[0; 8]))
            .unwrap();
        match reply(&mut tcp)[..] {
            [21, 3, 3, 0, 2, level, description] => format!(
                "alert {level} {:?}",
                rustls::AlertDescription::from(description)
            ),
            ref other => format!("not one plaintext alert: {other:?}"),
        }
    }

    /// A record of two change_cipher_spec bytes in the ClientHello's segment: RFC 8446
    /// section 5 owes unexpected_message, which rustls sends sealed after the server's
    /// flight, as long as something processes the record without waiting for more.
    fn ccs_record_with_the_client_hello(addr: SocketAddr, certs: &[LoadedCert]) -> String {
        let mut conn = client_of(&rustls::version::TLS13, certs);
        let mut tcp = connect(addr);
        let mut hello = Vec::new();
        while conn.wants_write() {
            conn.write_tls(&mut hello).unwrap();
        }
        tcp.write_all(&[hello, record(20, &[1, 1])].concat())
            .unwrap();
        let reply = reply(&mut tcp);
        let mut rest = &reply[..];
        while !rest.is_empty() {
            conn.read_tls(&mut rest).unwrap();
        }
        match conn.process_new_packets() {
            Ok(_) => format!("no alert in {} bytes", reply.len()),
            Err(e) => e.to_string(),
        }
    }

    /// Runs `client` against the handshake stages and checks the server refused it as
    /// `why`, its fault; returns what the client saw.
    fn refused(
        client: fn(SocketAddr, &[LoadedCert]) -> String,
        why: rustls::PeerMisbehaved,
    ) -> String {
        let (result, ctx, seen, _) = serve_one(engine(Box::new(ScalarBackend)), client);
        let err = result.expect_err("the server refuses the record");
        assert_eq!(Classify::source(&err), Source::Client, "{err:?}");
        match err {
            HandshakeError::Tls(rustls::Error::PeerMisbehaved(got)) => assert_eq!(got, why),
            other => panic!("{other:?}"),
        }
        assert!(ctx.timeline().finished.is_none());
        seen
    }

    #[test]
    fn application_data_inside_a_handshake_message_gets_unexpected_message() {
        let why = rustls::PeerMisbehaved::MessageInterleavedWithHandshakeMessage;
        assert_eq!(refused(interleaved_tls12, why), "alert 2 UnexpectedMessage");
    }

    #[test]
    fn an_all_padding_record_in_the_handshake_gets_unexpected_message_in_the_clear() {
        let why = rustls::PeerMisbehaved::IllegalTlsInnerPlaintext;
        assert_eq!(refused(all_padding_tls13, why), "alert 2 UnexpectedMessage");
    }

    #[test]
    fn records_that_came_with_the_client_hello_are_processed_at_once() {
        let why = rustls::PeerMisbehaved::IllegalMiddleboxChangeCipherSpec;
        assert_eq!(
            refused(ccs_record_with_the_client_hello, why),
            "received fatal alert: UnexpectedMessage"
        );
    }

    /// A TLS 1.3 client that sends half its data, then a KeyUpdate asking for the
    /// server's, and waits for that before sending the rest (as tlsfuzzer's "app data
    /// split, conversation with KeyUpdate msg" does).
    fn key_update_mid_request(addr: SocketAddr, certs: &[LoadedCert]) -> String {
        let mut conn = client_of(&rustls::version::TLS13, certs);
        let mut tcp = connect(addr);
        while conn.is_handshaking() {
            conn.complete_io(&mut tcp).unwrap();
        }
        conn.writer().write_all(b"pi").unwrap();
        conn.complete_io(&mut tcp).unwrap();
        // Whatever the server sends after its handshake (tickets) is taken first, so
        // that the next bytes can only be the KeyUpdate's answer.
        tcp.set_read_timeout(Some(std::time::Duration::from_millis(300)))
            .unwrap();
        while let Ok(n) = conn.read_tls(&mut tcp) {
            if n == 0 {
                return "closed after the handshake".into();
            }
            conn.process_new_packets().unwrap();
        }
        conn.refresh_traffic_keys().unwrap();
        while conn.wants_write() {
            conn.write_tls(&mut tcp).unwrap();
        }
        tcp.set_read_timeout(Some(std::time::Duration::from_secs(3)))
            .unwrap();
        match conn.read_tls(&mut tcp) {
            Ok(0) => return "closed instead of answering the KeyUpdate".into(),
            Ok(_) => conn.process_new_packets().unwrap(),
            Err(e) => return format!("no answer to the KeyUpdate: {e}"),
        };
        conn.writer().write_all(b"ng").unwrap();
        tcp.set_read_timeout(Some(std::time::Duration::from_secs(10)))
            .unwrap();
        let mut tls = rustls::Stream::new(&mut conn, &mut tcp);
        let mut byte = [0u8; 1];
        match tls.read_exact(&mut byte) {
            Ok(()) => "answered".into(),
            Err(e) => format!("no reply after the KeyUpdate: {e}"),
        }
    }

    #[test]
    fn a_key_update_request_is_answered_before_the_request_is_complete() {
        let (result, _, seen, _) =
            serve_one(engine(Box::new(ScalarBackend)), key_update_mid_request);
        result.unwrap();
        assert_eq!(seen, "answered");
    }
}
