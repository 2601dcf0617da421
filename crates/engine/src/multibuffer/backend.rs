//! The `multibuffer` backend: batches of up to 8 operations computed in one crypto_mb
//! call (AVX-512 IFMA), small batches and operations without a batched form computed
//! scalar on the worker.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use aws_lc_rs::encoding::{AsBigEndian, Curve25519SeedBin};
use aws_lc_rs::rand::{SecureRandom, SystemRandom};
use rustls::SignatureScheme;
use zeroize::Zeroizing;

use crate::backend::{Backend, BackendKind, Job, Reply};
use crate::metrics::EngineMetrics;
use crate::multibuffer::ecdsa::{self, P256Key};
use crate::multibuffer::emsa::Encoding;
use crate::multibuffer::rsa::{self, RsaCrtKey};
use crate::multibuffer::x25519;
use crate::op::{CryptoError, CryptoOp, CryptoOutput, KxPrivateKey, OpKind};
use crate::scalar;
use crate::signing_key::BatchKey;

/// Batches smaller than this are computed scalar. RSA-2048 here: one scalar signature
/// costs ~0.3 ms and an mb8 call ~1.0 ms whatever its lane count, so 4 lanes and up pay.
pub const RSA_CROSSOVER: usize = 4;
/// X25519 here: aws-lc makes a key pair in ~12 µs and agrees in ~30 µs; an mb8 call
/// costs ~44 µs (public keys) and ~53 µs (secrets). Batching pays from 3 requests.
pub const X25519_CROSSOVER: usize = 3;
/// ECDSA P-256: ~23 µs scalar, ~96 µs per mb8 call: batching pays from 5.
pub const ECDSA_CROSSOVER: usize = 5;

pub struct MultibufferBackend {
    metrics: Arc<EngineMetrics>,
}

impl MultibufferBackend {
    /// None when this CPU cannot run crypto_mb.
    pub fn new(metrics: Arc<EngineMetrics>) -> Option<Self> {
        super::applicable().then_some(Self { metrics })
    }

    fn scalar(&self, op: CryptoOp, reply: Reply) {
        EngineMetrics::add(&self.metrics.op(op.kind()).scalar_computed, 1);
        reply.complete(scalar::compute(op));
    }

    /// Computes `jobs` one by one: a batch below its operation's crossover.
    fn scalar_all(&self, jobs: impl IntoIterator<Item = (CryptoOp, Reply)>) {
        for (op, reply) in jobs {
            self.scalar(op, reply);
        }
    }

    /// Signs a batch of RSA requests: grouped by key size, each group of at least
    /// [`RSA_CROSSOVER`] encoded and computed in one mb8 call.
    fn rsa_batch(&self, jobs: Vec<(CryptoOp, Reply)>) {
        let mut groups: Vec<(usize, Vec<(CryptoOp, Reply)>)> = Vec::new();
        for (op, reply) in jobs {
            let bits = match &op {
                CryptoOp::Sign { key, .. } => key.rsa_crt().map(RsaCrtKey::bits),
                _ => None,
            };
            match bits {
                Some(bits) => match groups.iter_mut().find(|(b, _)| *b == bits) {
                    Some((_, group)) => group.push((op, reply)),
                    None => groups.push((bits, vec![(op, reply)])),
                },
                None => self.scalar(op, reply),
            }
        }
        for (bits, group) in groups {
            if group.len() < RSA_CROSSOVER {
                self.scalar_all(group);
                continue;
            }
            let mut lanes = Vec::with_capacity(group.len());
            for (op, reply) in group {
                let encoded = match &op {
                    CryptoOp::Sign {
                        scheme, message, ..
                    } => Encoding::for_scheme(*scheme).and_then(|e| e.encode(message, bits)),
                    _ => None,
                };
                match encoded {
                    Some(encoded) => lanes.push(RsaLane { op, reply, encoded }),
                    None => self.scalar(op, reply),
                }
            }
            if lanes.is_empty() {
                continue;
            }
            let inputs: Vec<(&RsaCrtKey, &[u8])> = lanes
                .iter()
                .map(|l| (l.key(), l.encoded.as_slice()))
                .collect();
            let results = rsa::private_crt(bits, &inputs);
            for (lane, result) in lanes.into_iter().zip(results) {
                lane.reply.complete(
                    result
                        .map(CryptoOutput::Signature)
                        .map_err(|_| CryptoError::SignFailed),
                );
            }
        }
    }

    /// Runs a batch of X25519 requests: one mb8 call for the public keys of the lanes that
    /// generate, one for the shared secrets of the lanes that agree.
    fn x25519_batch(&self, jobs: Vec<(CryptoOp, Reply)>) {
        if jobs.len() < X25519_CROSSOVER {
            self.scalar_all(jobs);
            return;
        }
        let rng = SystemRandom::new();
        let mut lanes = Vec::with_capacity(jobs.len());
        for (op, reply) in jobs {
            let existing = match &op {
                CryptoOp::KxAgree { private_key, .. } => Some(private_key),
                _ => None,
            };
            let private = match existing {
                None => {
                    let mut fresh = Zeroizing::new([0u8; x25519::KEY_LEN]);
                    if rng.fill(&mut fresh[..]).is_err() {
                        reply.complete(Err(CryptoError::KeyGenFailed("x25519")));
                        continue;
                    }
                    Some(fresh)
                }
                Some(KxPrivateKey::X25519(raw)) => Some(raw.clone()),
                // A key the scalar path made: take its 32-byte scalar.
                Some(KxPrivateKey::AwsLc(k)) => AsBigEndian::<Curve25519SeedBin>::as_be_bytes(k)
                    .ok()
                    .and_then(|seed| <[u8; x25519::KEY_LEN]>::try_from(seed.as_ref()).ok())
                    .map(Zeroizing::new),
            };
            match private {
                Some(private) => lanes.push(KxLane {
                    generate: existing.is_none(),
                    op,
                    reply,
                    private,
                }),
                None => self.scalar(op, reply),
            }
        }
        let generating: Vec<usize> = (0..lanes.len()).filter(|&i| lanes[i].generate).collect();
        let mut publics: Vec<Option<Result<[u8; x25519::KEY_LEN], rsa::LaneError>>> =
            vec![None; lanes.len()];
        for chunk in generating.chunks(crypto_mb_sys::LANES) {
            let keys: Vec<&[u8; x25519::KEY_LEN]> =
                chunk.iter().map(|&i| &*lanes[i].private).collect();
            for (&i, public) in chunk.iter().zip(x25519::public_keys(&keys)) {
                publics[i] = Some(public);
            }
        }
        let agreeing: Vec<usize> = (0..lanes.len())
            .filter(|&i| {
                matches!(
                    lanes[i].op,
                    CryptoOp::KxAgree { .. } | CryptoOp::KxGenerateAgree { .. }
                )
            })
            .collect();
        let mut shared = vec![None; lanes.len()];
        for chunk in agreeing.chunks(crypto_mb_sys::LANES) {
            let pairs: Vec<(&[u8; x25519::KEY_LEN], &[u8])> = chunk
                .iter()
                .map(|&i| match &lanes[i].op {
                    CryptoOp::KxAgree { peer_public, .. }
                    | CryptoOp::KxGenerateAgree { peer_public, .. } => {
                        (&*lanes[i].private, peer_public.as_slice())
                    }
                    _ => unreachable!("filtered to agreeing lanes"),
                })
                .collect();
            for (&i, secret) in chunk.iter().zip(x25519::shared_secrets(&pairs)) {
                shared[i] = Some(secret);
            }
        }
        let bad_peer = || CryptoError::BadPeerKey("x25519");
        for (i, lane) in lanes.into_iter().enumerate() {
            let public = publics[i]
                .take()
                .map(|p| p.map_err(|_| CryptoError::KeyGenFailed("x25519")));
            let secret = shared[i].take().map(|s| {
                s.map(|s| Zeroizing::new(s.to_vec()))
                    .map_err(|_| bad_peer())
            });
            let result = match lane.op {
                CryptoOp::KxGenerate { .. } => {
                    public
                        .expect("generated")
                        .map(|public| CryptoOutput::KeyPair {
                            private_key: KxPrivateKey::X25519(lane.private),
                            public: public.to_vec(),
                        })
                }
                CryptoOp::KxGenerateAgree { .. } => public.expect("generated").and_then(|public| {
                    secret
                        .expect("agreed")
                        .map(|shared| CryptoOutput::PublicAndShared {
                            public: public.to_vec(),
                            shared,
                        })
                }),
                CryptoOp::KxAgree { .. } => secret.expect("agreed").map(CryptoOutput::Shared),
                CryptoOp::Sign { .. } => unreachable!("only key exchanges are X25519 lanes"),
            };
            lane.reply.complete(result);
        }
    }

    /// Signs a batch of ECDSA requests; P-256 keys in one mb8 call, others scalar.
    fn ecdsa_batch(&self, jobs: Vec<(CryptoOp, Reply)>) {
        let (mut lanes, mut replies) = (Vec::new(), Vec::new());
        for (op, reply) in jobs {
            match &op {
                CryptoOp::Sign {
                    key,
                    scheme: SignatureScheme::ECDSA_NISTP256_SHA256,
                    ..
                } if matches!(key.batch_key(), Some(BatchKey::EcdsaP256(_))) => {
                    lanes.push(op);
                    replies.push(reply);
                }
                _ => self.scalar(op, reply),
            }
        }
        if lanes.len() < ECDSA_CROSSOVER {
            self.scalar_all(lanes.into_iter().zip(replies));
            return;
        }
        let inputs: Vec<(&P256Key, &[u8])> = lanes
            .iter()
            .map(|op| match op {
                CryptoOp::Sign { key, message, .. } => match key.batch_key() {
                    Some(BatchKey::EcdsaP256(k)) => (k, message.as_slice()),
                    _ => unreachable!("filtered to P-256 keys"),
                },
                _ => unreachable!("filtered to signatures"),
            })
            .collect();
        for (reply, result) in replies.into_iter().zip(ecdsa::sign_sha256(&inputs)) {
            reply.complete(
                result
                    .map(CryptoOutput::Signature)
                    .map_err(|_| CryptoError::SignFailed),
            );
        }
    }
}

impl Backend for MultibufferBackend {
    fn kind(&self) -> BackendKind {
        BackendKind::Multibuffer
    }

    fn max_batch(&self, op: OpKind) -> usize {
        match op {
            OpKind::RsaSign | OpKind::EcdsaSign | OpKind::X25519 => crypto_mb_sys::LANES,
            _ => 1,
        }
    }

    fn dispatch(&self, batch: Vec<Job>) -> Pin<Box<dyn Future<Output = ()> + '_>> {
        let jobs: Vec<(CryptoOp, Reply)> = batch.into_iter().map(Job::into_parts).collect();
        // A batch holds one operation kind (see `Backend::dispatch`).
        match jobs.first().map(|(op, _)| op.kind()) {
            Some(OpKind::RsaSign) => self.rsa_batch(jobs),
            Some(OpKind::EcdsaSign) => self.ecdsa_batch(jobs),
            Some(OpKind::X25519) => self.x25519_batch(jobs),
            _ => self.scalar_all(jobs),
        }
        Box::pin(std::future::ready(()))
    }
}

/// One RSA signature request and its encoded message.
struct RsaLane {
    op: CryptoOp,
    reply: Reply,
    encoded: Vec<u8>,
}

impl RsaLane {
    fn key(&self) -> &RsaCrtKey {
        match &self.op {
            CryptoOp::Sign { key, .. } => key
                .rsa_crt()
                .expect("lanes are made from keys with a CRT form"),
            _ => unreachable!("RSA lanes hold signatures"),
        }
    }
}

/// What one X25519 request needs from the kernels.
struct KxLane {
    op: CryptoOp,
    reply: Reply,
    private: Zeroizing<[u8; x25519::KEY_LEN]>,
    /// This lane's private key is fresh: its public key must be computed.
    generate: bool,
}
