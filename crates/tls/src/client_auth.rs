//! Client certificates (mutual TLS) per server: a policy (required or optional, the CAs
//! that sign clients, CRLs, a chain depth) becomes a rustls client verifier, and a
//! verified client becomes the identity told to upstreams and the access log.
//!
//! Each distinct policy gets a rustls configuration of its own, chosen after the
//! ClientHello like the rest (the crypto engine still computes the server's side of
//! every handshake; the client's signature is checked by aws-lc, as any certificate's).
//! Session tickets carry the policy they were issued under ([`PolicyTickets`]): a ticket
//! from a server that asked for no certificate must not resume on one that requires one
//! (rustls restores the client's certificate from the ticket and verifies nothing on
//! resumption).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::client::danger::HandshakeSignatureValid;
use rustls::pki_types::{CertificateDer, CertificateRevocationListDer, UnixTime};
use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use rustls::server::{ProducesTickets, WebPkiClientVerifier};
use rustls::{
    CertificateError, DigitallySignedStruct, DistinguishedName, RootCertStore, SignatureScheme,
};

/// Whether a client must show a certificate.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ClientAuthMode {
    /// No valid certificate, no handshake (nginx `ssl_verify_client on`).
    Required,
    /// A certificate is asked for; one that is shown must verify (nginx `optional`).
    Optional,
}

impl ClientAuthMode {
    /// Its name in the configuration.
    pub fn name(self) -> &'static str {
        match self {
            Self::Required => "required",
            Self::Optional => "optional",
        }
    }
}

/// A server's client-certificate policy.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ClientAuthPolicy {
    /// Required or optional.
    pub mode: ClientAuthMode,
    /// The CAs (PEM) whose clients are accepted.
    pub ca: PathBuf,
    /// Certificate revocation lists (PEM or DER), re-read at every reload.
    pub crls: Vec<PathBuf>,
    /// The most certificates a client's chain may have up to the trusted CA (nginx's
    /// `ssl_verify_depth`: 1 = issued by the CA itself); `None`: webpki's own limit.
    pub depth: Option<u32>,
}

impl ClientAuthPolicy {
    /// The verifier: the CA file's certificates as roots, the CRLs checked for the whole
    /// chain (a certificate whose issuer has no CRL is refused, as nginx's `ssl_crl`
    /// does), anonymous clients allowed only when optional.
    pub fn verifier(&self) -> Result<Arc<dyn ClientCertVerifier>, String> {
        let pem = read(&self.ca)?;
        let mut roots = RootCertStore::empty();
        for cert in rustls_pemfile::certs(&mut &pem[..]) {
            let cert = cert.map_err(|e| format!("{}: {e}", self.ca.display()))?;
            roots
                .add(cert)
                .map_err(|e| format!("{}: {e}", self.ca.display()))?;
        }
        if roots.is_empty() {
            return Err(format!("{}: no CA certificate in it", self.ca.display()));
        }
        let mut crls = Vec::new();
        for path in &self.crls {
            crls.extend(load_crls(path)?);
        }
        let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
        let mut builder =
            WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider).with_crls(crls);
        if self.mode == ClientAuthMode::Optional {
            builder = builder.allow_unauthenticated();
        }
        let verifier = builder.build().map_err(|e| format!("client_auth: {e}"))?;
        Ok(match self.depth {
            None => verifier,
            Some(depth) => Arc::new(Depth {
                inner: verifier,
                depth,
            }),
        })
    }

    /// A short tag naming the policy in the tickets issued under it.
    pub fn tag(&self) -> [u8; 8] {
        let text = format!("{:?}", self);
        let digest = aws_lc_rs::digest::digest(&aws_lc_rs::digest::SHA256, text.as_bytes());
        digest.as_ref()[..8].try_into().expect("8 bytes")
    }
}

fn read(path: &Path) -> Result<Vec<u8>, String> {
    std::fs::read(path).map_err(|e| format!("{}: {e}", path.display()))
}

/// The CRLs in `path`: PEM (one or more) or a single DER.
fn load_crls(path: &Path) -> Result<Vec<CertificateRevocationListDer<'static>>, String> {
    let bytes = read(path)?;
    if bytes.starts_with(b"-----") {
        let crls = rustls_pemfile::crls(&mut &bytes[..])
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| format!("{}: {e}", path.display()))?;
        if crls.is_empty() {
            return Err(format!("{}: no X509 CRL in it", path.display()));
        }
        return Ok(crls);
    }
    Ok(vec![CertificateRevocationListDer::from(bytes)])
}

/// A verifier that also bounds the chain's length.
#[derive(Debug)]
struct Depth {
    inner: Arc<dyn ClientCertVerifier>,
    depth: u32,
}

impl ClientCertVerifier for Depth {
    fn offer_client_auth(&self) -> bool {
        self.inner.offer_client_auth()
    }

    fn client_auth_mandatory(&self) -> bool {
        self.inner.client_auth_mandatory()
    }

    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        self.inner.root_hint_subjects()
    }

    fn verify_client_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        now: UnixTime,
    ) -> Result<ClientCertVerified, rustls::Error> {
        let verified = self
            .inner
            .verify_client_cert(end_entity, intermediates, now)?;
        // The chain as sent: the leaf and the intermediates up to (not counting) the CA.
        if 1 + intermediates.len() as u64 > u64::from(self.depth) {
            return Err(rustls::Error::InvalidCertificate(CertificateError::Other(
                rustls::OtherError(Arc::new(TooDeep(self.depth))),
            )));
        }
        Ok(verified)
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.inner.supported_verify_schemes()
    }
}

#[derive(Debug)]
struct TooDeep(u32);

impl std::fmt::Display for TooDeep {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "the client's chain is longer than depth = {}", self.0)
    }
}

impl std::error::Error for TooDeep {}

/// Tickets sealed by `inner` with the policy's tag inside: a ticket opens only under the
/// policy it was issued under (any other is a full handshake).
#[derive(Debug)]
pub struct PolicyTickets {
    inner: Arc<dyn ProducesTickets>,
    tag: [u8; 8],
}

impl PolicyTickets {
    /// `inner`'s tickets, tagged `tag` (a [`ClientAuthPolicy::tag`], or another for "no
    /// client certificates").
    pub fn new(inner: Arc<dyn ProducesTickets>, tag: [u8; 8]) -> Self {
        Self { inner, tag }
    }
}

impl ProducesTickets for PolicyTickets {
    fn enabled(&self) -> bool {
        self.inner.enabled()
    }

    fn lifetime(&self) -> u32 {
        self.inner.lifetime()
    }

    fn encrypt(&self, plain: &[u8]) -> Option<Vec<u8>> {
        let mut tagged = Vec::with_capacity(self.tag.len() + plain.len());
        tagged.extend_from_slice(&self.tag);
        tagged.extend_from_slice(plain);
        let sealed = self.inner.encrypt(&tagged);
        zeroize::Zeroize::zeroize(&mut tagged);
        sealed
    }

    fn decrypt(&self, ticket: &[u8]) -> Option<Vec<u8>> {
        let mut plain = self.inner.decrypt(ticket)?;
        if plain.get(..self.tag.len()) != Some(&self.tag[..]) {
            zeroize::Zeroize::zeroize(&mut plain);
            return None;
        }
        plain.drain(..self.tag.len());
        Some(plain)
    }
}

/// A verified client, as upstreams and the access log are told.
#[derive(Debug, Clone)]
pub struct ClientIdentity {
    /// The leaf certificate, DER.
    pub leaf: CertificateDer<'static>,
    /// The intermediates the client sent.
    pub chain: Vec<CertificateDer<'static>>,
    /// The leaf's subject, as RFC 4514 writes it.
    pub subject: String,
    /// SHA-256 of the leaf, hex.
    pub sha256: String,
    /// Its URI subjectAltNames (SPIFFE IDs among them).
    pub uris: Vec<String>,
    /// Its DNS subjectAltNames.
    pub dns: Vec<String>,
}

impl ClientIdentity {
    /// The identity of the client whose chain (leaf first) rustls verified.
    pub fn of(chain: &[CertificateDer<'_>]) -> Option<Self> {
        let (leaf, rest) = chain.split_first()?;
        let digest = aws_lc_rs::digest::digest(&aws_lc_rs::digest::SHA256, leaf);
        let sha256 = digest.as_ref().iter().map(|b| format!("{b:02x}")).collect();
        let (mut subject, mut uris, mut dns) = (String::new(), Vec::new(), Vec::new());
        if let Ok((_, cert)) = x509_parser::parse_x509_certificate(leaf) {
            subject = cert.subject().to_string();
            if let Ok(Some(san)) = cert.subject_alternative_name() {
                for name in &san.value.general_names {
                    match name {
                        x509_parser::extensions::GeneralName::URI(u) => uris.push(u.to_string()),
                        x509_parser::extensions::GeneralName::DNSName(d) => dns.push(d.to_string()),
                        _ => {}
                    }
                }
            }
        }
        Some(Self {
            leaf: leaf.clone().into_owned(),
            chain: rest.iter().map(|c| c.clone().into_owned()).collect(),
            subject,
            sha256,
            uris,
            dns,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug)]
    struct Plain;

    impl ProducesTickets for Plain {
        fn enabled(&self) -> bool {
            true
        }
        fn lifetime(&self) -> u32 {
            60
        }
        fn encrypt(&self, plain: &[u8]) -> Option<Vec<u8>> {
            Some(plain.to_vec())
        }
        fn decrypt(&self, ticket: &[u8]) -> Option<Vec<u8>> {
            Some(ticket.to_vec())
        }
    }

    #[test]
    fn a_ticket_opens_only_under_the_policy_it_was_issued_under() {
        let required = PolicyTickets::new(Arc::new(Plain), [1; 8]);
        let none = PolicyTickets::new(Arc::new(Plain), [0; 8]);
        let ticket = none.encrypt(b"session").unwrap();
        assert_eq!(none.decrypt(&ticket).as_deref(), Some(&b"session"[..]));
        assert_eq!(required.decrypt(&ticket), None);
        assert_eq!(required.decrypt(b"short"), None);
    }
}
