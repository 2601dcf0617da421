//! What the listeners answer while an order waits for the CA to validate a name.
//!
//! An order publishes its challenge here and withdraws it when the order is done
//! ([`Published`] does it on drop), so nothing is answered for a name no order is
//! proving. HTTP-01 answers are key authorizations by token, given to any host on the
//! plain listener (the token is the secret part, as RFC 8555 section 8.3 has it);
//! TLS-ALPN-01 answers are a whole TLS configuration for one name: the challenge
//! certificate (with its critical acmeIdentifier extension) and ALPN `acme-tls/1` only,
//! its signature computed by the crypto engine like every other handshake's.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};

use rustls::ServerConfig;
use terminus_tls::config::NoTickets;
use terminus_tls::{
    CertError, LoadedCert, SniResolver, TlsSettings, TlsSettingsError, VirtualHostCerts,
};

/// The ALPN protocol of TLS-ALPN-01 (RFC 8737 section 6.2).
pub const ACME_TLS_ALPN: &[u8] = b"acme-tls/1";

/// Why a TLS-ALPN-01 answer could not be made.
#[derive(Debug, thiserror::Error)]
pub enum ChallengeError {
    /// No key for the challenge certificate.
    #[error("challenge key: {0}")]
    Key(#[source] rcgen::Error),
    /// The challenge certificate could not be made (the name, as rcgen takes it).
    #[error("challenge certificate for {name}: {source}")]
    Certificate {
        /// The name it is for.
        name: String,
        /// What rcgen said.
        #[source]
        source: rcgen::Error,
    },
    /// The certificate and key made do not load.
    #[error(transparent)]
    Load(CertError),
    /// rustls will not make a configuration of them.
    #[error(transparent)]
    Config(TlsSettingsError),
}

/// The challenges being answered now, shared by the ACME thread and every worker.
#[derive(Default)]
pub struct Challenges {
    /// By token: the publication's number and the key authorization.
    http: RwLock<HashMap<String, (u64, String)>>,
    /// By name: the publication's number and the configuration.
    alpn: RwLock<HashMap<String, (u64, Arc<ServerConfig>)>>,
    /// Numbers publications, so that a guard withdraws only its own answer.
    published: AtomicU64,
}

/// Whose answer is published: this instance's order's replaces whatever is there;
/// another instance's (read from a fleet's store) never replaces one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Whose {
    Ours,
    Theirs,
}

impl std::fmt::Debug for Challenges {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Challenges")
            .field("http", &read(&self.http).len())
            .field("alpn", &read(&self.alpn).len())
            .finish()
    }
}

fn read<T>(lock: &RwLock<T>) -> std::sync::RwLockReadGuard<'_, T> {
    lock.read()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

fn write<T>(lock: &RwLock<T>) -> std::sync::RwLockWriteGuard<'_, T> {
    lock.write()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl Challenges {
    /// The HTTP-01 answer for `token`, if an order is waiting on it.
    pub fn http01(&self, token: &str) -> Option<String> {
        read(&self.http)
            .get(token)
            .map(|(_, answer)| answer.clone())
    }

    /// The TLS configuration that answers TLS-ALPN-01 for `name`, if an order is
    /// waiting on it.
    pub fn tls_alpn01(&self, name: &str) -> Option<Arc<ServerConfig>> {
        let alpn = read(&self.alpn);
        if alpn.is_empty() {
            return None;
        }
        alpn.get(&name.to_ascii_lowercase())
            .map(|(_, config)| config.clone())
    }

    /// Answers HTTP-01 for `token` with `key_authorization` until the guard is dropped
    /// (`None`: theirs, and an answer is already there).
    pub(crate) fn publish_http01(
        self: &Arc<Self>,
        token: &str,
        key_authorization: String,
        whose: Whose,
    ) -> Option<Published> {
        let id = self.published.fetch_add(1, Ordering::Relaxed);
        if !place(&self.http, token, (id, key_authorization), whose) {
            return None;
        }
        Some(Published {
            challenges: self.clone(),
            what: Withdraw::Http(token.to_owned()),
            id,
        })
    }

    /// Answers TLS-ALPN-01 for `name` with a certificate carrying the SHA-256 of
    /// `key_authorization` until the guard is dropped (`None`: theirs, and an answer is
    /// already there).
    pub(crate) fn publish_tls_alpn01(
        self: &Arc<Self>,
        name: &str,
        key_authorization: &str,
        whose: Whose,
    ) -> Result<Option<Published>, ChallengeError> {
        let config = alpn_config(name, key_authorization)?;
        let name = name.to_ascii_lowercase();
        let id = self.published.fetch_add(1, Ordering::Relaxed);
        if !place(&self.alpn, &name, (id, config), whose) {
            return Ok(None);
        }
        Ok(Some(Published {
            challenges: self.clone(),
            what: Withdraw::Alpn(name),
            id,
        }))
    }
}

/// Puts `entry` at `key` (theirs only where nothing is); whether it was put.
fn place<T>(
    map: &RwLock<HashMap<String, (u64, T)>>,
    key: &str,
    entry: (u64, T),
    whose: Whose,
) -> bool {
    let mut map = write(map);
    if whose == Whose::Theirs && map.contains_key(key) {
        return false;
    }
    map.insert(key.to_owned(), entry);
    true
}

/// Removes the entry at `key` if it is still publication `id`'s.
fn withdraw<T>(map: &RwLock<HashMap<String, (u64, T)>>, key: &str, id: u64) {
    let mut map = write(map);
    if map.get(key).is_some_and(|(held, _)| *held == id) {
        map.remove(key);
    }
}

enum Withdraw {
    Http(String),
    Alpn(String),
}

/// A challenge answered until this is dropped (unless another publication replaced it).
pub(crate) struct Published {
    challenges: Arc<Challenges>,
    what: Withdraw,
    id: u64,
}

impl Drop for Published {
    fn drop(&mut self) {
        match &self.what {
            Withdraw::Http(token) => withdraw(&self.challenges.http, token, self.id),
            Withdraw::Alpn(name) => withdraw(&self.challenges.alpn, name, self.id),
        }
    }
}

/// The challenge certificate of RFC 8737 section 3: self-signed, `name` its only
/// subjectAltName, the SHA-256 of the key authorization in a critical acmeIdentifier
/// extension; offered with ALPN `acme-tls/1` alone and no session resumption.
fn alpn_config(name: &str, key_authorization: &str) -> Result<Arc<ServerConfig>, ChallengeError> {
    let (cert, key_pem) = challenge_certificate(name, key_authorization)?;
    let loaded = LoadedCert::made_with(cert, key_pem.as_bytes()).map_err(ChallengeError::Load)?;
    let mut certs = VirtualHostCerts::default();
    certs.insert(loaded);
    let resolver = Arc::new(SniResolver::new(vec![(vec![name.to_owned()], certs)], 0));
    let settings = TlsSettings {
        alpn: vec![ACME_TLS_ALPN.to_vec()],
        session_tickets: false,
        session_cache: 0,
        ..TlsSettings::default()
    };
    settings
        // Validation handshakes resume nothing.
        .server_config(resolver, Arc::new(NoTickets))
        .map_err(ChallengeError::Config)
}

/// The challenge certificate for `name` (DER) and its key (PEM).
fn challenge_certificate(
    name: &str,
    key_authorization: &str,
) -> Result<(rustls::pki_types::CertificateDer<'static>, String), ChallengeError> {
    let digest =
        aws_lc_rs::digest::digest(&aws_lc_rs::digest::SHA256, key_authorization.as_bytes());
    let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256)
        .map_err(ChallengeError::Key)?;
    let refused = |source| ChallengeError::Certificate {
        name: name.to_owned(),
        source,
    };
    let mut params = rcgen::CertificateParams::new(vec![name.to_owned()]).map_err(refused)?;
    params
        .custom_extensions
        .push(rcgen::CustomExtension::new_acme_identifier(digest.as_ref()));
    let cert = params.self_signed(&key).map_err(refused)?;
    Ok((cert.der().clone(), key.serialize_pem()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers_live_as_long_as_their_order_holds_them() {
        let c = Arc::new(Challenges::default());
        let held = c.publish_http01("tok", "tok.thumb".into(), Whose::Ours);
        assert_eq!(c.http01("tok").as_deref(), Some("tok.thumb"));
        assert_eq!(c.http01("other"), None);
        drop(held);
        assert_eq!(c.http01("tok"), None);
        let held = c
            .publish_tls_alpn01("A.test", "tok.thumb", Whose::Ours)
            .unwrap();
        let config = c.tls_alpn01("a.test").expect("case-insensitive name");
        assert_eq!(config.alpn_protocols, vec![ACME_TLS_ALPN.to_vec()]);
        assert!(c.tls_alpn01("b.test").is_none());
        drop(held);
        assert!(c.tls_alpn01("a.test").is_none());
    }

    /// Another instance's answer (from a fleet's store) never replaces this instance's
    /// order's, and a guard whose answer was replaced withdraws nothing.
    #[test]
    fn a_guard_withdraws_only_its_own_answer_and_theirs_never_replaces_ours() {
        let c = Arc::new(Challenges::default());
        let theirs = c.publish_http01("tok", "old".into(), Whose::Theirs);
        assert!(theirs.is_some());
        let ours = c.publish_http01("tok", "new".into(), Whose::Ours);
        drop(theirs);
        assert_eq!(c.http01("tok").as_deref(), Some("new"));
        assert!(c
            .publish_http01("tok", "stale".into(), Whose::Theirs)
            .is_none());
        assert_eq!(c.http01("tok").as_deref(), Some("new"));
        drop(ours);
        assert_eq!(c.http01("tok"), None);
        let ours = c.publish_tls_alpn01("a.test", "k1", Whose::Ours).unwrap();
        assert!(c
            .publish_tls_alpn01("a.test", "k2", Whose::Theirs)
            .unwrap()
            .is_none());
        assert!(c.tls_alpn01("a.test").is_some());
        drop(ours);
        assert!(c.tls_alpn01("a.test").is_none());
    }

    /// RFC 8737 section 3: the name as the only subjectAltName, and a critical
    /// acmeIdentifier (1.3.6.1.5.5.7.1.31) holding the DER OCTET STRING of the key
    /// authorization's SHA-256.
    #[test]
    fn the_challenge_certificate_carries_the_key_authorization_digest_critically() {
        let (der, _) = challenge_certificate("a.test", "tok.thumb").unwrap();
        let (_, cert) = x509_parser::parse_x509_certificate(&der).unwrap();
        let oid = x509_parser::oid_registry::Oid::from(&[1, 3, 6, 1, 5, 5, 7, 1, 31]).unwrap();
        let ext = cert
            .extensions()
            .iter()
            .find(|e| e.oid == oid)
            .expect("an acmeIdentifier extension");
        assert!(ext.critical);
        let digest = aws_lc_rs::digest::digest(&aws_lc_rs::digest::SHA256, b"tok.thumb");
        let mut expected = vec![0x04, 32];
        expected.extend_from_slice(digest.as_ref());
        assert_eq!(ext.value, &expected[..]);
        let san = cert.subject_alternative_name().unwrap().unwrap();
        assert_eq!(san.value.general_names.len(), 1);
        assert!(matches!(
            san.value.general_names[0],
            x509_parser::extensions::GeneralName::DNSName("a.test")
        ));
    }
}
