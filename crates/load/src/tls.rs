//! The rustls client configuration: what the load negotiates (`--tls`, `--cipher`,
//! `--group`, `--sigalg`), how it trusts the server (`--cacert`, the system bundle, or
//! `--insecure`), and whether it resumes sessions (`--resume`).

use std::sync::Arc;

use rustls::client::Resumption;
use rustls::crypto::{aws_lc_rs, CryptoProvider, SupportedKxGroup, WebPkiSupportedAlgorithms};
use rustls::{ClientConfig, SignatureScheme};
use terminus_engine::KxGroup;
use terminus_tls::handshake::EngineKxGroup;
use terminus_tls::TlsSettings;

pub use terminus_tls::client::Trust;

use crate::LoadError;

/// What the client offers.
#[derive(Debug, Clone, Default)]
pub struct TlsChoice {
    /// `1.2` and/or `1.3`; empty = both.
    pub versions: Vec<String>,
    /// rustls suite names, in preference order; empty = rustls's default set in
    /// browsers' order (AES-128-GCM first).
    pub ciphers: Vec<String>,
    /// `x25519mlkem768`, `x25519`, `secp256r1`, `secp384r1`; empty = the three classical
    /// ones ([`KxGroup::CLASSICAL`]).
    pub groups: Vec<String>,
    /// TLS signature scheme names (`rsa_pss_rsae_sha256`, `ecdsa_secp256r1_sha256`, ...);
    /// empty = every scheme aws-lc verifies.
    pub sigalgs: Vec<String>,
    /// Which certificates the client trusts.
    pub trust: Trust,
    /// Offer the session from the previous connection (tickets or IDs).
    pub resume: bool,
    /// Which HTTP to offer by ALPN and speak.
    pub http: Http,
    /// Key exchanges through terminus's crypto engine (`--batch-kx`) instead of aws-lc
    /// directly; the connections must then run them on the engine's bridge.
    pub batch_kx: bool,
}

/// Which HTTP a run speaks.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Http {
    /// HTTP/1.1 (over TLS or plain).
    #[default]
    H1,
    /// HTTP/2 over TLS, one request at a time per connection.
    H2,
    /// HTTP/3 over QUIC.
    H3,
}

impl Http {
    /// Its ALPN protocol ID.
    pub fn alpn(self) -> &'static [u8] {
        match self {
            Http::H1 => b"http/1.1",
            Http::H2 => b"h2",
            Http::H3 => b"h3",
        }
    }

    /// Its name in reports.
    pub fn name(self) -> &'static str {
        match self {
            Http::H1 => "HTTP/1.1",
            Http::H2 => "HTTP/2",
            Http::H3 => "HTTP/3",
        }
    }
}

/// Builds the shared client configuration.
pub fn client_config(choice: &TlsChoice) -> Result<Arc<ClientConfig>, LoadError> {
    let setting = |e: terminus_tls::TlsSettingsError| LoadError::Tls(e.to_string());
    let versions = if choice.versions.is_empty() {
        rustls::DEFAULT_VERSIONS.to_vec()
    } else {
        choice
            .versions
            .iter()
            .map(|v| TlsSettings::version_from_name(v))
            .collect::<Result<_, _>>()
            .map_err(setting)?
    };
    let base = aws_lc_rs::default_provider();
    let cipher_suites = if choice.ciphers.is_empty() {
        browser_order(base.cipher_suites.clone())
    } else {
        choice
            .ciphers
            .iter()
            .map(|c| TlsSettings::suite_from_name(c))
            .collect::<Result<_, _>>()
            .map_err(setting)?
    };
    if !cipher_suites
        .iter()
        .any(|s| versions.iter().any(|v| s.version() == *v))
    {
        return Err(LoadError::Tls(
            "no --cipher belongs to a --tls version".into(),
        ));
    }
    let group_impl = if choice.batch_kx {
        engine_group
    } else {
        aws_lc_group
    };
    let kx_groups: Vec<&'static dyn SupportedKxGroup> = if choice.groups.is_empty() {
        // Like for like against servers that cannot offer the post-quantum hybrid
        // (nginx on OpenSSL 3.0); `--group x25519mlkem768` asks for it.
        KxGroup::CLASSICAL.into_iter().map(group_impl).collect()
    } else {
        choice
            .groups
            .iter()
            // The same names the server's `tls.groups` takes.
            .map(|g| TlsSettings::group_from_name(g).map(group_impl))
            .collect::<Result<_, _>>()
            .map_err(setting)?
    };
    let verify_algorithms =
        restrict_schemes(base.signature_verification_algorithms, &choice.sigalgs)?;
    let provider = Arc::new(CryptoProvider {
        cipher_suites,
        kx_groups,
        signature_verification_algorithms: verify_algorithms,
        ..base
    });
    let verifier = choice
        .trust
        .verifier(&provider)
        .map_err(|e| match choice.trust {
            Trust::System => LoadError::SystemTrust(e),
            _ => LoadError::Trust(e),
        })?;
    let mut config = ClientConfig::builder_with_provider(provider)
        .with_protocol_versions(&versions)
        .map_err(|e| LoadError::Tls(e.to_string()))?
        .dangerous()
        .with_custom_certificate_verifier(verifier)
        .with_no_client_auth();
    config.resumption = if choice.resume {
        Resumption::store(Arc::new(crate::tickets::TicketStore::new()))
    } else {
        Resumption::disabled()
    };
    config.alpn_protocols = vec![choice.http.alpn().to_vec()];
    Ok(Arc::new(config))
}

/// By default the client computes its key exchanges with aws-lc directly: the engine's
/// batching would add its wait to the handshake latency the client measures.
fn aws_lc_group(group: KxGroup) -> &'static dyn SupportedKxGroup {
    match group {
        KxGroup::X25519 => aws_lc_rs::kx_group::X25519,
        KxGroup::Secp256r1 => aws_lc_rs::kx_group::SECP256R1,
        KxGroup::Secp384r1 => aws_lc_rs::kx_group::SECP384R1,
        KxGroup::X25519MlKem768 => aws_lc_rs::kx_group::X25519MLKEM768,
    }
}

/// `--batch-kx`: key shares and shared secrets from the engine, 8 per crypto_mb call
/// where the CPU has AVX-512 IFMA.
fn engine_group(group: KxGroup) -> &'static dyn SupportedKxGroup {
    EngineKxGroup::for_group(group)
}

/// Keeps only the `--sigalg` schemes, so the ClientHello's signature_algorithms offers
/// exactly those and the server must sign with one of them.
fn restrict_schemes(
    all: WebPkiSupportedAlgorithms,
    names: &[String],
) -> Result<WebPkiSupportedAlgorithms, LoadError> {
    if names.is_empty() {
        return Ok(all);
    }
    let mut keep: Vec<(SignatureScheme, _)> = Vec::new();
    for name in names {
        let entry = all
            .mapping
            .iter()
            .find(|(scheme, _)| scheme_name(*scheme).eq_ignore_ascii_case(name))
            .ok_or_else(|| {
                let known: Vec<String> = all.mapping.iter().map(|(s, _)| scheme_name(*s)).collect();
                LoadError::Tls(format!(
                    "unknown signature algorithm {name:?} (known: {})",
                    known.join(", ")
                ))
            })?;
        keep.push(*entry);
    }
    // WebPkiSupportedAlgorithms wants 'static slices; the set is built once per run.
    Ok(WebPkiSupportedAlgorithms {
        all: all.all,
        mapping: Box::leak(keep.into_boxed_slice()),
    })
}

/// rustls's default suites in the order Chrome and Firefox offer them: AES-128-GCM, then
/// AES-256-GCM, then ChaCha20-Poly1305, TLS 1.3 before 1.2. (OpenSSL clients such as curl
/// and wrk put AES-256-GCM-SHA384 first; servers that follow the client's order then hash
/// the transcript with SHA-384.) `--cipher` sets another order.
fn browser_order(
    mut suites: Vec<rustls::SupportedCipherSuite>,
) -> Vec<rustls::SupportedCipherSuite> {
    let rank = |s: &rustls::SupportedCipherSuite| {
        let name = s.suite().as_str().unwrap_or("");
        let cipher = if name.contains("AES_128") {
            0
        } else if name.contains("AES_256") {
            1
        } else {
            2
        };
        (s.version() != &rustls::version::TLS13, cipher)
    };
    suites.sort_by_key(rank);
    suites
}

/// `RSA_PSS_SHA256` -> `rsa_pss_rsae_sha256` (the RFC 8446 name, as openssl's -sigalgs).
pub fn scheme_name(scheme: SignatureScheme) -> String {
    match scheme {
        SignatureScheme::RSA_PSS_SHA256 => "rsa_pss_rsae_sha256".into(),
        SignatureScheme::RSA_PSS_SHA384 => "rsa_pss_rsae_sha384".into(),
        SignatureScheme::RSA_PSS_SHA512 => "rsa_pss_rsae_sha512".into(),
        SignatureScheme::RSA_PKCS1_SHA256 => "rsa_pkcs1_sha256".into(),
        SignatureScheme::RSA_PKCS1_SHA384 => "rsa_pkcs1_sha384".into(),
        SignatureScheme::RSA_PKCS1_SHA512 => "rsa_pkcs1_sha512".into(),
        SignatureScheme::ECDSA_NISTP256_SHA256 => "ecdsa_secp256r1_sha256".into(),
        SignatureScheme::ECDSA_NISTP384_SHA384 => "ecdsa_secp384r1_sha384".into(),
        SignatureScheme::ECDSA_NISTP521_SHA512 => "ecdsa_secp521r1_sha512".into(),
        SignatureScheme::ED25519 => "ed25519".into(),
        other => format!("{other:?}").to_ascii_lowercase(),
    }
}
