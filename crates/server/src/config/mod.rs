//! The TOML configuration file: [`schema`] (the file as written), [`resolve`] (to typed
//! values, with defaults), [`upstream`] (the reverse proxy's sections) and [`overrides`]
//! (command-line flags).
//!
//! Every error names the file, the line and what to change. Unknown keys are errors, so a
//! typo never silently falls back to a default.

use std::fmt;
use std::net::SocketAddr;
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::time::Duration;

use terminus_engine::simd::Placement;
use terminus_engine::BackendKind;
use terminus_tls::TlsSettings;

use crate::http::files::CacheSettings;

mod acme;
mod client_auth;
mod headers;
mod overrides;
mod resolve;
mod route;
mod schema;
mod stream;
mod tenant;
mod upstream;

pub use overrides::Overrides;
pub use route::{RouteConfig, RouteTarget};
pub use schema::{parse_duration, ConfigDuration, ConfigFile};
pub use stream::StreamTarget;
pub use tenant::{TenantConfig, DEFAULT_TENANT};

pub use crate::connection::Cidr;

/// A configuration problem: where it is and how to fix it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError {
    pub file: String,
    pub line: Option<usize>,
    pub message: String,
    pub hint: Option<String>,
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.line {
            Some(line) => write!(f, "{}:{}: {}", self.file, line, self.message)?,
            None => write!(f, "{}: {}", self.file, self.message)?,
        }
        if let Some(hint) = &self.hint {
            write!(f, "\n  hint: {hint}")?;
        }
        Ok(())
    }
}

impl std::error::Error for ConfigError {}

/// Where a certificate pair comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CertPaths {
    pub cert: PathBuf,
    pub key: PathBuf,
    /// Line of the `[[server.certificate]]` entry, for errors.
    pub line: Option<usize>,
}

/// One virtual host.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerConfig {
    pub names: Vec<String>,
    pub default: bool,
    /// Longest prefix first once built; none: the built-in page.
    pub routes: Vec<RouteConfig>,
    /// Empty: the self-signed default certificates (or, with `acme`, until ACME's are
    /// stored).
    pub certificates: Vec<CertPaths>,
    /// `certificates = "acme"`: RSA-2048 and ECDSA P-256 certificates from the issuer.
    pub acme: bool,
    /// `client_auth`: the client certificates its handshakes ask for.
    pub client_auth: Option<terminus_tls::ClientAuthPolicy>,
    pub line: Option<usize>,
    /// A `[[stream]]`: its connections go to an upstream as bytes, not as HTTP.
    pub stream: Option<StreamTarget>,
    /// Headers added to every answer (`headers`).
    pub headers: Vec<(hyper::header::HeaderName, hyper::header::HeaderValue)>,
    /// The tenant whose capacity its handshakes use; None: the default tenant.
    pub tenant: Option<String>,
}

/// Whether a listener hands connections to kernel TLS after the handshake.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KtlsMode {
    /// Kernel TLS where the kernel takes the connection, userspace TLS otherwise.
    Auto,
    /// Always userspace TLS.
    Off,
    /// Kernel TLS or no connection.
    Required,
}

impl KtlsMode {
    pub fn from_name(name: &str) -> Option<Self> {
        match name {
            "auto" => Some(Self::Auto),
            "off" => Some(Self::Off),
            "required" => Some(Self::Required),
            _ => None,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Self::Auto => "auto",
            Self::Off => "off",
            Self::Required => "required",
        }
    }
}

const KTLS_HINT: &str =
    "use \"auto\" (kernel TLS where the kernel has it), \"off\" or \"required\"";

/// One listening address and how its connections are carried after the handshake.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Listen {
    pub addr: SocketAddr,
    pub ktls: KtlsMode,
    /// `proxy_protocol = true`: connections from these networks begin with a PROXY
    /// protocol header, which says who the client is.
    pub proxy_protocol: Option<std::sync::Arc<[Cidr]>>,
    /// `forwarded_from`: only clients in these networks have their own X-Forwarded-For
    /// and Forwarded passed on (appended to); others' are replaced. `None`: everyone's
    /// are kept, as nginx's `$proxy_add_x_forwarded_for`.
    pub forwarded_from: Option<std::sync::Arc<[Cidr]>>,
    /// `plain = "redirect"`: HTTP/1.1 without TLS. `None`: TLS.
    pub plain: Option<Plain>,
    /// `http3 = true`: QUIC (UDP) on the same address too.
    pub http3: bool,
}

/// What a plain-HTTP listener does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Plain {
    /// Answers ACME HTTP-01 challenges, and sends every other request to the same host
    /// and path over HTTPS (308).
    Redirect,
}

impl Listen {
    /// Whether `client`'s own forwarding fields are passed on upstream.
    pub fn keeps_forwarded(&self, client: std::net::IpAddr) -> bool {
        self.forwarded_from
            .as_ref()
            .is_none_or(|nets| nets.iter().any(|n| n.contains(client)))
    }
}

/// Where the access log goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AccessLogTarget {
    Off,
    Stdout,
    File(PathBuf),
}

/// A fully resolved configuration with every default filled in.
#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    /// The file it came from, or `<embedded default>`.
    pub source: String,
    pub workers: usize,
    /// Neither the file nor `--workers` set `workers`: one per CPU left to them.
    pub workers_auto: bool,
    pub pin: bool,
    pub listen: Vec<Listen>,
    /// `[tls]`, as rustls values.
    pub tls: TlsSettings,
    /// `tls.ticket_keys`: how the session-ticket keys rotate.
    pub ticket_keys: terminus_fleet::tickets::Rotation,
    /// `[fleet]`: the store the ticket keys are shared through, if any.
    pub fleet: Option<terminus_fleet::store::StoreSettings>,
    /// `[http3]`: which new QUIC connections each worker takes.
    pub http3: terminus_quic::Limits,
    /// `[http3] early_data`: 0-RTT taken (with the session cache).
    pub http3_early_data: bool,
    pub crypto_backend: BackendChoice,
    pub crypto_threads: usize,
    pub crypto_queue_capacity: usize,
    /// `crypto.simd`: where crypto_mb batches run.
    pub crypto_simd: Placement,
    /// `crypto.simd_cores`: physical cores given to crypto threads when dedicated.
    pub crypto_simd_cores: usize,
    pub max_batch_delay: Duration,
    pub handshake_timeout: Duration,
    pub request_header_timeout: Duration,
    pub keepalive_timeout: Duration,
    pub shutdown_grace: Duration,
    pub max_connections: usize,
    /// Admission control's bound on a worker's handshake work (zero: off).
    pub handshake_queue: Duration,
    pub access_log: AccessLogTarget,
    pub log_level: tracing::Level,
    pub admin: Option<SocketAddr>,
    pub files: CacheSettings,
    pub servers: Vec<ServerConfig>,
    /// `[[upstream]]`s, which routes name.
    pub upstreams: Vec<terminus_proxy::UpstreamSpec>,
    /// `[[tenant]]`s and the servers' own capacities.
    pub tenants: Vec<TenantConfig>,
    /// `[acme]`: the issuer of the servers with `certificates = "acme"`.
    pub acme: Option<terminus_acme::AcmeSettings>,
}

/// What `crypto.backend` asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BackendChoice {
    /// multibuffer where crypto_mb runs on this CPU, else scalar: decided at start.
    Auto,
    Use(BackendKind),
}

impl BackendChoice {
    pub fn from_name(name: &str) -> Option<Self> {
        match name {
            "auto" => Some(Self::Auto),
            other => BackendKind::from_name(other).map(Self::Use),
        }
    }
}

const BACKEND_HINT: &str = "use \"auto\", \"multibuffer\", \"scalar\" or \"threads\"";
const SIMD_HINT: &str = "use \"auto\" (measured at start-up), \"inline\" (batches on the workers) or \"dedicated\" (on cores of their own)";

pub const DEFAULT_LISTEN: &str = "127.0.0.1:8443";
pub const EMBEDDED: &str = "<embedded default>";

struct Ctx<'a> {
    file: &'a str,
    text: &'a str,
}

impl Ctx<'_> {
    fn line_of(&self, span: Range<usize>) -> Option<usize> {
        if self.text.is_empty() {
            return None;
        }
        let at = span.start.min(self.text.len());
        Some(self.text[..at].bytes().filter(|&b| b == b'\n').count() + 1)
    }

    fn err(
        &self,
        span: Option<Range<usize>>,
        message: impl Into<String>,
        hint: impl Into<Option<String>>,
    ) -> ConfigError {
        ConfigError {
            file: self.file.to_owned(),
            line: span.and_then(|s| self.line_of(s)),
            message: message.into(),
            hint: hint.into(),
        }
    }
}

impl Config {
    /// Reads and resolves a config file.
    pub fn load(path: &Path, overrides: &Overrides) -> Result<Self, ConfigError> {
        let file = path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|e| ConfigError {
            file: file.clone(),
            line: None,
            message: format!("cannot read the config file: {e}"),
            hint: Some("check the path given to --config".into()),
        })?;
        Self::parse(&text, &file, overrides)
    }

    /// The embedded default: 127.0.0.1:8443, self-signed certificates, built-in page.
    pub fn embedded(overrides: &Overrides) -> Result<Self, ConfigError> {
        Self::parse("", EMBEDDED, overrides)
    }

    /// Parses config text; `file` names it in errors (relative paths resolve from its folder).
    pub fn parse(text: &str, file: &str, overrides: &Overrides) -> Result<Self, ConfigError> {
        let ctx = Ctx { file, text };
        let raw: ConfigFile = toml::from_str(text).map_err(|e| {
            ctx.err(
                e.span(),
                e.message().trim().to_owned(),
                Some("see the configuration reference in README.md".to_owned()),
            )
        })?;
        let mut config = resolve::resolve(&raw, &ctx)?;
        config.apply(overrides, &ctx)?;
        Ok(config)
    }

    /// The server answering unknown or missing SNI: the one marked default, else the first.
    pub fn default_server_index(&self) -> usize {
        self.servers.iter().position(|s| s.default).unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<Config, ConfigError> {
        Config::parse(text, "t.toml", &Overrides::default())
    }

    #[test]
    fn empty_file_gives_defaults() {
        let c = parse("").unwrap();
        assert_eq!(c.listen[0].addr, DEFAULT_LISTEN.parse().unwrap());
        assert_eq!(c.listen[0].ktls, KtlsMode::Auto);
        assert_eq!(c.servers.len(), 1);
        assert_eq!(c.crypto_backend, BackendChoice::Auto);
        assert!(c.tls.session_tickets);
    }

    #[test]
    fn headers_are_checked_where_they_are_written() {
        let server = "[[server]]\nnames = [\"a\"]\n";
        let c = parse(&format!(
            "{server}headers = {{ \"Strict-Transport-Security\" = \"max-age=600; preload\", \"X-Content-Type-Options\" = \"nosniff\" }}\n"
        ))
        .unwrap();
        let h = &c.servers[0].headers;
        assert_eq!(h.len(), 2);
        assert_eq!(h[0].0, "strict-transport-security");
        assert_eq!(h[0].1, "max-age=600; preload");
        assert!(parse(server).unwrap().servers[0].headers.is_empty());
        for (bad, says) in [
            (
                "\"Strict-Transport-Security\" = \"max-age=soon\"",
                "max-age must be",
            ),
            (
                "\"Strict-Transport-Security\" = \"includeSubDomains\"",
                "max-age is required",
            ),
            (
                "\"Strict-Transport-Security\" = \"max-age=1; nope\"",
                "unknown directive",
            ),
            ("\"Content-Length\" = \"5\"", "written by the connection"),
            ("\"Bad Name\" = \"x\"", "not a header name"),
            ("\"X-A\" = \"line\\nbreak\"", "not a valid header value"),
        ] {
            let e = parse(&format!("{server}headers = {{ {bad} }}\n")).unwrap_err();
            assert_eq!(e.line, Some(3), "{bad}: {e}");
            assert!(e.message.contains(says), "{bad}: {e}");
        }
    }

    #[test]
    fn errors_name_the_line() {
        let e = parse("workers = 2\n\n[timeouts]\nhandshake = \"ten\"\n").unwrap_err();
        assert_eq!(e.line, Some(4), "{e}");
        assert!(e.to_string().starts_with("t.toml:4: "), "{e}");
        let e = parse("listen = [\"nope\"]\n").unwrap_err();
        assert_eq!(e.line, Some(1));
        let e = parse("\n[tls]\nverions = [\"1.3\"]\n").unwrap_err();
        assert_eq!(e.line, Some(3), "{e}");
        assert!(e.message.contains("verions"), "{e}");
        let e = parse("[crypto]\nbackend = \"gpu\"\n").unwrap_err();
        assert_eq!(e.line, Some(2));
    }

    #[test]
    fn crypto_simd_is_a_placement_of_crypto_mb_batches() {
        let c = parse("").unwrap();
        assert_eq!(c.crypto_simd, Placement::Auto);
        assert!(c.workers_auto);
        assert!(c.crypto_simd_cores >= 1);
        let c = parse("workers = 1\n[crypto]\nsimd = \"dedicated\"\nsimd_cores = 2\n").unwrap();
        assert_eq!(
            (c.crypto_simd, c.crypto_simd_cores),
            (Placement::Dedicated, 2)
        );
        assert!(!c.workers_auto);
        let e = parse("[crypto]\nsimd = \"sideways\"\n").unwrap_err();
        assert_eq!(e.line, Some(2), "{e}");
        assert!(e.to_string().contains("dedicated"), "{e}");
        // Nothing to place: the backend computes no crypto_mb batches.
        let e = parse("[crypto]\nbackend = \"scalar\"\n\nsimd = \"dedicated\"\n").unwrap_err();
        assert_eq!(e.line, Some(4), "{e}");
        assert!(e.message.contains("scalar"), "{e}");
        let e = parse("[crypto]\nsimd_cores = 0\n").unwrap_err();
        assert_eq!(e.line, Some(2), "{e}");
    }

    #[test]
    fn tls_values_are_resolved_where_they_are_written() {
        let c = parse("[tls]\nversions = [\"1.3\"]\ngroups = [\"x25519\"]\n").unwrap();
        assert_eq!(c.tls.versions, vec![&rustls::version::TLS13]);
        assert_eq!(c.tls.groups, vec![terminus_engine::KxGroup::X25519]);
        let pq = parse("[tls]\nversions = [\"1.3\"]\ngroups = [\"X25519MLKEM768\"]\n").unwrap();
        assert_eq!(
            pq.tls.groups,
            vec![terminus_engine::KxGroup::X25519MlKem768]
        );
        for (text, line, says) in [
            ("\n[tls]\nversions = [\"1.1\"]\n", 3, "unknown TLS version"),
            ("[tls]\ngroups = []\n", 2, "tls.groups is empty"),
            ("[tls]\ngroups = [\"x448\"]\n", 2, "unknown group"),
            (
                "[tls]\nversions = [\"1.3\"]\ncipher_suites = [\"TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256\"]\n",
                3,
                "no configured cipher suite",
            ),
            (
                "[tls]\n\ngroups = [\"X25519MLKEM768\"]\n",
                3,
                "TLS 1.2 is enabled but no configured group works with it",
            ),
            ("[log]\nlevel = \"loud\"\n", 2, "log level"),
        ] {
            let e = parse(text).unwrap_err();
            assert_eq!(e.line, Some(line), "{text:?}: {e}");
            assert!(e.message.contains(says), "{text:?}: {e}");
        }
        assert_eq!(
            parse("[log]\nlevel = \"debug\"\n").unwrap().log_level,
            tracing::Level::DEBUG
        );
    }

    #[test]
    fn overrides_win() {
        let o = Overrides {
            listen: vec!["127.0.0.1:9999".into()],
            workers: Some(3),
            no_resumption: true,
            crypto_backend: Some("threads".into()),
            ..Default::default()
        };
        let c = Config::parse("workers = 1\nlisten = [\"0.0.0.0:1\"]\n", "t.toml", &o).unwrap();
        assert_eq!(c.workers, 3);
        assert_eq!(c.listen.len(), 1);
        assert_eq!(c.listen[0].addr, "127.0.0.1:9999".parse().unwrap());
        assert!(!c.tls.session_tickets && c.tls.session_cache == 0);
        assert_eq!(c.crypto_backend, BackendChoice::Use(BackendKind::Threads));
    }

    #[test]
    fn ktls_per_listener_with_a_default_and_a_flag() {
        let text = "listen = [\"127.0.0.1:1\", { address = \"127.0.0.1:2\", ktls = \"required\" }]\n[tls]\nktls = \"off\"\n";
        let c = parse(text).unwrap();
        let modes: Vec<KtlsMode> = c.listen.iter().map(|l| l.ktls).collect();
        assert_eq!(modes, [KtlsMode::Off, KtlsMode::Required]);
        assert_eq!(c.listen[1].addr, "127.0.0.1:2".parse().unwrap());
        let o = Overrides {
            ktls: Some("auto".into()),
            ..Default::default()
        };
        let c = Config::parse(text, "t.toml", &o).unwrap();
        assert!(c.listen.iter().all(|l| l.ktls == KtlsMode::Auto));

        let e = parse("\n[tls]\nktls = \"sometimes\"\n").unwrap_err();
        assert_eq!(e.line, Some(3), "{e}");
        assert!(e.hint.unwrap().contains("required"));
        let e = parse("listen = [{ address = \"127.0.0.1:2\", ktls = \"on\" }]\n").unwrap_err();
        assert_eq!(e.line, Some(1), "{e}");
        let e = parse("listen = [{ address = \"nope\" }]\n").unwrap_err();
        assert!(e.message.contains("not IP:PORT"), "{e}");
        let o = Overrides {
            ktls: Some("yes".into()),
            ..Default::default()
        };
        assert!(Config::parse("", "t.toml", &o)
            .unwrap_err()
            .to_string()
            .contains("--ktls"));
    }

    #[test]
    fn durations() {
        assert_eq!(parse_duration("10s"), Some(Duration::from_secs(10)));
        assert_eq!(parse_duration("250ms"), Some(Duration::from_millis(250)));
        assert_eq!(parse_duration("2m"), Some(Duration::from_secs(120)));
        assert_eq!(parse_duration("5"), Some(Duration::from_secs(5)));
        assert_eq!(parse_duration("5 parsecs"), None);
        assert_eq!(parse_duration("1e300h"), None, "beyond any Duration");
    }

    mod properties {
        use super::parse;
        use proptest::prelude::*;

        /// Lines a config file could hold: known sections and keys with values of every
        /// type, plus junk.
        fn line() -> impl Strategy<Value = String> {
            let section = prop::sample::select(vec![
                "[tls]",
                "[crypto]",
                "[timeouts]",
                "[limits]",
                "[log]",
                "[files]",
                "[admin]",
                "[[server]]",
                "[[server.certificate]]",
                "[nonsense]",
            ]);
            let key = prop::sample::select(vec![
                "workers",
                "listen",
                "versions",
                "cipher_suites",
                "groups",
                "backend",
                "handshake",
                "keepalive",
                "max_connections",
                "level",
                "cache",
                "cache_valid",
                "cache_entries",
                "names",
                "root",
                "cert",
                "key",
                "default",
                "bogus",
            ]);
            let value = prop::sample::select(vec![
                "1",
                "0",
                "-3",
                "99999999999",
                "true",
                "\"1s\"",
                "\"10 s\"",
                "\"ten\"",
                "\"1.3\"",
                "[\"1.2\", \"1.3\"]",
                "[]",
                "\"127.0.0.1:0\"",
                "\"x\"",
                "{ a = 1 }",
                "\"",
                "[1, \"a\"]",
            ]);
            prop_oneof![
                section.prop_map(str::to_owned),
                (key, value).prop_map(|(k, v)| format!("{k} = {v}")),
                "[ -~]{0,20}",
            ]
        }

        proptest! {
            #![proptest_config(ProptestConfig::with_cases(256))]

            /// Whatever the file holds, parsing ends in a config or an error that names a
            /// line of the file; it never panics.
            #[test]
            fn errors_name_a_line_of_the_file(lines in prop::collection::vec(line(), 0..12)) {
                let text = lines.join("\n");
                if let Err(e) = parse(&text) {
                    if let Some(line) = e.line {
                        prop_assert!(line >= 1 && line <= lines.len().max(1), "line {} of {}: {}", line, lines.len(), e);
                    }
                }
            }
        }
    }
}
