//! The certificate's signing key as rustls sees it: every signature goes to the engine,
//! whether the key is here or on a keyless signer.

use std::sync::Arc;

use rustls::pki_types::SubjectPublicKeyInfoDer;
use rustls::sign::{Signer, SigningKey};
use rustls::{SignatureAlgorithm, SignatureScheme};
use terminus_engine::{
    scheme_digest, CryptoOp, CryptoOutput, KeyAlgorithm, RemoteKey, SigningKeyPair,
};

use super::bridge;
use super::error::{to_rustls, wrong_output};

/// A rustls [`SigningKey`] whose signatures are computed by the worker's crypto engine.
#[derive(Debug)]
pub struct EngineSigningKey {
    key: Key,
}

/// Where the private key is.
#[derive(Debug, Clone)]
enum Key {
    /// In this process.
    Local(Arc<SigningKeyPair>),
    /// On keyless signers: the engine sends the digest there.
    Remote(Arc<dyn RemoteKey>),
}

impl Key {
    fn algorithm(&self) -> KeyAlgorithm {
        match self {
            Key::Local(k) => k.algorithm(),
            Key::Remote(k) => k.algorithm(),
        }
    }
}

impl EngineSigningKey {
    /// A signing key whose operations go through the worker's engine.
    pub fn new(key: Arc<SigningKeyPair>) -> Self {
        Self {
            key: Key::Local(key),
        }
    }

    /// A key held by keyless signers: each signature is the engine's remote request.
    pub fn remote(key: Arc<dyn RemoteKey>) -> Self {
        Self {
            key: Key::Remote(key),
        }
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
        Some(SubjectPublicKeyInfoDer::from(match &self.key {
            Key::Local(k) => k.subject_public_key_info(),
            Key::Remote(k) => k.subject_public_key_info(),
        }))
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
    key: Key,
    scheme: SignatureScheme,
}

impl Signer for EngineSigner {
    fn sign(&self, message: &[u8]) -> Result<Vec<u8>, rustls::Error> {
        let op = match &self.key {
            Key::Local(key) => CryptoOp::Sign {
                key: key.clone(),
                scheme: self.scheme,
                message: message.to_vec(),
            },
            // The digest is made here: what crosses the network is the hash, as the
            // keyless protocol carries it.
            Key::Remote(key) => CryptoOp::RemoteSign {
                key: key.clone(),
                scheme: self.scheme,
                digest: aws_lc_rs::digest::digest(
                    scheme_digest(self.scheme).map_err(super::error::to_rustls)?,
                    message,
                )
                .as_ref()
                .to_vec(),
            },
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
