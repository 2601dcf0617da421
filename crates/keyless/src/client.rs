//! The terminator's side: a certificate whose key stays on keyless signers.
//!
//! [`RemoteSigningKey`] is the engine's [`RemoteKey`] for such a certificate. A
//! handshake's signature becomes a request on this worker's connection to one of the
//! key's signers ([`SignerSet`]): one multiplexed connection per signer per worker,
//! made when first needed, requests pipelined on it and answered by ID. Requests made
//! in the same turn of the worker's event loop leave in one write.
//!
//! Failures, as an upstream's:
//! - a signer that cannot be reached, or whose connection closes with requests on it,
//!   is marked down and the request goes to the next signer at once, within the same
//!   deadline;
//! - a signer that does not answer within the deadline fails the handshake (an alert,
//!   never a hang) and is marked down, so that the next requests go elsewhere;
//! - a signer marked down is tried again after [`SignerSet::DOWN_FOR`], or before
//!   that when every signer is down.

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::fmt;
use std::io;
use std::rc::Rc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rustls::pki_types::ServerName;
use rustls::SignatureScheme;
use terminus_engine::{CryptoError, CryptoOutput, KeyAlgorithm, RemoteHandshake, RemoteKey, Reply};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::{oneshot, Notify};
use tokio_rustls::TlsConnector;
use x509_parser::prelude::FromDer;
use x509_parser::public_key::PublicKey;
use x509_parser::x509::SubjectPublicKeyInfo;

use crate::keys::{key_ids, sign_of};
use crate::metrics::ClientMetrics;
use crate::protocol::{ErrorCode, Header, KeyId, Message, Op, HEADER_LEN};

/// The signers that hold a key, and how they are reached.
pub struct SignerSet {
    /// Distinguishes this set's connections in a worker's pool.
    id: u64,
    /// Dropped with the set: the workers' pools then close its connections.
    alive: Arc<()>,
    signers: Vec<Signer>,
    connector: TlsConnector,
    timeout: Duration,
    epoch: Instant,
    metrics: Arc<ClientMetrics>,
}

struct Signer {
    address: String,
    name: ServerName<'static>,
    /// Nanoseconds after the set's epoch until which the signer is down.
    down_until: AtomicU64,
}

impl fmt::Debug for SignerSet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let addresses: Vec<&str> = self.signers.iter().map(|s| s.address.as_str()).collect();
        f.debug_struct("SignerSet")
            .field("signers", &addresses)
            .field("timeout", &self.timeout)
            .finish_non_exhaustive()
    }
}

impl SignerSet {
    /// How long a signer that failed is passed over.
    pub const DOWN_FOR: Duration = Duration::from_secs(10);

    /// The signers at `addresses` (`host:port`, tried in turn), reached over TLS with
    /// `config` (which shows the terminator's certificate and trusts the signers' CA),
    /// each request answered within `timeout`. Counts into `metrics`, whose signers are
    /// these addresses in this order.
    pub fn new(
        addresses: Vec<String>,
        config: Arc<rustls::ClientConfig>,
        timeout: Duration,
        metrics: Arc<ClientMetrics>,
    ) -> Result<Self, String> {
        static IDS: AtomicU64 = AtomicU64::new(1);
        let signers = addresses
            .into_iter()
            .map(|address| {
                let host = address
                    .rsplit_once(':')
                    .map(|(h, _)| h.trim_start_matches('[').trim_end_matches(']'))
                    .ok_or_else(|| format!("signer {address:?} is not host:port"))?;
                let name = ServerName::try_from(host.to_owned())
                    .map_err(|_| format!("signer {address:?}: {host:?} is not a host name"))?;
                Ok(Signer {
                    address,
                    name,
                    down_until: AtomicU64::new(0),
                })
            })
            .collect::<Result<Vec<_>, String>>()?;
        if signers.is_empty() {
            return Err("no signer".into());
        }
        Ok(Self {
            id: IDS.fetch_add(1, Ordering::Relaxed),
            alive: Arc::new(()),
            signers,
            connector: TlsConnector::from(config),
            timeout,
            epoch: Instant::now(),
            metrics,
        })
    }

    fn now(&self) -> u64 {
        self.epoch.elapsed().as_nanos() as u64
    }

    fn is_down(&self, i: usize) -> bool {
        self.signers[i].down_until.load(Ordering::Relaxed) > self.now()
    }

    fn mark_down(&self, i: usize, why: &str) {
        let until = self.now() + Self::DOWN_FOR.as_nanos() as u64;
        let before = self.signers[i].down_until.swap(until, Ordering::Relaxed);
        if before <= self.now() {
            tracing::warn!(
                "keyless signer {} marked down for {:?}: {why}",
                self.signers[i].address,
                Self::DOWN_FOR
            );
        }
        // Its connection on this worker is of no more use: requests still waiting on it
        // fail over now rather than at their deadline.
        let slot = POOL.with(|p| p.borrow_mut().remove(&(self.id, i)));
        if let Some((_, slot)) = slot {
            close_slot(&slot);
        }
    }

    /// The signers in the order this request tries them: the healthy ones from a
    /// rotating start (so that the load spreads), then the ones marked down.
    fn order(&self) -> Vec<usize> {
        thread_local!(static NEXT: Cell<usize> = const { Cell::new(0) });
        let n = self.signers.len();
        let start = NEXT.with(|c| {
            let v = c.get();
            c.set(v.wrapping_add(1));
            v
        });
        let (mut up, down): (Vec<usize>, Vec<usize>) = (0..n)
            .map(|k| (start + k) % n)
            .partition(|&i| !self.is_down(i));
        up.extend(down);
        up
    }

    /// Signs `digest` with the key `key` names, by `scheme`'s operation, for the
    /// handshake `about`, within the set's timeout.
    async fn sign(
        &self,
        key: KeyId,
        scheme: SignatureScheme,
        digest: Vec<u8>,
        about: &RemoteHandshake,
    ) -> Result<Vec<u8>, CryptoError> {
        let sign = sign_of(scheme).ok_or(CryptoError::SchemeMismatch(scheme))?;
        let deadline = tokio::time::Instant::now() + self.timeout;
        let mut last = String::from("no signer");
        for i in self.order() {
            // Too little time left to blame a signer for not answering in it.
            if deadline.saturating_duration_since(tokio::time::Instant::now()) < self.timeout / 10 {
                break;
            }
            let started = Instant::now();
            let mut request = Message::sign(0, sign, key, digest.clone());
            request.server_name = about.server_name.as_deref().map(str::to_owned);
            request.client_ip = about.client;
            let address = &self.signers[i].address;
            match tokio::time::timeout_at(deadline, self.ask(i, request)).await {
                Ok(Ok(answer)) if answer.op == Some(Op::Response) => {
                    self.metrics.answered(i, started.elapsed());
                    return Ok(answer.payload);
                }
                Ok(Ok(answer)) => {
                    let code = ErrorCode::from_code(answer.payload.first().copied().unwrap_or(0));
                    self.metrics.failed(i, "refused");
                    last = format!("signer {address} refused: {code}");
                    // Another signer may hold the key (a rolling deployment) or be less
                    // busy; a refusal of the request itself would be the same anywhere.
                    if !matches!(
                        code,
                        ErrorCode::KeyNotFound | ErrorCode::Expired | ErrorCode::Internal
                    ) {
                        break;
                    }
                }
                Ok(Err(e)) => {
                    // Unreachable, or gone with the request: the next signer, at once.
                    self.metrics.failed(i, "connection");
                    self.mark_down(i, &e.to_string());
                    last = format!("signer {address}: {e}");
                }
                Err(_) => {
                    self.metrics.failed(i, "timeout");
                    self.mark_down(i, "no answer within the deadline");
                    return Err(CryptoError::Remote(format!(
                        "signer {address} did not answer within {:?}",
                        self.timeout
                    )));
                }
            }
        }
        Err(CryptoError::Remote(last))
    }

    /// Sends `request` to signer `i` on this worker's connection to it, and waits for
    /// its answer. Dropped (its deadline passed), it takes its ID off the connection.
    async fn ask(&self, i: usize, mut request: Message) -> io::Result<Message> {
        let conn = self.connection(i).await?;
        let (id, answer) = conn.register();
        let _pending = Pending { conn: &conn, id };
        request.id = id;
        let bytes = request
            .encode(true)
            .ok_or_else(|| io::Error::other("request too long to encode"))?;
        conn.send(&bytes);
        answer.await.map_err(|_| {
            io::Error::new(
                io::ErrorKind::ConnectionReset,
                "the connection closed before the answer",
            )
        })
    }

    /// This worker's connection to signer `i`, made now if it has none. Making it (or
    /// waiting for another request making it) may take a third of the timeout: a signer
    /// that does not accept in that leaves time to ask another.
    async fn connection(&self, i: usize) -> io::Result<Rc<Conn>> {
        let budget = self.timeout / 3;
        let slot = POOL.with(|p| {
            p.borrow_mut()
                .entry((self.id, i))
                .or_insert_with(|| (Arc::downgrade(&self.alive), Rc::default()))
                .1
                .clone()
        });
        let connecting = async {
            let mut conn = slot.lock().await;
            if let Some(c) = conn.as_ref().filter(|c| !c.closed.get()) {
                return Ok(c.clone());
            }
            let signer = &self.signers[i];
            let tcp = TcpStream::connect(signer.address.as_str()).await?;
            tcp.set_nodelay(true)?;
            let tls = self.connector.connect(signer.name.clone(), tcp).await?;
            self.metrics.connected(i);
            let c = Conn::start(tls);
            *conn = Some(c.clone());
            Ok(c)
        };
        tokio::time::timeout(budget, connecting)
            .await
            .unwrap_or_else(|_| {
                Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!("no connection within {budget:?}"),
                ))
            })
    }
}

/// Takes a request's ID off its connection when the request ends, answered or not.
struct Pending<'a> {
    conn: &'a Conn,
    id: u32,
}

impl Drop for Pending<'_> {
    fn drop(&mut self) {
        self.conn.pending.borrow_mut().remove(&self.id);
    }
}

/// A worker's connection to one signer: made by the first request that needs it, the
/// others waiting for it.
type Slot = Rc<tokio::sync::Mutex<Option<Rc<Conn>>>>;

/// A worker's slots by (signer set, signer), each with its set's liveness.
type Pool = HashMap<(u64, usize), (std::sync::Weak<()>, Slot)>;

thread_local! {
    /// This worker's connections, by signer set and signer, each with its set's life.
    static POOL: RefCell<Pool> = RefCell::default();
}

/// Closes the connection in `slot`, if it has one and no request is making it now.
fn close_slot(slot: &Slot) {
    if let Some(conn) = slot.try_lock().ok().and_then(|c| c.clone()) {
        conn.close();
    }
}

/// Closes this worker's connections of signer sets no site uses any more (a reload
/// changed them): call it every few seconds on every worker.
pub fn sweep() {
    POOL.with(|p| {
        p.borrow_mut().retain(|_, (alive, slot)| {
            let keep = alive.strong_count() > 0;
            if !keep {
                close_slot(slot);
            }
            keep
        })
    });
}

/// The TLS client configuration a terminator reaches its signers with: their
/// certificates checked against `ca`, and this terminator's `cert` and `key` shown to
/// them. The error names the file and what is wrong with it.
pub fn client_config(
    ca: &std::path::Path,
    cert: &std::path::Path,
    key: &std::path::Path,
) -> Result<Arc<rustls::ClientConfig>, String> {
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let verifier = terminus_tls::client::Trust::CaFile(ca.to_owned())
        .verifier(&provider)
        .map_err(|e| e.to_string())?;
    let (chain, key) = terminus_tls::client::load_identity(cert, key).map_err(|e| e.to_string())?;
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13])
        .map_err(|e| e.to_string())?
        .dangerous()
        .with_custom_certificate_verifier(verifier)
        .with_client_auth_cert(chain, key)
        .map_err(|e| format!("{}: {e}", cert.display()))?;
    Ok(Arc::new(config))
}

/// One multiplexed connection to a signer. Its reading and writing tasks end when it is
/// closed or dropped (the last request and the pool let go of it), and the socket with
/// them: a connection a mark-down or a reload left behind does not linger.
struct Conn {
    pending: RefCell<HashMap<u32, oneshot::Sender<Message>>>,
    out: Rc<RefCell<Vec<u8>>>,
    wake: Rc<Notify>,
    next_id: Cell<u32>,
    closed: Cell<bool>,
    tasks: RefCell<Vec<tokio::task::AbortHandle>>,
}

impl Drop for Conn {
    fn drop(&mut self) {
        for task in self.tasks.get_mut().drain(..) {
            task.abort();
        }
    }
}

impl Conn {
    fn start<S>(stream: S) -> Rc<Conn>
    where
        S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + 'static,
    {
        let conn = Rc::new(Conn {
            pending: RefCell::default(),
            out: Rc::default(),
            wake: Rc::new(Notify::new()),
            next_id: Cell::new(1),
            closed: Cell::new(false),
            tasks: RefCell::default(),
        });
        let (mut reader, mut writer) = tokio::io::split(stream);
        let (out, wake, w) = (conn.out.clone(), conn.wake.clone(), Rc::downgrade(&conn));
        let writing = tokio::task::spawn_local(async move {
            let mut buf = Vec::new();
            loop {
                wake.notified().await;
                if w.upgrade().is_none_or(|c| c.closed.get()) {
                    break;
                }
                std::mem::swap(&mut buf, &mut *out.borrow_mut());
                if buf.is_empty() {
                    continue;
                }
                if writer.write_all(&buf).await.is_err() || writer.flush().await.is_err() {
                    if let Some(c) = w.upgrade() {
                        c.close();
                    }
                    break;
                }
                buf.clear();
            }
            // close_notify and FIN: the signer closes its side, which ends the reader.
            let _ = writer.shutdown().await;
        });
        let r = Rc::downgrade(&conn);
        let reading = tokio::task::spawn_local(async move {
            let mut body = Vec::new();
            loop {
                let mut head = [0u8; HEADER_LEN];
                let read = async {
                    reader.read_exact(&mut head).await?;
                    let header = Header::parse(&head);
                    body.resize(usize::from(header.body_len), 0);
                    reader.read_exact(&mut body).await?;
                    io::Result::Ok(header)
                };
                let header = read.await;
                let Some(conn) = r.upgrade() else { return };
                let Ok(header) = header else {
                    conn.close();
                    return;
                };
                let Ok(message) = Message::decode(header, &body) else {
                    // Not the protocol: nothing more on it can be trusted.
                    conn.close();
                    return;
                };
                let waiting = conn.pending.borrow_mut().remove(&header.id);
                if let Some(waiting) = waiting {
                    let _ = waiting.send(message);
                }
            }
        });
        conn.tasks
            .borrow_mut()
            .extend([writing.abort_handle(), reading.abort_handle()]);
        conn
    }

    /// A fresh request ID and where its answer arrives.
    fn register(&self) -> (u32, oneshot::Receiver<Message>) {
        let id = self.next_id.get();
        self.next_id.set(id.wrapping_add(1).max(1));
        let (tx, rx) = oneshot::channel();
        let replaced = self.pending.borrow_mut().insert(id, tx);
        debug_assert!(replaced.is_none(), "request ID {id} reused while pending");
        (id, rx)
    }

    fn send(&self, bytes: &[u8]) {
        self.out.borrow_mut().extend_from_slice(bytes);
        self.wake.notify_one();
    }

    /// Fails every request waiting on the connection (their senders dropped), and ends
    /// its tasks: the writer after sending close_notify, the reader at once.
    fn close(&self) {
        self.closed.set(true);
        self.pending.borrow_mut().clear();
        self.wake.notify_one();
        if let Some(reading) = self.tasks.borrow().get(1) {
            reading.abort();
        }
    }
}

/// A certificate's key held by keyless signers: what the engine sends its signatures to.
pub struct RemoteSigningKey {
    signers: Arc<SignerSet>,
    id: KeyId,
    algorithm: KeyAlgorithm,
    spki: Vec<u8>,
}

impl fmt::Debug for RemoteSigningKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "RemoteSigningKey({:?}, {:?})", self.id, self.algorithm)
    }
}

impl RemoteSigningKey {
    /// The key whose public half is `spki` (the certificate's), on `signers`. The error
    /// says why the key cannot be used (a type terminus does not sign with).
    pub fn new(spki: &[u8], signers: Arc<SignerSet>) -> Result<Self, String> {
        let (id, _) = key_ids(spki).ok_or("the certificate's public key cannot be read")?;
        Ok(Self {
            signers,
            id,
            algorithm: algorithm_of(spki)?,
            spki: spki.to_vec(),
        })
    }
}

impl RemoteKey for RemoteSigningKey {
    fn algorithm(&self) -> KeyAlgorithm {
        self.algorithm
    }

    fn subject_public_key_info(&self) -> &[u8] {
        &self.spki
    }

    fn sign(
        self: Arc<Self>,
        scheme: SignatureScheme,
        digest: Vec<u8>,
        about: RemoteHandshake,
        reply: Reply,
    ) {
        tokio::task::spawn_local(async move {
            let signed = self.signers.sign(self.id, scheme, digest, &about).await;
            reply.complete(signed.map(CryptoOutput::Signature));
        });
    }
}

/// The key type of a SubjectPublicKeyInfo, as terminus signs with it.
fn algorithm_of(spki: &[u8]) -> Result<KeyAlgorithm, String> {
    let (_, parsed) = SubjectPublicKeyInfo::from_der(spki).map_err(|e| e.to_string())?;
    match parsed.parsed().map_err(|e| e.to_string())? {
        PublicKey::RSA(rsa) => {
            let bits = rsa.key_size();
            if [2048, 3072, 4096].contains(&bits) {
                Ok(KeyAlgorithm::Rsa { bits })
            } else {
                Err(format!(
                    "RSA key of {bits} bits (use 2048, 3072 or 4096 bits)"
                ))
            }
        }
        PublicKey::EC(_) => {
            // The named curve, not the point's size: secp256k1 or brainpool points are
            // as long as P-256's.
            let curve = parsed
                .algorithm
                .parameters
                .as_ref()
                .and_then(|p| p.as_oid().ok());
            match curve {
                Some(oid) if oid == x509_parser::oid_registry::OID_EC_P256 => {
                    Ok(KeyAlgorithm::EcdsaP256)
                }
                Some(oid) if oid == x509_parser::oid_registry::OID_NIST_EC_P384 => {
                    Ok(KeyAlgorithm::EcdsaP384)
                }
                _ => Err("an EC key on a curve other than P-256 or P-384".into()),
            }
        }
        _ => Err("not an RSA or ECDSA P-256/P-384 key".into()),
    }
}
