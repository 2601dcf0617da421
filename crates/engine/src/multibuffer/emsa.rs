//! Signature encodings for the raw RSA operation, from RFC 8017: EMSA-PKCS1-v1_5
//! (section 9.2) and EMSA-PSS with MGF1 (sections 9.1.1 and B.2.1).

use aws_lc_rs::digest;
use aws_lc_rs::rand::{SecureRandom, SystemRandom};
use rustls::SignatureScheme;

/// How a TLS signature scheme encodes the message for RSA.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Encoding {
    /// PKCS#1 v1.5: the digest and its DigestInfo prefix.
    Pkcs1(&'static digest::Algorithm, &'static [u8]),
    /// PSS with MGF1 over the digest, salt as long as the digest.
    Pss(&'static digest::Algorithm),
}

/// DER DigestInfo prefixes (RFC 8017 section 9.2, note 1).
const SHA256_INFO: &[u8] = &[
    0x30, 0x31, 0x30, 0x0d, 0x06, 0x09, 0x60, 0x86, 0x48, 0x01, 0x65, 0x03, 0x04, 0x02, 0x01, 0x05,
    0x00, 0x04, 0x20,
];
const SHA384_INFO: &[u8] = &[
    0x30, 0x41, 0x30, 0x0d, 0x06, 0x09, 0x60, 0x86, 0x48, 0x01, 0x65, 0x03, 0x04, 0x02, 0x02, 0x05,
    0x00, 0x04, 0x30,
];
const SHA512_INFO: &[u8] = &[
    0x30, 0x51, 0x30, 0x0d, 0x06, 0x09, 0x60, 0x86, 0x48, 0x01, 0x65, 0x03, 0x04, 0x02, 0x03, 0x05,
    0x00, 0x04, 0x40,
];

impl Encoding {
    /// The encoding of an RSA `scheme`; `None` for a scheme that is not RSA.
    pub fn for_scheme(scheme: SignatureScheme) -> Option<Self> {
        Some(match scheme {
            SignatureScheme::RSA_PKCS1_SHA256 => Encoding::Pkcs1(&digest::SHA256, SHA256_INFO),
            SignatureScheme::RSA_PKCS1_SHA384 => Encoding::Pkcs1(&digest::SHA384, SHA384_INFO),
            SignatureScheme::RSA_PKCS1_SHA512 => Encoding::Pkcs1(&digest::SHA512, SHA512_INFO),
            SignatureScheme::RSA_PSS_SHA256 => Encoding::Pss(&digest::SHA256),
            SignatureScheme::RSA_PSS_SHA384 => Encoding::Pss(&digest::SHA384),
            SignatureScheme::RSA_PSS_SHA512 => Encoding::Pss(&digest::SHA512),
            _ => return None,
        })
    }

    /// The hash the encoding signs with.
    pub fn digest_algorithm(self) -> &'static digest::Algorithm {
        match self {
            Encoding::Pkcs1(alg, _) | Encoding::Pss(alg) => alg,
        }
    }

    /// The encoded message for a modulus of `mod_bits` bits, as big-endian bytes of the
    /// modulus length (the RSA input). None if the key is too small for the hash.
    pub fn encode(self, message: &[u8], mod_bits: usize) -> Option<Vec<u8>> {
        let hash = digest::digest(self.digest_algorithm(), message);
        self.encode_digest(hash.as_ref(), mod_bits)
    }

    /// [`Encoding::encode`] of a message whose digest by the encoding's hash is `hash`
    /// (a keyless signer's request). None if the digest is not that hash's length, or
    /// the key is too small for it.
    pub fn encode_digest(self, hash: &[u8], mod_bits: usize) -> Option<Vec<u8>> {
        if hash.len() != self.digest_algorithm().output_len() {
            return None;
        }
        let k = mod_bits.div_ceil(8);
        match self {
            Encoding::Pkcs1(_, info) => {
                let t_len = info.len() + hash.len();
                if k < t_len + 11 {
                    return None;
                }
                let mut em = Vec::with_capacity(k);
                em.extend_from_slice(&[0x00, 0x01]);
                em.resize(k - t_len - 1, 0xff);
                em.push(0x00);
                em.extend_from_slice(info);
                em.extend_from_slice(hash);
                Some(em)
            }
            Encoding::Pss(alg) => {
                let em_bits = mod_bits - 1;
                let em_len = em_bits.div_ceil(8);
                let h_len = alg.output_len();
                let s_len = h_len; // TLS 1.3 requires salt length = hash length
                if em_len < h_len + s_len + 2 {
                    return None;
                }
                let mut salt = vec![0u8; s_len];
                SystemRandom::new().fill(&mut salt).ok()?;
                let mut ctx = digest::Context::new(alg);
                ctx.update(&[0u8; 8]);
                ctx.update(hash);
                ctx.update(&salt);
                let h = ctx.finish();
                let db_len = em_len - h_len - 1;
                let mut db = vec![0u8; db_len];
                db[db_len - s_len - 1] = 0x01;
                db[db_len - s_len..].copy_from_slice(&salt);
                mgf1_xor(alg, h.as_ref(), &mut db);
                db[0] &= 0xff >> (8 * em_len - em_bits);
                let mut em = Vec::with_capacity(k);
                // When emLen < k (mod_bits % 8 == 1) the RSA input has a leading zero.
                em.resize(k - em_len, 0);
                em.extend_from_slice(&db);
                em.extend_from_slice(h.as_ref());
                em.push(0xbc);
                Some(em)
            }
        }
    }
}

/// XORs MGF1(seed) into `out` (RFC 8017 B.2.1).
fn mgf1_xor(alg: &'static digest::Algorithm, seed: &[u8], out: &mut [u8]) {
    for (counter, chunk) in out.chunks_mut(alg.output_len()).enumerate() {
        let mut ctx = digest::Context::new(alg);
        ctx.update(seed);
        ctx.update(&(counter as u32).to_be_bytes());
        for (o, m) in chunk.iter_mut().zip(ctx.finish().as_ref()) {
            *o ^= m;
        }
    }
}
