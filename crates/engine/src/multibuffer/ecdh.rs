//! ECDH on P-256 and P-384, 8 lanes at a time: ephemeral public keys (uncompressed
//! points, as TLS sends them) and shared secrets (the x coordinate, RFC 8446 7.4.2).
//!
//! Peer points are checked here (encoding, coordinates below p) and by crypto_mb (on the
//! curve); a bad point fails its own lane only.

use crypto_mb_sys as mb;
use zeroize::Zeroizing;

use super::nist::{limbs_to_be, Curve};
use super::pick;
use super::rsa::LaneError;

type PublicKeyFn = unsafe extern "C" fn(
    *const *mut u64,
    *const *mut u64,
    *const *mut u64,
    *const *const u64,
    *mut u8,
) -> mb::mbx_status;
type EcdhFn = unsafe extern "C" fn(
    *const *mut u8,
    *const *const u64,
    *const *const u64,
    *const *const u64,
    *const *const u64,
    *mut u8,
) -> mb::mbx_status;

fn kernels(curve: Curve) -> (PublicKeyFn, EcdhFn) {
    match curve {
        Curve::P256 => (mb::mbx_nistp256_ecpublic_key_mb8, mb::mbx_nistp256_ecdh_mb8),
        Curve::P384 => (mb::mbx_nistp384_ecpublic_key_mb8, mb::mbx_nistp384_ecdh_mb8),
    }
}

/// The uncompressed public points (0x04 || x || y) of up to 8 private scalars
/// (big-endian, in [1, n-1]).
pub fn public_keys(curve: Curve, private_keys: &[&[u8]]) -> Vec<Result<Vec<u8>, LaneError>> {
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
    let (x_base, y_base) = (x.as_mut_ptr(), y.as_mut_ptr());
    let x_out: [*mut u64; mb::LANES] = std::array::from_fn(|i| x_base.wrapping_add(i * limbs));
    let y_out: [*mut u64; mb::LANES] = std::array::from_fn(|i| y_base.wrapping_add(i * limbs));
    let skey: [*const u64; mb::LANES] = std::array::from_fn(|i| {
        scalars[pick(&valid, filler, i)]
            .as_ref()
            .expect("picked lanes are valid")
            .as_ptr()
    });
    let (public_key_mb8, _) = kernels(curve);
    // SAFETY: 8 pointers each to scalars of the curve's limb count (made by `limbs_of`)
    // and to `limbs`-limb outputs inside `x`/`y`. A null `pa_pubz` asks for affine
    // coordinates; the scratch buffer is unused by the NIST curve code. Nothing is
    // retained.
    let status = unsafe {
        public_key_mb8(
            x_out.as_ptr(),
            y_out.as_ptr(),
            std::ptr::null(),
            skey.as_ptr(),
            std::ptr::null_mut(),
        )
    };
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
    let base = out.as_mut_ptr();
    let to: [*mut u8; mb::LANES] = std::array::from_fn(|i| base.wrapping_add(i * len));
    let skey: [*const u64; mb::LANES] = std::array::from_fn(|i| input(i).0.as_ptr());
    let px: [*const u64; mb::LANES] = std::array::from_fn(|i| input(i).1 .0.as_ptr());
    let py: [*const u64; mb::LANES] = std::array::from_fn(|i| input(i).1 .1.as_ptr());
    let (_, ecdh_mb8) = kernels(curve);
    // SAFETY: 8 pointers each to a scalar and affine peer coordinates of the curve's limb
    // count (made by `limbs_of`) and to `len`-byte outputs inside `out`. A null `pa_pubz`
    // means affine input; the scratch buffer is unused. Nothing is retained.
    let status = unsafe {
        ecdh_mb8(
            to.as_ptr(),
            skey.as_ptr(),
            px.as_ptr(),
            py.as_ptr(),
            std::ptr::null(),
            std::ptr::null_mut(),
        )
    };
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
