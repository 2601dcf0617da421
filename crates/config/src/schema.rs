//! The file as written: every section and key, all optional, unknown keys refused. What
//! the values mean is decided in [`super::resolve`].

use std::time::Duration;

use serde::{Deserialize, Deserializer};
use toml::Spanned;

use super::route::RouteSection;
use super::stream::StreamSection;
use super::tenant::{CapacitySection, TenantSection};
use super::upstream::UpstreamSection;
use crate::CacheSettings;

/// The config file as written (all fields optional; defaults applied in [`Config::resolve`]).
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ConfigFile {
    pub workers: Option<Spanned<usize>>,
    pub pin: Option<bool>,
    #[serde(default)]
    pub listen: Vec<Spanned<ListenEntry>>,
    #[serde(default)]
    pub tls: TlsSection,
    #[serde(default)]
    pub crypto: CryptoSection,
    #[serde(default)]
    pub timeouts: TimeoutsSection,
    #[serde(default)]
    pub limits: LimitsSection,
    #[serde(default)]
    pub log: LogSection,
    #[serde(default)]
    pub admin: AdminSection,
    #[serde(default)]
    pub upgrade: UpgradeSection,
    #[serde(default)]
    pub files: CacheSettings,
    #[serde(default)]
    pub compression: super::compress::CompressionSection,
    #[serde(default)]
    pub server: Vec<ServerSection>,
    #[serde(default)]
    pub upstream: Vec<UpstreamSection>,
    #[serde(default)]
    pub stream: Vec<StreamSection>,
    #[serde(default)]
    pub tenant: Vec<TenantSection>,
    pub fleet: Option<Spanned<FleetSection>>,
    #[serde(default)]
    pub http3: Http3Section,
    pub acme: Option<Spanned<super::acme::AcmeSection>>,
    pub signer: Option<Spanned<super::keyless::SignerSection>>,
}

/// `[fleet]`: the store instances share ticket keys through.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FleetSection {
    pub store: Option<String>,
    pub key_file: Option<String>,
    pub password_file: Option<String>,
    pub ca: Option<String>,
    pub prefix: Option<String>,
    pub poll: Option<String>,
}

/// A `listen` entry: `"IP:PORT"` or `{ address = "IP:PORT", ktls = "required" }`.
#[derive(Debug)]
pub enum ListenEntry {
    Address(String),
    Options(ListenOptions),
}

/// By the value's kind, not `#[serde(untagged)]`: an untagged enum reads its value into
/// a buffer first, and toml's spans do not survive it (the networks' `Spanned` entries
/// would fail to read); a table's unknown key is then also named as such.
impl<'de> Deserialize<'de> for ListenEntry {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Entry;
        impl<'de> serde::de::Visitor<'de> for Entry {
            type Value = ListenEntry;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("\"IP:PORT\" or { address = \"IP:PORT\", ... }")
            }
            fn visit_str<E: serde::de::Error>(self, s: &str) -> Result<ListenEntry, E> {
                Ok(ListenEntry::Address(s.to_owned()))
            }
            fn visit_map<M: serde::de::MapAccess<'de>>(
                self,
                m: M,
            ) -> Result<ListenEntry, M::Error> {
                ListenOptions::deserialize(serde::de::value::MapAccessDeserializer::new(m))
                    .map(ListenEntry::Options)
            }
        }
        d.deserialize_any(Entry)
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ListenOptions {
    pub address: String,
    pub ktls: Option<String>,
    #[serde(default)]
    pub proxy_protocol: bool,
    pub trusted: Option<Vec<Spanned<String>>>,
    /// Networks whose X-Forwarded-For and Forwarded are passed on (appended to).
    pub forwarded_from: Option<Vec<Spanned<String>>>,
    /// `"redirect"`: plain HTTP, no TLS (ACME challenges answered, the rest redirected).
    pub plain: Option<String>,
    /// HTTP/3 over QUIC on the same port (UDP) as well.
    #[serde(default)]
    pub http3: bool,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TlsSection {
    pub versions: Option<Spanned<Vec<String>>>,
    pub cipher_suites: Option<Spanned<Vec<String>>>,
    pub groups: Option<Spanned<Vec<String>>>,
    pub session_tickets: Option<bool>,
    pub session_cache: Option<usize>,
    pub prefer_server_ciphers: Option<bool>,
    /// The default `ktls` of every listener.
    pub ktls: Option<Spanned<String>>,
    pub ticket_keys: Option<Spanned<TicketKeysSection>>,
}

/// `tls.ticket_keys = { rotate = "6h", keep = 2 }`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TicketKeysSection {
    pub rotate: Option<String>,
    pub keep: Option<u32>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CryptoSection {
    pub backend: Option<Spanned<String>>,
    pub threads: Option<usize>,
    pub queue_capacity: Option<usize>,
    pub max_batch_delay: Option<Spanned<String>>,
    pub simd: Option<Spanned<String>>,
    pub simd_cores: Option<Spanned<usize>>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TimeoutsSection {
    pub handshake: Option<Spanned<String>>,
    pub request_header: Option<Spanned<String>>,
    pub keepalive: Option<Spanned<String>>,
    pub shutdown_grace: Option<Spanned<String>>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LimitsSection {
    pub max_connections: Option<usize>,
    pub handshake_queue: Option<Spanned<String>>,
    /// Connections one client address may hold open (nginx's `limit_conn`).
    pub connections_per_client: Option<Spanned<i64>>,
    /// The most clients the rate limits remember at once.
    pub rate_keys: Option<Spanned<i64>>,
}

/// `[http3]`: QUIC's admission, per worker, and 0-RTT.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Http3Section {
    /// `"auto"`, `"always"` or `"never"`.
    pub retry: Option<Spanned<String>>,
    pub max_handshakes: Option<Spanned<usize>>,
    pub early_data: Option<Spanned<bool>>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LogSection {
    pub access: Option<Spanned<String>>,
    pub format: Option<Spanned<String>>,
    pub error: Option<Spanned<String>>,
    pub level: Option<Spanned<String>>,
}

/// `[upgrade]`: handing the process over to a new one (`terminus upgrade`).
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UpgradeSection {
    pub socket: Option<Spanned<String>>,
    pub drain: Option<Spanned<String>>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AdminSection {
    pub listen: Option<Spanned<String>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ServerSection {
    pub names: Spanned<Vec<String>>,
    #[serde(default)]
    pub default: bool,
    pub root: Option<Spanned<String>>,
    #[serde(default)]
    pub certificate: Vec<CertificateSection>,
    /// `"acme"`: from the `[acme]` issuer.
    pub certificates: Option<Spanned<String>>,
    /// Client certificates (mutual TLS).
    pub client_auth: Option<Spanned<super::client_auth::ClientAuthSection>>,
    #[serde(default)]
    pub route: Vec<RouteSection>,
    pub headers: Option<Spanned<std::collections::BTreeMap<String, String>>>,
    /// The `[[tenant]]` whose capacity its handshakes use.
    pub tenant: Option<Spanned<String>>,
    /// `access`: allow and deny rules, in order.
    pub access: Option<Spanned<Vec<Spanned<String>>>>,
    /// `rate = { requests = 10, per = "1s", burst = 20 }`: requests per client.
    pub rate: Option<Spanned<toml::Value>>,
    /// A capacity of its own (a tenant named after its first name).
    pub capacity: Option<Spanned<CapacitySection>>,
    /// `compress`: the codings made on the fly, preferred first.
    pub compress: Option<Spanned<Vec<String>>>,
    /// `precompressed`: the codings whose copies are served from beside a file.
    pub precompressed: Option<Spanned<Vec<String>>>,
    /// `error_pages = { 404 = "errors/404.html" }`: a file per status.
    pub error_pages: Option<Spanned<std::collections::BTreeMap<String, String>>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CertificateSection {
    pub cert: Spanned<String>,
    pub key: Spanned<super::keyless::KeyEntry>,
}

/// A duration in a typed section, checked as the file is read (so its error has a line).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConfigDuration(pub Duration);

impl<'de> Deserialize<'de> for ConfigDuration {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let text = String::deserialize(d)?;
        parse_duration(&text).map(ConfigDuration).ok_or_else(|| {
            serde::de::Error::custom(format!(
                "{text:?} is not a duration; write it like \"10s\", \"500ms\" or \"2m\""
            ))
        })
    }
}

/// Parses "30s", "500ms", "2m", "1h" or a bare number of seconds.
pub fn parse_duration(text: &str) -> Option<Duration> {
    let t = text.trim();
    let split = t
        .find(|c: char| !c.is_ascii_digit() && c != '.')
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let value: f64 = num.parse().ok()?;
    let secs = match unit.trim() {
        "" | "s" => value,
        "ms" => value / 1e3,
        "us" | "µs" => value / 1e6,
        "m" => value * 60.0,
        "h" => value * 3600.0,
        _ => return None,
    };
    Duration::try_from_secs_f64(secs).ok()
}
