//! Loading certificate chains and private keys from PEM files.
//!
//! Every failure names the file and the reason, because an operator reading a start-up
//! error should not have to guess which of a dozen files is wrong.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::pki_types::CertificateDer;
use rustls::sign::CertifiedKey;
use sha2::{Digest, Sha256};
use terminus_engine::{KeyAlgorithm, KeyError, RemoteKey, SigningKeyPair};

use crate::handshake::EngineSigningKey;

/// Why a certificate or key cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum CertError {
    /// The file cannot be read.
    #[error("{}: cannot read: {source}", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// What reading it said.
        source: std::io::Error,
    },
    /// The file has no certificate.
    #[error("{}: no certificate found (expected PEM blocks \"-----BEGIN CERTIFICATE-----\")", path.display())]
    EmptyChain {
        /// The certificate file.
        path: PathBuf,
    },
    /// The file is not well-formed PEM.
    #[error("{}: malformed PEM: {detail}", path.display())]
    BadPem {
        /// The file.
        path: PathBuf,
        /// The PEM parser's complaint.
        detail: String,
    },
    /// The first certificate cannot be parsed as X.509.
    #[error("{}: the leaf certificate cannot be parsed: {detail}", path.display())]
    BadCertificate {
        /// The certificate file.
        path: PathBuf,
        /// The X.509 parser's complaint.
        detail: String,
    },
    /// The key file has no private key.
    #[error("{}: no private key found (expected \"PRIVATE KEY\", \"RSA PRIVATE KEY\" or \"EC PRIVATE KEY\")", path.display())]
    NoKey {
        /// The key file.
        path: PathBuf,
    },
    /// The private key is encrypted.
    #[error("{}: the private key is encrypted; terminus needs it unencrypted (e.g. `openssl pkey -in KEY -out KEY.plain`) and readable only by the server user", path.display())]
    EncryptedKey {
        /// The key file.
        path: PathBuf,
    },
    /// The private key is of a kind or size terminus cannot sign with.
    #[error("{}: {source}", path.display())]
    Key {
        /// The key file.
        path: PathBuf,
        /// Why the key cannot be used.
        source: KeyError,
    },
    /// The certificate's key cannot be used from keyless signers.
    #[error("{}: the certificate's key cannot be signed with remotely: {detail}", path.display())]
    RemoteKey {
        /// The certificate file.
        path: PathBuf,
        /// Why.
        detail: String,
    },
    /// The private key is not the certificate's.
    #[error("{}: the private key does not match the certificate in {}", key.display(), cert.display())]
    Mismatch {
        /// The certificate file.
        cert: PathBuf,
        /// The key file.
        key: PathBuf,
    },
}

/// A certificate chain with its key, ready for the resolver.
#[derive(Clone, Debug)]
pub struct LoadedCert {
    /// The chain and its signing key, as rustls's resolver hands them out.
    pub certified: Arc<CertifiedKey>,
    /// The key's kind, which decides the signature schemes it serves.
    pub algorithm: KeyAlgorithm,
    /// The private key, as the engine signs with it; None for a key on keyless
    /// signers.
    pub key: Option<Arc<SigningKeyPair>>,
}

impl LoadedCert {
    /// Loads a chain (leaf first) from `cert_path` and its key from `key_path`.
    pub fn from_files(cert_path: &Path, key_path: &Path) -> Result<Self, CertError> {
        let cert_pem = read(cert_path)?;
        let key_pem = read(key_path)?;
        Self::from_pem(&cert_pem, cert_path, &key_pem, key_path)
    }

    /// Like [`LoadedCert::from_files`] with the PEM text already read; the paths only name
    /// the sources in errors.
    pub fn from_pem(
        cert_pem: &[u8],
        cert_path: &Path,
        key_pem: &[u8],
        key_path: &Path,
    ) -> Result<Self, CertError> {
        let chain = parse_chain(cert_pem, cert_path)?;
        let key = parse_key(key_pem, key_path)?;
        let algorithm = key.algorithm();
        let key = Arc::new(key);
        let certified = CertifiedKey::new(chain, Arc::new(EngineSigningKey::new(key.clone())));
        match certified.keys_match() {
            Ok(()) => {}
            Err(rustls::Error::InconsistentKeys(_)) => {
                return Err(CertError::Mismatch {
                    cert: cert_path.to_owned(),
                    key: key_path.to_owned(),
                })
            }
            Err(e) => {
                return Err(CertError::BadCertificate {
                    path: cert_path.to_owned(),
                    detail: e.to_string(),
                })
            }
        }
        Ok(Self {
            certified: Arc::new(certified),
            algorithm,
            key: Some(key),
        })
    }

    /// The chain in `cert_path` (leaf first) whose private key is on keyless signers:
    /// `remote` makes the engine's key from the leaf's SubjectPublicKeyInfo. No key file
    /// is read; the signers prove they hold the key at the first handshake.
    pub fn with_remote_key(
        cert_path: &Path,
        remote: impl FnOnce(&[u8]) -> Result<Arc<dyn RemoteKey>, String>,
    ) -> Result<Self, CertError> {
        let chain = parse_chain(&read(cert_path)?, cert_path)?;
        let bad = |detail: String| CertError::BadCertificate {
            path: cert_path.to_owned(),
            detail,
        };
        let (_, leaf) = x509_parser::parse_x509_certificate(chain[0].as_ref())
            .map_err(|e| bad(e.to_string()))?;
        let key = remote(leaf.public_key().raw).map_err(|detail| CertError::RemoteKey {
            path: cert_path.to_owned(),
            detail,
        })?;
        let algorithm = key.algorithm();
        let certified = CertifiedKey::new(chain, Arc::new(EngineSigningKey::remote(key)));
        Ok(Self {
            certified: Arc::new(certified),
            algorithm,
            key: None,
        })
    }

    /// A certificate made together with its key, which webpki cannot check against it:
    /// TLS-ALPN-01's challenge certificate carries a critical extension (RFC 8737's
    /// acmeIdentifier) that webpki refuses to parse, as it should for any certificate it
    /// validates. Only for a certificate this process just made with `key_pem`.
    pub fn made_with(cert: CertificateDer<'static>, key_pem: &[u8]) -> Result<Self, CertError> {
        let key = Arc::new(parse_key(key_pem, Path::new("(generated key)"))?);
        let algorithm = key.algorithm();
        let certified = CertifiedKey::new(vec![cert], Arc::new(EngineSigningKey::new(key.clone())));
        Ok(Self {
            certified: Arc::new(certified),
            algorithm,
            key: Some(key),
        })
    }

    /// SHA-256 of the leaf certificate, as `openssl x509 -fingerprint -sha256` prints it.
    pub fn fingerprint(&self) -> String {
        fingerprint(&self.certified.cert[0])
    }
}

/// A private key from a PEM file (PKCS#8, PKCS#1 or SEC1), as the engine signs with it:
/// a keyless signer's keys, which come without their certificates.
pub fn load_signing_key(path: &Path) -> Result<SigningKeyPair, CertError> {
    parse_key(&read(path)?, path)
}

/// Colon-separated upper-case hex SHA-256 of a DER certificate.
pub fn fingerprint(cert: &CertificateDer<'_>) -> String {
    let digest = Sha256::digest(cert.as_ref());
    let mut out = String::with_capacity(95);
    for (i, b) in digest.iter().enumerate() {
        if i > 0 {
            out.push(':');
        }
        let _ = write!(out, "{b:02X}");
    }
    out
}

fn read(path: &Path) -> Result<Vec<u8>, CertError> {
    std::fs::read(path).map_err(|source| CertError::Read {
        path: path.to_owned(),
        source,
    })
}

fn parse_chain(pem: &[u8], path: &Path) -> Result<Vec<CertificateDer<'static>>, CertError> {
    let chain = rustls_pemfile::certs(&mut &pem[..])
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| CertError::BadPem {
            path: path.to_owned(),
            detail: e.to_string(),
        })?;
    if chain.is_empty() {
        return Err(CertError::EmptyChain {
            path: path.to_owned(),
        });
    }
    Ok(chain)
}

fn parse_key(pem: &[u8], path: &Path) -> Result<SigningKeyPair, CertError> {
    let text = String::from_utf8_lossy(pem);
    if text.contains("ENCRYPTED PRIVATE KEY") || text.contains("Proc-Type: 4,ENCRYPTED") {
        return Err(CertError::EncryptedKey {
            path: path.to_owned(),
        });
    }
    let key = rustls_pemfile::private_key(&mut &pem[..])
        .map_err(|e| CertError::BadPem {
            path: path.to_owned(),
            detail: e.to_string(),
        })?
        .ok_or_else(|| CertError::NoKey {
            path: path.to_owned(),
        })?;
    SigningKeyPair::from_der(key.secret_der()).map_err(|source| CertError::Key {
        path: path.to_owned(),
        source,
    })
}
