//! `[signer]`: this instance signs for keyless terminators. Each worker accepts on its
//! own SO_REUSEPORT socket; a terminator's connection must show a client certificate
//! from the configured CA (mutual TLS only), then its requests go to the worker's
//! engine through `terminus-keyless`'s signer, batched with every other connection's.
//! Every answered signature is a line in the access log: who asked (the terminator's
//! certificate subject), which key, for which SNI and client, and how it went.

use std::rc::Rc;
use std::sync::Arc;
use std::time::Duration;

use terminus_config::SignerConfig;
use terminus_keyless::signer::{self, AuditRecord, Serving, SignerKeys};
use terminus_tls::client_auth::{ClientAuthMode, ClientAuthPolicy, ClientIdentity};
use tokio_rustls::TlsAcceptor;

use crate::worker::Worker;

/// The most connections (terminators' and handshakes in progress) one worker's signer
/// listeners hold at once.
const MAX_CONNECTIONS: usize = 1024;

/// What every worker's signer listeners share.
pub(crate) struct SignerService {
    acceptor: TlsAcceptor,
    keys: Arc<SignerKeys>,
    deadline: Duration,
    handshake_timeout: Duration,
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
        })
    }
}

/// Accepts terminators' connections on `listener` for `worker` until the worker stops.
pub(crate) async fn accept_loop(listener: std::net::TcpListener, worker: Rc<Worker>) {
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
    // Terminators keep a connection per worker each; this bounds what anyone who can
    // reach the port can hold, handshakes included, on this worker.
    let room = Arc::new(tokio::sync::Semaphore::new(MAX_CONNECTIONS));
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
        let Ok(permit) = room.clone().try_acquire_owned() else {
            tracing::warn!(
                "signer: {MAX_CONNECTIONS} connections open on this worker; {peer} turned away"
            );
            continue;
        };
        let _ = tcp.set_nodelay(true);
        let (service, worker) = (service.clone(), worker.clone());
        tokio::task::spawn_local(async move {
            let _permit = permit;
            let handshake =
                tokio::time::timeout(service.handshake_timeout, service.acceptor.accept(tcp)).await;
            let stream = match handshake {
                Ok(Ok(s)) => s,
                Ok(Err(e)) => {
                    tracing::warn!("signer: terminator {peer} refused: {e}");
                    return;
                }
                Err(_) => {
                    tracing::warn!("signer: terminator {peer} did not complete its handshake");
                    return;
                }
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
