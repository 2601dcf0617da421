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
    ) -> Result<Arc<dyn ServerCertVerifier>, String> {
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
            .map_err(|e| e.to_string())
    }
}

/// A client certificate chain (leaf first) and its key, from PEM files, for servers that
/// ask for one (mutual TLS). Errors name the file and what is wrong with it.
pub fn load_identity(
    cert: &Path,
    key: &Path,
) -> Result<(Vec<CertificateDer<'static>>, PrivateKeyDer<'static>), String> {
    let read = |path: &Path| {
        std::fs::read(path).map_err(|e| format!("{}: cannot read: {e}", path.display()))
    };
    let pem = read(cert)?;
    let chain = rustls_pemfile::certs(&mut pem.as_slice())
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("{}: malformed PEM: {e}", cert.display()))?;
    if chain.is_empty() {
        return Err(format!("{}: no CERTIFICATE block", cert.display()));
    }
    let pem = read(key)?;
    let key_der = rustls_pemfile::private_key(&mut pem.as_slice())
        .map_err(|e| format!("{}: malformed PEM: {e}", key.display()))?
        .ok_or_else(|| format!("{}: no unencrypted private key", key.display()))?;
    Ok((chain, key_der))
}

/// Where the system's CA bundle is.
pub fn system_bundle() -> PathBuf {
    std::env::var_os("SSL_CERT_FILE")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/etc/ssl/certs/ca-certificates.crt"))
}

fn load_roots(path: &Path) -> Result<RootCertStore, String> {
    let cant = |why: String| format!("CA file {}: {why}", path.display());
    let pem = std::fs::read(path).map_err(|e| cant(e.to_string()))?;
    let mut roots = RootCertStore::empty();
    let mut added = 0;
    for cert in rustls_pemfile::certs(&mut pem.as_slice()) {
        let cert = cert.map_err(|e| cant(format!("not PEM: {e}")))?;
        if roots.add(cert).is_ok() {
            added += 1;
        }
    }
    if added == 0 {
        return Err(cant("holds no usable CERTIFICATE block".into()));
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
