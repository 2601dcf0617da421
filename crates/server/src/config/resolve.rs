//! From the file as written to a [`Config`]: every default filled in and every setting
//! resolved to its type (addresses, durations, TLS versions, suites and groups, the crypto
//! backend, the log level) while its line is known, so nothing is checked later without
//! one.

use std::net::SocketAddr;
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::time::Duration;

use terminus_engine::simd::Placement;
use terminus_engine::BackendKind;
use terminus_fleet::store::StoreSettings;
use terminus_fleet::tickets::Rotation;
use terminus_tls::{TlsSettings, TlsSettingsError};
use toml::Spanned;

use super::schema::{parse_duration, CertificateSection, ConfigFile, ListenEntry};
use super::{acme, client_auth, headers, route, stream, tenant, upstream};
use super::{
    AccessLogTarget, BackendChoice, CertPaths, Cidr, Config, ConfigError, Ctx, KtlsMode, Listen,
    Plain, ServerConfig, BACKEND_HINT, DEFAULT_LISTEN, EMBEDDED, KTLS_HINT, SIMD_HINT,
};

/// A `[[server]]`'s or `[[stream]]`'s names (checked) and certificates; the line of its
/// names.
fn names_and_certificates(
    names: &Spanned<Vec<String>>,
    certificate: &[CertificateSection],
    what: &str,
    resolve_path: &dyn Fn(&str) -> PathBuf,
    ctx: &Ctx<'_>,
) -> Result<(Option<usize>, Vec<CertPaths>), ConfigError> {
    if names.get_ref().is_empty() {
        return Err(ctx.err(
            Some(names.span()),
            format!("a {what} needs at least one name"),
            Some("names = [\"example.com\", \"*.example.com\"]".to_owned()),
        ));
    }
    for name in names.get_ref() {
        let bare = name.strip_prefix("*.").unwrap_or(name);
        if bare.is_empty() || bare.contains('*') || bare.contains(char::is_whitespace) {
            return Err(ctx.err(
                Some(names.span()),
                format!("server name {name:?} is not valid"),
                Some("use exact names or one leading wildcard label: \"*.example.com\"".to_owned()),
            ));
        }
    }
    let certificates = certificate
        .iter()
        .map(|c| CertPaths {
            cert: resolve_path(c.cert.get_ref()),
            key: resolve_path(c.key.get_ref()),
            line: ctx.line_of(c.cert.span()),
        })
        .collect::<Vec<_>>();
    if certificates.len() > 2 {
        return Err(ctx.err(
            Some(names.span()),
            format!("a {what} takes at most two certificates (one RSA and one ECDSA)"),
            None,
        ));
    }
    Ok((ctx.line_of(names.span()), certificates))
}

pub(super) fn resolve(raw: &ConfigFile, ctx: &Ctx<'_>) -> Result<Config, ConfigError> {
    let file = ctx.file;
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
    let workers_auto = raw.workers.is_none();
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
        let (address, ktls, options) = match entry.get_ref() {
            ListenEntry::Address(a) => (a, None, None),
            ListenEntry::Options(o) => (&o.address, o.ktls.as_deref(), Some(o)),
        };
        let spanned = Spanned::new(entry.span(), address.clone());
        let networks = |list: &[String], key: &str| {
            list.iter()
                .map(|t| {
                    Cidr::parse(t).ok_or_else(|| {
                        ctx.err(
                            Some(entry.span()),
                            format!("{key} network {t:?} is not ADDRESS/PREFIX"),
                            Some(
                                "e.g. \"10.0.0.0/8\", \"192.0.2.7\" or \"2001:db8::/32\""
                                    .to_owned(),
                            ),
                        )
                    })
                })
                .collect::<Result<Vec<_>, _>>()
        };
        let forwarded_from = options
            .and_then(|o| o.forwarded_from.as_deref())
            .map(|list| networks(list, "forwarded_from"))
            .transpose()?
            .map(Into::into);
        let proxy_protocol = match options {
            Some(o) if o.proxy_protocol => {
                let trusted = o.trusted.as_deref().unwrap_or_default();
                if trusted.is_empty() {
                    return Err(ctx.err(
                        Some(entry.span()),
                        format!("listener {address}: proxy_protocol needs the balancers' networks in trusted"),
                        Some("trusted = [\"10.0.0.0/8\"]: only connections from there may send a PROXY header".to_owned()),
                    ));
                }
                Some(networks(trusted, "trusted")?.into())
            }
            Some(o) if o.trusted.is_some() => {
                return Err(ctx.err(
                    Some(entry.span()),
                    "trusted is for proxy_protocol = true",
                    None,
                ))
            }
            _ => None,
        };
        let plain = match options.and_then(|o| o.plain.as_deref()) {
            None => None,
            Some("redirect") => Some(Plain::Redirect),
            Some(other) => {
                return Err(ctx.err(
                    Some(entry.span()),
                    format!("listener {address}: plain = {other:?} is not a plain-HTTP mode"),
                    Some("plain = \"redirect\" (ACME challenges answered, everything else sent to https://)".to_owned()),
                ))
            }
        };
        let http3 = options.is_some_and(|o| o.http3);
        if plain.is_some() && http3 {
            return Err(ctx.err(
                Some(entry.span()),
                format!("listener {address}: http3 is for TLS listeners, and this one is plain"),
                Some("put http3 = true on the TLS listener (port 443)".to_owned()),
            ));
        }
        if plain.is_some() && ktls.is_some() {
            return Err(ctx.err(
                Some(entry.span()),
                format!("listener {address}: ktls is for TLS listeners, and this one is plain"),
                None,
            ));
        }
        listen.push(Listen {
            addr: addr(&spanned, "listen")?,
            ktls: match ktls {
                Some(k) => ktls_mode(k, entry.span())?,
                None => default_ktls,
            },
            proxy_protocol,
            forwarded_from,
            plain,
            http3,
        });
    }
    if listen.is_empty() {
        listen.push(Listen {
            addr: DEFAULT_LISTEN.parse().expect("valid default"),
            ktls: default_ktls,
            proxy_protocol: None,
            forwarded_from: None,
            plain: None,
            http3: false,
        });
    }

    let upstreams = upstream::resolve_upstreams(&raw.upstream, &resolve_path, ctx)?;
    let handshake_timeout = duration(
        &raw.timeouts.handshake,
        "handshake",
        Duration::from_secs(10),
    )?;
    let (tenants, server_tenants) =
        tenant::resolve(&raw.tenant, &raw.server, handshake_timeout, ctx)?;
    let acme = acme::resolve(raw, &listen, &resolve_path, ctx)?;
    let mut servers = Vec::new();
    for (s, tenant) in raw.server.iter().zip(server_tenants) {
        let (line, certificates) =
            names_and_certificates(&s.names, &s.certificate, "[[server]]", &resolve_path, ctx)?;
        let uses_acme = acme::server_uses_acme(
            s.certificates.as_ref(),
            &s.names,
            !certificates.is_empty(),
            acme.as_ref(),
            ctx,
        )?;
        servers.push(ServerConfig {
            names: s.names.get_ref().clone(),
            default: s.default,
            routes: route::resolve_routes(
                &s.route,
                s.root.as_ref(),
                &upstreams,
                &resolve_path,
                ctx,
            )?,
            certificates,
            acme: uses_acme,
            client_auth: s
                .client_auth
                .as_ref()
                .map(|c| client_auth::resolve(c, &resolve_path, ctx))
                .transpose()?,
            line,
            stream: None,
            headers: match &s.headers {
                Some(table) => headers::resolve(table, ctx)?,
                None => Vec::new(),
            },
            tenant,
        });
    }
    // Two ACME servers with one name would share its certificate file and each other's
    // challenge answers.
    let acme_names: Vec<String> = servers
        .iter()
        .filter(|s| s.acme)
        .flat_map(|s| s.names.iter().map(|n| n.to_ascii_lowercase()))
        .collect();
    let repeated = (1..acme_names.len()).find(|&i| acme_names[..i].contains(&acme_names[i]));
    if let Some(name) = repeated.map(|i| &acme_names[i]) {
        let at = raw
            .server
            .iter()
            .filter(|s| {
                s.names
                    .get_ref()
                    .iter()
                    .any(|n| n.eq_ignore_ascii_case(name))
            })
            .nth(1)
            .map(|s| s.names.span());
        return Err(ctx.err(
            at,
            format!("{name:?} is named by two servers with certificates = \"acme\""),
            Some("give each name to one server".to_owned()),
        ));
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
            routes: Vec::new(),
            certificates: Vec::new(),
            acme: false,
            client_auth: None,
            line: None,
            stream: None,
            headers: Vec::new(),
            tenant: None,
        });
    }
    for s in &raw.stream {
        let (line, certificates) =
            names_and_certificates(&s.names, &s.certificate, "[[stream]]", &resolve_path, ctx)?;
        let taken = |n: &String| {
            servers
                .iter()
                .any(|o: &ServerConfig| o.names.iter().any(|m| m.eq_ignore_ascii_case(n)))
        };
        if let Some(name) = s.names.get_ref().iter().find(|n| taken(n)) {
            return Err(ctx.err(
                Some(s.names.span()),
                format!("{name:?} is already the name of a [[server]] or [[stream]]"),
                Some("SNI chooses between them: give each name to one".to_owned()),
            ));
        }
        servers.push(ServerConfig {
            names: s.names.get_ref().clone(),
            default: false,
            routes: Vec::new(),
            certificates,
            acme: false,
            client_auth: None,
            line,
            stream: Some(stream::resolve(s, &upstreams, ctx)?),
            headers: Vec::new(),
            tenant: None,
        });
    }

    let crypto_backend = match &raw.crypto.backend {
        None => BackendChoice::Auto,
        Some(b) => BackendChoice::from_name(b.get_ref()).ok_or_else(|| {
            ctx.err(
                Some(b.span()),
                format!("unknown crypto backend {:?}", b.get_ref()),
                Some(BACKEND_HINT.to_owned()),
            )
        })?,
    };

    let crypto_simd = match &raw.crypto.simd {
        None => Placement::Auto,
        Some(p) => Placement::from_name(p.get_ref()).ok_or_else(|| {
            ctx.err(
                Some(p.span()),
                format!("unknown crypto.simd placement {:?}", p.get_ref()),
                Some(SIMD_HINT.to_owned()),
            )
        })?,
    };
    if let (Some(p), BackendChoice::Use(kind @ (BackendKind::Scalar | BackendKind::Threads))) =
        (raw.crypto.simd.as_ref(), crypto_backend)
    {
        if crypto_simd == Placement::Dedicated {
            return Err(ctx.err(
                Some(p.span()),
                format!(
                    "crypto.simd = \"dedicated\" places crypto_mb batches, and backend = {:?} computes none",
                    kind.name()
                ),
                Some("use backend = \"multibuffer\" or \"auto\", or leave simd out".to_owned()),
            ));
        }
    }
    let crypto_simd_cores = match &raw.crypto.simd_cores {
        Some(n) if *n.get_ref() == 0 || *n.get_ref() > 1024 => {
            return Err(ctx.err(
                Some(n.span()),
                "crypto.simd_cores must be between 1 and 1024",
                None,
            ))
        }
        Some(n) => *n.get_ref(),
        // One crypto core per eight: a core of crypto_mb batches signs for several
        // workers' handshakes (bench/README, issue 40).
        None => std::thread::available_parallelism()
            .map_or(1, |n| n.get())
            .div_ceil(8),
    };

    let access_log = match raw.log.access.as_ref().map(|a| a.get_ref().as_str()) {
        None | Some("off") => AccessLogTarget::Off,
        Some("stdout") => AccessLogTarget::Stdout,
        Some(p) => AccessLogTarget::File(resolve_path(p)),
    };

    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let ticket_keys = resolve_ticket_keys(raw, ctx)?;
    let tls = resolve_tls(raw, ctx)?;
    let config = Config {
        source: file.to_owned(),
        workers,
        workers_auto,
        pin: raw.pin.unwrap_or(false),
        listen,
        http3_early_data: resolve_early_data(raw, ctx, &tls)?,
        tls,
        ticket_keys,
        fleet: resolve_fleet(raw, ctx, &resolve_path, ticket_keys)?,
        http3: resolve_http3(raw, ctx)?,
        acme,
        crypto_backend,
        crypto_threads: raw.crypto.threads.unwrap_or(cores).max(1),
        crypto_queue_capacity: raw.crypto.queue_capacity.unwrap_or(1024).max(1),
        crypto_simd,
        crypto_simd_cores,
        max_batch_delay: duration(
            &raw.crypto.max_batch_delay,
            "max_batch_delay",
            Duration::from_millis(2),
        )?,
        handshake_timeout,
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
        handshake_queue: duration(
            &raw.limits.handshake_queue,
            "handshake_queue",
            Duration::from_secs(1),
        )?,
        access_log,
        log_level: match &raw.log.level {
            None => tracing::Level::INFO,
            Some(l) => ["error", "warn", "info", "debug", "trace"]
                .contains(&l.get_ref().as_str())
                .then(|| l.get_ref().parse().ok())
                .flatten()
                .ok_or_else(|| {
                    ctx.err(
                        Some(l.span()),
                        format!("log level {:?} is not known", l.get_ref()),
                        Some("use error, warn, info, debug or trace".to_owned()),
                    )
                })?,
        },
        admin: raw
            .admin
            .listen
            .as_ref()
            .map(|a| addr(a, "admin"))
            .transpose()?,
        files: raw.files.clone(),
        servers,
        upstreams,
        tenants,
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
    if config.listen.iter().any(|l| l.http3) {
        if let Some(server) = config.servers.iter().find(|s| s.client_auth.is_some()) {
            // QUIC has one TLS configuration for every host: a host's client
            // certificates would not be asked for over it.
            return Err(ctx.err(
                None,
                format!(
                    "http3 and client_auth (server {}) do not go together yet: HTTP/3 would serve that server without a client certificate",
                    server.names.first().map_or("", String::as_str)
                ),
                Some("take http3 off the listeners, or client_auth off the server".to_owned()),
            ));
        }
    }
    Ok(config)
}

/// `[tls]` as rustls values. A name rustls does not have, an empty list, or suites of
/// none of the versions is refused here, at its line.
fn resolve_tls(raw: &ConfigFile, ctx: &Ctx<'_>) -> Result<TlsSettings, ConfigError> {
    fn list<T>(
        ctx: &Ctx<'_>,
        value: &Option<Spanned<Vec<String>>>,
        key: &str,
        hint: &str,
        parse: impl Fn(&str) -> Result<T, TlsSettingsError>,
    ) -> Result<Option<Vec<T>>, ConfigError> {
        let Some(v) = value else { return Ok(None) };
        if v.get_ref().is_empty() {
            return Err(ctx.err(
                Some(v.span()),
                format!("tls.{key} is empty"),
                Some(hint.to_owned()),
            ));
        }
        let parsed = v
            .get_ref()
            .iter()
            .map(|name| parse(name))
            .collect::<Result<_, _>>()
            .map_err(|e| {
                ctx.err(
                    Some(v.span()),
                    format!("tls.{key}: {e}"),
                    Some(hint.to_owned()),
                )
            })?;
        Ok(Some(parsed))
    }
    let t = &raw.tls;
    let mut tls = TlsSettings::default();
    if let Some(v) = list(
        ctx,
        &t.versions,
        "versions",
        "e.g. [\"1.2\", \"1.3\"]",
        TlsSettings::version_from_name,
    )? {
        tls.versions = v;
    }
    if let Some(s) = list(
        ctx,
        &t.cipher_suites,
        "cipher_suites",
        "leave it out for rustls's defaults",
        TlsSettings::suite_from_name,
    )? {
        tls.cipher_suites = s;
    }
    if let Some(g) = list(
        ctx,
        &t.groups,
        "groups",
        "e.g. [\"x25519mlkem768\", \"x25519\", \"secp256r1\"]",
        TlsSettings::group_from_name,
    )? {
        tls.groups = g;
    }
    if let Err(e) = tls.check() {
        let (at, hint) = match e {
            TlsSettingsError::NoTls12Group => (&t.groups, None),
            _ => (
                &t.cipher_suites,
                Some("add a suite of each version in tls.versions".to_owned()),
            ),
        };
        let at = at.as_ref().or(t.versions.as_ref()).map(|v| v.span());
        return Err(ctx.err(at, e.to_string(), hint));
    }
    tls.session_tickets = t.session_tickets.unwrap_or(true);
    tls.session_cache = t.session_cache.unwrap_or(256 * 1024);
    tls.prefer_server_ciphers = t.prefer_server_ciphers.unwrap_or(true);
    Ok(tls)
}

/// `[http3]`: Retry and the limit of QUIC handshakes in flight per worker.
fn resolve_http3(raw: &ConfigFile, ctx: &Ctx<'_>) -> Result<terminus_quic::Limits, ConfigError> {
    use terminus_quic::{Limits, Retry};
    let section = &raw.http3;
    let max_handshakes = match &section.max_handshakes {
        None => Limits::MAX_HANDSHAKES,
        Some(n) if *n.get_ref() == 0 => {
            return Err(ctx.err(
                Some(n.span()),
                "[http3] max_handshakes = 0 would refuse every QUIC connection",
                Some(format!(
                    "max_handshakes = {} (the default), or leave http3 off the listeners",
                    Limits::MAX_HANDSHAKES
                )),
            ))
        }
        Some(n) => *n.get_ref(),
    };
    let retry = match section.retry.as_ref().map(|r| (r.get_ref().as_str(), r.span())) {
        None | Some(("auto", _)) => Retry::Above(max_handshakes / 2),
        Some(("always", _)) => Retry::Always,
        Some(("never", _)) => Retry::Never,
        Some((other, span)) => {
            return Err(ctx.err(
                Some(span),
                format!("[http3] retry = {other:?} is not a Retry policy"),
                Some("retry = \"auto\" (when half of max_handshakes are in flight), \"always\" or \"never\"".to_owned()),
            ))
        }
    };
    Ok(Limits {
        retry,
        max_handshakes,
        ..Limits::default()
    })
}

/// `[http3] early_data`: 0-RTT, which needs the session cache (rustls takes early data
/// only on sessions from it, each once).
fn resolve_early_data(
    raw: &ConfigFile,
    ctx: &Ctx<'_>,
    tls: &TlsSettings,
) -> Result<bool, ConfigError> {
    match &raw.http3.early_data {
        Some(on) if *on.get_ref() && tls.session_cache == 0 => Err(ctx.err(
            Some(on.span()),
            "[http3] early_data needs the session cache, and tls.session_cache = 0",
            Some("a tls.session_cache of some entries (0-RTT is taken only on a session resumed from it, once), or early_data = false".to_owned()),
        )),
        Some(on) => Ok(*on.get_ref()),
        None => Ok(false),
    }
}

/// `[fleet]`: where the store is and the files that open it (read at start).
fn resolve_fleet(
    raw: &ConfigFile,
    ctx: &Ctx<'_>,
    resolve_path: &dyn Fn(&str) -> PathBuf,
    rotation: Rotation,
) -> Result<Option<StoreSettings>, ConfigError> {
    let Some(section) = &raw.fleet else {
        return Ok(None);
    };
    let f = section.get_ref();
    let at = Some(section.span());
    let Some(url) = &f.store else {
        return Err(ctx.err(
            at,
            "[fleet] needs store",
            Some("store = \"redis://127.0.0.1:6379/0\" (or rediss:// for TLS)".to_owned()),
        ));
    };
    if let Err(e) = StoreSettings::check_url(url) {
        return Err(ctx.err(
            at,
            format!("[fleet] {e}"),
            Some("store = \"redis://HOST:PORT/DB\"".to_owned()),
        ));
    }
    let Some(key_file) = &f.key_file else {
        return Err(ctx.err(
            at,
            "[fleet] needs key_file: ticket keys are kept in the store wrapped under it",
            Some(
                "make one with `openssl rand -hex 32 > fleet.key`, the same file on every instance"
                    .to_owned(),
            ),
        ));
    };
    let poll = match &f.poll {
        None => StoreSettings::POLL,
        Some(p) => parse_duration(p).filter(|d| !d.is_zero()).ok_or_else(|| {
            ctx.err(
                Some(section.span()),
                format!("[fleet] poll = {p:?} is not a duration"),
                Some("e.g. poll = \"1s\"".to_owned()),
            )
        })?,
    };
    if poll * 4 > rotation.rotate {
        return Err(ctx.err(
            at.clone(),
            format!(
                "[fleet] poll ({poll:?}) is more than a quarter of tls.ticket_keys rotate ({:?}): the next period's key would not reach every instance before it seals",
                rotation.rotate
            ),
            Some("poll = \"1s\" (the default) with rotate of 4s or more".to_owned()),
        ));
    }
    if f.ca.is_some() && !url.starts_with("rediss://") {
        return Err(ctx.err(at, "[fleet] ca is for a rediss:// (TLS) store", None));
    }
    Ok(Some(StoreSettings {
        url: url.clone(),
        key_file: resolve_path(key_file),
        password_file: f.password_file.as_deref().map(resolve_path),
        ca: f.ca.as_deref().map(resolve_path),
        prefix: f
            .prefix
            .clone()
            .unwrap_or_else(|| StoreSettings::PREFIX.to_owned()),
        poll,
    }))
}

/// `tls.ticket_keys`: how the session-ticket keys rotate.
fn resolve_ticket_keys(raw: &ConfigFile, ctx: &Ctx<'_>) -> Result<Rotation, ConfigError> {
    let Some(section) = &raw.tls.ticket_keys else {
        return Ok(Rotation::default());
    };
    let t = section.get_ref();
    let mut rotation = Rotation::default();
    if let Some(rotate) = &t.rotate {
        rotation.rotate = parse_duration(rotate).ok_or_else(|| {
            ctx.err(
                Some(section.span()),
                format!("tls.ticket_keys rotate = {rotate:?} is not a duration"),
                Some("write it like \"6h\", \"30m\" or \"2s\"".to_owned()),
            )
        })?;
    }
    if let Some(keep) = t.keep {
        rotation.keep = keep;
    }
    rotation.check().map_err(|e| {
        ctx.err(
            Some(section.span()),
            format!("tls.ticket_keys: {e}"),
            Some("e.g. ticket_keys = { rotate = \"6h\", keep = 2 }".to_owned()),
        )
    })?;
    Ok(rotation)
}
