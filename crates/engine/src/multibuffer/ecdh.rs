//! ECDH on P-256 and P-384, 8 lanes at a time: ephemeral public keys (uncompressed
//! points, as TLS sends them) and shared secrets (the x coordinate, RFC 8446 7.4.2).
//!
//! Peer points are checked here (encoding, coordinates below p) and by crypto_mb (on the
//! curve); a bad point fails its own lane only.

use crypto_mb_sys as mb;
use zeroize::Zeroizing;

use super::kernel::{split_lanes, CryptoMb, Kernels};
use super::nist::{limbs_to_be, Curve};
use super::pick;
use super::rsa::LaneError;

/// The uncompressed public points (0x04 || x || y) of up to 8 private scalars
/// (big-endian, in [1, n-1]).
pub fn public_keys(curve: Curve, private_keys: &[&[u8]]) -> Vec<Result<Vec<u8>, LaneError>> {
    public_keys_on(&CryptoMb, curve, private_keys)
}

/// [`public_keys`] on `kernels`.
pub(crate) fn public_keys_on(
    kernels: &dyn Kernels,
    curve: Curve,
    private_keys: &[&[u8]],
) -> Vec<Result<Vec<u8>, LaneError>> {
    assert!(
        !private_keys.is_empty() && private_keys.len() <= mb::LANES,
        "1..=8 lanes"
    );
    let scalars: Vec<Option<Limbs>> = private_keys
        .iter()
        .map(|k| {
            curve
                .is_valid_scalar(k)
                .then(|| curve.limbs_of(k))
                .flatten()
        })
        .collect();
    let valid: Vec<bool> = scalars.iter().map(Option::is_some).collect();
    let Some(filler) = valid.iter().position(|&v| v) else {
        return private_keys
            .iter()
            .map(|_| Err(LaneError::BadInput))
            .collect();
    };
    let limbs = curve.limbs();
    let mut x = vec![0u64; mb::LANES * limbs];
    let mut y = vec![0u64; mb::LANES * limbs];
    let status = kernels.ec_public_key(
        curve,
        std::array::from_fn(|i| {
            scalars[pick(&valid, filler, i)]
                .as_ref()
                .expect("picked lanes are valid")
                .as_slice()
        }),
        split_lanes(&mut x, limbs),
        split_lanes(&mut y, limbs),
    );
    (0..private_keys.len())
        .map(|i| {
            if !valid[i] {
                return Err(LaneError::BadInput);
            }
            match mb::lane_status(status, i) {
                mb::MBX_STATUS_OK => {
                    let mut point = Vec::with_capacity(1 + 2 * curve.byte_len());
                    point.push(0x04);
                    point.extend(limbs_to_be(
                        &x[i * limbs..(i + 1) * limbs],
                        curve.byte_len(),
                    ));
                    point.extend(limbs_to_be(
                        &y[i * limbs..(i + 1) * limbs],
                        curve.byte_len(),
                    ));
                    Ok(point)
                }
                st => Err(LaneError::Status(st)),
            }
        })
        .collect()
}

/// Little-endian limbs of a scalar or coordinate.
type Limbs = Zeroizing<Vec<u64>>;

/// A peer's uncompressed point as (x, y) limbs, if it is well formed with coordinates
/// below p.
fn peer_point(curve: Curve, encoded: &[u8]) -> Option<(Limbs, Limbs)> {
    let len = curve.byte_len();
    if encoded.len() != 1 + 2 * len || encoded[0] != 0x04 {
        return None;
    }
    let (x, y) = encoded[1..].split_at(len);
    if x >= curve.prime() || y >= curve.prime() {
        return None;
    }
    Some((curve.limbs_of(x)?, curve.limbs_of(y)?))
}

/// Shared secrets for up to 8 (private scalar, peer's uncompressed point) pairs.
pub fn shared_secrets(
    curve: Curve,
    pairs: &[(&[u8], &[u8])],
) -> Vec<Result<Zeroizing<Vec<u8>>, LaneError>> {
    shared_secrets_on(&CryptoMb, curve, pairs)
}

/// [`shared_secrets`] on `kernels`.
pub(crate) fn shared_secrets_on(
    kernels: &dyn Kernels,
    curve: Curve,
    pairs: &[(&[u8], &[u8])],
) -> Vec<Result<Zeroizing<Vec<u8>>, LaneError>> {
    assert!(!pairs.is_empty() && pairs.len() <= mb::LANES, "1..=8 lanes");
    type Lane = (Limbs, (Limbs, Limbs));
    let inputs: Vec<Option<Lane>> = pairs
        .iter()
        .map(|(private, peer)| {
            let scalar = curve
                .is_valid_scalar(private)
                .then(|| curve.limbs_of(private))
                .flatten()?;
            Some((scalar, peer_point(curve, peer)?))
        })
        .collect();
    let valid: Vec<bool> = inputs.iter().map(Option::is_some).collect();
    let Some(filler) = valid.iter().position(|&v| v) else {
        return pairs.iter().map(|_| Err(LaneError::BadInput)).collect();
    };
    let input = |i: usize| {
        inputs[pick(&valid, filler, i)]
            .as_ref()
            .expect("picked lanes are valid")
    };
    let len = curve.byte_len();
    let mut out = Zeroizing::new(vec![0u8; mb::LANES * len]);
    let status = kernels.ecdh(
        curve,
        std::array::from_fn(|i| input(i).0.as_slice()),
        std::array::from_fn(|i| input(i).1 .0.as_slice()),
        std::array::from_fn(|i| input(i).1 .1.as_slice()),
        split_lanes(&mut out, len),
    );
    (0..pairs.len())
        .map(|i| {
            if !valid[i] {
                return Err(LaneError::BadInput);
            }
            match mb::lane_status(status, i) {
                mb::MBX_STATUS_OK => Ok(Zeroizing::new(out[i * len..(i + 1) * len].to_vec())),
                st => Err(LaneError::Status(st)),
            }
        })
        .collect()
}
