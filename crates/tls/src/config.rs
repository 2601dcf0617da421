//! TLS protocol settings and the rustls `ServerConfig` built from them.

use std::sync::Arc;

use rustls::crypto::{aws_lc_rs, CryptoProvider, SupportedKxGroup};
use rustls::server::{NoServerSessionStorage, ProducesTickets, ServerSessionMemoryCache};
use rustls::{ServerConfig, SupportedCipherSuite, SupportedProtocolVersion};
use terminus_engine::KxGroup;

use crate::handshake::EngineKxGroup;
use crate::resolver::SniResolver;

/// What the `[tls]` config section asks for, resolved to rustls values.
#[derive(Debug, Clone, PartialEq)]
pub struct TlsSettings {
    /// Protocol versions offered, in preference order.
    pub versions: Vec<&'static SupportedProtocolVersion>,
    /// Cipher suites offered, in preference order.
    pub cipher_suites: Vec<SupportedCipherSuite>,
    /// Choose by this order, not the client's (nginx `ssl_prefer_server_ciphers on`,
    /// HAProxy's default).
    pub prefer_server_ciphers: bool,
    /// Key-exchange groups offered, in preference order.
    pub groups: Vec<KxGroup>,
    /// TLS 1.2 tickets and TLS 1.3 resumption tickets.
    pub session_tickets: bool,
    /// Entries in the server-side session cache; 0 turns it off.
    pub session_cache: usize,
    /// ALPN protocols offered, in preference order.
    pub alpn: Vec<Vec<u8>>,
}

/// A `[tls]` value that names something terminus does not have.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TlsSettingsError {
    #[error("unknown TLS version {0:?} (use \"1.2\" or \"1.3\")")]
    /// A version name terminus does not know.
    Version(String),
    #[error("unknown cipher suite {0:?} (known: {1})")]
    /// A cipher suite name terminus does not know (the name, and what to use instead).
    CipherSuite(String, String),
    #[error("unknown group {0:?} (known: x25519mlkem768, x25519, secp256r1, secp384r1)")]
    /// A group name terminus does not know.
    Group(String),
    #[error("{0} list is empty")]
    /// A list that must not be empty is (the setting's name).
    Empty(&'static str),
    #[error("no configured cipher suite belongs to a configured TLS version")]
    /// No configured suite works with any configured version.
    NoUsableSuite,
    #[error("TLS 1.2 is enabled but no configured group works with it (x25519mlkem768 is TLS 1.3 only): add x25519, secp256r1 or secp384r1 to groups, or set versions = [\"1.3\"]")]
    /// TLS 1.2 clients could never complete: every group is TLS 1.3 only.
    NoTls12Group,
    #[error("building the TLS configuration failed: {0}")]
    /// rustls refused the configuration.
    Rustls(String),
}

/// rustls's safe suites, AES-128-GCM first in each version: every suite here is strong,
/// and AES-128-GCM costs the least per byte on CPUs with AES instructions (the server's
/// order decides, see [`TlsSettings::prefer_server_ciphers`]).
pub static DEFAULT_CIPHER_SUITES: &[SupportedCipherSuite] = &[
    aws_lc_rs::cipher_suite::TLS13_AES_128_GCM_SHA256,
    aws_lc_rs::cipher_suite::TLS13_AES_256_GCM_SHA384,
    aws_lc_rs::cipher_suite::TLS13_CHACHA20_POLY1305_SHA256,
    aws_lc_rs::cipher_suite::TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256,
    aws_lc_rs::cipher_suite::TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384,
    aws_lc_rs::cipher_suite::TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256,
    aws_lc_rs::cipher_suite::TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256,
    aws_lc_rs::cipher_suite::TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384,
    aws_lc_rs::cipher_suite::TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256,
];

impl Default for TlsSettings {
    fn default() -> Self {
        Self {
            versions: rustls::DEFAULT_VERSIONS.to_vec(),
            cipher_suites: DEFAULT_CIPHER_SUITES.to_vec(),
            prefer_server_ciphers: true,
            groups: KxGroup::ALL.to_vec(),
            session_tickets: true,
            session_cache: 256 * 1024,
            alpn: vec![b"h2".to_vec(), b"http/1.1".to_vec()],
        }
    }
}

impl TlsSettings {
    /// The version a configuration name (`"1.2"`, `"1.3"`) means.
    pub fn version_from_name(
        name: &str,
    ) -> Result<&'static SupportedProtocolVersion, TlsSettingsError> {
        match name.trim_start_matches("TLSv").trim_start_matches("TLS") {
            "1.2" => Ok(&rustls::version::TLS12),
            "1.3" => Ok(&rustls::version::TLS13),
            _ => Err(TlsSettingsError::Version(name.to_owned())),
        }
    }

    /// The suite a configuration name (IANA's or OpenSSL's) means.
    pub fn suite_from_name(name: &str) -> Result<SupportedCipherSuite, TlsSettingsError> {
        aws_lc_rs::ALL_CIPHER_SUITES
            .iter()
            .find(|s| {
                s.suite()
                    .as_str()
                    .is_some_and(|n| n.eq_ignore_ascii_case(name))
            })
            .copied()
            .ok_or_else(|| {
                let known: Vec<&str> = aws_lc_rs::ALL_CIPHER_SUITES
                    .iter()
                    .filter_map(|s| s.suite().as_str())
                    .collect();
                TlsSettingsError::CipherSuite(name.to_owned(), known.join(", "))
            })
    }

    /// The group a configuration name means.
    pub fn group_from_name(name: &str) -> Result<KxGroup, TlsSettingsError> {
        KxGroup::from_name(name).ok_or_else(|| TlsSettingsError::Group(name.to_owned()))
    }

    /// Whether the settings can make a working configuration: no empty list, a suite for
    /// some version, a group for TLS 1.2 if it is on.
    pub fn check(&self) -> Result<(), TlsSettingsError> {
        for (list, empty) in [
            (self.versions.is_empty(), "versions"),
            (self.cipher_suites.is_empty(), "cipher_suites"),
            (self.groups.is_empty(), "groups"),
        ] {
            if list {
                return Err(TlsSettingsError::Empty(empty));
            }
        }
        if !self
            .cipher_suites
            .iter()
            .any(|s| self.versions.iter().any(|v| s.version() == *v))
        {
            return Err(TlsSettingsError::NoUsableSuite);
        }
        if self.versions.contains(&&rustls::version::TLS12)
            && !self.groups.iter().any(|g| g.tls12())
        {
            return Err(TlsSettingsError::NoTls12Group);
        }
        Ok(())
    }

    /// The rustls configuration: aws-lc-rs for everything but key exchange and signing,
    /// which go to the crypto engine through [`EngineKxGroup`] and the resolver's keys.
    /// With `session_tickets`, tickets are sealed by `ticketer` (the process keeps one
    /// across reloads, so that a reload does not void every ticket issued).
    pub fn server_config(
        &self,
        resolver: Arc<SniResolver>,
        ticketer: Arc<dyn ProducesTickets>,
    ) -> Result<Arc<ServerConfig>, TlsSettingsError> {
        self.server_config_verifying(resolver, ticketer, None)
    }

    /// [`TlsSettings::server_config`], asking clients for certificates that `clients`
    /// verifies (see [`crate::client_auth`]).
    pub fn server_config_verifying(
        &self,
        resolver: Arc<SniResolver>,
        ticketer: Arc<dyn ProducesTickets>,
        clients: Option<Arc<dyn rustls::server::danger::ClientCertVerifier>>,
    ) -> Result<Arc<ServerConfig>, TlsSettingsError> {
        self.check()?;
        let provider = CryptoProvider {
            cipher_suites: self.cipher_suites.clone(),
            kx_groups: self
                .groups
                .iter()
                .map(|g| EngineKxGroup::for_group(*g) as &'static dyn SupportedKxGroup)
                .collect(),
            ..aws_lc_rs::default_provider()
        };
        let config = ServerConfig::builder_with_provider(Arc::new(provider))
            .with_protocol_versions(&self.versions)
            .map_err(|e| TlsSettingsError::Rustls(e.to_string()))?;
        let mut config = match clients {
            None => config.with_no_client_auth(),
            Some(verifier) => config.with_client_cert_verifier(verifier),
        }
        .with_cert_resolver(resolver);
        config.alpn_protocols = self.alpn.clone();
        config.ignore_client_order = self.prefer_server_ciphers;
        // Kernel TLS takes the traffic keys after the handshake (crate::ktls).
        config.enable_secret_extraction = true;
        config.session_storage = if self.session_cache > 0 {
            ServerSessionMemoryCache::new(self.session_cache)
        } else {
            Arc::new(NoServerSessionStorage {})
        };
        if self.session_tickets {
            config.ticketer = ticketer;
        } else if self.session_cache == 0 {
            // Neither stateless nor stateful resumption: a TLS 1.3 ticket would be useless.
            config.send_tls13_tickets = 0;
        }
        Ok(Arc::new(config))
    }
}

/// A ticketer that issues no tickets: where resumption, if any, is from the session
/// cache alone (ACME's validation handshakes; QUIC with 0-RTT, which rustls takes only
/// with sessions from its cache).
#[derive(Debug)]
pub struct NoTickets;

impl rustls::server::ProducesTickets for NoTickets {
    fn enabled(&self) -> bool {
        false
    }

    fn lifetime(&self) -> u32 {
        0
    }

    fn encrypt(&self, _: &[u8]) -> Option<Vec<u8>> {
        None
    }

    fn decrypt(&self, _: &[u8]) -> Option<Vec<u8>> {
        None
    }
}
