//! The NIST prime curves crypto_mb batches, P-256 and P-384: their sizes and group
//! constants, and uniformly random scalars, so that ECDSA and ECDH are written once.

use aws_lc_rs::rand::{SecureRandom, SystemRandom};
use zeroize::Zeroizing;

use super::der::to_limbs;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
/// The NIST curves crypto_mb batches.
pub enum Curve {
    /// NIST P-256 (secp256r1).
    P256,
    /// NIST P-384 (secp384r1).
    P384,
}

/// Big-endian bytes of a hex constant, at compile time.
const fn hex<const N: usize>(s: &str) -> [u8; N] {
    const fn nibble(c: u8) -> u8 {
        match c {
            b'0'..=b'9' => c - b'0',
            b'a'..=b'f' => c - b'a' + 10,
            b'A'..=b'F' => c - b'A' + 10,
            _ => panic!("not a hex digit"),
        }
    }
    let s = s.as_bytes();
    assert!(s.len() == 2 * N, "constant has the wrong length");
    let mut out = [0u8; N];
    let mut i = 0;
    while i < N {
        out[i] = nibble(s[2 * i]) << 4 | nibble(s[2 * i + 1]);
        i += 1;
    }
    out
}

// SEC 2 (v2) sections 2.4.2 and 2.5.1: the field primes p and the group orders n.
const P256_P: [u8; 32] = hex("ffffffff00000001000000000000000000000000ffffffffffffffffffffffff");
const P256_N: [u8; 32] = hex("ffffffff00000000ffffffffffffffffbce6faada7179e84f3b9cac2fc632551");
const P384_P: [u8; 48] = hex(
    "fffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffeffffffff0000000000000000ffffffff",
);
const P384_N: [u8; 48] = hex(
    "ffffffffffffffffffffffffffffffffffffffffffffffffc7634d81f4372ddf581a0db248b0a77aecec196accc52973",
);

impl Curve {
    /// Bytes in a field element or scalar.
    pub const fn byte_len(self) -> usize {
        match self {
            Curve::P256 => 32,
            Curve::P384 => 48,
        }
    }

    /// 64-bit limbs in a field element or scalar.
    pub const fn limbs(self) -> usize {
        self.byte_len() / 8
    }

    /// The curve's name in logs and tests.
    pub fn name(self) -> &'static str {
        match self {
            Curve::P256 => "P-256",
            Curve::P384 => "P-384",
        }
    }

    /// The DER contents of the curve's OID (SEC 2: secp256r1 1.2.840.10045.3.1.7,
    /// secp384r1 1.3.132.0.34).
    pub fn oid(self) -> &'static [u8] {
        match self {
            Curve::P256 => &[0x2a, 0x86, 0x48, 0xce, 0x3d, 0x03, 0x01, 0x07],
            Curve::P384 => &[0x2b, 0x81, 0x04, 0x00, 0x22],
        }
    }

    /// The group order n, big-endian.
    pub fn order(self) -> &'static [u8] {
        match self {
            Curve::P256 => &P256_N,
            Curve::P384 => &P384_N,
        }
    }

    /// The field prime p, big-endian.
    pub fn prime(self) -> &'static [u8] {
        match self {
            Curve::P256 => &P256_P,
            Curve::P384 => &P384_P,
        }
    }

    /// True when the big-endian `scalar` (of this curve's length) is in [1, n-1].
    pub fn is_valid_scalar(self, scalar: &[u8]) -> bool {
        scalar.len() == self.byte_len() && scalar < self.order() && scalar.iter().any(|&b| b != 0)
    }

    /// A scalar drawn uniformly from [1, n-1] by the OS CSPRNG (rejection sampling; for
    /// these curves a draw is rejected with probability below 2^-32), big-endian.
    pub fn random_scalar(self, rng: &SystemRandom) -> Option<Zeroizing<Vec<u8>>> {
        let mut k = Zeroizing::new(vec![0u8; self.byte_len()]);
        for _ in 0..64 {
            rng.fill(&mut k).ok()?;
            if self.is_valid_scalar(&k) {
                return Some(k);
            }
        }
        None
    }

    /// A big-endian scalar or field element as crypto_mb's little-endian limbs.
    pub fn limbs_of(self, be: &[u8]) -> Option<Zeroizing<Vec<u64>>> {
        to_limbs(be, self.limbs())
    }
}

/// Big-endian bytes of little-endian limbs, `len` bytes long.
pub fn limbs_to_be(limbs: &[u64], len: usize) -> Vec<u8> {
    let mut out: Vec<u8> = limbs.iter().flat_map(|l| l.to_le_bytes()).collect();
    out.truncate(len);
    out.reverse();
    out
}
