//! How terminus's client side trusts a server: the load generator's connections and the
//! proxy's connections to TLS upstreams both check certificates here, against a CA file,
//! the system bundle, or (benchmarks, or an operator who says so) not at all beyond the
//! handshake signature.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::client::WebPkiServerVerifier;
use rustls::crypto::{CryptoProvider, WebPkiSupportedAlgorithms};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::{DigitallySignedStruct, RootCertStore, SignatureScheme};

/// Why the trust a server's certificate is checked against cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum TrustError {
    /// The CA file cannot be read.
    #[error("CA file {}: {source}", path.display())]
    Read {
        /// The CA file.
        path: PathBuf,
        /// What reading it said.
        #[source]
        source: std::io::Error,
    },
    /// The CA file is not PEM.
    #[error("CA file {}: not PEM: {source}", path.display())]
    Pem {
        /// The CA file.
        path: PathBuf,
        /// What the PEM reader said.
        #[source]
        source: std::io::Error,
    },
    /// The CA file holds no certificate rustls takes as a root.
    #[error("CA file {}: holds no usable CERTIFICATE block", path.display())]
    NoRoots {
        /// The CA file.
        path: PathBuf,
    },
    /// rustls will not make a verifier of the roots.
    #[error(transparent)]
    Verifier(rustls::client::VerifierBuilderError),
}

/// Why a client certificate and its key cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum IdentityError {
    /// A file cannot be read.
    #[error("{}: cannot read: {source}", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// What reading it said.
        #[source]
        source: std::io::Error,
    },
    /// A file is not PEM.
    #[error("{}: malformed PEM: {source}", path.display())]
    Pem {
        /// The file.
        path: PathBuf,
        /// What the PEM reader said.
        #[source]
        source: std::io::Error,
    },
    /// The certificate file holds no certificate.
    #[error("{}: no CERTIFICATE block", path.display())]
    NoCertificate {
        /// The certificate file.
        path: PathBuf,
    },
    /// The key file holds no key (or only an encrypted one).
    #[error("{}: no unencrypted private key", path.display())]
    NoKey {
        /// The key file.
        path: PathBuf,
    },
}

/// How a server's certificate is checked.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum Trust {
    /// The system's CA bundle (`SSL_CERT_FILE`, else Debian's
    /// `/etc/ssl/certs/ca-certificates.crt`).
    #[default]
    System,
    /// Chains must end at a certificate in this PEM file.
    CaFile(PathBuf),
    /// The chain and name are not checked; the handshake signature still is, so a
    /// handshake costs what a real one does and the key's holder is still the peer.
    Insecure,
}

impl Trust {
    /// The verifier for this trust, verifying signatures with `provider`'s algorithms.
    /// Errors name the file and what is wrong with it.
    pub fn verifier(
        &self,
        provider: &Arc<CryptoProvider>,
    ) -> Result<Arc<dyn ServerCertVerifier>, TrustError> {
        let roots = match self {
            Trust::Insecure => {
                return Ok(Arc::new(SignatureOnly {
                    algorithms: provider.signature_verification_algorithms,
                }))
            }
            Trust::CaFile(path) => load_roots(path)?,
            Trust::System => load_roots(&system_bundle())?,
        };
        WebPkiServerVerifier::builder_with_provider(Arc::new(roots), provider.clone())
            .build()
            .map(|v| v as Arc<dyn ServerCertVerifier>)
            .map_err(TrustError::Verifier)
    }
}

/// A client certificate chain (leaf first) and its key, from PEM files, for servers that
/// ask for one (mutual TLS). Errors name the file and what is wrong with it.
pub fn load_identity(
    cert: &Path,
    key: &Path,
) -> Result<(Vec<CertificateDer<'static>>, PrivateKeyDer<'static>), IdentityError> {
    let read = |path: &Path| {
        std::fs::read(path).map_err(|source| IdentityError::Read {
            path: path.to_owned(),
            source,
        })
    };
    let malformed = |path: &Path| {
        let path = path.to_owned();
        move |source| IdentityError::Pem { path, source }
    };
    let pem = read(cert)?;
    let chain = rustls_pemfile::certs(&mut pem.as_slice())
        .collect::<Result<Vec<_>, _>>()
        .map_err(malformed(cert))?;
    if chain.is_empty() {
        return Err(IdentityError::NoCertificate {
            path: cert.to_owned(),
        });
    }
    let pem = read(key)?;
    let key_der = rustls_pemfile::private_key(&mut pem.as_slice())
        .map_err(malformed(key))?
        .ok_or_else(|| IdentityError::NoKey {
            path: key.to_owned(),
        })?;
    Ok((chain, key_der))
}

/// Where the system's CA bundle is.
pub fn system_bundle() -> PathBuf {
    std::env::var_os("SSL_CERT_FILE")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/etc/ssl/certs/ca-certificates.crt"))
}

fn load_roots(path: &Path) -> Result<RootCertStore, TrustError> {
    let pem = std::fs::read(path).map_err(|source| TrustError::Read {
        path: path.to_owned(),
        source,
    })?;
    let mut roots = RootCertStore::empty();
    let mut added = 0;
    for cert in rustls_pemfile::certs(&mut pem.as_slice()) {
        let cert = cert.map_err(|source| TrustError::Pem {
            path: path.to_owned(),
            source,
        })?;
        if roots.add(cert).is_ok() {
            added += 1;
        }
    }
    if added == 0 {
        return Err(TrustError::NoRoots {
            path: path.to_owned(),
        });
    }
    Ok(roots)
}

/// Any chain and name are accepted, but the handshake signature is verified against the
/// leaf's key as usual.
#[derive(Debug)]
struct SignatureOnly {
    algorithms: WebPkiSupportedAlgorithms,
}

impl ServerCertVerifier for SignatureOnly {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(message, cert, dss, &self.algorithms)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.algorithms.supported_schemes()
    }
}
