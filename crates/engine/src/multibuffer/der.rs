//! Just enough DER to read an RSA private key's CRT components (RFC 8017 A.1.2), from
//! PKCS#1 `RSAPrivateKey` or the PKCS#8 `PrivateKeyInfo` that wraps it.

use zeroize::Zeroizing;

/// The components crypto_mb needs, big-endian without leading zeros.
pub struct RsaComponents {
    pub n: Vec<u8>,
    pub e: Vec<u8>,
    pub p: Zeroizing<Vec<u8>>,
    pub q: Zeroizing<Vec<u8>>,
    pub dp: Zeroizing<Vec<u8>>,
    pub dq: Zeroizing<Vec<u8>>,
    pub qinv: Zeroizing<Vec<u8>>,
}

struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    /// Reads one TLV with the expected tag; returns its contents.
    fn take(&mut self, tag: u8) -> Option<&'a [u8]> {
        let (&t, rest) = self.0.split_first()?;
        if t != tag {
            return None;
        }
        let (&first, mut rest) = rest.split_first()?;
        let len = if first < 0x80 {
            first as usize
        } else {
            let n = (first & 0x7f) as usize;
            if n == 0 || n > 4 || rest.len() < n {
                return None;
            }
            let len = rest[..n]
                .iter()
                .fold(0usize, |acc, &b| (acc << 8) | b as usize);
            rest = &rest[n..];
            len
        };
        if rest.len() < len {
            return None;
        }
        let (value, after) = rest.split_at(len);
        self.0 = after;
        Some(value)
    }

    fn integer(&mut self) -> Option<&'a [u8]> {
        let v = self.take(0x02)?;
        // Positive integers only; drop the sign-padding zero.
        match v {
            [0, rest @ ..] => Some(rest),
            [b, ..] if b & 0x80 != 0 => None,
            v => Some(v),
        }
    }
}

const RSA_ENCRYPTION_OID: &[u8] = &[0x2a, 0x86, 0x48, 0x86, 0xf7, 0x0d, 0x01, 0x01, 0x01];

/// Parses PKCS#1 or PKCS#8 DER; None if it is neither (or not RSA).
pub fn rsa_components(der: &[u8]) -> Option<RsaComponents> {
    pkcs1(der).or_else(|| {
        let mut outer = Reader(der);
        let mut info = Reader(outer.take(0x30)?);
        info.integer()?;
        let mut alg = Reader(info.take(0x30)?);
        if alg.take(0x06)? != RSA_ENCRYPTION_OID {
            return None;
        }
        pkcs1(info.take(0x04)?)
    })
}

fn pkcs1(der: &[u8]) -> Option<RsaComponents> {
    let mut outer = Reader(der);
    let mut seq = Reader(outer.take(0x30)?);
    // Version 0: two-prime. Version 1 (multi-prime) has no CRT form crypto_mb takes.
    if !seq.integer()?.is_empty() {
        return None;
    }
    let n = seq.integer()?.to_vec();
    let e = seq.integer()?.to_vec();
    let _d = Zeroizing::new(seq.integer()?.to_vec());
    Some(RsaComponents {
        n,
        e,
        p: Zeroizing::new(seq.integer()?.to_vec()),
        q: Zeroizing::new(seq.integer()?.to_vec()),
        dp: Zeroizing::new(seq.integer()?.to_vec()),
        dq: Zeroizing::new(seq.integer()?.to_vec()),
        qinv: Zeroizing::new(seq.integer()?.to_vec()),
    })
}

const EC_PUBLIC_KEY_OID: &[u8] = &[0x2a, 0x86, 0x48, 0xce, 0x3d, 0x02, 0x01];

/// An EC private key as DER carries it.
pub struct EcPrivateKey {
    /// The named curve's OID, where the encoding names one (PKCS#8 always does; SEC1 may).
    pub curve: Option<Vec<u8>>,
    /// The private scalar, big-endian.
    pub scalar: Zeroizing<Vec<u8>>,
}

/// An EC key in SEC1 `ECPrivateKey` DER (RFC 5915), or the PKCS#8 `PrivateKeyInfo` that
/// wraps one.
pub fn ec_private_key(der: &[u8]) -> Option<EcPrivateKey> {
    sec1(der).or_else(|| {
        let mut outer = Reader(der);
        let mut info = Reader(outer.take(0x30)?);
        info.integer()?;
        let mut alg = Reader(info.take(0x30)?);
        if alg.take(0x06)? != EC_PUBLIC_KEY_OID {
            return None;
        }
        let named = alg.take(0x06)?.to_vec();
        let mut key = sec1(info.take(0x04)?)?;
        if key.curve.as_ref().is_some_and(|inner| *inner != named) {
            return None;
        }
        key.curve = Some(named);
        Some(key)
    })
}

fn sec1(der: &[u8]) -> Option<EcPrivateKey> {
    let mut outer = Reader(der);
    let mut seq = Reader(outer.take(0x30)?);
    if seq.integer()? != [1] {
        return None;
    }
    let scalar = Zeroizing::new(seq.take(0x04)?.to_vec());
    // parameters [0] EXPLICIT ECParameters: a namedCurve OID.
    let curve = match seq.take(0xa0) {
        Some(params) => Some(Reader(params).take(0x06)?.to_vec()),
        None => None,
    };
    Some(EcPrivateKey { curve, scalar })
}

/// Big-endian bytes to `limbs` little-endian 64-bit limbs (zero-padded); None if too big.
pub fn to_limbs(be: &[u8], limbs: usize) -> Option<Zeroizing<Vec<u64>>> {
    if be.len() > limbs * 8 {
        return None;
    }
    let mut out = Zeroizing::new(vec![0u64; limbs]);
    for (i, &b) in be.iter().rev().enumerate() {
        out[i / 8] |= (b as u64) << (8 * (i % 8));
    }
    Some(out)
}
