//! RSA private operations, 8 lanes at a time, with each result checked before release.

use crypto_mb_sys as mb;
use zeroize::Zeroizing;

use super::der::{rsa_components, to_limbs};
use super::kernel::{lanes_of, split_lanes, CryptoMb, Kernels};
use super::pick;

/// An RSA key in the form crypto_mb's CRT kernel takes: little-endian 64-bit limbs.
pub struct RsaCrtKey {
    bits: usize,
    n: Vec<u64>,
    p: Zeroizing<Vec<u64>>,
    q: Zeroizing<Vec<u64>>,
    dp: Zeroizing<Vec<u64>>,
    dq: Zeroizing<Vec<u64>>,
    qinv: Zeroizing<Vec<u64>>,
}

impl RsaCrtKey {
    /// From PKCS#1 or PKCS#8 DER. None unless it is a two-prime 2048/3072/4096-bit key
    /// with e = 65537 (the exponent the batched check uses).
    pub fn from_der(der: &[u8]) -> Option<Self> {
        let c = rsa_components(der)?;
        let bits = c.n.len() * 8;
        if ![2048, 3072, 4096].contains(&bits) || c.n[0] & 0x80 == 0 || c.e != [1, 0, 1] {
            return None;
        }
        let half = bits / 128;
        Some(Self {
            bits,
            n: to_limbs(&c.n, bits / 64)?.to_vec(),
            p: to_limbs(&c.p, half)?,
            q: to_limbs(&c.q, half)?,
            dp: to_limbs(&c.dp, half)?,
            dq: to_limbs(&c.dq, half)?,
            qinv: to_limbs(&c.qinv, half)?,
        })
    }

    /// The modulus size.
    pub fn bits(&self) -> usize {
        self.bits
    }

    pub(crate) fn n(&self) -> &[u64] {
        &self.n
    }

    pub(crate) fn p(&self) -> &[u64] {
        &self.p
    }

    pub(crate) fn q(&self) -> &[u64] {
        &self.q
    }

    pub(crate) fn dp(&self) -> &[u64] {
        &self.dp
    }

    pub(crate) fn dq(&self) -> &[u64] {
        &self.dq
    }

    pub(crate) fn qinv(&self) -> &[u64] {
        &self.qinv
    }
}

impl std::fmt::Debug for RsaCrtKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "RsaCrtKey({} bits)", self.bits)
    }
}

/// Why a lane produced no result.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LaneError {
    /// crypto_mb reported an error for this lane (status nibble).
    Status(u32),
    /// The input is not below the modulus, or the key size does not match the batch.
    BadInput,
    /// The result did not survive the public-exponent check: never released.
    CheckFailed,
}

impl From<LaneError> for crate::FallbackCause {
    fn from(e: LaneError) -> Self {
        match e {
            LaneError::Status(_) => crate::FallbackCause::LaneError,
            LaneError::BadInput => crate::FallbackCause::BadInput,
            LaneError::CheckFailed => crate::FallbackCause::CheckFailed,
        }
    }
}

/// Computes `input^d mod n` (big-endian, `bits/8` bytes each) for up to 8 lanes, all
/// keys of `bits` bits, with crypto_mb. Every result is raised to e = 65537 and compared
/// with its input before it is returned, so a faulty lane can never leak a CRT signature.
pub fn private_crt(bits: usize, lanes: &[(&RsaCrtKey, &[u8])]) -> Vec<Result<Vec<u8>, LaneError>> {
    private_crt_on(&CryptoMb, bits, lanes)
}

/// [`private_crt`] on `kernels`.
pub(crate) fn private_crt_on(
    kernels: &dyn Kernels,
    bits: usize,
    lanes: &[(&RsaCrtKey, &[u8])],
) -> Vec<Result<Vec<u8>, LaneError>> {
    assert!(!lanes.is_empty() && lanes.len() <= mb::LANES, "1..=8 lanes");
    let len = bits / 8;
    // Lanes that cannot be computed stand out now; their slot carries a valid lane's inputs.
    let valid: Vec<bool> = lanes
        .iter()
        .map(|(key, input)| key.bits == bits && input.len() == len && below_modulus(input, &key.n))
        .collect();
    let Some(filler) = valid.iter().position(|&v| v) else {
        return lanes.iter().map(|_| Err(LaneError::BadInput)).collect();
    };
    let lane = |i: usize| lanes[pick(&valid, filler, i)];
    let mut outputs = Zeroizing::new(vec![0u8; len * mb::LANES]);
    let status = kernels.rsa_private_crt(
        bits,
        std::array::from_fn(|i| lane(i).0),
        std::array::from_fn(|i| lane(i).1),
        split_lanes(&mut outputs, len),
    );
    let mut checks = vec![0u8; len * mb::LANES];
    let check_status = kernels.rsa_public_65537(
        bits,
        std::array::from_fn(|i| lane(i).0.n()),
        lanes_of(&outputs, len),
        split_lanes(&mut checks, len),
    );
    (0..lanes.len())
        .map(|i| {
            if !valid[i] {
                return Err(LaneError::BadInput);
            }
            let st = mb::lane_status(status, i) | mb::lane_status(check_status, i);
            if st != mb::MBX_STATUS_OK {
                Err(LaneError::Status(st))
            } else if checks[i * len..(i + 1) * len] != *lanes[i].1 {
                Err(LaneError::CheckFailed)
            } else {
                Ok(outputs[i * len..(i + 1) * len].to_vec())
            }
        })
        .collect()
}

/// `input < n`, with `input` big-endian and `n` little-endian limbs.
fn below_modulus(input: &[u8], n: &[u64]) -> bool {
    let limbs = match to_limbs(input, n.len()) {
        Some(l) => l,
        None => return false,
    };
    for (a, b) in limbs.iter().rev().zip(n.iter().rev()) {
        if a != b {
            return a < b;
        }
    }
    false
}
