//! One interface over the batched key exchanges (X25519 and ECDH on P-256/P-384): fresh
//! private keys, public keys and shared secrets, in the byte forms TLS uses.

use aws_lc_rs::agreement;
use aws_lc_rs::encoding::{AsBigEndian, Curve25519SeedBin, EcPrivateKeyBin};
use aws_lc_rs::rand::{SecureRandom, SystemRandom};
use zeroize::Zeroizing;

use super::kernel::{CryptoMb, Kernels};
use super::nist::Curve;
use super::rsa::LaneError;
use super::{ecdh, x25519};
use crate::op::KxGroup;

fn curve(group: KxGroup) -> Option<Curve> {
    match group {
        KxGroup::X25519 => None,
        KxGroup::Secp256r1 => Some(Curve::P256),
        KxGroup::Secp384r1 => Some(Curve::P384),
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
