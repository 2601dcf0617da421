//! The TOML configuration file: its schema, validation, and command-line overrides.
//!
//! Every error names the file, the line and what to change. Unknown keys are errors, so a
//! typo never silently falls back to a default.

use std::fmt;
use std::net::SocketAddr;
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Deserializer};
use toml::Spanned;

use crate::http::files::CacheSettings;

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
    pub files: CacheSettings,
    #[serde(default)]
    pub server: Vec<ServerSection>,
}

/// A `listen` entry: `"IP:PORT"` or `{ address = "IP:PORT", ktls = "required" }`.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub enum ListenEntry {
    Address(String),
    Options(ListenOptions),
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ListenOptions {
    pub address: String,
    pub ktls: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TlsSection {
    pub versions: Option<Spanned<Vec<String>>>,
    pub cipher_suites: Option<Spanned<Vec<String>>>,
    pub groups: Option<Spanned<Vec<String>>>,
    pub session_tickets: Option<bool>,
    pub session_cache: Option<usize>,
    /// The default `ktls` of every listener.
    pub ktls: Option<Spanned<String>>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CryptoSection {
    pub backend: Option<Spanned<String>>,
    pub threads: Option<usize>,
    pub queue_capacity: Option<usize>,
    pub max_batch_delay: Option<Spanned<String>>,
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
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LogSection {
    pub access: Option<Spanned<String>>,
    pub level: Option<Spanned<String>>,
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
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CertificateSection {
    pub cert: Spanned<String>,
    pub key: Spanned<String>,
}

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
    /// None: the built-in page.
    pub root: Option<PathBuf>,
    pub root_line: Option<usize>,
    /// Empty: the self-signed default certificates.
    pub certificates: Vec<CertPaths>,
    pub line: Option<usize>,
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
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Listen {
    pub addr: SocketAddr,
    pub ktls: KtlsMode,
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
    pub pin: bool,
    pub listen: Vec<Listen>,
    pub tls_versions: Vec<String>,
    pub cipher_suites: Option<Vec<String>>,
    pub groups: Vec<String>,
    pub session_tickets: bool,
    pub session_cache: usize,
    pub crypto_backend: String,
    pub crypto_threads: usize,
    pub crypto_queue_capacity: usize,
    pub max_batch_delay: Duration,
    pub handshake_timeout: Duration,
    pub request_header_timeout: Duration,
    pub keepalive_timeout: Duration,
    pub shutdown_grace: Duration,
    pub max_connections: usize,
    pub access_log: AccessLogTarget,
    pub log_level: String,
    pub admin: Option<SocketAddr>,
    pub files: CacheSettings,
    pub servers: Vec<ServerConfig>,
}

/// Command-line flags that override the file.
#[derive(Debug, Clone, Default)]
pub struct Overrides {
    pub listen: Vec<String>,
    pub certs: Vec<(PathBuf, PathBuf)>,
    pub root: Option<PathBuf>,
    pub workers: Option<usize>,
    pub pin: bool,
    pub crypto_backend: Option<String>,
    pub no_resumption: bool,
    pub admin: Option<String>,
    /// `--ktls MODE`: every listener's `ktls`.
    pub ktls: Option<String>,
}

/// Values of `crypto.backend`: `auto` is multibuffer where crypto_mb runs, else scalar.
pub const BACKENDS: [&str; 4] = ["auto", "multibuffer", "scalar", "threads"];

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
    (secs.is_finite() && secs >= 0.0).then(|| Duration::from_secs_f64(secs))
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
        let base = Path::new(file)
            .parent()
            .filter(|_| file != EMBEDDED)
            .map(Path::to_path_buf);
        let resolve_path = |p: &str| -> PathBuf {
            let p = PathBuf::from(p);
            match (&base, p.is_relative()) {
                (Some(b), true) => b.join(p),
                _ => p,
            }
        };
        let duration = |v: &Option<Spanned<String>>,
                        name: &str,
                        default: Duration|
         -> Result<Duration, ConfigError> {
            match v {
                None => Ok(default),
                Some(s) => parse_duration(s.get_ref()).ok_or_else(|| {
                    ctx.err(
                        Some(s.span()),
                        format!("{name} = {:?} is not a duration", s.get_ref()),
                        Some("write it like \"10s\", \"500ms\" or \"2m\"".to_owned()),
                    )
                }),
            }
        };
        let addr = |s: &Spanned<String>, what: &str| -> Result<SocketAddr, ConfigError> {
            s.get_ref().parse().map_err(|_| {
                ctx.err(
                    Some(s.span()),
                    format!("{what} address {:?} is not IP:PORT", s.get_ref()),
                    Some("e.g. \"0.0.0.0:443\", \"127.0.0.1:8443\" or \"[::]:443\"".to_owned()),
                )
            })
        };

        let workers = match &raw.workers {
            Some(w) if *w.get_ref() == 0 || *w.get_ref() > 1024 => {
                return Err(ctx.err(Some(w.span()), "workers must be between 1 and 1024", None))
            }
            Some(w) => *w.get_ref(),
            None => std::thread::available_parallelism().map_or(1, |n| n.get()),
        };
        let ktls_mode = |name: &str, span: Range<usize>| {
            KtlsMode::from_name(name).ok_or_else(|| {
                ctx.err(
                    Some(span),
                    format!("ktls = {name:?} is not a kTLS mode"),
                    Some(KTLS_HINT.to_owned()),
                )
            })
        };
        let default_ktls = match &raw.tls.ktls {
            Some(k) => ktls_mode(k.get_ref(), k.span())?,
            None => KtlsMode::Auto,
        };
        let mut listen = Vec::new();
        for entry in &raw.listen {
            let (address, ktls) = match entry.get_ref() {
                ListenEntry::Address(a) => (a, None),
                ListenEntry::Options(o) => (&o.address, o.ktls.as_deref()),
            };
            let spanned = Spanned::new(entry.span(), address.clone());
            listen.push(Listen {
                addr: addr(&spanned, "listen")?,
                ktls: match ktls {
                    Some(k) => ktls_mode(k, entry.span())?,
                    None => default_ktls,
                },
            });
        }
        if listen.is_empty() {
            listen.push(Listen {
                addr: DEFAULT_LISTEN.parse().expect("valid default"),
                ktls: default_ktls,
            });
        }

        let mut servers = Vec::new();
        for s in &raw.server {
            let line = ctx.line_of(s.names.span());
            if s.names.get_ref().is_empty() {
                return Err(ctx.err(
                    Some(s.names.span()),
                    "a [[server]] needs at least one name",
                    Some("names = [\"example.com\", \"*.example.com\"]".to_owned()),
                ));
            }
            for name in s.names.get_ref() {
                let bare = name.strip_prefix("*.").unwrap_or(name);
                if bare.is_empty() || bare.contains('*') || bare.contains(char::is_whitespace) {
                    return Err(ctx.err(
                        Some(s.names.span()),
                        format!("server name {name:?} is not valid"),
                        Some(
                            "use exact names or one leading wildcard label: \"*.example.com\""
                                .to_owned(),
                        ),
                    ));
                }
            }
            let certificates = s
                .certificate
                .iter()
                .map(|c| CertPaths {
                    cert: resolve_path(c.cert.get_ref()),
                    key: resolve_path(c.key.get_ref()),
                    line: ctx.line_of(c.cert.span()),
                })
                .collect::<Vec<_>>();
            if certificates.len() > 2 {
                return Err(ctx.err(
                    Some(s.names.span()),
                    "a server takes at most two certificates (one RSA and one ECDSA)",
                    None,
                ));
            }
            servers.push(ServerConfig {
                names: s.names.get_ref().clone(),
                default: s.default,
                root: s.root.as_ref().map(|r| resolve_path(r.get_ref())),
                root_line: s.root.as_ref().and_then(|r| ctx.line_of(r.span())),
                certificates,
                line,
            });
        }
        if servers.iter().filter(|s| s.default).count() > 1 {
            let second = raw
                .server
                .iter()
                .filter(|s| s.default)
                .nth(1)
                .map(|s| s.names.span());
            return Err(ctx.err(second, "more than one [[server]] has default = true", None));
        }
        if servers.is_empty() {
            servers.push(ServerConfig {
                names: vec!["localhost".into()],
                default: true,
                root: None,
                root_line: None,
                certificates: Vec::new(),
                line: None,
            });
        }

        let backend = raw.crypto.backend.as_ref();
        let crypto_backend = backend.map_or("auto".to_owned(), |b| b.get_ref().clone());
        if !BACKENDS.contains(&crypto_backend.as_str()) {
            return Err(ctx.err(
                backend.map(|b| b.span()),
                format!("unknown crypto backend {crypto_backend:?}"),
                Some("use \"auto\", \"multibuffer\", \"scalar\" or \"threads\"".to_owned()),
            ));
        }

        let access_log = match raw.log.access.as_ref().map(|a| a.get_ref().as_str()) {
            None | Some("off") => AccessLogTarget::Off,
            Some("stdout") => AccessLogTarget::Stdout,
            Some(p) => AccessLogTarget::File(resolve_path(p)),
        };

        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        let mut config = Config {
            source: file.to_owned(),
            workers,
            pin: raw.pin.unwrap_or(false),
            listen,
            tls_versions: raw
                .tls
                .versions
                .as_ref()
                .map_or_else(|| vec!["1.2".into(), "1.3".into()], |v| v.get_ref().clone()),
            cipher_suites: raw.tls.cipher_suites.as_ref().map(|v| v.get_ref().clone()),
            groups: raw.tls.groups.as_ref().map_or_else(
                || vec!["x25519".into(), "secp256r1".into(), "secp384r1".into()],
                |v| v.get_ref().clone(),
            ),
            session_tickets: raw.tls.session_tickets.unwrap_or(true),
            session_cache: raw.tls.session_cache.unwrap_or(256 * 1024),
            crypto_backend,
            crypto_threads: raw.crypto.threads.unwrap_or(cores).max(1),
            crypto_queue_capacity: raw.crypto.queue_capacity.unwrap_or(1024).max(1),
            max_batch_delay: duration(
                &raw.crypto.max_batch_delay,
                "max_batch_delay",
                Duration::from_millis(2),
            )?,
            handshake_timeout: duration(
                &raw.timeouts.handshake,
                "handshake",
                Duration::from_secs(10),
            )?,
            request_header_timeout: duration(
                &raw.timeouts.request_header,
                "request_header",
                Duration::from_secs(10),
            )?,
            keepalive_timeout: duration(
                &raw.timeouts.keepalive,
                "keepalive",
                Duration::from_secs(75),
            )?,
            shutdown_grace: duration(
                &raw.timeouts.shutdown_grace,
                "shutdown_grace",
                Duration::from_secs(10),
            )?,
            max_connections: raw.limits.max_connections.unwrap_or(10_000).max(1),
            access_log,
            log_level: match &raw.log.level {
                None => "info".into(),
                Some(l)
                    if ["error", "warn", "info", "debug", "trace"]
                        .contains(&l.get_ref().as_str()) =>
                {
                    l.get_ref().clone()
                }
                Some(l) => {
                    return Err(ctx.err(
                        Some(l.span()),
                        format!("log level {:?} is not known", l.get_ref()),
                        Some("use error, warn, info, debug or trace".to_owned()),
                    ))
                }
            },
            admin: raw
                .admin
                .listen
                .as_ref()
                .map(|a| addr(a, "admin"))
                .transpose()?,
            files: raw.files.clone(),
            servers,
        };
        for (name, d) in [
            ("handshake", config.handshake_timeout),
            ("request_header", config.request_header_timeout),
            ("keepalive", config.keepalive_timeout),
        ] {
            if d.is_zero() {
                return Err(ctx.err(None, format!("timeouts.{name} must be above zero"), None));
            }
        }
        config.apply(overrides, &ctx)?;
        Ok(config)
    }

    fn apply(&mut self, o: &Overrides, ctx: &Ctx<'_>) -> Result<(), ConfigError> {
        let flag_err = |flag: &str, msg: String, hint: &str| ConfigError {
            file: format!("{} (command line {flag})", ctx.file),
            line: None,
            message: msg,
            hint: Some(hint.to_owned()),
        };
        if !o.listen.is_empty() {
            let ktls = self.listen.first().map_or(KtlsMode::Auto, |l| l.ktls);
            self.listen = o
                .listen
                .iter()
                .map(|l| {
                    let addr = l.parse().map_err(|_| {
                        flag_err(
                            "--listen",
                            format!("{l:?} is not IP:PORT"),
                            "e.g. --listen 0.0.0.0:443",
                        )
                    })?;
                    Ok(Listen { addr, ktls })
                })
                .collect::<Result<_, _>>()?;
        }
        if let Some(k) = &o.ktls {
            let mode = KtlsMode::from_name(k)
                .ok_or_else(|| flag_err("--ktls", format!("unknown mode {k:?}"), KTLS_HINT))?;
            for l in &mut self.listen {
                l.ktls = mode;
            }
        }
        if let Some(w) = o.workers {
            if w == 0 || w > 1024 {
                return Err(flag_err(
                    "--workers",
                    format!("{w} workers"),
                    "use 1 to 1024",
                ));
            }
            self.workers = w;
        }
        self.pin |= o.pin;
        if let Some(b) = &o.crypto_backend {
            if !BACKENDS.contains(&b.as_str()) {
                return Err(flag_err(
                    "--crypto-backend",
                    format!("unknown backend {b:?}"),
                    "use auto, multibuffer, scalar or threads",
                ));
            }
            self.crypto_backend = b.clone();
        }
        if o.no_resumption {
            self.session_tickets = false;
            self.session_cache = 0;
        }
        if let Some(a) = &o.admin {
            self.admin = Some(a.parse().map_err(|_| {
                flag_err(
                    "--admin",
                    format!("{a:?} is not IP:PORT"),
                    "e.g. --admin 127.0.0.1:9100",
                )
            })?);
        }
        let default = self.default_server_index();
        if !o.certs.is_empty() {
            self.servers[default].certificates = o
                .certs
                .iter()
                .map(|(cert, key)| CertPaths {
                    cert: cert.clone(),
                    key: key.clone(),
                    line: None,
                })
                .collect();
        }
        if let Some(root) = &o.root {
            self.servers[default].root = Some(root.clone());
            self.servers[default].root_line = None;
        }
        Ok(())
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
        assert_eq!(c.crypto_backend, "auto");
        assert!(c.session_tickets);
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
        assert!(!c.session_tickets && c.session_cache == 0);
        assert_eq!(c.crypto_backend, "threads");
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
