//! From the file as written to a [`Config`]: each section resolved by its own module, the
//! small ones (timeouts, limits, log, admin, files) here, and the checks that span
//! sections last. Every setting is resolved to its type while its line is known, so
//! nothing is checked later without one.

use std::time::Duration;

use crate::schema::ConfigFile;
use crate::{acme, crypto, fleet, http3, keyless, listen, servers, tenant, tls, upstream};
use crate::{AccessLogTarget, Config, ConfigError, Ctx, LogFormat};

pub(crate) fn resolve(raw: &ConfigFile, ctx: &Ctx<'_>) -> Result<Config, ConfigError> {
    // Sections are resolved in one fixed order, so that of two mistakes in a file the
    // same one is always reported first.
    let workers = match &raw.workers {
        Some(w) if *w.get_ref() == 0 || *w.get_ref() > 1024 => {
            return Err(ctx.err(Some(w.span()), "workers must be between 1 and 1024", None))
        }
        w => w.as_ref().map(|w| *w.get_ref()),
    };
    let listen = listen::resolve(raw, ctx)?;
    let upstreams = upstream::resolve_upstreams(&raw.upstream, ctx)?;
    let t = &raw.timeouts;
    let handshake_timeout = ctx.duration(&t.handshake, "handshake", Duration::from_secs(10))?;
    let (tenants, server_tenants) =
        tenant::resolve(&raw.tenant, &raw.server, handshake_timeout, ctx)?;
    let acme = acme::resolve(raw, &listen, ctx)?;
    let servers = servers::resolve(raw, &upstreams, acme.as_ref(), server_tenants, ctx)?;
    check_client_address_with_http3(raw, &listen, ctx)?;
    let mut crypto = crypto::resolve(raw, ctx)?;
    let ticket_keys = tls::ticket_keys(raw, ctx)?;
    let tls = tls::resolve(raw, ctx)?;
    let http3_early_data = http3::early_data(raw, ctx, &tls)?;
    let fleet = fleet::resolve(raw, ctx, ticket_keys)?;
    let signer = keyless::resolve_signer(raw, ctx)?;
    let http3 = http3::limits(raw, ctx)?;
    crypto.max_batch_delay = crypto::max_batch_delay(raw, ctx)?;
    let config = Config {
        source: ctx.file.to_owned(),
        workers,
        pin: raw.pin.unwrap_or(false),
        listen,
        http3_early_data,
        tls,
        ticket_keys,
        fleet,
        signer,
        http3,
        acme,
        crypto,
        handshake_timeout,
        request_header_timeout: ctx.duration(
            &t.request_header,
            "request_header",
            Duration::from_secs(10),
        )?,
        keepalive_timeout: ctx.duration(&t.keepalive, "keepalive", Duration::from_secs(75))?,
        shutdown_grace: ctx.duration(
            &t.shutdown_grace,
            "shutdown_grace",
            Duration::from_secs(10),
        )?,
        max_connections: raw.limits.max_connections.unwrap_or(10_000).max(1),
        handshake_queue: ctx.duration(
            &raw.limits.handshake_queue,
            "handshake_queue",
            Duration::from_secs(1),
        )?,
        connections_per_client: crate::rate::connections_per_client(
            raw.limits.connections_per_client.as_ref(),
            ctx,
        )?,
        rate_keys: crate::rate::rate_keys(raw.limits.rate_keys.as_ref(), ctx)?,
        access_log: access_log(raw, ctx)?,
        log_format: log_format(raw, ctx)?,
        error_log: error_log(raw, ctx)?,
        log_level: log_level(raw, ctx)?,
        admin: raw
            .admin
            .listen
            .as_ref()
            .map(|a| ctx.addr(a, "admin"))
            .transpose()?,
        upgrade_socket: upgrade_socket(raw, ctx)?,
        upgrade_drain: ctx.duration(
            &raw.upgrade.drain,
            "upgrade.drain",
            Duration::from_secs(300),
        )?,
        files: raw.files.clone(),
        servers,
        upstreams,
        tenants,
    };
    check_timeouts(&config, ctx)?;
    check_http3_client_auth(&config, ctx)?;
    Ok(config)
}

/// `upgrade.socket`: a path (relative to the file's folder), not empty.
fn upgrade_socket(
    raw: &ConfigFile,
    ctx: &Ctx<'_>,
) -> Result<Option<std::path::PathBuf>, ConfigError> {
    let Some(written) = &raw.upgrade.socket else {
        return Ok(None);
    };
    let path = written.get_ref();
    // sun_path holds 108 bytes with its terminating zero.
    if path.is_empty() || ctx.path(path).as_os_str().len() > 107 {
        return Err(ctx.err(
            Some(written.span()),
            format!("upgrade.socket = {path:?} cannot be a Unix socket's path"),
            Some(
                "give a path of at most 107 bytes, like \"/run/terminus/control.sock\"".to_owned(),
            ),
        ));
    }
    Ok(Some(ctx.path(path)))
}

/// `[timeouts]` that must be above zero.
fn check_timeouts(config: &Config, ctx: &Ctx<'_>) -> Result<(), ConfigError> {
    for (name, d) in [
        ("handshake", config.handshake_timeout),
        ("request_header", config.request_header_timeout),
        ("keepalive", config.keepalive_timeout),
    ] {
        if d.is_zero() {
            return Err(ctx.err(None, format!("timeouts.{name} must be above zero"), None));
        }
    }
    Ok(())
}

/// `log.access`: a word that names a stream is not taken for a file of that name.
fn access_log(raw: &ConfigFile, ctx: &Ctx<'_>) -> Result<AccessLogTarget, ConfigError> {
    Ok(
        match raw.log.access.as_ref().map(|a| (a, a.get_ref().as_str())) {
            None | Some((_, "off")) => AccessLogTarget::Off,
            Some((_, "stdout")) => AccessLogTarget::Stdout,
            Some((a, "stderr")) => {
                return Err(ctx.err(
                    Some(a.span()),
                    "log.access cannot go to standard error (the error log's)",
                    Some("use \"stdout\", a file path or \"off\"".to_owned()),
                ))
            }
            Some((_, p)) => AccessLogTarget::File(ctx.path(p)),
        },
    )
}

/// `log.error`: standard error (`None`) or a file.
fn error_log(raw: &ConfigFile, ctx: &Ctx<'_>) -> Result<Option<std::path::PathBuf>, ConfigError> {
    Ok(
        match raw.log.error.as_ref().map(|a| (a, a.get_ref().as_str())) {
            None | Some((_, "stderr")) => None,
            Some((a, word @ ("stdout" | "off"))) => {
                return Err(ctx.err(
                    Some(a.span()),
                    format!("log.error cannot be {word:?}: errors are always logged"),
                    Some("use \"stderr\" (the journal, under systemd) or a file path".to_owned()),
                ))
            }
            Some((_, p)) => Some(ctx.path(p)),
        },
    )
}

/// `log.format`.
fn log_format(raw: &ConfigFile, ctx: &Ctx<'_>) -> Result<LogFormat, ConfigError> {
    match raw.log.format.as_ref().map(|f| (f, f.get_ref().as_str())) {
        None | Some((_, "text")) => Ok(LogFormat::Text),
        Some((_, "json")) => Ok(LogFormat::Json),
        Some((f, other)) => Err(ctx.err(
            Some(f.span()),
            format!("log format {other:?} is not known"),
            Some("use \"text\" or \"json\"".to_owned()),
        )),
    }
}

/// `log.level`.
fn log_level(raw: &ConfigFile, ctx: &Ctx<'_>) -> Result<tracing::Level, ConfigError> {
    let Some(l) = &raw.log.level else {
        return Ok(tracing::Level::INFO);
    };
    ["error", "warn", "info", "debug", "trace"]
        .contains(&l.get_ref().as_str())
        .then(|| l.get_ref().parse().ok())
        .flatten()
        .ok_or_else(|| {
            ctx.err(
                Some(l.span()),
                format!("log level {:?} is not known", l.get_ref()),
                Some("use error, warn, info, debug or trace".to_owned()),
            )
        })
}

/// QUIC has one TLS configuration for every host: a host's client certificates would not
/// be asked for over it.
/// Settings judged on the client's address (`access` rules, a `rate` per address) and
/// HTTP/3 on a PROXY-protocol listener are refused together: QUIC carries no PROXY
/// header, so every HTTP/3 request would come from the balancer's address.
fn check_client_address_with_http3(
    raw: &crate::schema::ConfigFile,
    listen: &[crate::Listen],
    ctx: &Ctx<'_>,
) -> Result<(), ConfigError> {
    if !listen.iter().any(|l| l.http3 && l.proxy_protocol.is_some()) {
        return Ok(());
    }
    let behind = "serve http3 on a listener without proxy_protocol, or leave it off there";
    if let Some(rules) = crate::access::first_rules(raw) {
        return Err(ctx.err(
            Some(rules.span()),
            "access rules with http3 on a proxy_protocol listener: QUIC carries no PROXY header, so HTTP/3 requests would be judged by the balancer's address",
            Some(behind.to_owned()),
        ));
    }
    if let Some(limit) = &raw.limits.connections_per_client {
        return Err(ctx.err(
            Some(limit.span()),
            "limits.connections_per_client with http3 on a proxy_protocol listener: QUIC carries no PROXY header, so every HTTP/3 client would count as the balancer",
            Some(behind.to_owned()),
        ));
    }
    if let Some(rate) = crate::rate::first_by_address(raw) {
        return Err(ctx.err(
            Some(rate.span()),
            "a rate per client address with http3 on a proxy_protocol listener: QUIC carries no PROXY header, so every HTTP/3 client would count as the balancer",
            Some(format!("{behind}; or count by a header: key = \"header:X-Api-Key\"")),
        ));
    }
    Ok(())
}

fn check_http3_client_auth(config: &Config, ctx: &Ctx<'_>) -> Result<(), ConfigError> {
    if !config.listen.iter().any(|l| l.http3) {
        return Ok(());
    }
    let Some(server) = config.servers.iter().find(|s| s.client_auth.is_some()) else {
        return Ok(());
    };
    Err(ctx.err(
        None,
        format!(
            "http3 and client_auth (server {}) do not go together yet: HTTP/3 would serve that server without a client certificate",
            server.names.first().map_or("", String::as_str)
        ),
        Some("take http3 off the listeners, or client_auth off the server".to_owned()),
    ))
}
