//! The `multibuffer` backend: batches of up to 8 operations computed in one crypto_mb
//! call (AVX-512 IFMA), small batches and operations without a batched form computed
//! scalar on the worker.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use crate::backend::{Backend, BackendKind, Job, Reply};
use crate::metrics::EngineMetrics;
use crate::multibuffer::emsa::Encoding;
use crate::multibuffer::rsa::{self, RsaCrtKey};
use crate::op::{CryptoError, CryptoOp, CryptoOutput, OpKind};
use crate::scalar;

/// Batches smaller than this are computed scalar. RSA-2048 here: one scalar signature
/// costs ~0.3 ms and an mb8 call ~1.0 ms whatever its lane count, so 4 lanes and up pay.
pub const RSA_CROSSOVER: usize = 4;

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

    /// Signs a batch of RSA requests: grouped by key size, encoded, one mb8 call each.
    fn rsa_batch(&self, jobs: Vec<(CryptoOp, Reply)>) {
        if jobs.len() < RSA_CROSSOVER {
            for (op, reply) in jobs {
                self.scalar(op, reply);
            }
            return;
        }
        let mut groups: Vec<(usize, Vec<(CryptoOp, Reply, Vec<u8>)>)> = Vec::new();
        for (op, reply) in jobs {
            let encoded = match &op {
                CryptoOp::Sign {
                    key,
                    scheme,
                    message,
                } => key.rsa_crt().and_then(|crt| {
                    Encoding::for_scheme(*scheme)
                        .and_then(|e| e.encode(message, crt.bits()))
                        .map(|em| (crt.bits(), em))
                }),
                _ => None,
            };
            match encoded {
                Some((bits, em)) => match groups.iter_mut().find(|(b, _)| *b == bits) {
                    Some((_, g)) => g.push((op, reply, em)),
                    None => groups.push((bits, vec![(op, reply, em)])),
                },
                None => self.scalar(op, reply),
            }
        }
        for (bits, group) in groups {
            let crt_keys: Vec<&RsaCrtKey> = group
                .iter()
                .map(|(op, _, _)| match op {
                    CryptoOp::Sign { key, .. } => {
                        key.rsa_crt().expect("grouped keys have a CRT form")
                    }
                    _ => unreachable!("only signatures are grouped"),
                })
                .collect();
            let lanes: Vec<(&RsaCrtKey, &[u8])> = crt_keys
                .iter()
                .zip(&group)
                .map(|(k, (_, _, em))| (*k, em.as_slice()))
                .collect();
            let results = rsa::private_crt(bits, &lanes);
            for ((_, reply, _), result) in group.into_iter().zip(results) {
                reply.complete(
                    result
                        .map(CryptoOutput::Signature)
                        .map_err(|_| CryptoError::SignFailed),
                );
            }
        }
    }
}

impl Backend for MultibufferBackend {
    fn kind(&self) -> BackendKind {
        BackendKind::Multibuffer
    }

    fn max_batch(&self, op: OpKind) -> usize {
        match op {
            OpKind::RsaSign => crypto_mb_sys::LANES,
            _ => 1,
        }
    }

    fn dispatch(&self, batch: Vec<Job>) -> Pin<Box<dyn Future<Output = ()> + '_>> {
        let mut rsa_jobs = Vec::new();
        for job in batch {
            let (op, reply) = job.into_parts();
            match op.kind() {
                OpKind::RsaSign => rsa_jobs.push((op, reply)),
                _ => self.scalar(op, reply),
            }
        }
        if !rsa_jobs.is_empty() {
            self.rsa_batch(rsa_jobs);
        }
        Box::pin(std::future::ready(()))
    }
}
