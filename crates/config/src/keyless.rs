//! Keyless signing's settings: `[signer]`, where this instance signs for terminators
//! with the keys it holds, and a certificate's `key = { signer = ... }`, where a
//! terminator asks signers for its handshakes' signatures instead of reading a key file.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use serde::Deserialize;
use toml::Spanned;

use crate::cidr::{self, Cidr};
use crate::schema::ConfigFile;
use crate::{ConfigError, Ctx};

/// `[signer]` as written.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SignerSection {
    pub listen: Spanned<OneOrMany>,
    pub ca: Option<Spanned<String>>,
    pub certificate: Option<Spanned<IdentitySection>>,
    pub deadline: Option<Spanned<String>>,
    /// The networks terminators connect from; others are closed at accept.
    pub allow: Option<Spanned<Vec<Spanned<String>>>>,
    #[serde(default)]
    pub key: Vec<Spanned<SignerKeySection>>,
}

/// A string or a list of them.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub enum OneOrMany {
    One(String),
    Many(Vec<String>),
}

/// `certificate = { cert, key }`: a TLS identity.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct IdentitySection {
    pub cert: String,
    pub key: String,
}

/// `[[signer.key]] file = "..."`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SignerKeySection {
    pub file: String,
}

/// A certificate's `key`: a file, or the signers that hold it.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub enum KeyEntry {
    File(String),
    Signers(RemoteKeySection),
}

/// `key = { signer = [...], ca, cert, key, timeout }` as written.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RemoteKeySection {
    pub signer: OneOrMany,
    pub ca: Option<String>,
    pub cert: Option<String>,
    pub key: Option<String>,
    pub timeout: Option<String>,
}

/// `[signer]`: this instance signs for terminators.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SignerConfig {
    /// Where terminators connect (mutual TLS only).
    pub listen: Vec<SocketAddr>,
    /// The CA terminators' client certificates must chain to.
    pub ca: PathBuf,
    /// The signer's own certificate chain and key.
    pub cert: PathBuf,
    /// Its key.
    pub key: PathBuf,
    /// A request not answered within this is answered "expired".
    pub deadline: Duration,
    /// The keys it signs with.
    pub keys: Vec<PathBuf>,
    /// `allow`: the networks terminators connect from (closed at accept, before any
    /// TLS, otherwise); `None`: any address may try mutual TLS.
    pub allow: Option<Arc<[Cidr]>>,
}

/// Where a certificate's private key is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KeySource {
    /// A PEM file.
    File(PathBuf),
    /// Keyless signers.
    Signers(RemoteKeyConfig),
}

/// A certificate's key on keyless signers, and how they are reached.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct RemoteKeyConfig {
    /// `host:port` of each signer, tried in turn.
    pub signers: Vec<String>,
    /// The CA the signers' certificates chain to.
    pub ca: PathBuf,
    /// The certificate this terminator shows the signers.
    pub cert: PathBuf,
    /// Its key.
    pub key: PathBuf,
    /// A signature not answered within this fails its handshake.
    pub timeout: Duration,
}

/// The default of `[signer] deadline`: no longer than a terminator's default `timeout`,
/// so that an overloaded signer does not sign what nobody waits for any more.
pub const SIGNER_DEADLINE: Duration = Duration::from_millis(500);
/// The default of a remote key's `timeout`.
pub const REMOTE_TIMEOUT: Duration = Duration::from_millis(500);

const SIGNER_EXAMPLE: &str = "[signer]\nlisten = \"0.0.0.0:2407\"\nca = \"terminators-ca.pem\"\ncertificate = { cert = \"signer.pem\", key = \"signer.key\" }\n[[signer.key]]\nfile = \"site.key\"";

/// `[signer]`.
pub(crate) fn resolve_signer(
    raw: &ConfigFile,
    ctx: &Ctx<'_>,
) -> Result<Option<SignerConfig>, ConfigError> {
    let Some(section) = &raw.signer else {
        return Ok(None);
    };
    let at = Some(section.span());
    let s = section.get_ref();
    let missing = |what: &str| {
        ctx.err(
            at.clone(),
            format!("[signer] needs {what}: terminators are served over mutual TLS only"),
            Some(SIGNER_EXAMPLE.to_owned()),
        )
    };
    let ca =
        s.ca.as_ref()
            .ok_or_else(|| missing("ca (the terminators' CA)"))?;
    let identity = s
        .certificate
        .as_ref()
        .ok_or_else(|| missing("certificate = { cert, key } (the signer's own)"))?;
    let listen = s
        .listen
        .get_ref()
        .clone_strings()
        .into_iter()
        .map(|a| ctx.addr(&Spanned::new(s.listen.span(), a), "[signer] listen"))
        .collect::<Result<Vec<_>, _>>()?;
    if listen.is_empty() {
        return Err(ctx.err(Some(s.listen.span()), "[signer] listen is empty", None));
    }
    if s.key.is_empty() {
        return Err(ctx.err(
            at,
            "[signer] holds no key",
            Some("add [[signer.key]] file = \"site.key\" for each key it signs with".to_owned()),
        ));
    }
    let deadline = ctx.duration(&s.deadline, "[signer] deadline", SIGNER_DEADLINE)?;
    if deadline.is_zero() {
        return Err(ctx.err(
            s.deadline.as_ref().map(|d| d.span()),
            "[signer] deadline must be more than zero",
            None,
        ));
    }
    let allow = match &s.allow {
        None => None,
        Some(list) if list.get_ref().is_empty() => {
            return Err(ctx.err(
                Some(list.span()),
                "[signer] allow is empty: no terminator could connect",
                Some("name the terminators' networks, or leave allow out to let any address try mutual TLS".to_owned()),
            ));
        }
        Some(list) => Some(cidr::networks(list.get_ref(), "[signer] allow", ctx)?),
    };
    Ok(Some(SignerConfig {
        allow,
        listen,
        ca: ctx.path(ca.get_ref()),
        cert: ctx.path(&identity.get_ref().cert),
        key: ctx.path(&identity.get_ref().key),
        deadline,
        keys: s.key.iter().map(|k| ctx.path(&k.get_ref().file)).collect(),
    }))
}

impl OneOrMany {
    fn clone_strings(&self) -> Vec<String> {
        match self {
            OneOrMany::One(s) => vec![s.clone()],
            OneOrMany::Many(v) => v.clone(),
        }
    }
}

/// A certificate's `key`, written at `span`.
pub(crate) fn resolve_key(
    key: &Spanned<KeyEntry>,
    ctx: &Ctx<'_>,
) -> Result<KeySource, ConfigError> {
    let r = match key.get_ref() {
        KeyEntry::File(path) => return Ok(KeySource::File(ctx.path(path))),
        KeyEntry::Signers(r) => r,
    };
    let at = Some(key.span());
    let example = "key = { signer = [\"keys1.internal:2407\", \"keys2.internal:2407\"], ca = \"signers-ca.pem\", cert = \"terminator.pem\", key = \"terminator.key\" }";
    let missing = |what: &str| {
        ctx.err(
            at.clone(),
            format!("a certificate's key on signers needs {what}: signers are reached over mutual TLS only"),
            Some(example.to_owned()),
        )
    };
    let ca =
        r.ca.as_ref()
            .ok_or_else(|| missing("ca (the signers' CA)"))?;
    let cert = r
        .cert
        .as_ref()
        .ok_or_else(|| missing("cert (this terminator's client certificate)"))?;
    let client_key = r
        .key
        .as_ref()
        .ok_or_else(|| missing("key (the client certificate's key)"))?;
    let signers = r.signer.clone_strings();
    if signers.is_empty() {
        return Err(ctx.err(at, "signer = [] names no signer", Some(example.to_owned())));
    }
    for s in &signers {
        ctx.name(s, key.span(), "signer")?;
        let port = s
            .rsplit_once(':')
            .and_then(|(h, p)| (!h.is_empty()).then_some(p));
        if port.and_then(|p| p.parse::<u16>().ok()).is_none() {
            return Err(ctx.err(
                at,
                format!("signer {s:?} is not host:port"),
                Some("e.g. signer = \"keys.internal:2407\"".to_owned()),
            ));
        }
    }
    let timeout = match &r.timeout {
        None => REMOTE_TIMEOUT,
        Some(t) => crate::schema::parse_duration(t)
            .filter(|d| !d.is_zero())
            .ok_or_else(|| {
                ctx.err(
                    at.clone(),
                    format!("timeout = {t:?} is not a duration above zero"),
                    Some("e.g. timeout = \"500ms\"".to_owned()),
                )
            })?,
    };
    Ok(KeySource::Signers(RemoteKeyConfig {
        signers,
        ca: ctx.path(ca),
        cert: ctx.path(cert),
        key: ctx.path(client_key),
        timeout,
    }))
}

#[cfg(test)]
mod tests {
    use crate::{Config, Overrides};

    /// `allow = []` would let no terminator in: refused at its line (a bad network in
    /// it is cidr's to test, with every other list of networks).
    #[test]
    fn an_empty_allow_list_is_refused_at_its_line() {
        let text = "[signer]\nlisten = \"127.0.0.1:0\"\nca = \"ca.pem\"\ncertificate = { cert = \"s.pem\", key = \"s.key\" }\n\nallow = []\n[[signer.key]]\nfile = \"k.pem\"\n";
        let e = Config::parse(text, "/etc/terminus/t.toml", &Overrides::default()).unwrap_err();
        assert!(
            e.to_string()
                .starts_with("/etc/terminus/t.toml:6: [signer] allow is empty"),
            "{e}"
        );
        assert!(e.hint.is_some_and(|h| h.contains("leave allow out")));
    }
}
