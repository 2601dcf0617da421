//! The certificate's signing key as rustls sees it: every signature goes to the engine.

use std::sync::Arc;

use rustls::pki_types::SubjectPublicKeyInfoDer;
use rustls::sign::{Signer, SigningKey};
use rustls::{SignatureAlgorithm, SignatureScheme};
use terminus_engine::{CryptoOp, CryptoOutput, KeyAlgorithm, SigningKeyPair};

use super::bridge;
use super::error::{to_rustls, wrong_output};

/// A rustls [`SigningKey`] whose signatures are computed by the worker's crypto engine.
#[derive(Debug)]
pub struct EngineSigningKey {
    key: Arc<SigningKeyPair>,
}

impl EngineSigningKey {
    /// A signing key whose operations go through the worker's engine.
    pub fn new(key: Arc<SigningKeyPair>) -> Self {
        Self { key }
    }
}

impl SigningKey for EngineSigningKey {
    fn choose_scheme(&self, offered: &[SignatureScheme]) -> Option<Box<dyn Signer>> {
        let scheme = *self
            .key
            .algorithm()
            .schemes()
            .iter()
            .find(|s| offered.contains(s))?;
        Some(Box::new(EngineSigner {
            key: self.key.clone(),
            scheme,
        }))
    }

    fn public_key(&self) -> Option<SubjectPublicKeyInfoDer<'_>> {
        Some(SubjectPublicKeyInfoDer::from(
            self.key.subject_public_key_info(),
        ))
    }

    fn algorithm(&self) -> SignatureAlgorithm {
        match self.key.algorithm() {
            KeyAlgorithm::Rsa { .. } => SignatureAlgorithm::RSA,
            KeyAlgorithm::EcdsaP256 | KeyAlgorithm::EcdsaP384 => SignatureAlgorithm::ECDSA,
        }
    }
}

#[derive(Debug)]
struct EngineSigner {
    key: Arc<SigningKeyPair>,
    scheme: SignatureScheme,
}

impl Signer for EngineSigner {
    fn sign(&self, message: &[u8]) -> Result<Vec<u8>, rustls::Error> {
        let op = CryptoOp::Sign {
            key: self.key.clone(),
            scheme: self.scheme,
            message: message.to_vec(),
        };
        let kind = op.kind();
        match bridge::call(op).map_err(to_rustls)? {
            CryptoOutput::Signature(sig) => Ok(sig),
            other => Err(wrong_output(kind, &other)),
        }
    }

    fn scheme(&self) -> SignatureScheme {
        self.scheme
    }
}
