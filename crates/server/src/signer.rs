//! `[signer]`: this instance signs for keyless terminators. Each worker accepts on its
//! own SO_REUSEPORT socket; a terminator's connection must show a client certificate
//! from the configured CA (mutual TLS only), then its requests go to the worker's
//! engine through `terminus-keyless`'s signer, batched with every other connection's.
//! Every answered signature is a line in the access log: who asked (the terminator's
//! certificate subject), which key, for which SNI and client, and how it went.
//!
//! Whoever can reach the port can open connections, so what a connection may hold
//! before it shows a certificate is a small budget of its own ([`Gate`]): 64 per
//! worker, 8 per source address (an IPv6 one by its /64), and when full a newcomer takes
//! the place of the oldest from the address holding the most; 3 seconds (or the
//! handshake timeout, if less) to finish mutual TLS; with `allow`, an address outside
//! the terminators' networks is closed at accept and takes nothing. Terminators past it
//! have 1,024 places per worker that strangers never take. Who was turned away is
//! counted by reason and said at most once per 10 s for each reason.

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::rc::Rc;
use std::sync::Arc;
use std::time::Duration;

use terminus_admission::unauthenticated::{Admit, Ticket, Unauthenticated};

use terminus_config::{Cidr, SignerConfig};
use terminus_keyless::metrics::Refusal;
use terminus_keyless::signer::{self, AuditRecord, Serving, SignerKeys};
use terminus_tls::client_auth::{ClientAuthMode, ClientAuthPolicy, ClientIdentity};
use tokio::task::AbortHandle;
use tokio_rustls::TlsAcceptor;

use crate::logs::throttled::ByReason;
use crate::worker::Worker;

/// The most terminators' connections (past mutual TLS) one worker serves at once.
const TERMINATORS: usize = 1024;

/// The most connections one worker holds that have not shown a certificate yet: apart
/// from [`TERMINATORS`], so that strangers never take a terminator's place.
const UNAUTHENTICATED: usize = 64;

/// The most of [`UNAUTHENTICATED`] one source address holds.
const UNAUTHENTICATED_PER_ADDRESS: usize = 8;

/// How long a connection has to finish mutual TLS (or less, if the configured handshake
/// timeout is less): a terminator on a data-centre network needs a round trip or two.
const HANDSHAKE_DEADLINE: Duration = Duration::from_secs(3);

/// A worker writes at most one line per reason about connections it turned away per
/// this long (a scanner's `not_allowed` never holds back a terminator's
/// `handshake_failed`); `terminus_signer_refused_total` counts them all.
const WARN_EVERY: Duration = Duration::from_secs(10);

/// What every worker's signer listeners share.
pub(crate) struct SignerService {
    acceptor: TlsAcceptor,
    keys: Arc<SignerKeys>,
    deadline: Duration,
    handshake_timeout: Duration,
    /// `[signer] allow`.
    allow: Option<Arc<[Cidr]>>,
}

impl SignerService {
    /// Reads `[signer]`'s files: the terminators' CA, the signer's own certificate, and
    /// the keys it signs with. The error names the file and what is wrong.
    pub(crate) fn load(config: &SignerConfig, handshake_timeout: Duration) -> Result<Self, String> {
        let policy = ClientAuthPolicy {
            mode: ClientAuthMode::Required,
            ca: config.ca.clone(),
            crls: Vec::new(),
            depth: None,
        };
        let verifier = policy
            .load()
            .map_err(|e| format!("[signer] ca: {e}"))?
            .verifier;
        let (chain, key) = terminus_tls::client::load_identity(&config.cert, &config.key)
            .map_err(|e| format!("[signer] certificate: {e}"))?;
        let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
        let tls = rustls::ServerConfig::builder_with_provider(provider)
            .with_protocol_versions(&[&rustls::version::TLS13])
            .map_err(|e| e.to_string())?
            .with_client_cert_verifier(verifier)
            .with_single_cert(chain, key)
            .map_err(|e| format!("[signer] certificate {}: {e}", config.cert.display()))?;
        let mut keys = Vec::new();
        for path in &config.keys {
            let key = terminus_tls::certs::load_signing_key(path)
                .map_err(|e| format!("[[signer.key]] {e}"))?;
            keys.push(Arc::new(key));
        }
        let keys =
            SignerKeys::new(keys).ok_or("[[signer.key]]: a key's public half cannot be read")?;
        tracing::info!(
            "keyless signer: {} keys, terminators from {}",
            keys.len(),
            config.ca.display()
        );
        Ok(Self {
            acceptor: TlsAcceptor::from(Arc::new(tls)),
            keys: Arc::new(keys),
            deadline: config.deadline,
            handshake_timeout,
            allow: config.allow.clone(),
        })
    }
}

/// What one worker's signer listeners admit: strangers' handshakes in a budget of
/// their own ([`Unauthenticated`]), terminators past mutual TLS up to [`TERMINATORS`],
/// and the warnings about who was turned away, throttled.
pub(crate) struct Gate {
    strangers: RefCell<Unauthenticated>,
    /// The handshakes in progress, to close the one a newcomer evicts.
    handshakes: RefCell<HashMap<Ticket, AbortHandle>>,
    terminators: Cell<usize>,
    warnings: RefCell<ByReason<{ Refusal::ALL.len() }>>,
}

impl Gate {
    pub(crate) fn new() -> Rc<Self> {
        Rc::new(Gate {
            strangers: RefCell::new(Unauthenticated::new(
                UNAUTHENTICATED,
                UNAUTHENTICATED_PER_ADDRESS,
            )),
            handshakes: RefCell::default(),
            terminators: Cell::new(0),
            warnings: RefCell::new(ByReason::new(WARN_EVERY, "terminus_signer_refused_total")),
        })
    }

    /// Counts a connection closed unserved, and says so (throttled by reason).
    fn refuse(&self, why: Refusal, line: impl FnOnce() -> String) {
        terminus_keyless::metrics::signer_refused(why);
        self.warnings.borrow_mut().warn(why as usize, line);
    }

    /// A terminator's place, if one is free.
    fn terminator(self: &Rc<Self>) -> Option<TerminatorSlot> {
        if self.terminators.get() >= TERMINATORS {
            return None;
        }
        self.terminators.set(self.terminators.get() + 1);
        Some(TerminatorSlot(self.clone()))
    }
}

/// An unauthenticated connection's place: given back when its handshake ends, whichever
/// way (its task aborted too).
struct Stranger {
    gate: Rc<Gate>,
    ticket: Ticket,
}

impl Drop for Stranger {
    fn drop(&mut self) {
        self.gate.strangers.borrow_mut().done(self.ticket);
        self.gate.handshakes.borrow_mut().remove(&self.ticket);
    }
}

/// A terminator's place, held while it is served.
struct TerminatorSlot(Rc<Gate>);

impl Drop for TerminatorSlot {
    fn drop(&mut self) {
        self.0.terminators.set(self.0.terminators.get() - 1);
    }
}

/// Accepts terminators' connections on `listener` for `worker` until the worker stops;
/// `gate` is the worker's, shared by its signer listeners.
pub(crate) async fn accept_loop(
    listener: std::net::TcpListener,
    worker: Rc<Worker>,
    gate: Rc<Gate>,
) {
    let Some(service) = worker.shared.signer.clone() else {
        return;
    };
    let listener = match tokio::net::TcpListener::from_std(listener) {
        Ok(l) => l,
        Err(e) => {
            tracing::error!("signer listener: {e}");
            return;
        }
    };
    let mut shutdown = worker.shared.shutdown.clone();
    let deadline = HANDSHAKE_DEADLINE.min(service.handshake_timeout);
    loop {
        let accepted = tokio::select! {
            a = listener.accept() => a,
            _ = shutdown.wait_for(|&stop| stop) => return,
        };
        let (tcp, peer) = match accepted {
            Ok(a) => a,
            Err(e) => {
                tracing::debug!("signer accept: {e}");
                tokio::time::sleep(Duration::from_millis(10)).await;
                continue;
            }
        };
        if let Some(allow) = &service.allow {
            if !allow.iter().any(|net| net.contains(peer.ip())) {
                gate.refuse(Refusal::NotAllowed, || {
                    format!("signer: {peer} turned away: not in [signer] allow")
                });
                continue;
            }
        }
        let admitted = gate.strangers.borrow_mut().admit(peer.ip());
        let (ticket, evict) = match admitted {
            Admit::Yes { ticket, evict } => (ticket, evict),
            Admit::AddressFull => {
                gate.refuse(Refusal::AddressFull, || {
                    format!("signer: {peer} turned away: its address holds {UNAUTHENTICATED_PER_ADDRESS} connections without a certificate")
                });
                continue;
            }
        };
        if let Some(old) = evict {
            // Its task's future is dropped later, on this thread: no borrow is held then.
            let task = gate.handshakes.borrow_mut().remove(&old);
            if let Some(task) = task {
                task.abort();
            }
            gate.refuse(Refusal::Evicted, || {
                format!("signer: {UNAUTHENTICATED} connections without a certificate on this worker: the oldest closed for {peer}")
            });
        }
        let _ = tcp.set_nodelay(true);
        let stranger = Stranger {
            gate: gate.clone(),
            ticket,
        };
        let (service, worker) = (service.clone(), worker.clone());
        let task = tokio::task::spawn_local(async move {
            let gate = stranger.gate.clone();
            let handshake = tokio::time::timeout(deadline, service.acceptor.accept(tcp)).await;
            drop(stranger);
            let stream = match handshake {
                Ok(Ok(s)) => s,
                Ok(Err(e)) => {
                    gate.refuse(Refusal::HandshakeFailed, || {
                        format!("signer: terminator {peer} refused: {e}")
                    });
                    return;
                }
                Err(_) => {
                    gate.refuse(Refusal::HandshakeTimeout, || {
                        format!("signer: terminator {peer} did not complete its handshake within {deadline:?}")
                    });
                    return;
                }
            };
            let Some(_slot) = gate.terminator() else {
                gate.refuse(Refusal::Full, || {
                    format!("signer: {TERMINATORS} terminators connected to this worker; {peer} turned away")
                });
                return;
            };
            let subject: Rc<str> = stream
                .get_ref()
                .1
                .peer_certificates()
                .and_then(ClientIdentity::of)
                .map_or_else(|| "-".into(), |id| id.subject.into());
            terminus_keyless::metrics::signer_connection();
            tracing::debug!("signer: terminator {peer} ({subject}) connected");
            let observer = audit(worker.clone());
            let serving = Serving {
                keys: service.keys.clone(),
                engine: worker.engine.clone(),
                deadline: service.deadline,
                observer: Some(observer),
            };
            signer::serve(stream, peer, subject, serving).await;
        });
        gate.handshakes
            .borrow_mut()
            .insert(ticket, task.abort_handle());
    }
}

/// Counts each answer, and writes it to the access log where there is one.
fn audit(worker: Rc<Worker>) -> signer::Observer {
    Rc::new(move |record: &AuditRecord| {
        terminus_keyless::metrics::signer_answered(record.error, record.took);
        if let Some(log) = &worker.shared.site.current().access_log {
            log.signature(record);
        }
    })
}
