//! One interface over the batched key exchanges (X25519 and ECDH on P-256/P-384): fresh
//! private keys, public keys and shared secrets, in the byte forms TLS uses; and
//! [`compute_on`], which runs whole key-exchange requests (hybrids included) through them.

use aws_lc_rs::agreement;
use aws_lc_rs::encoding::{AsBigEndian, Curve25519SeedBin, EcPrivateKeyBin};
use aws_lc_rs::rand::{SecureRandom, SystemRandom};
use zeroize::Zeroizing;

use super::kernel::{CryptoMb, Kernels};
use super::nist::Curve;
use super::rsa::LaneError;
use super::{ecdh, x25519};
use crate::hybrid;
use crate::op::{CryptoError, CryptoOp, CryptoOutput, KxGroup, KxPrivateKey};
use crate::scalar;

fn curve(group: KxGroup) -> Option<Curve> {
    match group.classical() {
        KxGroup::Secp256r1 => Some(Curve::P256),
        KxGroup::Secp384r1 => Some(Curve::P384),
        KxGroup::X25519 | KxGroup::X25519MlKem768 => None,
    }
}

/// A private key for `group` from the OS CSPRNG: X25519's 32 random bytes, or a NIST
/// scalar uniform in [1, n-1] (big-endian).
pub fn random_private(group: KxGroup, rng: &SystemRandom) -> Option<Zeroizing<Vec<u8>>> {
    match curve(group) {
        None => {
            let mut k = Zeroizing::new(vec![0u8; x25519::KEY_LEN]);
            rng.fill(&mut k).ok()?;
            Some(k)
        }
        Some(c) => c.random_scalar(rng),
    }
}

/// The raw private key of an aws-lc-rs key (made by the scalar path), in the form
/// [`random_private`] gives.
pub fn raw_private(group: KxGroup, key: &agreement::PrivateKey) -> Option<Zeroizing<Vec<u8>>> {
    let raw = match curve(group) {
        None => AsBigEndian::<Curve25519SeedBin>::as_be_bytes(key)
            .ok()?
            .as_ref()
            .to_vec(),
        Some(_) => AsBigEndian::<EcPrivateKeyBin>::as_be_bytes(key)
            .ok()?
            .as_ref()
            .to_vec(),
    };
    let raw = Zeroizing::new(raw);
    let len = curve(group).map_or(x25519::KEY_LEN, Curve::byte_len);
    if raw.len() > len {
        return None;
    }
    // Left-pad a short big-endian scalar to the curve's length.
    let mut padded = Zeroizing::new(vec![0u8; len]);
    padded[len - raw.len()..].copy_from_slice(&raw);
    Some(padded)
}

/// Public keys of up to 8 private keys of `group`, one crypto_mb call.
pub fn public_keys(group: KxGroup, private_keys: &[&[u8]]) -> Vec<Result<Vec<u8>, LaneError>> {
    public_keys_on(&CryptoMb, group, private_keys)
}

/// [`public_keys`] on `kernels`.
pub(crate) fn public_keys_on(
    kernels: &dyn Kernels,
    group: KxGroup,
    private_keys: &[&[u8]],
) -> Vec<Result<Vec<u8>, LaneError>> {
    match curve(group) {
        None => x25519::public_keys_on(kernels, private_keys),
        Some(c) => ecdh::public_keys_on(kernels, c, private_keys),
    }
}

/// Shared secrets of up to 8 (private key, peer public key) pairs of `group`, one
/// crypto_mb call.
pub fn shared_secrets(
    group: KxGroup,
    pairs: &[(&[u8], &[u8])],
) -> Vec<Result<Zeroizing<Vec<u8>>, LaneError>> {
    shared_secrets_on(&CryptoMb, group, pairs)
}

/// [`shared_secrets`] on `kernels`.
pub(crate) fn shared_secrets_on(
    kernels: &dyn Kernels,
    group: KxGroup,
    pairs: &[(&[u8], &[u8])],
) -> Vec<Result<Zeroizing<Vec<u8>>, LaneError>> {
    match curve(group) {
        None => x25519::shared_secrets_on(kernels, pairs),
        Some(c) => ecdh::shared_secrets_on(kernels, c, pairs),
    }
}

/// What [`compute_on`] did with a batch.
pub(crate) struct KxBatch {
    /// Each request's result, in order.
    pub results: Vec<Result<CryptoOutput, CryptoError>>,
    /// Requests computed scalar instead: a key the scalar path made that cannot be
    /// imported.
    pub computed_scalar: usize,
    /// Requests a lane failed and the scalar path computed (see
    /// [`crate::FallbackCause`]): a fresh key's public half, or a shared secret the
    /// scalar path could compute (one it refuses too was the peer's bad key).
    pub fallbacks: Vec<crate::FallbackCause>,
}

/// Computes key-exchange requests of `group` together: one mb8 call per 8 public keys of
/// the requests that generate, one per 8 shared secrets of those that agree. A hybrid's
/// KEM parts are computed first, one by one, and its X25519 halves batched
/// ([`crate::hybrid`]).
pub(crate) fn compute_on(kernels: &dyn Kernels, group: KxGroup, ops: Vec<CryptoOp>) -> KxBatch {
    if group.kem().is_some() {
        let mut kem_parts = Vec::with_capacity(ops.len());
        let mut classical = Vec::with_capacity(ops.len());
        for op in ops {
            match hybrid::split(op) {
                Ok((kem, op)) => {
                    kem_parts.push(Ok(kem));
                    classical.push(op);
                }
                Err(e) => kem_parts.push(Err(e)),
            }
        }
        let inner = compute_on(kernels, group.classical(), classical);
        let mut results = inner.results.into_iter();
        let joined = kem_parts
            .into_iter()
            .map(|kem| {
                // A request refused by its KEM part has no classical half.
                let kem = kem?;
                let classical = results.next().expect("one result per classical request");
                hybrid::join(kem, classical)
            })
            .collect();
        return KxBatch {
            results: joined,
            ..inner
        };
    }
    let rng = SystemRandom::new();
    let mut results: Vec<Option<Result<CryptoOutput, CryptoError>>> =
        (0..ops.len()).map(|_| None).collect();
    let mut computed_scalar = 0;
    let mut fallbacks = Vec::new();
    let mut lanes = Vec::with_capacity(ops.len());
    for (slot, op) in ops.into_iter().enumerate() {
        let existing = match &op {
            CryptoOp::KxAgree { private_key, .. } => Some(private_key),
            _ => None,
        };
        let private = match existing {
            None => match random_private(group, &rng) {
                Some(fresh) => fresh,
                None => {
                    results[slot] = Some(Err(CryptoError::KeyGenFailed(group.name())));
                    continue;
                }
            },
            Some(KxPrivateKey::Raw(raw)) => raw.clone(),
            // A key the scalar path made.
            Some(KxPrivateKey::AwsLc(k)) => match raw_private(group, k) {
                Some(raw) => raw,
                None => {
                    computed_scalar += 1;
                    results[slot] = Some(scalar::compute(op));
                    continue;
                }
            },
            Some(KxPrivateKey::Hybrid(_)) => {
                results[slot] = Some(Err(CryptoError::KeyMismatch(group.name())));
                continue;
            }
        };
        lanes.push(Lane {
            slot,
            generate: existing.is_none(),
            op,
            private,
        });
    }
    let mut publics: Vec<Option<Result<Vec<u8>, LaneError>>> = vec![None; lanes.len()];
    let generating: Vec<usize> = (0..lanes.len()).filter(|&i| lanes[i].generate).collect();
    for chunk in generating.chunks(crypto_mb_sys::LANES) {
        let keys: Vec<&[u8]> = chunk.iter().map(|&i| lanes[i].private.as_slice()).collect();
        for (&i, public) in chunk.iter().zip(public_keys_on(kernels, group, &keys)) {
            publics[i] = Some(public);
        }
    }
    let mut shared = vec![None; lanes.len()];
    let agreeing: Vec<usize> = (0..lanes.len())
        .filter(|&i| lanes[i].peer_public().is_some())
        .collect();
    for chunk in agreeing.chunks(crypto_mb_sys::LANES) {
        let pairs: Vec<(&[u8], &[u8])> = chunk
            .iter()
            .map(|&i| {
                let peer = lanes[i].peer_public().expect("filtered to agreeing lanes");
                (lanes[i].private.as_slice(), peer)
            })
            .collect();
        for (&i, secret) in chunk.iter().zip(shared_secrets_on(kernels, group, &pairs)) {
            shared[i] = Some(secret);
        }
    }
    for (i, lane) in lanes.into_iter().enumerate() {
        let (public, secret) = (publics[i].take(), shared[i].take());
        // Inputs the lane refused before the call are the peer's; any other lane failure
        // may be the kernel's, and the scalar path says which.
        let fault = match (&public, &secret) {
            (Some(Err(e)), _) => Some(*e),
            (_, Some(Err(e))) if *e != LaneError::BadInput => Some(*e),
            _ => None,
        };
        if let Some(fault) = fault {
            let result = scalar::compute(lane.op);
            if result.is_ok() {
                fallbacks.push(fault.into());
            }
            results[lane.slot] = Some(result);
            continue;
        }
        let public = public.map(|p| p.map_err(|_| CryptoError::KeyGenFailed(group.name())));
        let secret = secret.map(|s| s.map_err(|_| CryptoError::BadPeerKey(group.name())));
        results[lane.slot] = Some(match lane.op {
            CryptoOp::KxGenerate { .. } => {
                public
                    .expect("generated")
                    .map(|public| CryptoOutput::KeyPair {
                        private_key: KxPrivateKey::Raw(lane.private),
                        public,
                    })
            }
            CryptoOp::KxGenerateAgree { .. } => public.expect("generated").and_then(|public| {
                secret
                    .expect("agreed")
                    .map(|shared| CryptoOutput::PublicAndShared { public, shared })
            }),
            CryptoOp::KxAgree { .. } => secret.expect("agreed").map(CryptoOutput::Shared),
            CryptoOp::Sign { .. } | CryptoOp::SignDigest { .. } | CryptoOp::RemoteSign { .. } => {
                unreachable!("key-exchange batches hold no signatures")
            }
        });
    }
    let results = results
        .into_iter()
        .map(|r| r.expect("every request answered"))
        .collect();
    KxBatch {
        results,
        computed_scalar,
        fallbacks,
    }
}

/// What one key-exchange request needs from the kernels.
struct Lane {
    /// Where its result goes in the answer.
    slot: usize,
    op: CryptoOp,
    private: Zeroizing<Vec<u8>>,
    /// This lane's private key is fresh: its public key must be computed.
    generate: bool,
}

impl Lane {
    fn peer_public(&self) -> Option<&[u8]> {
        match &self.op {
            CryptoOp::KxAgree { peer_public, .. }
            | CryptoOp::KxGenerateAgree { peer_public, .. } => Some(peer_public),
            _ => None,
        }
    }
}
