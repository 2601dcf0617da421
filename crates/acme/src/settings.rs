//! The issuer, as the server resolved it from `[acme]`.

use std::path::PathBuf;

/// Which challenge proves control of a name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChallengeKind {
    /// HTTP-01: a file under `/.well-known/acme-challenge/` on port 80 (the plain
    /// listener answers it).
    Http01,
    /// TLS-ALPN-01 (RFC 8737): a certificate shown to a handshake offering `acme-tls/1`
    /// on port 443, so that port 80 can stay closed.
    TlsAlpn01,
}

impl ChallengeKind {
    /// Its name in the configuration and in RFC 8555's registry.
    pub fn name(self) -> &'static str {
        match self {
            Self::Http01 => "http-01",
            Self::TlsAlpn01 => "tls-alpn-01",
        }
    }
}

/// External account binding (RFC 8555 section 7.3.4): what a CA that knows its
/// customers (ZeroSSL, Google's, a private one) gives to bind the ACME account.
#[derive(Clone, PartialEq, Eq)]
pub struct Eab {
    /// The key identifier.
    pub kid: String,
    /// The MAC key, decoded.
    pub hmac_key: Vec<u8>,
}

impl std::fmt::Debug for Eab {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The key is a secret.
        f.debug_struct("Eab")
            .field("kid", &self.kid)
            .finish_non_exhaustive()
    }
}

/// One ACME issuer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AcmeSettings {
    /// The directory URL.
    pub directory: String,
    /// `mailto:` addresses for the account.
    pub contact: Vec<String>,
    /// The root certificate the directory's HTTPS certificate chains to, for a private
    /// CA; `None`: the system's roots.
    pub ca: Option<PathBuf>,
    /// External account binding, where the CA asks for one.
    pub eab: Option<Eab>,
    /// The certificate profile to ask for (draft-aaron-acme-profiles), e.g. `shortlived`.
    pub profile: Option<String>,
    /// Where the account and the certificates are kept.
    pub state_dir: PathBuf,
    /// How names are proven.
    pub challenge: ChallengeKind,
}
