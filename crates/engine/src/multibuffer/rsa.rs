//! RSA private operations, 8 lanes at a time, with each result checked before release.

use std::os::raw::c_int;

use crypto_mb_sys as mb;
use zeroize::Zeroizing;

use super::der::{rsa_components, to_limbs};

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

    pub fn bits(&self) -> usize {
        self.bits
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

/// Computes `input^d mod n` (big-endian, `bits/8` bytes each) for up to 8 lanes, all
/// keys of `bits` bits. Every result is raised to e = 65537 and compared with its input
/// before it is returned, so a faulty lane can never leak a CRT signature.
pub fn private_crt(bits: usize, lanes: &[(&RsaCrtKey, &[u8])]) -> Vec<Result<Vec<u8>, LaneError>> {
    assert!(!lanes.is_empty() && lanes.len() <= mb::LANES, "1..=8 lanes");
    let len = bits / 8;
    let mut results: Vec<Result<Vec<u8>, LaneError>> = vec![Ok(Vec::new()); lanes.len()];
    // Lanes that cannot be computed stand out now; their slot carries lane 0's inputs.
    let mut valid = [false; mb::LANES];
    for (i, (key, input)) in lanes.iter().enumerate() {
        valid[i] = key.bits == bits && input.len() == len && below_modulus(input, &key.n);
        if !valid[i] {
            results[i] = Err(LaneError::BadInput);
        }
    }
    let Some(filler) = (0..lanes.len()).find(|&i| valid[i]) else {
        return results;
    };
    let pick = |i: usize| {
        if i < lanes.len() && valid[i] {
            i
        } else {
            filler
        }
    };

    let mut outputs = Zeroizing::new(vec![0u8; len * mb::LANES]);
    let mut checks = vec![0u8; len * mb::LANES];
    let (from, to, p, q, dp, dq, qinv, n);
    {
        let lane = |i: usize| lanes[pick(i)];
        from = std::array::from_fn::<_, 8, _>(|i| lane(i).1.as_ptr());
        p = std::array::from_fn::<_, 8, _>(|i| lane(i).0.p.as_ptr());
        q = std::array::from_fn::<_, 8, _>(|i| lane(i).0.q.as_ptr());
        dp = std::array::from_fn::<_, 8, _>(|i| lane(i).0.dp.as_ptr());
        dq = std::array::from_fn::<_, 8, _>(|i| lane(i).0.dq.as_ptr());
        qinv = std::array::from_fn::<_, 8, _>(|i| lane(i).0.qinv.as_ptr());
        n = std::array::from_fn::<_, 8, _>(|i| lane(i).0.n.as_ptr());
    }
    let out_base = outputs.as_mut_ptr();
    to = std::array::from_fn::<*mut u8, 8, _>(|i| out_base.wrapping_add(i * len));
    let check_base = checks.as_mut_ptr();
    let check_to = std::array::from_fn::<*mut u8, 8, _>(|i| check_base.wrapping_add(i * len));
    let sig_from = std::array::from_fn::<*const u8, 8, _>(|i| to[i] as *const u8);

    // SAFETY: every pointer array holds 8 valid pointers: inputs of `len` bytes and key
    // limbs of the sizes crypto_mb expects for `bits` (checked by `valid`/`from_der`),
    // outputs into `outputs`/`checks`, which have `len` bytes per lane; the scratch
    // buffer has the size the method asks for. Nothing is retained after the calls.
    let (status, check_status) = unsafe {
        let method = mb::mbx_RSA_private_crt_Method(bits as c_int);
        let pub_method = mb::mbx_RSA_pub65537_Method(bits as c_int);
        if method.is_null() || pub_method.is_null() {
            return lanes.iter().map(|_| Err(LaneError::BadInput)).collect();
        }
        let scratch_len =
            mb::mbx_RSA_Method_BufSize(method).max(mb::mbx_RSA_Method_BufSize(pub_method));
        let mut scratch = Zeroizing::new(vec![0u8; scratch_len.max(0) as usize]);
        let status = mb::mbx_rsa_private_crt_mb8(
            from.as_ptr(),
            to.as_ptr(),
            p.as_ptr(),
            q.as_ptr(),
            dp.as_ptr(),
            dq.as_ptr(),
            qinv.as_ptr(),
            bits as c_int,
            method,
            scratch.as_mut_ptr(),
        );
        let check_status = mb::mbx_rsa_public_mb8(
            sig_from.as_ptr(),
            check_to.as_ptr(),
            n.as_ptr(),
            bits as c_int,
            pub_method,
            scratch.as_mut_ptr(),
        );
        (status, check_status)
    };
    for (i, slot) in results.iter_mut().enumerate() {
        if !valid[i] {
            continue;
        }
        let st = mb::lane_status(status, i) | mb::lane_status(check_status, i);
        let out = &outputs[i * len..(i + 1) * len];
        *slot = if st != mb::MBX_STATUS_OK {
            Err(LaneError::Status(st))
        } else if checks[i * len..(i + 1) * len] != *lanes[i].1 {
            Err(LaneError::CheckFailed)
        } else {
            Ok(out.to_vec())
        };
    }
    results
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
