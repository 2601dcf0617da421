//! Private signing keys held by the engine.
//!
//! Keys are parsed once at load time (PKCS#8, PKCS#1 `RSA PRIVATE KEY` or SEC1
//! `EC PRIVATE KEY` DER) into aws-lc-rs key pairs, which zeroize their memory when freed.

use std::fmt;

use aws_lc_rs::digest;
use aws_lc_rs::encoding::AsDer;
use aws_lc_rs::rand::SystemRandom;
use aws_lc_rs::signature::{self, EcdsaKeyPair, KeyPair, RsaKeyPair};
use rustls::SignatureScheme;

use crate::multibuffer::ecdsa::EcKey;
use crate::multibuffer::nist::Curve;
use crate::multibuffer::rsa::RsaCrtKey;
use crate::op::CryptoError;

/// What kind of key this is; decides which signature schemes it can serve.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KeyAlgorithm {
    /// RSA with a modulus of `bits`.
    Rsa {
        /// The modulus size.
        bits: usize,
    },
    /// ECDSA on P-256.
    EcdsaP256,
    /// ECDSA on P-384.
    EcdsaP384,
}

impl KeyAlgorithm {
    /// Schemes in our order of preference.
    pub fn schemes(self) -> &'static [SignatureScheme] {
        match self {
            KeyAlgorithm::Rsa { .. } => &[
                SignatureScheme::RSA_PSS_SHA256,
                SignatureScheme::RSA_PSS_SHA384,
                SignatureScheme::RSA_PSS_SHA512,
                SignatureScheme::RSA_PKCS1_SHA256,
                SignatureScheme::RSA_PKCS1_SHA384,
                SignatureScheme::RSA_PKCS1_SHA512,
            ],
            KeyAlgorithm::EcdsaP256 => &[SignatureScheme::ECDSA_NISTP256_SHA256],
            KeyAlgorithm::EcdsaP384 => &[SignatureScheme::ECDSA_NISTP384_SHA384],
        }
    }

    /// Label for logs and metrics.
    pub fn label(self) -> &'static str {
        match self {
            KeyAlgorithm::Rsa { .. } => "rsa",
            KeyAlgorithm::EcdsaP256 | KeyAlgorithm::EcdsaP384 => "ecdsa",
        }
    }
}

/// Why a private key cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KeyError {
    #[error("RSA key of {0} bits is not supported (use 2048, 3072 or 4096 bits)")]
    /// An RSA modulus size other than 2048, 3072 or 4096.
    UnsupportedRsaSize(usize),
    #[error("RSA key {0} 2048 bits is not supported (use 2048, 3072 or 4096 bits)")]
    /// An RSA modulus below or above what is supported.
    RsaSizeOutOfRange(&'static str),
    #[error("unsupported key type (terminus accepts RSA and ECDSA P-256/P-384 keys): {0}")]
    /// Neither RSA nor ECDSA P-256/P-384.
    UnsupportedType(String),
}

enum Pair {
    Rsa(RsaKeyPair),
    Ecdsa(EcdsaKeyPair),
}

/// A certificate's private key, usable by every backend.
pub struct SigningKeyPair {
    pair: Pair,
    algorithm: KeyAlgorithm,
    spki: Vec<u8>,
    /// The same key in the form crypto_mb takes, when it has one.
    batch_key: Option<BatchKey>,
}

/// A private key as the multi-buffer kernels take it.
#[derive(Debug)]
pub enum BatchKey {
    /// Two-prime RSA with e = 65537, as CRT limbs.
    Rsa(RsaCrtKey),
    /// ECDSA on P-256 or P-384, as little-endian limbs.
    Ecdsa(EcKey),
}

impl fmt::Debug for SigningKeyPair {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "SigningKeyPair({:?})", self.algorithm)
    }
}

impl SigningKeyPair {
    /// Parses an unencrypted private key in PKCS#8, PKCS#1 or SEC1 DER form.
    pub fn from_der(der: &[u8]) -> Result<Self, KeyError> {
        // PKCS#8 first, then PKCS#1; a size verdict from either is the answer.
        let rsa = match RsaKeyPair::from_pkcs8(der) {
            Err(e) if !matches!(e.description_(), "TooSmall" | "TooLarge") => {
                RsaKeyPair::from_der(der)
            }
            other => other,
        };
        match rsa.as_ref().map_err(|e| e.description_()) {
            Err("TooSmall") => return Err(KeyError::RsaSizeOutOfRange("smaller than")),
            Err("TooLarge") => return Err(KeyError::RsaSizeOutOfRange("far larger than")),
            _ => {}
        }
        if let Ok(rsa) = rsa {
            let bits = rsa.public_modulus_len() * 8;
            if ![2048, 3072, 4096].contains(&bits) {
                return Err(KeyError::UnsupportedRsaSize(bits));
            }
            let spki = rsa
                .public_key()
                .as_der()
                .map_err(|_| KeyError::UnsupportedType("RSA public key not encodable".into()))?
                .as_ref()
                .to_vec();
            return Ok(Self {
                pair: Pair::Rsa(rsa),
                algorithm: KeyAlgorithm::Rsa { bits },
                spki,
                batch_key: RsaCrtKey::from_der(der).map(BatchKey::Rsa),
            });
        }
        for (alg, algorithm) in [
            (
                &signature::ECDSA_P256_SHA256_ASN1_SIGNING,
                KeyAlgorithm::EcdsaP256,
            ),
            (
                &signature::ECDSA_P384_SHA384_ASN1_SIGNING,
                KeyAlgorithm::EcdsaP384,
            ),
        ] {
            if let Ok(ec) = EcdsaKeyPair::from_pkcs8(alg, der)
                .or_else(|_| EcdsaKeyPair::from_private_key_der(alg, der))
            {
                let spki = ec
                    .public_key()
                    .as_der()
                    .map_err(|_| KeyError::UnsupportedType("EC public key not encodable".into()))?
                    .as_ref()
                    .to_vec();
                return Ok(Self {
                    pair: Pair::Ecdsa(ec),
                    algorithm,
                    spki,
                    batch_key: EcKey::from_der(
                        match algorithm {
                            KeyAlgorithm::EcdsaP384 => Curve::P384,
                            _ => Curve::P256,
                        },
                        der,
                    )
                    .map(BatchKey::Ecdsa),
                });
            }
        }
        Err(KeyError::UnsupportedType(
            "not an RSA or ECDSA P-256/P-384 key (Ed25519, DSA and other curves are not supported)"
                .into(),
        ))
    }

    /// What kind of key this is.
    pub fn algorithm(&self) -> KeyAlgorithm {
        self.algorithm
    }

    /// The key in the form the multi-buffer kernels take, if it has one.
    pub fn batch_key(&self) -> Option<&BatchKey> {
        self.batch_key.as_ref()
    }

    /// The RSA CRT form, if this key has one.
    pub fn rsa_crt(&self) -> Option<&RsaCrtKey> {
        match &self.batch_key {
            Some(BatchKey::Rsa(k)) => Some(k),
            _ => None,
        }
    }

    /// The DER SubjectPublicKeyInfo, to check the key against its certificate.
    pub fn subject_public_key_info(&self) -> &[u8] {
        &self.spki
    }

    /// Signs a `digest` made by `scheme`'s hash on the calling thread with aws-lc-rs
    /// (a keyless signer's request). ECDSA takes only its curve's hash (TLS 1.3's
    /// pairings, and the only schemes terminus offers for the key).
    pub(crate) fn sign_digest_scalar(
        &self,
        scheme: SignatureScheme,
        digest: &[u8],
    ) -> Result<Vec<u8>, CryptoError> {
        if !self.algorithm.schemes().contains(&scheme) {
            return Err(CryptoError::SchemeMismatch(scheme));
        }
        let digest = digest::Digest::import_less_safe(digest, scheme_digest(scheme)?)
            .map_err(|_| CryptoError::SignFailed)?;
        match &self.pair {
            Pair::Rsa(rsa) => {
                let mut sig = vec![0u8; rsa.public_modulus_len()];
                rsa.sign_digest(rsa_encoding(scheme)?, &digest, &mut sig)
                    .map_err(|_| CryptoError::SignFailed)?;
                Ok(sig)
            }
            Pair::Ecdsa(ec) => ec
                .sign_digest(&digest)
                .map(|s| s.as_ref().to_vec())
                .map_err(|_| CryptoError::SignFailed),
        }
    }

    /// Signs on the calling thread with aws-lc-rs.
    pub(crate) fn sign_scalar(
        &self,
        scheme: SignatureScheme,
        message: &[u8],
    ) -> Result<Vec<u8>, CryptoError> {
        let rng = SystemRandom::new();
        match &self.pair {
            Pair::Rsa(rsa) => {
                let padding = rsa_encoding(scheme)?;
                let mut sig = vec![0u8; rsa.public_modulus_len()];
                rsa.sign(padding, &rng, message, &mut sig)
                    .map_err(|_| CryptoError::SignFailed)?;
                Ok(sig)
            }
            Pair::Ecdsa(ec) => {
                if !self.algorithm.schemes().contains(&scheme) {
                    return Err(CryptoError::SchemeMismatch(scheme));
                }
                // aws-lc draws the nonce from its CSPRNG for every signature.
                ec.sign(&rng, message)
                    .map(|s| s.as_ref().to_vec())
                    .map_err(|_| CryptoError::SignFailed)
            }
        }
    }
}

/// aws-lc-rs's encoding for an RSA `scheme`.
fn rsa_encoding(
    scheme: SignatureScheme,
) -> Result<&'static dyn signature::RsaEncoding, CryptoError> {
    Ok(match scheme {
        SignatureScheme::RSA_PKCS1_SHA256 => &signature::RSA_PKCS1_SHA256,
        SignatureScheme::RSA_PKCS1_SHA384 => &signature::RSA_PKCS1_SHA384,
        SignatureScheme::RSA_PKCS1_SHA512 => &signature::RSA_PKCS1_SHA512,
        SignatureScheme::RSA_PSS_SHA256 => &signature::RSA_PSS_SHA256,
        SignatureScheme::RSA_PSS_SHA384 => &signature::RSA_PSS_SHA384,
        SignatureScheme::RSA_PSS_SHA512 => &signature::RSA_PSS_SHA512,
        other => return Err(CryptoError::SchemeMismatch(other)),
    })
}

/// The hash a signature `scheme` signs with: what a digest for it must be.
pub fn scheme_digest(scheme: SignatureScheme) -> Result<&'static digest::Algorithm, CryptoError> {
    Ok(match scheme {
        SignatureScheme::RSA_PKCS1_SHA256
        | SignatureScheme::RSA_PSS_SHA256
        | SignatureScheme::ECDSA_NISTP256_SHA256 => &digest::SHA256,
        SignatureScheme::RSA_PKCS1_SHA384
        | SignatureScheme::RSA_PSS_SHA384
        | SignatureScheme::ECDSA_NISTP384_SHA384 => &digest::SHA384,
        SignatureScheme::RSA_PKCS1_SHA512
        | SignatureScheme::RSA_PSS_SHA512
        | SignatureScheme::ECDSA_NISTP521_SHA512 => &digest::SHA512,
        other => return Err(CryptoError::SchemeMismatch(other)),
    })
}
