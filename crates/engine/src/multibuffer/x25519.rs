//! X25519 (RFC 7748), 8 lanes at a time: public keys and shared secrets.

use crypto_mb_sys as mb;
use zeroize::Zeroizing;

use super::pick;
use super::rsa::LaneError;

pub const KEY_LEN: usize = 32;

/// The public keys of up to 8 private keys (32 bytes each; other lengths fail their lane).
pub fn public_keys(private_keys: &[&[u8]]) -> Vec<Result<Vec<u8>, LaneError>> {
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
    let mut out = [[0u8; KEY_LEN]; mb::LANES];
    let base = out.as_mut_ptr();
    let to: [*mut u8; mb::LANES] = std::array::from_fn(|i| base.wrapping_add(i) as *mut u8);
    let from: [*const u8; mb::LANES] =
        std::array::from_fn(|i| private_keys[pick(&valid, filler, i)].as_ptr());
    // SAFETY: 8 input pointers to 32-byte private keys (lengths checked above; invalid
    // lanes carry a valid lane's input) and 8 output pointers into `out`, 32 bytes each;
    // crypto_mb reads and writes exactly that and keeps nothing.
    let status = unsafe { mb::mbx_x25519_public_key_mb8(to.as_ptr(), from.as_ptr()) };
    (0..private_keys.len())
        .map(|i| {
            if !valid[i] {
                return Err(LaneError::BadInput);
            }
            match mb::lane_status(status, i) {
                mb::MBX_STATUS_OK => Ok(out[i].to_vec()),
                st => Err(LaneError::Status(st)),
            }
        })
        .collect()
}

/// Shared secrets for up to 8 (private key, peer public key) pairs. A key of the wrong
/// length, or a peer key giving the all-zero secret (low order), fails its lane only.
pub fn shared_secrets(pairs: &[(&[u8], &[u8])]) -> Vec<Result<Zeroizing<Vec<u8>>, LaneError>> {
    assert!(!pairs.is_empty() && pairs.len() <= mb::LANES, "1..=8 lanes");
    let valid: Vec<bool> = pairs
        .iter()
        .map(|(private, peer)| private.len() == KEY_LEN && peer.len() == KEY_LEN)
        .collect();
    let Some(filler) = valid.iter().position(|&v| v) else {
        return pairs.iter().map(|_| Err(LaneError::BadInput)).collect();
    };
    let mut out = Zeroizing::new([[0u8; KEY_LEN]; mb::LANES]);
    let base = out.as_mut_ptr();
    let to: [*mut u8; mb::LANES] = std::array::from_fn(|i| base.wrapping_add(i) as *mut u8);
    let private: [*const u8; mb::LANES] =
        std::array::from_fn(|i| pairs[pick(&valid, filler, i)].0.as_ptr());
    let public: [*const u8; mb::LANES] =
        std::array::from_fn(|i| pairs[pick(&valid, filler, i)].1.as_ptr());
    // SAFETY: 8 pointers each to 32-byte private keys, 32-byte peer keys (lengths checked
    // above; invalid lanes carry a valid lane's inputs) and 32-byte outputs in `out`.
    let status = unsafe { mb::mbx_x25519_mb8(to.as_ptr(), private.as_ptr(), public.as_ptr()) };
    (0..pairs.len())
        .map(|i| {
            if !valid[i] {
                return Err(LaneError::BadInput);
            }
            match mb::lane_status(status, i) {
                mb::MBX_STATUS_OK if out[i] != [0u8; KEY_LEN] => {
                    Ok(Zeroizing::new(out[i].to_vec()))
                }
                mb::MBX_STATUS_OK => Err(LaneError::Status(mb::MBX_STATUS_LOW_ORDER_ERR)),
                st => Err(LaneError::Status(st)),
            }
        })
        .collect()
}
