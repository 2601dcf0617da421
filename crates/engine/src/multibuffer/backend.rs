//! The `multibuffer` backend: batches of up to 8 operations computed in one crypto_mb
//! call (AVX-512 IFMA), small batches and operations without a batched form computed
//! scalar on the worker.

use std::sync::Arc;

use crate::backend::{Backend, BackendKind, Job, Reply};
use crate::cost::{Crossovers, Operation};
use crate::metrics::EngineMetrics;
use crate::multibuffer::ecdsa::{self, EcKey};
use crate::multibuffer::emsa::Encoding;
use crate::multibuffer::kernel::{CryptoMb, Kernels};
use crate::multibuffer::kx;
use crate::multibuffer::rsa::{self, RsaCrtKey};
use crate::op::{CryptoOp, CryptoOutput, KxGroup, OpKind};
use crate::scalar;
use crate::signing_key::BatchKey;

/// The crypto_mb backend: a flushed queue becomes 8-lane calls (fewer requests than pay for a batch go to the scalar path instead).
pub struct MultibufferBackend {
    metrics: Arc<EngineMetrics>,
    crossovers: Arc<Crossovers>,
    kernels: Box<dyn Kernels>,
}

impl MultibufferBackend {
    /// None when this CPU cannot run crypto_mb.
    pub fn new(metrics: Arc<EngineMetrics>) -> Option<Self> {
        super::applicable().then(|| Self::on(Box::new(CryptoMb), metrics))
    }

    /// The backend computing its batches on `kernels` (crypto_mb, or in tests a reference
    /// implementation that runs on any CPU).
    pub(crate) fn on(kernels: Box<dyn Kernels>, metrics: Arc<EngineMetrics>) -> Self {
        Self {
            metrics,
            crossovers: Arc::default(),
            kernels,
        }
    }

    /// Decides small batches by `crossovers` (measured on this CPU) instead of defaults.
    pub fn with_crossovers(mut self, crossovers: Arc<Crossovers>) -> Self {
        self.crossovers = crossovers;
        self
    }

    fn scalar(&self, op: CryptoOp, reply: Reply) {
        self.metrics.computed_scalar(op.kind());
        reply.complete(scalar::compute(op));
    }

    /// Computes `jobs` one by one: a batch below its operation's crossover.
    fn scalar_all(&self, jobs: impl IntoIterator<Item = (CryptoOp, Reply)>) {
        for (op, reply) in jobs {
            self.scalar(op, reply);
        }
    }

    /// Signs a batch of signature requests: grouped by the batched operation they are
    /// (RSA key size, ECDSA curve), each group of at least its crossover in one mb8 call;
    /// smaller groups, and keys or schemes the kernels do not take, scalar.
    fn sign_batch(&self, jobs: Vec<(CryptoOp, Reply)>) {
        let mut groups: Vec<(Operation, Vec<(CryptoOp, Reply)>)> = Vec::new();
        for (op, reply) in jobs {
            let batched = match &op {
                CryptoOp::Sign { key, scheme, .. } | CryptoOp::SignDigest { key, scheme, .. }
                    if key.algorithm().schemes().contains(scheme) =>
                {
                    Operation::for_key(key)
                }
                _ => None,
            };
            match batched {
                Some(batched) => match groups.iter_mut().find(|(o, _)| *o == batched) {
                    Some((_, group)) => group.push((op, reply)),
                    None => groups.push((batched, vec![(op, reply)])),
                },
                None => self.scalar(op, reply),
            }
        }
        for (operation, group) in groups {
            if group.len() < self.crossovers.get(operation) {
                self.scalar_all(group);
            } else if matches!(operation, Operation::EcdsaP256 | Operation::EcdsaP384) {
                self.ecdsa_sign(group);
            } else {
                self.rsa_sign(group);
            }
        }
    }

    /// One mb8 call over RSA signatures with keys of one size, each message encoded first.
    fn rsa_sign(&self, group: Vec<(CryptoOp, Reply)>) {
        let mut lanes = Vec::with_capacity(group.len());
        for (op, reply) in group {
            let encoded = match &op {
                CryptoOp::Sign {
                    key,
                    scheme,
                    message,
                } => key
                    .rsa_crt()
                    .zip(Encoding::for_scheme(*scheme))
                    .and_then(|(k, e)| e.encode(message, k.bits())),
                CryptoOp::SignDigest {
                    key,
                    scheme,
                    digest,
                } => key
                    .rsa_crt()
                    .zip(Encoding::for_scheme(*scheme))
                    .and_then(|(k, e)| e.encode_digest(digest, k.bits())),
                _ => None,
            };
            match encoded {
                Some(encoded) => lanes.push(RsaLane { op, reply, encoded }),
                None => self.scalar(op, reply),
            }
        }
        let Some(bits) = lanes.first().map(|l| l.key().bits()) else {
            return;
        };
        let inputs: Vec<(&RsaCrtKey, &[u8])> = lanes
            .iter()
            .map(|l| (l.key(), l.encoded.as_slice()))
            .collect();
        let results = rsa::private_crt_on(&*self.kernels, bits, &inputs);
        for (lane, result) in lanes.into_iter().zip(results) {
            match result {
                Ok(signature) => lane.reply.complete(Ok(CryptoOutput::Signature(signature))),
                // A fault of crypto_mb or of the lane bookkeeping costs the request a
                // scalar operation, not its handshake.
                Err(e) => lane.reply.fall_back(lane.op, e.into(), &self.metrics),
            }
        }
    }

    /// Runs a batch of key exchanges of one group (see [`kx::compute_on`]), or computes
    /// it scalar when it is below the crossover.
    fn kx_batch(&self, group: KxGroup, jobs: Vec<(CryptoOp, Reply)>) {
        if jobs.len() < self.crossovers.get(Operation::for_group(group)) {
            self.scalar_all(jobs);
            return;
        }
        let (ops, replies): (Vec<CryptoOp>, Vec<Reply>) = jobs.into_iter().unzip();
        let batch = kx::compute_on(&*self.kernels, group, ops);
        for _ in 0..batch.computed_scalar {
            self.metrics.computed_scalar(group.op_kind());
        }
        for cause in batch.fallbacks {
            self.metrics.fell_back(group.op_kind(), cause);
        }
        for (reply, result) in replies.into_iter().zip(batch.results) {
            reply.complete(result);
        }
    }

    /// One mb8 call over ECDSA signatures with keys on one curve: messages hashed here,
    /// digests (a keyless signer's requests) as they came.
    fn ecdsa_sign(&self, group: Vec<(CryptoOp, Reply)>) {
        let (ops, replies): (Vec<CryptoOp>, Vec<Reply>) = group.into_iter().unzip();
        let hashed: Vec<Option<aws_lc_rs::digest::Digest>> = ops
            .iter()
            .map(|op| match op {
                CryptoOp::Sign {
                    scheme, message, ..
                } => crate::scheme_digest(*scheme)
                    .ok()
                    .map(|alg| aws_lc_rs::digest::digest(alg, message)),
                _ => None,
            })
            .collect();
        let inputs: Vec<(&EcKey, &[u8])> = ops
            .iter()
            .zip(&hashed)
            .map(|(op, hashed)| {
                let (key, digest) = match op {
                    CryptoOp::Sign { key, .. } => {
                        (key, hashed.as_ref().map_or(&[][..], |d| d.as_ref()))
                    }
                    CryptoOp::SignDigest { key, digest, .. } => (key, digest.as_slice()),
                    _ => unreachable!("grouped signatures"),
                };
                match key.batch_key() {
                    Some(BatchKey::Ecdsa(k)) => (k, digest),
                    _ => unreachable!("grouped by ECDSA key"),
                }
            })
            .collect();
        let results = ecdsa::sign_digests_on(&*self.kernels, &inputs);
        for ((op, reply), result) in ops.into_iter().zip(replies).zip(results) {
            match result {
                Ok(signature) => reply.complete(Ok(CryptoOutput::Signature(signature))),
                Err(e) => reply.fall_back(op, e.into(), &self.metrics),
            }
        }
    }
}

impl Backend for MultibufferBackend {
    fn kind(&self) -> BackendKind {
        BackendKind::Multibuffer
    }

    fn max_batch(&self, _op: OpKind) -> usize {
        // Every operation kind has an 8-lane kernel.
        crypto_mb_sys::LANES
    }

    fn dispatch(&self, batch: Vec<Job>) {
        let jobs: Vec<(CryptoOp, Reply)> = batch.into_iter().map(Job::into_parts).collect();
        // A batch holds one operation kind (see `Backend::dispatch`).
        match jobs.first().map(|(op, _)| op.kind()) {
            Some(OpKind::RsaSign | OpKind::EcdsaSign) => self.sign_batch(jobs),
            Some(OpKind::X25519) => self.kx_batch(KxGroup::X25519, jobs),
            Some(OpKind::P256) => self.kx_batch(KxGroup::Secp256r1, jobs),
            Some(OpKind::P384) => self.kx_batch(KxGroup::Secp384r1, jobs),
            Some(OpKind::X25519MlKem768) => self.kx_batch(KxGroup::X25519MlKem768, jobs),
            // Never queued (see `Engine::submit`); scalar::compute answers with an error.
            Some(OpKind::RemoteSign) => self.scalar_all(jobs),
            None => {}
        }
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
            CryptoOp::Sign { key, .. } | CryptoOp::SignDigest { key, .. } => key
                .rsa_crt()
                .expect("lanes are made from keys with a CRT form"),
            _ => unreachable!("RSA lanes hold signatures"),
        }
    }
}
