//! ECDSA P-256 signatures, 8 lanes at a time. Every signature gets its own nonce, drawn
//! uniformly from [1, n-1] by the CSPRNG (rejection sampling); nonces are never reused
//! and are zeroized after use.

use aws_lc_rs::digest;
use aws_lc_rs::rand::{SecureRandom, SystemRandom};
use crypto_mb_sys as mb;
use zeroize::Zeroizing;

use super::der::{ec_private_key, to_limbs};
use super::rsa::LaneError;

/// The order n of the P-256 group, big-endian.
const ORDER: [u8; 32] = [
    0xff, 0xff, 0xff, 0xff, 0x00, 0x00, 0x00, 0x00, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff,
    0xbc, 0xe6, 0xfa, 0xad, 0xa7, 0x17, 0x9e, 0x84, 0xf3, 0xb9, 0xca, 0xc2, 0xfc, 0x63, 0x25, 0x51,
];

/// A P-256 private scalar as crypto_mb takes it: 4 little-endian limbs.
pub struct P256Key {
    scalar: Zeroizing<Vec<u64>>,
}

impl P256Key {
    /// From PKCS#8 or SEC1 DER of a P-256 key.
    pub fn from_der(der: &[u8]) -> Option<Self> {
        let private = ec_private_key(der)?;
        if private.len() > 32 || private.iter().all(|&b| b == 0) {
            return None;
        }
        Some(Self {
            scalar: to_limbs(&private, 4)?,
        })
    }
}

impl std::fmt::Debug for P256Key {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("P256Key(..)")
    }
}

/// A uniformly random scalar in [1, n-1], as limbs.
fn nonce(rng: &SystemRandom) -> Option<Zeroizing<Vec<u64>>> {
    let mut k = Zeroizing::new([0u8; 32]);
    for _ in 0..64 {
        rng.fill(&mut k[..]).ok()?;
        if k[..] < ORDER[..] && k.iter().any(|&b| b != 0) {
            return to_limbs(&k[..], 4);
        }
    }
    None
}

/// ECDSA-SHA256 signatures of `messages` (unhashed), DER-encoded as TLS sends them.
pub fn sign_sha256(lanes: &[(&P256Key, &[u8])]) -> Vec<Result<Vec<u8>, LaneError>> {
    assert!(!lanes.is_empty() && lanes.len() <= mb::LANES, "1..=8 lanes");
    let rng = SystemRandom::new();
    let digests: Vec<digest::Digest> = lanes
        .iter()
        .map(|(_, m)| digest::digest(&digest::SHA256, m))
        .collect();
    let nonces: Vec<Option<Zeroizing<Vec<u64>>>> = lanes.iter().map(|_| nonce(&rng)).collect();
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
    let mut r = [[0u8; 32]; mb::LANES];
    let mut s = [[0u8; 32]; mb::LANES];
    let (r_base, s_base) = (r.as_mut_ptr(), s.as_mut_ptr());
    let r_out: [*mut u8; mb::LANES] = std::array::from_fn(|i| r_base.wrapping_add(i) as *mut u8);
    let s_out: [*mut u8; mb::LANES] = std::array::from_fn(|i| s_base.wrapping_add(i) as *mut u8);
    let msg: [*const u8; mb::LANES] = std::array::from_fn(|i| digests[pick(i)].as_ref().as_ptr());
    let eph: [*const u64; mb::LANES] = std::array::from_fn(|i| {
        nonces[pick(i)]
            .as_ref()
            .expect("picked lanes have a nonce")
            .as_ptr()
    });
    let reg: [*const u64; mb::LANES] = std::array::from_fn(|i| lanes[pick(i)].0.scalar.as_ptr());
    // SAFETY: 8 pointers each to 32-byte digests, 4-limb nonces and keys (sizes fixed by
    // the types above) and 32-byte outputs in `r`/`s`; the scratch buffer is unused by
    // crypto_mb's P-256 code, so null is allowed. Nothing is retained.
    let status = unsafe {
        mb::mbx_nistp256_ecdsa_sign_mb8(
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
                mb::MBX_STATUS_OK => Ok(der_signature(&r[i], &s[i])),
                st => Err(LaneError::Status(st)),
            }
        })
        .collect()
}

/// `SEQUENCE { INTEGER r, INTEGER s }` with minimal integer encodings.
fn der_signature(r: &[u8; 32], s: &[u8; 32]) -> Vec<u8> {
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
    let mut body = Vec::with_capacity(72);
    integer(&mut body, r);
    integer(&mut body, s);
    let mut out = Vec::with_capacity(body.len() + 2);
    out.push(0x30);
    out.push(body.len() as u8);
    out.extend_from_slice(&body);
    out
}
