//! The signer's side: a terminator's connection served on a worker, each request a
//! digest signature submitted to the worker's crypto engine, so that one crypto_mb call
//! fills with requests from every connection and terminator at once.
//!
//! A connection counts as a handshake in flight for the engine's flush policy, and so
//! does each request until it is answered: the engine then waits for the worker to run
//! out of ready sockets (or for a full batch, or its batch delay) before computing, as
//! it does for handshakes, instead of computing each request as it arrives.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::rc::Rc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use terminus_engine::{CryptoOp, CryptoOutput, Engine, HandshakeContext, SigningKeyPair};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::{mpsc, Semaphore};

use crate::keys::{key_ids, scheme_of};
use crate::protocol::{ErrorCode, Header, KeyId, Message, Op, HEADER_LEN};

/// Requests one connection may have in flight; the next is read only once one is
/// answered, so a terminator that pipelines without end is slowed, not buffered.
pub const MAX_IN_FLIGHT: usize = 4096;

/// The keys a signer holds, by every identity a request may name them with.
#[derive(Debug, Default)]
pub struct SignerKeys {
    by_id: HashMap<KeyId, Arc<SigningKeyPair>>,
}

impl SignerKeys {
    /// Indexes `keys` by their SKI (and RSA modulus digest). None when a key's public
    /// half cannot be read, which a key that parsed always can.
    pub fn new(keys: impl IntoIterator<Item = Arc<SigningKeyPair>>) -> Option<Self> {
        let mut by_id = HashMap::new();
        for key in keys {
            let (ski, modulus) = key_ids(key.subject_public_key_info())?;
            by_id.insert(ski, key.clone());
            if let Some(modulus) = modulus {
                by_id.insert(modulus, key);
            }
        }
        Some(Self { by_id })
    }

    /// The key `id` names.
    pub fn get(&self, id: &KeyId) -> Option<&Arc<SigningKeyPair>> {
        self.by_id.get(id)
    }

    /// How many keys (not identities) are held.
    pub fn len(&self) -> usize {
        let mut seen: Vec<*const SigningKeyPair> = self.by_id.values().map(Arc::as_ptr).collect();
        seen.sort();
        seen.dedup();
        seen.len()
    }

    /// Whether no key is held.
    pub fn is_empty(&self) -> bool {
        self.by_id.is_empty()
    }
}

/// Who asked for a signature, and what came of it: one line of the signer's audit log.
/// Never key material, never the digest.
#[derive(Debug, Clone)]
pub struct AuditRecord {
    /// The terminator's address.
    pub peer: SocketAddr,
    /// The terminator's certificate subject (mutual TLS).
    pub terminator: Rc<str>,
    /// The key asked for.
    pub key: Option<KeyId>,
    /// The operation asked for.
    pub op: Option<Op>,
    /// The SNI of the handshake being signed for, as the terminator sent it.
    pub server_name: Option<String>,
    /// The TLS client's address, as the terminator sent it.
    pub client_ip: Option<std::net::IpAddr>,
    /// None: signed; else the error answered.
    pub error: Option<ErrorCode>,
    /// Request read to answer queued.
    pub took: Duration,
}

/// What the signer does for each answered request (the audit log, metrics).
pub type Observer = Rc<dyn Fn(&AuditRecord)>;

/// How a connection is served.
#[derive(Clone)]
pub struct Serving {
    /// The keys.
    pub keys: Arc<SignerKeys>,
    /// The worker's engine.
    pub engine: Engine,
    /// A request not answered within this is answered [`ErrorCode::Expired`].
    pub deadline: Duration,
    /// Told of every answer.
    pub observer: Option<Observer>,
}

/// Serves one terminator's connection (already past its mutual-TLS handshake) until it
/// closes or sends bytes that are not the protocol. `terminator` names it in the audit
/// log.
pub async fn serve<S>(stream: S, peer: SocketAddr, terminator: Rc<str>, serving: Serving)
where
    S: AsyncRead + AsyncWrite + Unpin + 'static,
{
    let (mut reader, mut writer) = tokio::io::split(stream);
    let (tx, mut rx) = mpsc::unbounded_channel::<Vec<u8>>();
    // Answers leave as they are made; those made in the same turn of the event loop go
    // out in one write.
    let writing = tokio::task::spawn_local(async move {
        let mut out = Vec::new();
        while let Some(first) = rx.recv().await {
            out.clear();
            out.extend_from_slice(&first);
            while let Ok(more) = rx.try_recv() {
                out.extend_from_slice(&more);
            }
            if writer.write_all(&out).await.is_err() || writer.flush().await.is_err() {
                return;
            }
        }
        let _ = writer.shutdown().await;
    });
    let _connection = serving.engine.handshake_started();
    let in_flight = Arc::new(Semaphore::new(MAX_IN_FLIGHT));
    let mut body = Vec::new();
    loop {
        let mut head = [0u8; HEADER_LEN];
        if reader.read_exact(&mut head).await.is_err() {
            break;
        }
        let header = Header::parse(&head);
        body.resize(usize::from(header.body_len), 0);
        if reader.read_exact(&mut body).await.is_err() {
            break;
        }
        let read_at = Instant::now();
        let Ok(permit) = in_flight.clone().acquire_owned().await else {
            break;
        };
        let message = Message::decode(header, &body);
        let (tx, serving, terminator) = (tx.clone(), serving.clone(), terminator.clone());
        let guard = serving.engine.handshake_started();
        tokio::task::spawn_local(async move {
            let (answer, record) = answer(message, header.id, &serving).await;
            drop(guard);
            if let Some(bytes) = answer.encode(false) {
                let _ = tx.send(bytes);
            }
            drop(permit);
            if let (Some(observer), Some((key, op, server_name, client_ip))) =
                (&serving.observer, record)
            {
                observer(&AuditRecord {
                    peer,
                    terminator,
                    key,
                    op,
                    server_name,
                    client_ip,
                    error: (answer.op == Some(Op::Error)).then(|| {
                        ErrorCode::from_code(answer.payload.first().copied().unwrap_or(0))
                    }),
                    took: read_at.elapsed(),
                });
            }
        });
    }
    drop(tx);
    let _ = writing.await;
}

type Record = Option<(
    Option<KeyId>,
    Option<Op>,
    Option<String>,
    Option<std::net::IpAddr>,
)>;

/// The answer to one request, and what the audit log records of it (pings are not
/// recorded).
async fn answer(
    message: Result<Message, crate::protocol::DecodeError>,
    id: u32,
    serving: &Serving,
) -> (Message, Record) {
    let request = match message {
        Ok(m) => m,
        Err(e) => {
            return (
                Message::error(id, e.answer()),
                Some((None, None, None, None)),
            )
        }
    };
    let record = Some((
        request.key,
        request.op,
        request.server_name.clone(),
        request.client_ip,
    ));
    let sign = match request.op {
        Some(Op::Ping) => {
            return (
                Message {
                    id,
                    op: Some(Op::Pong),
                    payload: request.payload,
                    ..Message::default()
                },
                None,
            )
        }
        Some(Op::Sign(sign)) => sign,
        Some(Op::Response | Op::Pong | Op::Error) => {
            return (Message::error(id, ErrorCode::UnexpectedOpcode), record)
        }
        _ => return (Message::error(id, ErrorCode::BadOpcode), record),
    };
    let Some(key) = request.key.as_ref().and_then(|k| serving.keys.get(k)) else {
        return (Message::error(id, ErrorCode::KeyNotFound), record);
    };
    let Some(scheme) = scheme_of(sign, key.algorithm()) else {
        return (Message::error(id, ErrorCode::CryptoFailed), record);
    };
    let op = CryptoOp::SignDigest {
        key: key.clone(),
        scheme,
        digest: request.payload,
    };
    let ctx = HandshakeContext::starting_now();
    let answered = tokio::time::timeout(serving.deadline, serving.engine.submit(op, &ctx)).await;
    let answer = match answered {
        Ok(Ok(CryptoOutput::Signature(signature))) => Message::response(id, signature),
        Ok(Ok(_)) => Message::error(id, ErrorCode::Internal),
        Ok(Err(_)) => Message::error(id, ErrorCode::CryptoFailed),
        Err(_) => Message::error(id, ErrorCode::Expired),
    };
    (answer, record)
}
