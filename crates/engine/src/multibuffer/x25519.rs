//! X25519 (RFC 7748), 8 lanes at a time: public keys and shared secrets.

use crypto_mb_sys as mb;
use zeroize::Zeroizing;

use super::kernel::{split_lanes, CryptoMb, Kernels};
use super::pick;
use super::rsa::LaneError;

/// X25519 keys and shared secrets are 32 bytes.
pub const KEY_LEN: usize = 32;

/// The public keys of up to 8 private keys (32 bytes each; other lengths fail their lane).
pub fn public_keys(private_keys: &[&[u8]]) -> Vec<Result<Vec<u8>, LaneError>> {
    public_keys_on(&CryptoMb, private_keys)
}

/// [`public_keys`] on `kernels`.
pub(crate) fn public_keys_on(
    kernels: &dyn Kernels,
    private_keys: &[&[u8]],
) -> Vec<Result<Vec<u8>, LaneError>> {
    assert!(
        !private_keys.is_empty() && private_keys.len() <= mb::LANES,
        "1..=8 lanes"
    );
    let valid: Vec<bool> = private_keys.iter().map(|k| k.len() == KEY_LEN).collect();
    let Some(filler) = valid.iter().position(|&v| v) else {
        return private_keys
            .iter()
            .map(|_| Err(LaneError::BadInput))
            .collect();
    };
    let mut out = vec![0u8; mb::LANES * KEY_LEN];
    let status = kernels.x25519_public_key(
        std::array::from_fn(|i| private_keys[pick(&valid, filler, i)]),
        split_lanes(&mut out, KEY_LEN),
    );
    (0..private_keys.len())
        .map(|i| {
            if !valid[i] {
                return Err(LaneError::BadInput);
            }
            match mb::lane_status(status, i) {
                mb::MBX_STATUS_OK => Ok(out[i * KEY_LEN..(i + 1) * KEY_LEN].to_vec()),
                st => Err(LaneError::Status(st)),
            }
        })
        .collect()
}

/// Shared secrets for up to 8 (private key, peer public key) pairs. A key of the wrong
/// length, or a peer key giving the all-zero secret (low order), fails its lane only.
pub fn shared_secrets(pairs: &[(&[u8], &[u8])]) -> Vec<Result<Zeroizing<Vec<u8>>, LaneError>> {
    shared_secrets_on(&CryptoMb, pairs)
}

/// [`shared_secrets`] on `kernels`.
pub(crate) fn shared_secrets_on(
    kernels: &dyn Kernels,
    pairs: &[(&[u8], &[u8])],
) -> Vec<Result<Zeroizing<Vec<u8>>, LaneError>> {
    assert!(!pairs.is_empty() && pairs.len() <= mb::LANES, "1..=8 lanes");
    let valid: Vec<bool> = pairs
        .iter()
        .map(|(private, peer)| private.len() == KEY_LEN && peer.len() == KEY_LEN)
        .collect();
    let Some(filler) = valid.iter().position(|&v| v) else {
        return pairs.iter().map(|_| Err(LaneError::BadInput)).collect();
    };
    let lane = |i: usize| pairs[pick(&valid, filler, i)];
    let mut out = Zeroizing::new(vec![0u8; mb::LANES * KEY_LEN]);
    let status = kernels.x25519(
        std::array::from_fn(|i| lane(i).0),
        std::array::from_fn(|i| lane(i).1),
        split_lanes(&mut out, KEY_LEN),
    );
    (0..pairs.len())
        .map(|i| {
            if !valid[i] {
                return Err(LaneError::BadInput);
            }
            let secret = &out[i * KEY_LEN..(i + 1) * KEY_LEN];
            match mb::lane_status(status, i) {
                mb::MBX_STATUS_OK if secret.iter().any(|&b| b != 0) => {
                    Ok(Zeroizing::new(secret.to_vec()))
                }
                mb::MBX_STATUS_OK => Err(LaneError::Status(mb::MBX_STATUS_LOW_ORDER_ERR)),
                st => Err(LaneError::Status(st)),
            }
        })
        .collect()
}
