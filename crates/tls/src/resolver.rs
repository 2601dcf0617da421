//! Choosing the certificate: virtual host by SNI, then RSA or ECDSA by what the client offers.
//!
//! Like nginx with two `ssl_certificate` lines, a host may carry one RSA and one ECDSA
//! certificate; a client that can verify ECDSA (signature scheme offered, and a TLS 1.3 or
//! ECDHE-ECDSA suite to use it with) gets the cheaper ECDSA one.

use std::collections::HashMap;
use std::sync::Arc;

use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use rustls::CipherSuite;
use terminus_engine::KeyAlgorithm;

use crate::certs::LoadedCert;

/// The certificates of one virtual host.
#[derive(Debug, Clone, Default)]
pub struct VirtualHostCerts {
    /// The RSA certificate, if any.
    pub rsa: Option<LoadedCert>,
    /// The ECDSA certificate, if any.
    pub ecdsa: Option<LoadedCert>,
}

impl VirtualHostCerts {
    /// Adds a certificate in the slot its key type belongs to; returns the one it replaces.
    pub fn insert(&mut self, cert: LoadedCert) -> Option<LoadedCert> {
        let slot = match cert.algorithm {
            KeyAlgorithm::Rsa { .. } => &mut self.rsa,
            KeyAlgorithm::EcdsaP256 | KeyAlgorithm::EcdsaP384 => &mut self.ecdsa,
        };
        slot.replace(cert)
    }

    fn choose(&self, hello: &ClientHello<'_>) -> Option<&LoadedCert> {
        if let Some(ecdsa) = &self.ecdsa {
            let scheme_ok = ecdsa
                .algorithm
                .schemes()
                .iter()
                .any(|s| hello.signature_schemes().contains(s));
            let suite_ok = hello
                .cipher_suites()
                .iter()
                .any(|s| ECDSA_CAPABLE_SUITES.contains(s));
            if (scheme_ok && suite_ok) || self.rsa.is_none() {
                return Some(ecdsa);
            }
        }
        self.rsa.as_ref()
    }
}

/// Suites with which an ECDSA certificate can be used.
const ECDSA_CAPABLE_SUITES: &[CipherSuite] = &[
    CipherSuite::TLS13_AES_128_GCM_SHA256,
    CipherSuite::TLS13_AES_256_GCM_SHA384,
    CipherSuite::TLS13_CHACHA20_POLY1305_SHA256,
    CipherSuite::TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256,
    CipherSuite::TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384,
    CipherSuite::TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256,
];

/// Maps SNI names to virtual hosts: exact names first, then `*.example.com` wildcards
/// (one label), then the default host.
#[derive(Debug)]
pub struct SniResolver {
    hosts: Vec<VirtualHostCerts>,
    exact: HashMap<String, usize>,
    wildcard: HashMap<String, usize>,
    default: usize,
}

impl SniResolver {
    /// `hosts[i]` is served for `names[i]`; `default` answers unknown or missing SNI.
    pub fn new(hosts: Vec<(Vec<String>, VirtualHostCerts)>, default: usize) -> Self {
        let mut exact = HashMap::new();
        let mut wildcard = HashMap::new();
        let mut certs = Vec::with_capacity(hosts.len());
        for (i, (names, host)) in hosts.into_iter().enumerate() {
            for name in names {
                let name = name.to_ascii_lowercase();
                match name.strip_prefix("*.") {
                    Some(suffix) => wildcard.entry(suffix.to_owned()).or_insert(i),
                    None => exact.entry(name).or_insert(i),
                };
            }
            certs.push(host);
        }
        Self {
            hosts: certs,
            exact,
            wildcard,
            default,
        }
    }

    /// The virtual host index that serves `sni`.
    pub fn lookup(&self, sni: Option<&str>) -> usize {
        sni.and_then(|name| self.find(name)).unwrap_or(self.default)
    }

    /// The virtual host `name` is configured for (exactly or by a wildcard), if any.
    pub fn find(&self, name: &str) -> Option<usize> {
        let name = name.trim_end_matches('.').to_ascii_lowercase();
        if let Some(&i) = self.exact.get(&name) {
            return Some(i);
        }
        name.split_once('.')
            .and_then(|(_, parent)| self.wildcard.get(parent).copied())
    }
}

impl SniResolver {
    /// The key a full handshake with `hello` would sign with: what quota admission
    /// charges before the handshake has run.
    pub fn key_for(&self, hello: &ClientHello<'_>) -> Option<KeyAlgorithm> {
        let index = self.lookup(hello.server_name());
        self.hosts[index].choose(hello).map(|c| c.algorithm)
    }
}

impl ResolvesServerCert for SniResolver {
    fn resolve(&self, hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        let index = self.lookup(hello.server_name());
        self.hosts[index]
            .choose(&hello)
            .map(|c| c.certified.clone())
    }
}
