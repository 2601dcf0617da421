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
//! resumption). The tag names what the policy's files hold, not where they are
//! ([`ClientAuthPolicy::load`] reads them once for the verifier and the tag alike), so
//! that a reload bringing a new CRL at the same path voids the tickets issued under the
//! old one. And since a session may come back by another way (rustls's session cache,
//! a fleet's shared ticket keys), a resumed session's restored chain is checked again
//! against the CRLs in force ([`Revocations::revokes`]): a lookup, not a signature.

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::client::danger::HandshakeSignatureValid;
use rustls::pki_types::{CertificateDer, CertificateRevocationListDer, UnixTime};
use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use rustls::server::{ProducesTickets, WebPkiClientVerifier};
use rustls::{
    CertificateError, DigitallySignedStruct, DistinguishedName, RootCertStore, SignatureScheme,
};

/// Why a client-certificate policy's files cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum ClientAuthError {
    /// A file cannot be read.
    #[error("{}: {source}", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// What reading it said.
        #[source]
        source: std::io::Error,
    },
    /// A PEM file is malformed.
    #[error("{}: {source}", path.display())]
    Pem {
        /// The file.
        path: PathBuf,
        /// What the PEM reader said.
        #[source]
        source: std::io::Error,
    },
    /// The CA file holds no certificate.
    #[error("{}: no CA certificate in it", path.display())]
    NoCa {
        /// The CA file.
        path: PathBuf,
    },
    /// A CA certificate is refused as a root.
    #[error("{}: {source}", path.display())]
    Root {
        /// The CA file.
        path: PathBuf,
        /// What rustls said.
        #[source]
        source: rustls::Error,
    },
    /// A CRL file holds no CRL.
    #[error("{}: no X509 CRL in it", path.display())]
    NoCrl {
        /// The CRL file.
        path: PathBuf,
    },
    /// A CRL does not parse.
    #[error("{}: {source}", path.display())]
    Crl {
        /// The CRL file.
        path: PathBuf,
        /// What the parser said.
        #[source]
        source: x509_parser::nom::Err<x509_parser::error::X509Error>,
    },
    /// rustls will not make a verifier of them.
    #[error("client_auth: {0}")]
    Verifier(#[source] rustls::server::VerifierBuilderError),
}

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
    /// Reads the policy's files once and makes of them what the server needs: the
    /// verifier, the tag its tickets carry and the revocations resumed sessions are
    /// checked against. One reading for all three, so that a file changed between two
    /// readings cannot give a verifier of one content a tag of another.
    ///
    /// The verifier takes the CA file's certificates as roots, checks the CRLs for the
    /// whole chain (a certificate whose issuer has no CRL is refused, as nginx's
    /// `ssl_crl` does) and allows anonymous clients only when optional.
    pub fn load(&self) -> Result<LoadedPolicy, ClientAuthError> {
        let files = self.read_files()?;
        let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
        let mut roots = RootCertStore::empty();
        for cert in &files.roots {
            roots
                .add(cert.clone())
                .map_err(|source| ClientAuthError::Root {
                    path: self.ca.clone(),
                    source,
                })?;
        }
        let mut builder = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
            .with_crls(files.crls.iter().cloned());
        if self.mode == ClientAuthMode::Optional {
            builder = builder.allow_unauthenticated();
        }
        let verifier = builder.build().map_err(ClientAuthError::Verifier)?;
        let verifier = match self.depth {
            None => verifier,
            Some(depth) => Arc::new(Depth {
                inner: verifier,
                depth,
            }),
        };
        Ok(LoadedPolicy {
            verifier,
            tag: self.tag_of(&files),
            revocations: Arc::new(files.revocations),
        })
    }

    /// A short tag naming the policy in the tickets issued under it: a digest of its
    /// mode, depth, and the certificates and CRLs its files hold now (read here; the
    /// server takes it from [`ClientAuthPolicy::load`] instead, with the verifier).
    /// Contents, not paths: a new CRL written over the old one must void the tickets
    /// issued under the old one.
    pub fn tag(&self) -> Result<[u8; 8], ClientAuthError> {
        Ok(self.tag_of(&self.read_files()?))
    }

    fn tag_of(&self, files: &Files) -> [u8; 8] {
        use aws_lc_rs::digest::{Context, SHA256};
        let mut digest = Context::new(&SHA256);
        digest.update(b"terminus client_auth policy 1\0");
        digest.update(self.mode.name().as_bytes());
        match self.depth {
            None => digest.update(&[0]),
            Some(depth) => {
                digest.update(&[1]);
                digest.update(&depth.to_be_bytes());
            }
        }
        // Each item kind-marked and length-prefixed: no two lists hash alike.
        let items = files
            .roots
            .iter()
            .map(|c| (b'C', c.as_ref()))
            .chain(files.crls.iter().map(|c| (b'R', c.as_ref())));
        for (kind, der) in items {
            digest.update(&[kind]);
            digest.update(&(der.len() as u64).to_be_bytes());
            digest.update(der);
        }
        digest.finish().as_ref()[..8].try_into().expect("8 bytes")
    }

    fn read_files(&self) -> Result<Files, ClientAuthError> {
        let pem = read(&self.ca)?;
        let roots = rustls_pemfile::certs(&mut &pem[..])
            .collect::<Result<Vec<_>, _>>()
            .map_err(|source| ClientAuthError::Pem {
                path: self.ca.clone(),
                source,
            })?;
        if roots.is_empty() {
            return Err(ClientAuthError::NoCa {
                path: self.ca.clone(),
            });
        }
        let mut crls = Vec::new();
        let mut revocations = Revocations::default();
        for path in &self.crls {
            for crl in load_crls(path)? {
                revocations
                    .add(&crl)
                    .map_err(|source| ClientAuthError::Crl {
                        path: path.clone(),
                        source,
                    })?;
                crls.push(crl);
            }
        }
        Ok(Files {
            roots,
            crls,
            revocations,
        })
    }
}

/// What a policy's files held when read.
struct Files {
    roots: Vec<CertificateDer<'static>>,
    crls: Vec<CertificateRevocationListDer<'static>>,
    revocations: Revocations,
}

/// A [`ClientAuthPolicy`] with its files read ([`ClientAuthPolicy::load`]).
#[derive(Debug, Clone)]
pub struct LoadedPolicy {
    /// What rustls verifies a client's certificate with in a full handshake.
    pub verifier: Arc<dyn ClientCertVerifier>,
    /// The tag of the tickets issued under it ([`PolicyTickets`]).
    pub tag: [u8; 8],
    /// The certificates its CRLs revoke: what a resumed session's chain is checked against.
    pub revocations: Arc<Revocations>,
}

/// The certificates a policy's CRLs revoke, by issuer and serial number.
///
/// rustls verifies nothing when a session resumes: it restores the client's chain from
/// the ticket or the session cache. The chain was verified when the session began; what
/// may have changed since is a CRL, and checking that is a lookup of each certificate's
/// issuer and serial here, not a signature.
#[derive(Debug, Default)]
pub struct Revocations {
    /// Issuer name (DER) to the serial numbers (DER integer contents) it revoked.
    by_issuer: HashMap<Box<[u8]>, HashSet<Box<[u8]>>>,
}

impl Revocations {
    fn add(
        &mut self,
        crl: &[u8],
    ) -> Result<(), x509_parser::nom::Err<x509_parser::error::X509Error>> {
        let (_, crl) = x509_parser::parse_x509_crl(crl)?;
        let serials = self
            .by_issuer
            .entry(crl.issuer().as_raw().into())
            .or_default();
        for revoked in crl.iter_revoked_certificates() {
            serials.insert(revoked.raw_serial().into());
        }
        Ok(())
    }

    /// Whether a CRL revokes a certificate of `chain` (leaf first, then the
    /// intermediates, as the client sent it and rustls restored it). A certificate that
    /// does not parse counts as revoked: it cannot be shown not to be. Without CRLs,
    /// nothing is parsed.
    pub fn revokes(&self, chain: &[CertificateDer<'_>]) -> bool {
        if self.by_issuer.is_empty() {
            return false;
        }
        chain
            .iter()
            .any(|der| match x509_parser::parse_x509_certificate(der) {
                Ok((_, cert)) => self
                    .by_issuer
                    .get(cert.issuer().as_raw())
                    .is_some_and(|serials| serials.contains(cert.tbs_certificate.raw_serial())),
                Err(_) => true,
            })
    }
}

fn read(path: &Path) -> Result<Vec<u8>, ClientAuthError> {
    std::fs::read(path).map_err(|source| ClientAuthError::Read {
        path: path.to_owned(),
        source,
    })
}

/// The CRLs in `path`: PEM (one or more) or a single DER.
fn load_crls(path: &Path) -> Result<Vec<CertificateRevocationListDer<'static>>, ClientAuthError> {
    let bytes = read(path)?;
    if bytes.starts_with(b"-----") {
        let crls = rustls_pemfile::crls(&mut &bytes[..])
            .collect::<Result<Vec<_>, _>>()
            .map_err(|source| ClientAuthError::Pem {
                path: path.to_owned(),
                source,
            })?;
        if crls.is_empty() {
            return Err(ClientAuthError::NoCrl {
                path: path.to_owned(),
            });
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

    /// A CA (named as its directory), and certificates it issues by serial number.
    struct Pki {
        dir: terminus_testkit::TestDir,
        ca: rcgen::Certificate,
        key: rcgen::KeyPair,
    }

    impl Pki {
        fn new(name: &str) -> Self {
            let dir = terminus_testkit::TestDir::new(name);
            let key = rcgen::KeyPair::generate().unwrap();
            let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
            params.distinguished_name = rcgen::DistinguishedName::new();
            params
                .distinguished_name
                .push(rcgen::DnType::CommonName, name);
            params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
            params.key_usages = vec![
                rcgen::KeyUsagePurpose::KeyCertSign,
                rcgen::KeyUsagePurpose::CrlSign,
            ];
            let ca = params.self_signed(&key).unwrap();
            dir.write("ca.pem", ca.pem());
            Pki { dir, ca, key }
        }

        /// A certificate with serial `serial`, issued by the CA.
        fn issue(&self, serial: u64) -> CertificateDer<'static> {
            let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
            params.serial_number = Some(serial.into());
            let key = rcgen::KeyPair::generate().unwrap();
            params
                .signed_by(&key, &self.ca, &self.key)
                .unwrap()
                .der()
                .clone()
        }

        /// Writes the CA's CRL, revoking `serials`, to crl.pem (always the same path).
        fn crl(&self, serials: &[u64]) {
            let params = rcgen::CertificateRevocationListParams {
                this_update: rcgen::date_time_ymd(2024, 1, 1),
                next_update: rcgen::date_time_ymd(4000, 1, 1),
                crl_number: 1u64.into(),
                issuing_distribution_point: None,
                revoked_certs: serials
                    .iter()
                    .map(|s| rcgen::RevokedCertParams {
                        serial_number: (*s).into(),
                        revocation_time: rcgen::date_time_ymd(2024, 1, 1),
                        reason_code: None,
                        invalidity_date: None,
                    })
                    .collect(),
                key_identifier_method: rcgen::KeyIdMethod::Sha256,
            };
            let crl = params.signed_by(&self.ca, &self.key).unwrap();
            self.dir.write("crl.pem", crl.pem().unwrap());
        }

        fn policy(&self) -> ClientAuthPolicy {
            ClientAuthPolicy {
                mode: ClientAuthMode::Required,
                ca: self.dir.path("ca.pem"),
                crls: vec![self.dir.path("crl.pem")],
                depth: None,
            }
        }
    }

    /// A reload that brings a new CRL to the same path must void the tickets issued under
    /// the old one: the tag is of the files' contents, not of their paths.
    #[test]
    fn a_ticket_opens_only_under_the_policy_it_was_issued_under() {
        let pki = Pki::new("client-auth-tag");
        let policy = pki.policy();
        pki.crl(&[]);
        let before = policy.tag().unwrap();
        assert_eq!(
            policy.tag().unwrap(),
            before,
            "the same files, the same tag"
        );
        assert_eq!(policy.load().unwrap().tag, before, "load's tag is tag()'s");
        pki.crl(&[7]);
        let after = policy.tag().unwrap();
        assert_ne!(before, after, "a new CRL at the same path");
        let optional = ClientAuthPolicy {
            mode: ClientAuthMode::Optional,
            ..policy.clone()
        };
        let shallow = ClientAuthPolicy {
            depth: Some(1),
            ..policy.clone()
        };
        for other in [&optional, &shallow] {
            assert_ne!(other.tag().unwrap(), after, "{other:?}");
        }

        let old = PolicyTickets::new(Arc::new(Plain), before);
        let new = PolicyTickets::new(Arc::new(Plain), after);
        let none = PolicyTickets::new(Arc::new(Plain), *b"no-mtls\0");
        let ticket = old.encrypt(b"session").unwrap();
        assert_eq!(old.decrypt(&ticket).as_deref(), Some(&b"session"[..]));
        assert_eq!(new.decrypt(&ticket), None, "issued under the old CRL");
        assert_eq!(none.decrypt(&ticket), None);
        assert_eq!(old.decrypt(&none.encrypt(b"session").unwrap()), None);
        assert_eq!(new.decrypt(b"short"), None);
    }

    /// What a resumed session's restored chain is checked against: the CRLs in force,
    /// for the leaf and every intermediate the client sent.
    #[test]
    fn a_resumed_chain_is_checked_against_the_crls_in_force() {
        let pki = Pki::new("client-auth-revocations");
        let (revoked, kept) = (pki.issue(7), pki.issue(8));
        pki.crl(&[]);
        let before = pki.policy().load().unwrap().revocations;
        assert!(!before.revokes(std::slice::from_ref(&revoked)));
        pki.crl(&[7]);
        let now = pki.policy().load().unwrap().revocations;
        assert!(now.revokes(std::slice::from_ref(&revoked)));
        assert!(!now.revokes(std::slice::from_ref(&kept)));
        // As an intermediate the client sent, too.
        assert!(now.revokes(&[kept.clone(), revoked.clone()]));
        // Another CA's (another issuer's) certificate of the same serial is not revoked.
        let other = Pki::new("client-auth-other-ca");
        assert!(!now.revokes(&[other.issue(7)]));
        // What does not parse cannot be shown not to be revoked.
        assert!(now.revokes(&[CertificateDer::from(vec![0x30, 0x03, 0x02, 0x01, 0x07])]));
        // Without CRLs there is nothing to check.
        let none = ClientAuthPolicy {
            crls: Vec::new(),
            ..pki.policy()
        };
        assert!(!none.load().unwrap().revocations.revokes(&[revoked]));
    }
}
