//! ECDSA P-256 and P-384 signatures, 8 lanes at a time. Every signature gets its own nonce, drawn
//! uniformly from [1, n-1] by the CSPRNG (rejection sampling); nonces are never reused
//! and are zeroized after use.

use aws_lc_rs::digest;
use aws_lc_rs::rand::SystemRandom;
use crypto_mb_sys as mb;
use zeroize::Zeroizing;

use super::der::ec_private_key;
use super::nist::Curve;
use super::rsa::LaneError;

/// An ECDSA private scalar as crypto_mb takes it: little-endian limbs.
pub struct EcKey {
    curve: Curve,
    scalar: Zeroizing<Vec<u64>>,
}

impl EcKey {
    /// From PKCS#8 or SEC1 DER of a key on `curve`.
    pub fn from_der(curve: Curve, der: &[u8]) -> Option<Self> {
        let private = ec_private_key(der)?;
        let start = private.len().saturating_sub(curve.byte_len());
        if private[..start].iter().any(|&b| b != 0) {
            return None;
        }
        let mut padded = Zeroizing::new(vec![0u8; curve.byte_len()]);
        padded[curve.byte_len() - (private.len() - start)..].copy_from_slice(&private[start..]);
        if !curve.is_valid_scalar(&padded) {
            return None;
        }
        Some(Self {
            curve,
            scalar: curve.limbs_of(&padded)?,
        })
    }

    pub fn curve(&self) -> Curve {
        self.curve
    }
}

impl std::fmt::Debug for EcKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "EcKey({})", self.curve.name())
    }
}

/// The TLS pairing of curve and hash (TLS 1.3's ecdsa_secp256r1_sha256 and
/// ecdsa_secp384r1_sha384).
fn digest_algorithm(curve: Curve) -> &'static digest::Algorithm {
    match curve {
        Curve::P256 => &digest::SHA256,
        Curve::P384 => &digest::SHA384,
    }
}

/// ECDSA signatures of `messages` (unhashed; SHA-256 on P-256, SHA-384 on P-384),
/// DER-encoded as TLS sends them. All keys must be on one curve.
pub fn sign(lanes: &[(&EcKey, &[u8])]) -> Vec<Result<Vec<u8>, LaneError>> {
    assert!(!lanes.is_empty() && lanes.len() <= mb::LANES, "1..=8 lanes");
    let curve = lanes[0].0.curve;
    assert!(
        lanes.iter().all(|(k, _)| k.curve == curve),
        "one curve per batch"
    );
    let len = curve.byte_len();
    let rng = SystemRandom::new();
    let digests: Vec<digest::Digest> = lanes
        .iter()
        .map(|(_, m)| digest::digest(digest_algorithm(curve), m))
        .collect();
    let nonces: Vec<Option<Zeroizing<Vec<u64>>>> = lanes
        .iter()
        .map(|_| curve.random_scalar(&rng).and_then(|k| curve.limbs_of(&k)))
        .collect();
    let Some(filler) = nonces.iter().position(Option::is_some) else {
        return lanes.iter().map(|_| Err(LaneError::BadInput)).collect();
    };
    let pick = |i: usize| {
        if i < lanes.len() && nonces[i].is_some() {
            i
        } else {
            filler
        }
    };
    let mut r = vec![0u8; mb::LANES * len];
    let mut s = vec![0u8; mb::LANES * len];
    let (r_base, s_base) = (r.as_mut_ptr(), s.as_mut_ptr());
    let r_out: [*mut u8; mb::LANES] = std::array::from_fn(|i| r_base.wrapping_add(i * len));
    let s_out: [*mut u8; mb::LANES] = std::array::from_fn(|i| s_base.wrapping_add(i * len));
    let msg: [*const u8; mb::LANES] = std::array::from_fn(|i| digests[pick(i)].as_ref().as_ptr());
    let eph: [*const u64; mb::LANES] = std::array::from_fn(|i| {
        nonces[pick(i)]
            .as_ref()
            .expect("picked lanes have a nonce")
            .as_ptr()
    });
    let reg: [*const u64; mb::LANES] = std::array::from_fn(|i| lanes[pick(i)].0.scalar.as_ptr());
    let sign_mb8 = match curve {
        Curve::P256 => mb::mbx_nistp256_ecdsa_sign_mb8,
        Curve::P384 => mb::mbx_nistp384_ecdsa_sign_mb8,
    };
    // SAFETY: 8 pointers each to digests of the curve's length (SHA-256 for P-256,
    // SHA-384 for P-384), nonces and keys of its limb count (made by `limbs_of`) and
    // `len`-byte outputs inside `r`/`s`; the scratch buffer is unused by crypto_mb's NIST
    // curve code, so null is allowed. Nothing is retained.
    let status = unsafe {
        sign_mb8(
            r_out.as_ptr(),
            s_out.as_ptr(),
            msg.as_ptr(),
            eph.as_ptr(),
            reg.as_ptr(),
            std::ptr::null_mut(),
        )
    };
    (0..lanes.len())
        .map(|i| {
            if nonces[i].is_none() {
                return Err(LaneError::BadInput);
            }
            match mb::lane_status(status, i) {
                mb::MBX_STATUS_OK => Ok(der_signature(
                    &r[i * len..(i + 1) * len],
                    &s[i * len..(i + 1) * len],
                )),
                st => Err(LaneError::Status(st)),
            }
        })
        .collect()
}

/// `SEQUENCE { INTEGER r, INTEGER s }` with minimal integer encodings.
fn der_signature(r: &[u8], s: &[u8]) -> Vec<u8> {
    fn integer(out: &mut Vec<u8>, v: &[u8]) {
        let start = v.iter().position(|&b| b != 0).unwrap_or(v.len() - 1);
        let v = &v[start..];
        let pad = v[0] & 0x80 != 0;
        out.push(0x02);
        out.push((v.len() + pad as usize) as u8);
        if pad {
            out.push(0);
        }
        out.extend_from_slice(v);
    }
    let mut body = Vec::with_capacity(2 * r.len() + 8);
    integer(&mut body, r);
    integer(&mut body, s);
    let mut out = Vec::with_capacity(body.len() + 2);
    out.push(0x30);
    out.push(body.len() as u8);
    out.extend_from_slice(&body);
    out
}
