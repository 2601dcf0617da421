//! `tls = { ... }` on an upstream: connections to its servers are TLS, their certificates
//! checked against the upstream's trust and name, the protocol chosen by ALPN. Sessions
//! are resumed across connections (rustls's in-memory store, shared by the workers), so
//! that a pool refilling after an idle timeout does not pay full handshakes.

use std::fmt;
use std::sync::Arc;

use rustls::client::Resumption;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use rustls::ClientConfig;
use terminus_tls::client::Trust;
use tokio_rustls::TlsConnector;

use crate::spec::{Protocol, ServerSpec};

/// Why an upstream's TLS side cannot be set up.
#[derive(Debug, thiserror::Error)]
pub enum UpstreamTlsError {
    /// The trust (a CA file) cannot be used.
    #[error(transparent)]
    Trust(#[from] terminus_tls::client::TrustError),
    /// rustls refuses the protocol versions.
    #[error(transparent)]
    Versions(rustls::Error),
    /// rustls refuses the client certificate or its key.
    #[error("client certificate: {0}")]
    ClientCertificate(#[source] rustls::Error),
}

/// How an upstream's servers are reached over TLS.
#[derive(Clone)]
pub struct UpstreamTls {
    /// The name sent by SNI and checked against each server's certificate; `None`: each
    /// server's own host as written, else its IP address.
    pub server_name: Option<ServerName<'static>>,
    /// What the certificates are checked against.
    pub trust: Trust,
    /// The certificate chain shown to servers that ask for one (mutual TLS).
    pub client_chain: Option<Vec<CertificateDer<'static>>>,
    connector: TlsConnector,
}

impl UpstreamTls {
    /// The TLS side of an upstream speaking `protocol` (offered by ALPN: `h2` or
    /// `http/1.1`), showing `identity` (a chain and its key) to servers that ask for a
    /// client certificate. Reads the CA file `trust` names; the error says what is wrong
    /// with it or with the key.
    pub fn new(
        server_name: Option<ServerName<'static>>,
        trust: Trust,
        identity: Option<(Vec<CertificateDer<'static>>, PrivateKeyDer<'static>)>,
        protocol: Protocol,
    ) -> Result<Self, UpstreamTlsError> {
        let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
        let verifier = trust.verifier(&provider)?;
        let builder = ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(UpstreamTlsError::Versions)?
            .dangerous()
            .with_custom_certificate_verifier(verifier);
        let client_chain = identity.as_ref().map(|(chain, _)| chain.clone());
        let mut config = match identity {
            None => builder.with_no_client_auth(),
            Some((chain, key)) => builder
                .with_client_auth_cert(chain, key)
                .map_err(UpstreamTlsError::ClientCertificate)?,
        };
        config.alpn_protocols = vec![match protocol {
            Protocol::H2 => b"h2".to_vec(),
            Protocol::Http1 | Protocol::H2c => b"http/1.1".to_vec(),
        }];
        config.resumption = Resumption::in_memory_sessions(256);
        Ok(UpstreamTls {
            server_name,
            trust,
            client_chain,
            connector: TlsConnector::from(Arc::new(config)),
        })
    }

    pub(crate) fn connector(&self) -> &TlsConnector {
        &self.connector
    }

    /// The name `server` is asked for.
    pub(crate) fn name_for(&self, server: &ServerSpec) -> ServerName<'static> {
        self.server_name
            .clone()
            .unwrap_or_else(|| super::default_name(server))
    }
}

impl fmt::Debug for UpstreamTls {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("UpstreamTls")
            .field("server_name", &self.server_name)
            .field("trust", &self.trust)
            .field("client_certificate", &self.client_chain.is_some())
            .finish_non_exhaustive()
    }
}

/// Two are the same when they were configured the same (the built configurations are
/// not comparable).
impl PartialEq for UpstreamTls {
    fn eq(&self, other: &Self) -> bool {
        self.server_name == other.server_name
            && self.trust == other.trust
            && self.client_chain == other.client_chain
            && self.connector.config().alpn_protocols == other.connector.config().alpn_protocols
    }
}

impl Eq for UpstreamTls {}
