//! ECDSA P-256 and P-384 signatures, 8 lanes at a time. Every signature gets its own nonce, drawn
//! uniformly from [1, n-1] by the CSPRNG (rejection sampling); nonces are never reused
//! and are zeroized after use.

use aws_lc_rs::digest;
use aws_lc_rs::rand::SystemRandom;
use crypto_mb_sys as mb;
use zeroize::Zeroizing;

use super::der::ec_private_key;
use super::kernel::{split_lanes, CryptoMb, Kernels};
use super::nist::Curve;
use super::pick;
use super::rsa::LaneError;

/// An ECDSA private scalar as crypto_mb takes it: little-endian limbs.
pub struct EcKey {
    curve: Curve,
    scalar: Zeroizing<Vec<u64>>,
}

impl EcKey {
    /// From PKCS#8 or SEC1 DER of a key on `curve`. A key that names another curve is
    /// refused. A key that names none (SEC1 without parameters) must have a scalar of the
    /// curve's length (RFC 5915), since a shorter curve's scalar is also a valid scalar of
    /// a longer one and would sign wrongly; one that names `curve` may have dropped leading
    /// zero bytes, as some encoders do.
    pub fn from_der(curve: Curve, der: &[u8]) -> Option<Self> {
        let key = ec_private_key(der)?;
        let len = key.scalar.len();
        let fits = match key.curve {
            Some(oid) => oid == curve.oid() && len <= curve.byte_len(),
            None => len == curve.byte_len(),
        };
        if !fits {
            return None;
        }
        let mut padded = Zeroizing::new(vec![0u8; curve.byte_len()]);
        padded[curve.byte_len() - len..].copy_from_slice(&key.scalar);
        if !curve.is_valid_scalar(&padded) {
            return None;
        }
        Some(Self {
            curve,
            scalar: curve.limbs_of(&padded)?,
        })
    }

    /// The key's curve.
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
    sign_on(&CryptoMb, lanes)
}

/// [`sign`] on `kernels`.
pub(crate) fn sign_on(
    kernels: &dyn Kernels,
    lanes: &[(&EcKey, &[u8])],
) -> Vec<Result<Vec<u8>, LaneError>> {
    let digests: Vec<digest::Digest> = lanes
        .iter()
        .map(|(k, m)| digest::digest(digest_algorithm(k.curve), m))
        .collect();
    let lanes: Vec<(&EcKey, &[u8])> = lanes
        .iter()
        .zip(&digests)
        .map(|((k, _), d)| (*k, d.as_ref()))
        .collect();
    sign_digests_on(kernels, &lanes)
}

/// ECDSA signatures of digests made by each key's curve's hash (a keyless signer's
/// requests), on `kernels`; a digest of another length is refused as bad input.
pub(crate) fn sign_digests_on(
    kernels: &dyn Kernels,
    lanes: &[(&EcKey, &[u8])],
) -> Vec<Result<Vec<u8>, LaneError>> {
    assert!(!lanes.is_empty() && lanes.len() <= mb::LANES, "1..=8 lanes");
    let curve = lanes[0].0.curve;
    assert!(
        lanes.iter().all(|(k, _)| k.curve == curve),
        "one curve per batch"
    );
    let len = curve.byte_len();
    let rng = SystemRandom::new();
    let hash_len = digest_algorithm(curve).output_len();
    let digests: Vec<&[u8]> = lanes.iter().map(|(_, d)| *d).collect();
    let nonces: Vec<Option<Zeroizing<Vec<u64>>>> = lanes
        .iter()
        .map(|(_, d)| {
            // A digest of the wrong length has no lane (the kernel reads hash_len bytes).
            (d.len() == hash_len)
                .then(|| curve.random_scalar(&rng).and_then(|k| curve.limbs_of(&k)))
                .flatten()
        })
        .collect();
    let valid: Vec<bool> = nonces.iter().map(Option::is_some).collect();
    let Some(filler) = valid.iter().position(|&v| v) else {
        return lanes.iter().map(|_| Err(LaneError::BadInput)).collect();
    };
    let lane = |i: usize| pick(&valid, filler, i);
    let mut r = vec![0u8; mb::LANES * len];
    let mut s = vec![0u8; mb::LANES * len];
    let status = kernels.ecdsa_sign(
        curve,
        std::array::from_fn(|i| digests[lane(i)]),
        std::array::from_fn(|i| {
            nonces[lane(i)]
                .as_ref()
                .expect("picked lanes have a nonce")
                .as_slice()
        }),
        std::array::from_fn(|i| lanes[lane(i)].0.scalar.as_slice()),
        split_lanes(&mut r, len),
        split_lanes(&mut s, len),
    );
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
