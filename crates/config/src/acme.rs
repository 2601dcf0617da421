//! `[acme]` (the issuer) and `[[server]] certificates = "acme"`: which servers get their
//! certificates from an ACME CA and how.
//!
//! ```toml
//! [acme]
//! directory = "https://acme-v02.api.letsencrypt.org/directory"
//! contact = ["mailto:ops@example.com"]
//! state_dir = "/var/lib/terminus/acme"
//! # challenge = "http-01" (with a plain listener) or "tls-alpn-01" (without)
//! # ca = "private-ca-root.pem", profile = "shortlived",
//! # eab = { kid = "...", hmac_key_file = "eab.key" }
//! ```

use serde::Deserialize;
use terminus_acme::{AcmeSettings, ChallengeKind, Eab};
use toml::Spanned;

use super::schema::ConfigFile;
use super::{ConfigError, Ctx, Listen};

/// `[acme]` as written.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AcmeSection {
    pub directory: Option<String>,
    #[serde(default)]
    pub contact: Vec<String>,
    pub ca: Option<String>,
    pub eab: Option<EabSection>,
    pub profile: Option<String>,
    pub state_dir: Option<String>,
    pub challenge: Option<String>,
}

/// `eab = { kid = "...", hmac_key_file = "..." }`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EabSection {
    pub kid: String,
    pub hmac_key_file: String,
}

/// `[acme]` resolved; `None` without the section. Which servers use it is checked by
/// [`check_servers`].
pub(crate) fn resolve(
    raw: &ConfigFile,
    listen: &[Listen],
    ctx: &Ctx<'_>,
) -> Result<Option<AcmeSettings>, ConfigError> {
    let Some(section) = &raw.acme else {
        return Ok(None);
    };
    let at = Some(section.span());
    let a = section.get_ref();
    let err = |message: String, hint: &str| ctx.err(at.clone(), message, Some(hint.to_owned()));
    let directory = match &a.directory {
        Some(d) if d.starts_with("https://") => d.clone(),
        Some(d) => {
            return Err(err(
                format!("[acme] directory {d:?} is not an https:// URL (RFC 8555 section 6.1)"),
                "directory = \"https://acme-v02.api.letsencrypt.org/directory\"",
            ))
        }
        None => {
            return Err(err(
                "[acme] needs directory: the CA's ACME directory URL".into(),
                "directory = \"https://acme-v02.api.letsencrypt.org/directory\" (Let's Encrypt; its staging CA for trials)",
            ))
        }
    };
    for c in &a.contact {
        if !c.starts_with("mailto:") {
            return Err(err(
                format!("[acme] contact {c:?} is not a mailto: URL"),
                "contact = [\"mailto:ops@example.com\"]",
            ));
        }
    }
    let Some(state_dir) = &a.state_dir else {
        return Err(err(
            "[acme] needs state_dir: where the account and the certificates are kept".into(),
            "state_dir = \"/var/lib/terminus/acme\" (kept across restarts: a restart with valid certificates orders nothing)",
        ));
    };
    let ca = a.ca.as_deref().map(|p| ctx.path(p));
    if let Some(ca) = &ca {
        let pem = std::fs::read(ca).map_err(|e| {
            err(
                format!("[acme] ca {}: {e}", ca.display()),
                "ca is the PEM root certificate the directory's HTTPS certificate chains to",
            )
        })?;
        if !String::from_utf8_lossy(&pem).contains("-----BEGIN CERTIFICATE-----") {
            return Err(err(
                format!("[acme] ca {}: no PEM certificate in it", ca.display()),
                "ca is the PEM root certificate the directory's HTTPS certificate chains to",
            ));
        }
    }
    let eab = a.eab.as_ref().map(|e| eab(e, &err, ctx)).transpose()?;
    let challenge = challenge(a, listen, &err)?;
    Ok(Some(AcmeSettings {
        directory,
        contact: a.contact.clone(),
        ca,
        eab,
        profile: a.profile.clone(),
        state_dir: ctx.path(state_dir),
        challenge,
    }))
}

/// Whether a `[[server]]`'s `certificates` asks for ACME: checked against the rest of it.
pub fn server_uses_acme(
    certificates: Option<&Spanned<String>>,
    names: &Spanned<Vec<String>>,
    has_files: bool,
    acme: Option<&AcmeSettings>,
    ctx: &Ctx<'_>,
) -> Result<bool, ConfigError> {
    let Some(value) = certificates else {
        return Ok(false);
    };
    let at = Some(value.span());
    if value.get_ref() != "acme" {
        return Err(ctx.err(
            at,
            format!(
                "certificates = {:?} is not a certificate source",
                value.get_ref()
            ),
            Some(
                "certificates = \"acme\" (from the [acme] issuer), or [[server.certificate]] files"
                    .to_owned(),
            ),
        ));
    }
    if has_files {
        return Err(ctx.err(
            at,
            "a server takes its certificates from ACME or from [[server.certificate]] files, not both",
            None,
        ));
    }
    if acme.is_none() {
        return Err(ctx.err(
            at,
            "certificates = \"acme\" needs an [acme] issuer",
            Some("[acme] directory = \"...\", state_dir = \"...\"".to_owned()),
        ));
    }
    if let Some(wild) = names.get_ref().iter().find(|n| n.starts_with("*.")) {
        return Err(ctx.err(
            Some(names.span()),
            format!("{wild}: a wildcard certificate needs the DNS-01 challenge, which terminus does not answer"),
            Some("name each host, or bring the wildcard certificate as [[server.certificate]] files".to_owned()),
        ));
    }
    if let Some(bad) = names.get_ref().iter().find(|n| !is_dns_name(n)) {
        return Err(ctx.err(
            Some(names.span()),
            format!("{bad:?} is not a DNS name a CA issues for"),
            Some(
                "letters, digits and hyphens in dot-separated labels: \"www.example.com\""
                    .to_owned(),
            ),
        ));
    }
    Ok(true)
}

/// A host name of letters, digits and hyphens in labels of 1-63, two labels or more
/// (what a public CA issues for; also what the state directory may name a folder by).
fn is_dns_name(name: &str) -> bool {
    let labels: Vec<&str> = name.split('.').collect();
    name.len() <= 253
        && labels.len() >= 2
        && labels.iter().all(|l| {
            !l.is_empty()
                && l.len() <= 63
                && !l.starts_with('-')
                && !l.ends_with('-')
                && l.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
        })
}

/// Decodes base64url, padded or not.
fn base64url(text: &str) -> Option<Vec<u8>> {
    use base64::Engine;
    base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(text.trim_end_matches('='))
        .ok()
}

/// `eab`: the CA's key id and the MAC key, read from its file now.
fn eab(
    e: &EabSection,
    err: &dyn Fn(String, &str) -> ConfigError,
    ctx: &Ctx<'_>,
) -> Result<Eab, ConfigError> {
    let path = ctx.path(&e.hmac_key_file);
    let text = std::fs::read_to_string(&path).map_err(|io| {
        err(
            format!("[acme] eab hmac_key_file {}: {io}", path.display()),
            "the MAC key the CA gave, base64url, in a file of its own",
        )
    })?;
    let hmac_key = base64url(text.trim()).ok_or_else(|| {
        err(
            format!(
                "[acme] eab hmac_key_file {} is not base64url",
                path.display()
            ),
            "the MAC key exactly as the CA gave it",
        )
    })?;
    Ok(Eab {
        kid: e.kid.clone(),
        hmac_key,
    })
}

/// `challenge`: http-01 where a plain listener can answer it, else tls-alpn-01.
fn challenge(
    a: &AcmeSection,
    listen: &[Listen],
    err: &dyn Fn(String, &str) -> ConfigError,
) -> Result<ChallengeKind, ConfigError> {
    let plain = listen.iter().any(|l| l.plain.is_some());
    Ok(match a.challenge.as_deref() {
        None if plain => ChallengeKind::Http01,
        None => ChallengeKind::TlsAlpn01,
        Some("http-01") if plain => ChallengeKind::Http01,
        Some("http-01") => {
            return Err(err(
                "[acme] challenge = \"http-01\" needs a plain-HTTP listener to answer it".into(),
                "add listen = [{ address = \"0.0.0.0:80\", plain = \"redirect\" }], or use challenge = \"tls-alpn-01\"",
            ))
        }
        Some("tls-alpn-01") => ChallengeKind::TlsAlpn01,
        Some("dns-01") => {
            return Err(err(
                "[acme] challenge = \"dns-01\" is not built".into(),
                "use \"http-01\" or \"tls-alpn-01\"",
            ))
        }
        Some(other) => {
            return Err(err(
                format!("[acme] challenge = {other:?} is not a challenge type"),
                "use \"http-01\" or \"tls-alpn-01\"",
            ))
        }
    })
}
