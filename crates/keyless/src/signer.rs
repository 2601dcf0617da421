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
use tokio::sync::{mpsc, OwnedSemaphorePermit, Semaphore};

use crate::keys::{key_ids, scheme_of};
use crate::protocol::{ErrorCode, Header, KeyId, Message, Op, HEADER_LEN};

/// Requests one connection may have in flight; the next is read only once one is
/// answered and its answer written, so a terminator that pipelines without end (or
/// never reads) is slowed, not buffered.
pub const MAX_IN_FLIGHT: usize = 4096;

/// The longest digest a signing request may carry (SHA-512's); a ping's data is bounded
/// by [`MAX_PING`]. With the in-flight bound, what one connection can make the signer
/// hold is a few MiB.
const MAX_DIGEST: usize = 64;
/// The most data a ping may ask to be echoed.
const MAX_PING: usize = 1024;

/// How long the rest of a request may take to arrive once its header has: a peer that
/// announces a body and stalls is cut off, not waited for.
pub const FRAME_TIMEOUT: Duration = Duration::from_secs(10);

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
/// closes, or stalls mid-request for [`FRAME_TIMEOUT`]. A request that is not the
/// protocol is answered with an error code, and the connection goes on. `terminator`
/// names it in the audit log.
pub async fn serve<S>(stream: S, peer: SocketAddr, terminator: Rc<str>, serving: Serving)
where
    S: AsyncRead + AsyncWrite + Unpin + 'static,
{
    let (mut reader, mut writer) = tokio::io::split(stream);
    // Each answer travels with its request's permit, given back only once the answer is
    // written: a terminator that sends and never reads stops being read at
    // MAX_IN_FLIGHT, its answers held here bounded by that.
    let (tx, mut rx) = mpsc::unbounded_channel::<(Vec<u8>, OwnedSemaphorePermit)>();
    // Answers leave as they are made; those made in the same turn of the event loop go
    // out in one write.
    let writing = tokio::task::spawn_local(async move {
        let mut out = Vec::new();
        let mut permits = Vec::new();
        while let Some(first) = rx.recv().await {
            out.clear();
            out.extend_from_slice(&first.0);
            permits.push(first.1);
            while let Ok((more, permit)) = rx.try_recv() {
                out.extend_from_slice(&more);
                permits.push(permit);
            }
            if writer.write_all(&out).await.is_err() || writer.flush().await.is_err() {
                return;
            }
            permits.clear();
        }
        let _ = writer.shutdown().await;
    });
    // Each request counts as a handshake in flight until it is answered (not the
    // connection: an idle one would keep the engine from ever seeing everyone parked):
    // the requests of one read are all submitted before the last of them finds every
    // request parked and flushes them together.
    let in_flight = Arc::new(Semaphore::new(MAX_IN_FLIGHT));
    let mut body = Vec::new();
    loop {
        let mut head = [0u8; HEADER_LEN];
        if reader.read_exact(&mut head).await.is_err() {
            break;
        }
        let header = Header::parse(&head);
        body.resize(usize::from(header.body_len), 0);
        match tokio::time::timeout(FRAME_TIMEOUT, reader.read_exact(&mut body)).await {
            Ok(Ok(_)) => {}
            _ => break,
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
                let _ = tx.send((bytes, permit));
            }
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
        Some(Op::Ping) if request.payload.len() > MAX_PING => {
            return (Message::error(id, ErrorCode::Format), None)
        }
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
    if request.payload.len() > MAX_DIGEST {
        return (Message::error(id, ErrorCode::Format), record);
    }
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

#[cfg(test)]
mod tests {
    use std::cell::Cell;
    use std::collections::HashSet;

    use aws_lc_rs::digest;
    use aws_lc_rs::signature::{self, EcdsaKeyPair, KeyPair, UnparsedPublicKey};
    use terminus_engine::{BackendKind, EngineMetrics, EngineSpec};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    use super::*;
    use crate::protocol::{Hash, Sign};

    /// A signer over an in-memory stream (no TLS: what is tested is the serving),
    /// holding one ECDSA P-256 key; returns the terminator's end, the key's public
    /// point, its identity and the count of answers made.
    fn start(buffer: usize) -> (tokio::io::DuplexStream, Vec<u8>, KeyId, Rc<Cell<usize>>) {
        let pkcs8 = EcdsaKeyPair::generate(&signature::ECDSA_P256_SHA256_ASN1_SIGNING).unwrap();
        let public = pkcs8.public_key().as_ref().to_vec();
        let key = Arc::new(SigningKeyPair::from_der(pkcs8.to_pkcs8v1().unwrap().as_ref()).unwrap());
        let (id, _) = key_ids(key.subject_public_key_info()).unwrap();
        let metrics = Arc::new(EngineMetrics::new(BackendKind::Scalar));
        let engine = EngineSpec::new(BackendKind::Scalar).build(metrics);
        let answered = Rc::new(Cell::new(0));
        let count = answered.clone();
        let serving = Serving {
            keys: Arc::new(SignerKeys::new([key]).unwrap()),
            engine,
            deadline: Duration::from_secs(5),
            observer: Some(Rc::new(move |_: &AuditRecord| count.set(count.get() + 1))),
        };
        let (ours, theirs) = tokio::io::duplex(buffer);
        let peer: SocketAddr = "127.0.0.1:9".parse().unwrap();
        tokio::task::spawn_local(serve(theirs, peer, "CN=test".into(), serving));
        (ours, public, id, answered)
    }

    fn request(id: u32, key: KeyId, message: &[u8]) -> Vec<u8> {
        let digest = digest::digest(&digest::SHA256, message).as_ref().to_vec();
        Message::sign(id, Sign::Ecdsa(Hash::Sha256), key, digest)
            .encode(true)
            .unwrap()
    }

    async fn read_answer(stream: &mut tokio::io::DuplexStream) -> Message {
        let mut head = [0u8; HEADER_LEN];
        stream.read_exact(&mut head).await.unwrap();
        let header = Header::parse(&head);
        let mut body = vec![0u8; usize::from(header.body_len)];
        stream.read_exact(&mut body).await.unwrap();
        Message::decode(header, &body).unwrap()
    }

    fn local<F: std::future::Future>(f: F) -> F::Output {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .unwrap();
        tokio::task::LocalSet::new().block_on(&rt, f)
    }

    /// Pipelined requests are each answered once, by ID, with a signature that
    /// verifies (aws-lc) for that request's own message; an unknown key and a
    /// malformed body get their error codes, and the connection goes on.
    #[test]
    fn pipelined_requests_are_answered_by_id_each_with_its_own_signature() {
        local(async {
            let (mut stream, public, key, _) = start(1 << 20);
            let mut bytes = Vec::new();
            for id in 1..=40u32 {
                bytes.extend(request(id, key, format!("message {id}").as_bytes()));
            }
            bytes.extend(request(41, KeyId::Ski([7; 20]), b"x"));
            // A body whose item runs past its end.
            bytes.extend([1, 0, 0, 4, 0, 0, 0, 42, 0x12, 0, 9, 1]);
            bytes.extend(request(43, key, b"after"));
            stream.write_all(&bytes).await.unwrap();
            let mut seen = HashSet::new();
            for _ in 0..43 {
                let answer = read_answer(&mut stream).await;
                assert!(seen.insert(answer.id), "{} answered twice", answer.id);
                match answer.id {
                    41 => assert_eq!(answer.payload, vec![ErrorCode::KeyNotFound.code()]),
                    42 => assert_eq!(answer.payload, vec![ErrorCode::Format.code()]),
                    id => {
                        assert_eq!(answer.op, Some(Op::Response), "{id}");
                        let message = if id == 43 {
                            b"after".to_vec()
                        } else {
                            format!("message {id}").into_bytes()
                        };
                        UnparsedPublicKey::new(&signature::ECDSA_P256_SHA256_ASN1, &public)
                            .verify(&message, &answer.payload)
                            .unwrap_or_else(|_| panic!("{id}: not its own message's signature"));
                    }
                }
            }
        });
    }

    /// A terminator that sends and never reads is read no further than MAX_IN_FLIGHT
    /// requests past what the stream buffers: the signer holds a bounded backlog.
    #[test]
    fn a_terminator_that_never_reads_is_not_read_without_bound() {
        local(async {
            let (stream, _, key, answered) = start(64 * 1024);
            let (_reader, mut writer) = tokio::io::split(stream);
            let total = MAX_IN_FLIGHT * 3;
            let sending = tokio::task::spawn_local(async move {
                for id in 0..total as u32 {
                    if writer.write_all(&request(id, key, b"m")).await.is_err() {
                        return;
                    }
                }
            });
            tokio::time::sleep(Duration::from_secs(2)).await;
            let n = answered.get();
            // The in-flight bound, plus what 64 KiB of unread answers holds.
            assert!(
                n <= MAX_IN_FLIGHT + 1024,
                "{n} answered of {total} with none read"
            );
            assert!(
                n >= MAX_IN_FLIGHT / 2,
                "only {n} answered: the test measured nothing"
            );
            sending.abort();
        });
    }
}
