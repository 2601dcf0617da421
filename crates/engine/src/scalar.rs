//! The scalar backend: every operation computed on the calling thread with aws-lc-rs.
//!
//! [`compute`] is also what the crypto threads run and what the handshake bridge falls back
//! to when no coroutine is active.

use aws_lc_rs::agreement::{self, UnparsedPublicKey};
use zeroize::Zeroizing;

use crate::backend::{Backend, BackendKind, Job};
use crate::hybrid;
use crate::op::{CryptoError, CryptoOp, CryptoOutput, KxGroup, KxPrivateKey, OpKind};

/// Computes one operation synchronously.
pub fn compute(op: CryptoOp) -> Result<CryptoOutput, CryptoError> {
    if hybrid::is_hybrid(&op) {
        let (kem, classical) = hybrid::split(op)?;
        return hybrid::join(kem, compute(classical));
    }
    match op {
        CryptoOp::Sign {
            key,
            scheme,
            message,
        } => key
            .sign_scalar(scheme, &message)
            .map(CryptoOutput::Signature),
        CryptoOp::SignDigest {
            key,
            scheme,
            digest,
        } => key
            .sign_digest_scalar(scheme, &digest)
            .map(CryptoOutput::Signature),
        // Only the keyless client can reach the key (the engine never queues these).
        CryptoOp::RemoteSign { .. } => Err(CryptoError::Remote(
            "a remote signature was asked of a local backend".into(),
        )),
        CryptoOp::KxGenerate { group } => {
            let (private_key, public) = generate(group)?;
            Ok(CryptoOutput::KeyPair {
                private_key,
                public,
            })
        }
        CryptoOp::KxAgree {
            group,
            private_key,
            peer_public,
        } => agree(group, &private_key, &peer_public).map(CryptoOutput::Shared),
        CryptoOp::KxGenerateAgree { group, peer_public } => {
            let (private_key, public) = generate(group)?;
            let shared = agree(group, &private_key, &peer_public)?;
            Ok(CryptoOutput::PublicAndShared { public, shared })
        }
    }
}

fn generate(group: KxGroup) -> Result<(KxPrivateKey, Vec<u8>), CryptoError> {
    let private = agreement::PrivateKey::generate(group.algorithm())
        .map_err(|_| CryptoError::KeyGenFailed(group.name()))?;
    let public = private
        .compute_public_key()
        .map_err(|_| CryptoError::KeyGenFailed(group.name()))?
        .as_ref()
        .to_vec();
    Ok((KxPrivateKey::AwsLc(private), public))
}

fn agree(
    group: KxGroup,
    private_key: &KxPrivateKey,
    peer_public: &[u8],
) -> Result<Zeroizing<Vec<u8>>, CryptoError> {
    let imported;
    let private = match private_key {
        KxPrivateKey::AwsLc(k) => k,
        KxPrivateKey::Raw(raw) => {
            imported = agreement::PrivateKey::from_private_key(group.algorithm(), &raw[..])
                .map_err(|_| CryptoError::KeyGenFailed(group.name()))?;
            &imported
        }
        KxPrivateKey::Hybrid(_) => return Err(CryptoError::KeyMismatch(group.name())),
    };
    // A NIST-curve share must be an uncompressed point (RFC 8446 section 4.2.8.2, RFC 8422
    // section 5.4.1); aws-lc also takes compressed and hybrid forms, which the multibuffer
    // path refuses: both backends answer alike.
    const UNCOMPRESSED: u8 = 4;
    if group.classical() != KxGroup::X25519 && peer_public.first() != Some(&UNCOMPRESSED) {
        return Err(CryptoError::BadPeerKey(group.name()));
    }
    let peer = UnparsedPublicKey::new(group.algorithm(), peer_public);
    agreement::agree(
        private,
        peer,
        CryptoError::BadPeerKey(group.name()),
        |secret| Ok(Zeroizing::new(secret.to_vec())),
    )
}

/// Computes each flushed request on the worker, one at a time: the nginx-like baseline.
#[derive(Debug, Default)]
pub struct ScalarBackend;

impl Backend for ScalarBackend {
    fn kind(&self) -> BackendKind {
        BackendKind::Scalar
    }

    fn max_batch(&self, _op: OpKind) -> usize {
        1
    }

    fn dispatch(&self, batch: Vec<Job>) {
        for job in batch {
            let (op, reply) = job.into_parts();
            reply.complete(compute(op));
        }
    }
}

/// Makes aws-lc seed its random generator now. Its first use in a process gathers CPU
/// jitter entropy, which stalls the calling thread for ~40 ms on these machines; done at
/// start-up, that cost does not land on the first handshake (or, in `terminus load`, on
/// every request scheduled during the stall).
pub fn warm_up_csprng() {
    let mut byte = [0u8; 1];
    // A failing generator fails the first handshake loudly; nothing to add here.
    let _ = aws_lc_rs::rand::fill(&mut byte);
}
