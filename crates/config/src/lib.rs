//! The TOML configuration file, from text to a typed [`Config`] with every default filled
//! in. Each section has its own module and resolving function: `listen`, `servers`
//! (`[[server]]`, `[[stream]]`, their routes, certificates and headers), `tls`, `crypto`,
//! `tenant`, `upstream`, `acme`, `fleet` and `http3`; `access` and `rate` (a server's or
//! route's allow and deny rules, its request rate per client); `resolve` puts them together with
//! the small sections (timeouts, limits, log, admin, files), and [`Overrides`] applies the
//! command line's flags last. `schema` is the file as written (serde), `Ctx` the file
//! being read (its lines, its folder).
//!
//! Every error names the file, the line and what to change, and is made here: nothing
//! later checks a setting without its line. Unknown keys are errors, so a typo never
//! silently falls back to a default. What depends on the machine (how many CPUs there
//! are, so how many workers and crypto cores) is not decided here: a setting left out
//! stays `None` for the server's placement to decide at start.

use std::fmt;
use std::net::SocketAddr;
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::time::Duration;

use terminus_tls::TlsSettings;
use toml::Spanned;

mod access;
mod acme;
mod cidr;
mod client_auth;
mod compress;
mod crypto;
mod files;
mod fleet;
mod headers;
mod http3;
mod keyless;
mod listen;
mod overrides;
mod rate;
mod resolve;
mod route;
mod schema;
mod servers;
mod stream;
mod tenant;
mod tls;
mod upstream;

pub use access::Access;
pub use cidr::Cidr;
pub use crypto::{BackendChoice, Crypto};
pub use files::CacheSettings;
pub use keyless::{KeySource, RemoteKeyConfig, SignerConfig};
pub use listen::{KtlsMode, Listen, Plain};
pub use overrides::Overrides;
pub use rate::{RateKey, RateLimit};
pub use route::{RouteConfig, RouteTarget, REDIRECT_PLACEHOLDERS};
pub use schema::{parse_duration, ConfigDuration};
pub use servers::{CertPaths, ErrorPage, ServerConfig};
pub use stream::StreamTarget;
pub use tenant::{TenantConfig, DEFAULT_TENANT};

use schema::ConfigFile;

/// A configuration problem: where it is and how to fix it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError {
    /// The config file, or `<embedded default>`.
    pub file: String,
    /// The line the problem is on, where one line is to blame.
    pub line: Option<usize>,
    /// What is wrong.
    pub message: String,
    /// What to write instead.
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

/// Where the access log goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AccessLogTarget {
    /// No access log.
    Off,
    /// A line per request on standard output.
    Stdout,
    /// A line per request appended to this file.
    File(PathBuf),
}

/// How the access log writes a request (`log.format`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum LogFormat {
    /// One line of space-separated fields, nginx-like (client, time, request line, status,
    /// bytes), key=value fields after them.
    #[default]
    Text,
    /// One JSON object a line, as log shippers (Vector, Fluent Bit, Filebeat) read.
    Json,
}

/// A fully resolved configuration with every default filled in.
#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    /// The file it came from, or `<embedded default>`.
    pub source: String,
    /// `workers`: worker threads; `None`: one per CPU left to them, decided at start.
    pub workers: Option<usize>,
    /// `pin`: each worker on a CPU of its own.
    pub pin: bool,
    /// `listen`: the addresses served, at least one.
    pub listen: Vec<Listen>,
    /// `[tls]`, as rustls values.
    pub tls: TlsSettings,
    /// `tls.ticket_keys`: how the session-ticket keys rotate.
    pub ticket_keys: terminus_fleet::tickets::Rotation,
    /// `[fleet]`: the store the ticket keys are shared through, if any.
    pub fleet: Option<terminus_fleet::store::StoreSettings>,
    /// `[signer]`: this instance signs for keyless terminators, if set.
    pub signer: Option<SignerConfig>,
    /// `[http3]`: which new QUIC connections each worker takes.
    pub http3: terminus_quic::Limits,
    /// `[http3] early_data`: 0-RTT taken (with the session cache).
    pub http3_early_data: bool,
    /// `[crypto]`: the engine computing handshake crypto.
    pub crypto: Crypto,
    /// `timeouts.handshake`: a TLS handshake's whole time.
    pub handshake_timeout: Duration,
    /// `timeouts.request_header`: a request head's arrival.
    pub request_header_timeout: Duration,
    /// `timeouts.keepalive`: an idle connection's life between requests.
    pub keepalive_timeout: Duration,
    /// `timeouts.shutdown_grace`: how long a drain waits for requests in flight.
    pub shutdown_grace: Duration,
    /// `limits.max_connections`: open connections, all workers together.
    pub max_connections: usize,
    /// Admission control's bound on a worker's handshake work (zero: off).
    pub handshake_queue: Duration,
    /// `limits.connections_per_client`: connections one client address may hold open
    /// (IPv6 by its /64); `None`: no limit.
    pub connections_per_client: Option<u32>,
    /// `limits.rate_keys`: the most clients the rate limits remember at once (read at
    /// start: a reload keeps the table).
    pub rate_keys: usize,
    /// `log.access`.
    pub access_log: AccessLogTarget,
    /// `log.format`: the access log's.
    pub log_format: LogFormat,
    /// `log.error`: the file the error log is appended to; `None`, standard error (read
    /// at start).
    pub error_log: Option<PathBuf>,
    /// `log.level`.
    pub log_level: tracing::Level,
    /// `admin.listen`: where `/metrics` and `/capacity` are served.
    pub admin: Option<SocketAddr>,
    /// `upgrade.socket`: the control socket `terminus upgrade` reaches this process on;
    /// `None` where the file does not say (the server's default then applies).
    pub upgrade_socket: Option<PathBuf>,
    /// `upgrade.drain`: how long a process that handed over to a new one goes on
    /// serving the connections it has.
    pub upgrade_drain: Duration,
    /// `[files]`.
    pub files: CacheSettings,
    /// `[[server]]`s, then `[[stream]]`s: at least one.
    pub servers: Vec<ServerConfig>,
    /// `[[upstream]]`s, which routes name.
    pub upstreams: Vec<terminus_proxy::UpstreamSpec>,
    /// `[[tenant]]`s and the servers' own capacities.
    pub tenants: Vec<TenantConfig>,
    /// `[acme]`: the issuer of the servers with `certificates = "acme"`.
    pub acme: Option<terminus_acme::AcmeSettings>,
}

/// The address served when the file names none.
pub const DEFAULT_LISTEN: &str = "127.0.0.1:8443";
/// The name errors give the embedded default configuration.
pub const EMBEDDED: &str = "<embedded default>";

/// The file being resolved: its name and text (for errors' lines) and its folder (for
/// relative paths).
struct Ctx<'a> {
    file: &'a str,
    text: &'a str,
    base: Option<PathBuf>,
}

impl<'a> Ctx<'a> {
    fn new(file: &'a str, text: &'a str) -> Self {
        let base = Path::new(file)
            .parent()
            .filter(|_| file != EMBEDDED)
            .map(Path::to_path_buf);
        Self { file, text, base }
    }

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

    /// A path as written, relative to the config file's folder.
    fn path(&self, written: &str) -> PathBuf {
        let p = PathBuf::from(written);
        match (&self.base, p.is_relative()) {
            (Some(b), true) => b.join(p),
            _ => p,
        }
    }

    /// A duration setting (`"10s"`, `"500ms"`, `"2m"`), `default` where it is left out.
    fn duration(
        &self,
        v: &Option<Spanned<String>>,
        name: &str,
        default: Duration,
    ) -> Result<Duration, ConfigError> {
        match v {
            None => Ok(default),
            Some(s) => parse_duration(s.get_ref()).ok_or_else(|| {
                self.err(
                    Some(s.span()),
                    format!("{name} = {:?} is not a duration", s.get_ref()),
                    Some("write it like \"10s\", \"500ms\" or \"2m\"".to_owned()),
                )
            }),
        }
    }

    /// A name the operator gives something (a server, a tenant, an upstream, a signer),
    /// which logs, `/metrics` labels and the status page show: control characters
    /// (a newline, a tab, an escape) are refused, as they would show as something else.
    fn name(&self, name: &str, span: Range<usize>, what: &str) -> Result<(), ConfigError> {
        match name.chars().find(|c| c.is_control()) {
            None => Ok(()),
            Some(c) => Err(self.err(
                Some(span),
                format!("{what} {name:?} holds the control character {c:?}"),
                Some("names are printable text: remove it".to_owned()),
            )),
        }
    }

    /// An `IP:PORT` setting.
    fn addr(&self, s: &Spanned<String>, what: &str) -> Result<SocketAddr, ConfigError> {
        s.get_ref().parse().map_err(|_| {
            self.err(
                Some(s.span()),
                format!("{what} address {:?} is not IP:PORT", s.get_ref()),
                Some("e.g. \"0.0.0.0:443\", \"127.0.0.1:8443\" or \"[::]:443\"".to_owned()),
            )
        })
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
        let ctx = Ctx::new(file, text);
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

    /// An error found when the configuration's files are loaded (a certificate that does
    /// not parse, a CA file that is missing): named by this configuration's file and
    /// `line`, the line of the setting that names the file.
    pub fn error_at(
        &self,
        line: Option<usize>,
        message: impl Into<String>,
        hint: Option<&str>,
    ) -> ConfigError {
        ConfigError {
            file: self.source.clone(),
            line,
            message: message.into(),
            hint: hint.map(str::to_owned),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use terminus_capacity::simd::Placement;
    use terminus_engine::BackendKind;

    fn parse(text: &str) -> Result<Config, ConfigError> {
        Config::parse(text, "t.toml", &Overrides::default())
    }

    #[test]
    fn empty_file_gives_defaults() {
        let c = parse("").unwrap();
        assert_eq!(c.listen[0].addr, DEFAULT_LISTEN.parse().unwrap());
        assert_eq!(c.listen[0].ktls, KtlsMode::Auto);
        assert_eq!(c.servers.len(), 1);
        assert_eq!(c.crypto.backend, BackendChoice::Auto);
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
        // Server replaces terminus's token; "" removes it.
        let token = |text: &str| {
            parse(&format!("{server}headers = {{ {text} }}\n"))
                .unwrap()
                .servers[0]
                .server_header
                .clone()
        };
        assert_eq!(token("Server = \"edge\"").unwrap(), "edge");
        assert_eq!(token("server = \"\""), None);
        assert_eq!(token("X-A = \"b\"").unwrap(), "terminus");
        assert_eq!(
            parse(server).unwrap().servers[0]
                .server_header
                .clone()
                .unwrap(),
            "terminus"
        );
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

    /// What `terminus check` prints for a bad file (the binary prints the error as it
    /// is): `FILE:LINE: what`, then the hint on its own line.
    #[test]
    fn every_error_gives_file_line_what_and_hint() {
        let cases: [(&str, &str, &[&str]); 10] = [
            ("workers = 2\nlisten = [\"127.0.0.1:1\"\n", "3", &["expected `]`", "\n  hint: "]),
            ("workers = 2\n\n[tls]\nversion = [\"1.3\"]\n", "4", &["unknown field `version`", "versions"]),
            ("[timeouts]\nhandshake = \"soon\"\n", "2", &["not a duration", "\n  hint: ", "\"10s\""]),
            ("listen = [\"localhost\"]\n", "1", &["not IP:PORT", "\n  hint: "]),
            ("\n[crypto]\nbackend = \"quantum\"\n", "3", &["unknown crypto backend", "\n  hint: ", "scalar"]),
            ("[tls]\nversions = [\"1.1\"]\n", "2", &["unknown TLS version", "\n  hint: "]),
            ("[tls]\ncipher_suites = [\"RC4\"]\n", "2", &["unknown cipher suite", "TLS13_AES_128_GCM_SHA256"]),
            ("[[server]]\nnames = [\"a\"]\ndefault = true\n[[server]]\nnames = [\"b\"]\ndefault = true\n", "5", &["more than one"]),
            ("workers = 0\n", "1", &["between 1 and 1024"]),
            ("[[upstream]]\nname = \"u\"\nservers = [\"127.0.0.1:1\"]\nupgrades = [\"h2c\"]\n", "4", &["\"h2c\" cannot be allowed", "protocol = \"h2c\""]),
        ];
        for (text, line, says) in cases {
            let shown = Config::parse(text, "/etc/terminus/t.toml", &Overrides::default())
                .unwrap_err()
                .to_string();
            assert!(
                shown.starts_with(&format!("/etc/terminus/t.toml:{line}: ")),
                "{text:?}: {shown}"
            );
            for s in says {
                assert!(shown.contains(s), "{text:?} lacks {s:?}: {shown}");
            }
        }
        let e = Config::load(
            Path::new("/nonexistent/terminus.toml"),
            &Overrides::default(),
        )
        .unwrap_err();
        assert!(
            e.to_string()
                .starts_with("/nonexistent/terminus.toml: cannot read the config file"),
            "{e}"
        );
    }

    /// Of two mistakes in a file, the one reported is the first in the resolving order
    /// (servers before crypto before tls before timeouts' values): always the same.
    #[test]
    fn of_two_mistakes_the_same_one_is_reported() {
        for (text, line, says) in [
            (
                "[timeouts]\nkeepalive = \"0s\"\n[[server]]\nnames = []\n",
                4,
                "needs at least one name",
            ),
            (
                "[tls]\nversions = [\"1.1\"]\n[crypto]\nbackend = \"gpu\"\n",
                4,
                "unknown crypto backend",
            ),
            (
                "[log]\nlevel = \"loud\"\n[crypto]\nmax_batch_delay = \"soon\"\n",
                4,
                "not a duration",
            ),
        ] {
            let e = parse(text).unwrap_err();
            assert_eq!(e.line, Some(line), "{text:?}: {e}");
            assert!(e.message.contains(says), "{text:?}: {e}");
        }
    }

    /// Names reach logs, `/metrics` labels and the status page: quotes and backslashes
    /// are theirs to hold (the exposition escapes them), control characters are refused
    /// at the name's line.
    #[test]
    fn names_with_control_characters_are_refused_at_their_line() {
        let quoted = "[[upstream]]\nname = 'a\"b\\c'\nservers = [\"127.0.0.1:1\"]\n[[tenant]]\nname = 'shop \"one\" \\'\ncapacity = { acu = 1 }\n";
        let c = parse(quoted).unwrap();
        assert_eq!(c.upstreams[0].name, "a\"b\\c");
        assert_eq!(c.tenants[0].name, "shop \"one\" \\");
        let signer = |s: &str| {
            format!("[[server]]\nnames = [\"a\"]\n[[server.certificate]]\ncert = \"c.pem\"\nkey = {{ signer = \"{s}\", ca = \"ca.pem\", cert = \"t.pem\", key = \"t.key\" }}\n")
        };
        for (text, line, what) in [
            (
                "[[upstream]]\nname = \"a\\nb\"\nservers = [\"127.0.0.1:1\"]\n".to_owned(),
                2,
                "upstream name",
            ),
            (
                "\n[[tenant]]\nname = \"shop\\u0007\"\ncapacity = { acu = 1 }\n".to_owned(),
                3,
                "tenant name",
            ),
            (
                "[[server]]\nnames = [\"a\", \"b\\u001b[31m\"]\n".to_owned(),
                2,
                "server name",
            ),
            (
                "[[stream]]\nnames = [\"a\\u0000\"]\nupstream = \"u\"\n".to_owned(),
                2,
                "server name",
            ),
            (signer("k\\r:2407"), 5, "signer"),
        ] {
            let e = parse(&text).unwrap_err();
            assert_eq!(e.line, Some(line), "{text:?}: {e}");
            assert!(
                e.message.starts_with(what) && e.message.contains("control character"),
                "{text:?}: {e}"
            );
        }
    }

    /// SNI picks the first server that names a host: a second naming it would never be
    /// served for it, its certificate included. Refused at the second, naming the first.
    #[test]
    fn a_name_given_to_two_servers_is_refused_naming_both_lines() {
        for (second, name) in [
            ("[\"b.example\", \"a.example\"]", "a.example"),
            ("[\"A.Example.\"]", "A.Example."),
            ("[\"*.example\"]", "*.example"),
        ] {
            let text = format!(
                "[[server]]\nnames = [\"a.example\", \"*.example\"]\ndefault = true\n\n[[server]]\nnames = {second}\n"
            );
            let e = parse(&text).unwrap_err();
            assert_eq!(e.line, Some(6), "{text}: {e}");
            assert_eq!(
                e.message,
                format!("{name:?} is already a name of the [[server]] at line 2"),
                "{text}"
            );
            assert!(e.hint.unwrap().contains("give each name to one"));
        }
        // A wildcard and an exact name under it: the exact name wins, as in nginx.
        let c = parse("[[server]]\nnames = [\"*.example\"]\n[[server]]\nnames = [\"a.example\"]\n")
            .unwrap();
        assert_eq!(c.servers.len(), 2);
        // One server may list a name twice: nothing is hidden.
        parse("[[server]]\nnames = [\"a.example\", \"a.example\"]\n").unwrap();
    }

    /// The keys of every table the file may hold, read from this crate's own source: the
    /// fields of each `#[derive(Deserialize)]` struct (the schema serde reads, so a key
    /// added there is a key here). Keys read from a free-form table (`rate`) are not
    /// fields, and are not found.
    fn schema_keys() -> Vec<(String, String)> {
        fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
            for entry in std::fs::read_dir(dir).unwrap() {
                let path = entry.unwrap().path();
                if path.is_dir() {
                    rust_files(&path, out);
                } else if path.extension().is_some_and(|e| e == "rs") {
                    out.push(path);
                }
            }
        }
        let mut files = Vec::new();
        rust_files(
            &Path::new(env!("CARGO_MANIFEST_DIR")).join("src"),
            &mut files,
        );
        let mut keys = Vec::new();
        for file in files {
            let text = std::fs::read_to_string(&file).unwrap();
            for attribute in ["rename", "alias", "flatten"] {
                // Written apart so that this file does not find itself.
                let needle = format!("#[serde({attribute}");
                assert!(
                    !text.contains(&needle),
                    "{}: {needle}: read it here too",
                    file.display()
                );
            }
            let mut lines = text.lines();
            while let Some(line) = lines.next() {
                if !(line.starts_with("#[derive(") && line.contains("Deserialize")) {
                    continue;
                }
                let Some(head) = lines.by_ref().find(|l| !l.starts_with("#[")) else {
                    break;
                };
                let Some(name) = head
                    .strip_prefix("pub struct ")
                    .and_then(|r| r.split_whitespace().next())
                else {
                    continue;
                };
                for field in lines.by_ref().take_while(|l| *l != "}") {
                    let field = field.trim_start();
                    let field = field.strip_prefix("pub ").unwrap_or(field);
                    if let Some((key, _)) = field.split_once(": ") {
                        if key
                            .chars()
                            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
                        {
                            keys.push((name.to_owned(), key.to_owned()));
                        }
                    }
                }
            }
        }
        keys
    }

    /// Whether `key` is written as a key in `text`, commented out or not: `key =`,
    /// `[key]`, `[[key]]`, `[section.key]` or `{ key = ... }`.
    fn has_key(text: &str, key: &str) -> bool {
        text.match_indices(key).any(|(at, _)| {
            let before = text[..at].chars().next_back();
            let after = text[at + key.len()..]
                .trim_start_matches(' ')
                .chars()
                .next();
            !before.is_some_and(|c| c.is_ascii_alphanumeric() || c == '_')
                && matches!(after, Some('=' | ']'))
        })
    }

    /// terminus.example.toml says it shows every key: each field of the schema is in it
    /// (optional ones commented out), and it is a valid file.
    #[test]
    fn the_example_has_every_key_of_the_schema() {
        let keys = schema_keys();
        assert!(keys.len() > 100, "the schema read: {keys:?}");
        for probe in [
            ("ConfigFile", "workers"),
            ("LogSection", "format"),
            ("SignerSection", "deadline"),
            ("ListenOptions", "forwarded_from"),
        ] {
            assert!(
                keys.contains(&(probe.0.to_owned(), probe.1.to_owned())),
                "{probe:?} not read from the schema"
            );
        }
        let example = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../terminus.example.toml");
        let text = std::fs::read_to_string(&example).unwrap();
        let missing: Vec<String> = keys
            .iter()
            .filter(|(_, key)| !has_key(&text, key))
            .map(|(table, key)| format!("{table}.{key}"))
            .collect();
        assert!(
            missing.is_empty(),
            "terminus.example.toml lacks {missing:?}"
        );
        Config::parse(&text, &example.display().to_string(), &Overrides::default()).unwrap();
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
        assert_eq!(c.crypto.simd, Placement::Auto);
        // How many workers and crypto cores a machine has is placement's to decide.
        assert_eq!((c.workers, c.crypto.simd_cores), (None, None));
        let c = parse("workers = 1\n[crypto]\nsimd = \"dedicated\"\nsimd_cores = 2\n").unwrap();
        assert_eq!(
            (c.crypto.simd, c.crypto.simd_cores, c.workers),
            (Placement::Dedicated, Some(2), Some(1))
        );
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
            ("[log]\nformat = \"xml\"\n", 2, "log format \"xml\" is not known"),
            ("[log]\nerror = \"off\"\n", 2, "log.error cannot be \"off\""),
            ("[log]\naccess = \"stderr\"\n", 2, "cannot go to standard error"),
        ] {
            let e = parse(text).unwrap_err();
            assert_eq!(e.line, Some(line), "{text:?}: {e}");
            assert!(e.message.contains(says), "{text:?}: {e}");
        }
        assert_eq!(
            parse("[log]\nlevel = \"debug\"\n").unwrap().log_level,
            tracing::Level::DEBUG
        );
        let json = parse("[log]\nformat = \"json\"\nerror = \"/var/log/t/error.log\"\n").unwrap();
        assert_eq!(json.log_format, LogFormat::Json);
        assert_eq!(json.error_log, Some(PathBuf::from("/var/log/t/error.log")));
        let default = parse("").unwrap();
        assert_eq!(
            (default.log_format, default.error_log),
            (LogFormat::Text, None)
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
        assert_eq!(c.workers, Some(3));
        assert_eq!(c.listen.len(), 1);
        assert_eq!(c.listen[0].addr, "127.0.0.1:9999".parse().unwrap());
        assert!(!c.tls.session_tickets && c.tls.session_cache == 0);
        assert_eq!(c.crypto.backend, BackendChoice::Use(BackendKind::Threads));
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
