//! `[[upstream]]`: the servers the proxy sends requests to, as written and resolved to
//! [`UpstreamSpec`]s, every error at its line; [`tls`] is its re-encryption part.

mod tls;

use std::collections::HashSet;
use std::net::{SocketAddr, ToSocketAddrs};
use std::ops::Range;
use std::time::Duration;

use serde::Deserialize;
use terminus_proxy::proxy_protocol::Version as ProxyProtocolVersion;
use terminus_proxy::spec::{
    Balance, Check, HashKey, Health, Keepalive, Protocol, ServerSpec, Timeouts,
};
use terminus_proxy::UpstreamSpec;
use toml::Spanned;

use super::schema::ConfigDuration;
use super::{ConfigError, Ctx};

/// An `[[upstream]]` as written.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UpstreamSection {
    pub name: Spanned<String>,
    pub servers: Spanned<Vec<Spanned<ServerEntry>>>,
    pub balance: Option<Spanned<String>>,
    pub hash_key: Option<Spanned<String>>,
    pub protocol: Option<Spanned<String>>,
    pub keepalive: Option<KeepaliveSection>,
    pub timeouts: Option<TimeoutsSection>,
    pub health: Option<HealthSection>,
    pub proxy_protocol: Option<Spanned<String>>,
    pub tls: Option<Spanned<tls::TlsSection>>,
    /// Upgrade tokens beyond `websocket` that may switch a connection to the server.
    pub upgrades: Option<Spanned<Vec<String>>>,
    /// `"rfc9440"` or `"xfcc"`: how a client's certificate is told to the servers.
    pub client_cert: Option<Spanned<String>>,
    /// Whether a request of a method that is not idempotent (POST, PATCH) may be sent
    /// again after a server may have seen it (nginx `proxy_next_upstream
    /// non_idempotent`): off unless the application says its requests are safe to repeat.
    #[serde(default)]
    pub retry_non_idempotent: bool,
}

/// A server: `"HOST:PORT"` or `{ address = "HOST:PORT", weight = 2, backup = true }`.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub enum ServerEntry {
    Address(String),
    Options(ServerOptions),
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ServerOptions {
    pub address: String,
    pub weight: Option<u32>,
    #[serde(default)]
    pub backup: bool,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KeepaliveSection {
    pub idle: Option<usize>,
    pub timeout: Option<ConfigDuration>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TimeoutsSection {
    pub connect: Option<ConfigDuration>,
    pub response_header: Option<ConfigDuration>,
    pub idle: Option<ConfigDuration>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HealthSection {
    pub fails: Option<u32>,
    pub interval: Option<ConfigDuration>,
    /// Active checks: the path to GET.
    pub path: Option<Spanned<String>>,
    pub timeout: Option<ConfigDuration>,
    pub passes: Option<u32>,
}

const MAX_WEIGHT: u32 = 1000;

pub(super) fn resolve_upstreams(
    raw: &[UpstreamSection],
    ctx: &Ctx<'_>,
) -> Result<Vec<UpstreamSpec>, ConfigError> {
    let mut names = HashSet::new();
    raw.iter()
        .map(|u| {
            let name = u.name.get_ref();
            ctx.name(name, u.name.span(), "upstream name")?;
            if name.is_empty() || !names.insert(name.clone()) {
                return Err(ctx.err(
                    Some(u.name.span()),
                    format!("upstream name {name:?} is empty or used twice"),
                    Some("give each [[upstream]] its own name".to_owned()),
                ));
            }
            resolve_upstream(u, ctx)
        })
        .collect()
}

fn resolve_upstream(u: &UpstreamSection, ctx: &Ctx<'_>) -> Result<UpstreamSpec, ConfigError> {
    // In the order written in the section's reference, so that the first of two
    // mistakes is the one reported.
    let servers = servers(u, ctx)?;
    let balance = balance(u, ctx)?;
    let protocol = protocol(u, ctx)?;
    let (keepalive, timeouts) = keepalive_and_timeouts(u, ctx)?;
    let health = health(u, ctx)?;
    let proxy_protocol = proxy_protocol(u, protocol, ctx)?;
    let tls = u
        .tls
        .as_ref()
        .map(|t| tls::resolve(t, u.name.get_ref(), protocol, ctx))
        .transpose()?;
    let upgrades = upgrades(u, ctx)?;
    let client_cert = match u.client_cert.as_ref().map(|c| (c.get_ref().as_str(), c.span())) {
        None | Some(("rfc9440", _)) => terminus_proxy::spec::ClientCertHeader::Rfc9440,
        Some(("xfcc", _)) => terminus_proxy::spec::ClientCertHeader::Xfcc,
        Some((other, span)) => {
            return Err(ctx.err(
                Some(span),
                format!("client_cert = {other:?} is not a header format"),
                Some("\"rfc9440\" (Client-Cert, Client-Cert-Chain) or \"xfcc\" (Envoy's X-Forwarded-Client-Cert)".to_owned()),
            ))
        }
    };
    Ok(UpstreamSpec {
        tls,
        upgrades,
        client_cert,
        retry_non_idempotent: u.retry_non_idempotent,
        name: u.name.get_ref().clone(),
        servers,
        balance,
        protocol,
        proxy_protocol,
        keepalive,
        timeouts,
        health,
    })
}

/// `servers`: each address (a name resolves to all its addresses), primaries first, each
/// group in the order written.
fn servers(u: &UpstreamSection, ctx: &Ctx<'_>) -> Result<Vec<ServerSpec>, ConfigError> {
    let mut servers = Vec::new();
    for entry in u.servers.get_ref() {
        let (address, weight, backup) = match entry.get_ref() {
            ServerEntry::Address(a) => (a, None, false),
            ServerEntry::Options(o) => (&o.address, o.weight, o.backup),
        };
        let weight = weight.unwrap_or(1);
        if weight == 0 || weight > MAX_WEIGHT {
            return Err(ctx.err(
                Some(entry.span()),
                format!("weight {weight} is out of range"),
                Some(format!("a weight is between 1 and {MAX_WEIGHT}")),
            ));
        }
        // A name (not an address) is also what TLS asks the server for by default.
        let host = address
            .parse::<SocketAddr>()
            .is_err()
            .then(|| address.rsplit_once(':').map(|(h, _)| h.to_owned()))
            .flatten();
        for address in resolve_address(address, entry.span(), ctx)? {
            servers.push(ServerSpec {
                address,
                host: host.clone(),
                weight,
                backup,
            });
        }
    }
    if servers.iter().all(|s| s.backup) {
        return Err(ctx.err(
            Some(u.servers.span()),
            format!("upstream {:?} has no primary server", u.name.get_ref()),
            Some("servers = [\"127.0.0.1:8080\"]: at least one that is not a backup".to_owned()),
        ));
    }
    // Primaries first, each group in the order written.
    servers.sort_by_key(|s| s.backup);

    Ok(servers)
}

/// `balance` and `hash_key`.
fn balance(u: &UpstreamSection, ctx: &Ctx<'_>) -> Result<Balance, ConfigError> {
    let balance = match u.balance.as_ref().map(|b| (b.get_ref().as_str(), b.span())) {
        None | Some(("round_robin", _)) => Balance::RoundRobin,
        Some(("least_conn", _)) => Balance::LeastConn,
        Some(("hash", _)) => Balance::Hash(hash_key(u, ctx)?),
        Some((other, span)) => {
            return Err(ctx.err(
                Some(span),
                format!("balance = {other:?} is not a balancing method"),
                Some("use \"round_robin\", \"least_conn\" or \"hash\"".to_owned()),
            ))
        }
    };
    if let (Some(k), false) = (&u.hash_key, matches!(balance, Balance::Hash(_))) {
        return Err(ctx.err(
            Some(k.span()),
            "hash_key is only for balance = \"hash\"",
            None,
        ));
    }
    Ok(balance)
}

/// `protocol`, which must agree with `tls`.
fn protocol(u: &UpstreamSection, ctx: &Ctx<'_>) -> Result<Protocol, ConfigError> {
    let protocol = match u.protocol.as_ref().map(|p| (p.get_ref().as_str(), p.span())) {
        None | Some(("http1", _)) => Protocol::Http1,
        Some(("h2", span)) if u.tls.is_none() => {
            return Err(ctx.err(
                Some(span),
                "protocol = \"h2\" is HTTP/2 over TLS and needs tls = { ... }",
                Some("add tls = {} (verified against the system's CAs) or use \"h2c\" for HTTP/2 in cleartext".to_owned()),
            ))
        }
        Some(("h2", _)) => Protocol::H2,
        Some(("h2c", span)) if u.tls.is_some() => {
            return Err(ctx.err(
                Some(span),
                "protocol = \"h2c\" is HTTP/2 in cleartext, but this upstream has tls",
                Some("use \"h2\" for HTTP/2 over TLS".to_owned()),
            ))
        }
        Some(("h2c", _)) => Protocol::H2c,
        Some((other, span)) => {
            return Err(ctx.err(
                Some(span),
                format!("protocol = {other:?} is not supported"),
                Some("use \"http1\" (HTTP/1.1), \"h2\" (HTTP/2 over TLS) or \"h2c\" (HTTP/2 in cleartext, as gRPC backends speak)".to_owned()),
            ))
        }
    };
    Ok(protocol)
}

/// `keepalive` and `timeouts` (each above zero).
fn keepalive_and_timeouts(
    u: &UpstreamSection,
    ctx: &Ctx<'_>,
) -> Result<(Keepalive, Timeouts), ConfigError> {
    let d = |v: &Option<ConfigDuration>, default| v.map_or(default, |d| d.0);
    let keepalive = u.keepalive.as_ref().map_or_else(Keepalive::default, |k| {
        let default = Keepalive::default();
        Keepalive {
            idle: k.idle.unwrap_or(default.idle),
            timeout: d(&k.timeout, default.timeout),
        }
    });
    let timeouts = u.timeouts.as_ref().map_or_else(Timeouts::default, |t| {
        let default = Timeouts::default();
        Timeouts {
            connect: d(&t.connect, default.connect),
            response_header: d(&t.response_header, default.response_header),
            idle: d(&t.idle, default.idle),
        }
    });
    if [timeouts.connect, timeouts.response_header, timeouts.idle]
        .iter()
        .any(|t| t.is_zero())
    {
        return Err(ctx.err(
            Some(u.name.span()),
            format!(
                "upstream {:?}: timeouts must be above zero",
                u.name.get_ref()
            ),
            None,
        ));
    }
    Ok((keepalive, timeouts))
}

/// `health`: passive always, active with a `path`.
fn health(u: &UpstreamSection, ctx: &Ctx<'_>) -> Result<Health, ConfigError> {
    let d = |v: &Option<ConfigDuration>, default| v.map_or(default, |d| d.0);
    Ok(match &u.health {
        None => Health::default(),
        Some(h) => {
            let default = Health::default();
            let check = match &h.path {
                Some(path) if !path.get_ref().starts_with('/') => {
                    return Err(ctx.err(
                        Some(path.span()),
                        format!("health path {:?} does not start with /", path.get_ref()),
                        Some("health = { path = \"/healthz\" }".to_owned()),
                    ))
                }
                Some(path) => Some(Check {
                    path: path.get_ref().clone(),
                    timeout: d(&h.timeout, Duration::from_secs(1)),
                    passes: h.passes.unwrap_or(2).max(1),
                }),
                None if h.timeout.is_some() || h.passes.is_some() => {
                    return Err(ctx.err(
                        Some(u.name.span()),
                        format!("upstream {:?}: health timeout and passes are for active checks, which need a path", u.name.get_ref()),
                        Some("add path = \"/healthz\" to health".to_owned()),
                    ))
                }
                None => None,
            };
            Health {
                fails: h.fails.unwrap_or(default.fails).max(1),
                interval: d(&h.interval, default.interval),
                check,
            }
        }
    })
}

/// `proxy_protocol`: for HTTP/1.1 upstreams only.
fn proxy_protocol(
    u: &UpstreamSection,
    protocol: Protocol,
    ctx: &Ctx<'_>,
) -> Result<Option<ProxyProtocolVersion>, ConfigError> {
    let proxy_protocol = match u
        .proxy_protocol
        .as_ref()
        .map(|p| (p.get_ref().as_str(), p.span()))
    {
        None | Some(("off", _)) => None,
        Some(("v1", _)) => Some(ProxyProtocolVersion::V1),
        Some(("v2", _)) => Some(ProxyProtocolVersion::V2),
        Some((other, span)) => {
            return Err(ctx.err(
                Some(span),
                format!("proxy_protocol = {other:?} is not a PROXY protocol version"),
                Some("use \"off\", \"v1\" or \"v2\"".to_owned()),
            ))
        }
    };
    if let (Some(_), Protocol::H2 | Protocol::H2c) = (proxy_protocol, protocol) {
        return Err(ctx.err(
            u.proxy_protocol.as_ref().map(|p| p.span()),
            "proxy_protocol is for http1 upstreams",
            Some("an HTTP/2 connection carries many clients' requests; one PROXY header cannot name them all".to_owned()),
        ));
    }
    Ok(proxy_protocol)
}

/// The Upgrade tokens a client may switch to through this upstream: `websocket` and
/// those listed. `h2c` never: it would give the client an HTTP/2 connection to the server
/// that no route chose (request smuggling past routing).
fn upgrades(u: &UpstreamSection, ctx: &Ctx<'_>) -> Result<Vec<String>, ConfigError> {
    let mut tokens = vec!["websocket".to_owned()];
    let Some(listed) = &u.upgrades else {
        return Ok(tokens);
    };
    for token in listed.get_ref() {
        let lower = token.to_ascii_lowercase();
        let is_token = !lower.is_empty()
            && lower
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~/".contains(&b));
        if !is_token || lower.starts_with("h2c") {
            return Err(ctx.err(
                Some(listed.span()),
                format!("upgrades: {token:?} cannot be allowed"),
                Some(if is_token {
                    "h2c would let a client speak HTTP/2 to the server past routing; use protocol = \"h2c\" for an h2c upstream".to_owned()
                } else {
                    "give protocol tokens, as the Upgrade header names them".to_owned()
                }),
            ));
        }
        if !tokens.contains(&lower) {
            tokens.push(lower);
        }
    }
    Ok(tokens)
}

fn hash_key(u: &UpstreamSection, ctx: &Ctx<'_>) -> Result<HashKey, ConfigError> {
    let Some(k) = &u.hash_key else {
        return Ok(HashKey::ClientIp);
    };
    match k.get_ref().as_str() {
        "client_ip" => Ok(HashKey::ClientIp),
        "uri" => Ok(HashKey::Uri),
        other => match other.strip_prefix("header:") {
            Some(name) if http::header::HeaderName::from_bytes(name.as_bytes()).is_ok() => {
                Ok(HashKey::Header(name.to_ascii_lowercase()))
            }
            _ => Err(ctx.err(
                Some(k.span()),
                format!("hash_key = {other:?} is not a hash key"),
                Some("use \"client_ip\", \"uri\" or \"header:NAME\"".to_owned()),
            )),
        },
    }
}

/// `IP:PORT`, or `NAME:PORT` resolved now to every address it has (as nginx does when it
/// loads its configuration).
fn resolve_address(
    text: &str,
    span: Range<usize>,
    ctx: &Ctx<'_>,
) -> Result<Vec<SocketAddr>, ConfigError> {
    if let Ok(a) = text.parse() {
        return Ok(vec![a]);
    }
    // A host and a port that did not resolve, or something else.
    let host_port = text
        .rsplit_once(':')
        .is_some_and(|(host, port)| !host.is_empty() && port.parse::<u16>().is_ok());
    let err = |why: String| {
        let hint = if host_port {
            "the name did not resolve on this machine when the configuration loaded (names are looked up at start and at each reload): check its spelling and the resolver (/etc/resolv.conf, /etc/hosts), or write the server's \"IP:PORT\""
        } else {
            "write \"IP:PORT\" or \"hostname:PORT\""
        };
        ctx.err(
            Some(span.clone()),
            format!("upstream server {text:?}: {why}"),
            Some(hint.to_owned()),
        )
    };
    let resolved: Vec<SocketAddr> = text
        .to_socket_addrs()
        .map_err(|e| err(e.to_string()))?
        .collect();
    if resolved.is_empty() {
        return Err(err("the name has no address".into()));
    }
    Ok(resolved)
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::{Config, Overrides};

    fn parse(text: &str) -> Result<Config, ConfigError> {
        Config::parse(text, "t.toml", &Overrides::default())
    }

    const APP: &str = "[[upstream]]\nname = \"app\"\nservers = [\"127.0.0.1:8081\", { address = \"127.0.0.1:8080\", backup = true }, { address = \"127.0.0.1:8082\", weight = 3 }]\n";

    #[test]
    fn upstreams_resolve_with_defaults_and_primaries_first() {
        let c = parse(&format!(
            "{APP}balance = \"hash\"\nhash_key = \"header:X-User\"\ntimeouts = {{ connect = \"1s\" }}\n"
        ))
        .unwrap();
        let u = &c.upstreams[0];
        let servers: Vec<(u16, u32, bool)> = u
            .servers
            .iter()
            .map(|s| (s.address.port(), s.weight, s.backup))
            .collect();
        assert_eq!(
            servers,
            [(8081, 1, false), (8082, 3, false), (8080, 1, true)]
        );
        assert_eq!(u.balance, Balance::Hash(HashKey::Header("x-user".into())));
        assert_eq!(u.timeouts.connect, Duration::from_secs(1));
        assert_eq!(
            u.timeouts.response_header,
            Timeouts::default().response_header
        );
        assert_eq!(u.keepalive, Keepalive::default());
        let c = parse("[[upstream]]\nname = \"n\"\nservers = [\"localhost:80\"]\n").unwrap();
        assert!(c.upstreams[0].servers[0].address.ip().is_loopback());
    }

    /// A name that does not resolve is written right: the hint says where to look, not
    /// how to write it; an address without a port is told how to write it.
    #[test]
    fn an_unresolvable_name_gets_a_hint_about_resolving() {
        let hint = |server: &str| {
            parse(&format!(
                "[[upstream]]\nname = \"a\"\nservers = [\"{server}\"]\n"
            ))
            .unwrap_err()
            .hint
            .unwrap()
        };
        let unresolved = hint("no-such-host.invalid:80");
        assert!(
            unresolved.contains("did not resolve")
                && unresolved.contains("/etc/resolv.conf")
                && !unresolved.contains("hostname:PORT"),
            "{unresolved}"
        );
        assert!(hint("app.internal").contains("\"hostname:PORT\""));
    }

    #[test]
    fn mistakes_are_refused_at_their_line() {
        for (text, line, says) in [
            ("[[upstream]]\nname = \"a\"\nservers = [\"no-such-host.invalid:80\"]\n", 3, "no-such-host"),
            ("[[upstream]]\nname = \"a\"\nservers = [{ address = \"127.0.0.1:1\", weight = 0 }]\n", 3, "weight"),
            ("[[upstream]]\nname = \"a\"\nservers = [{ address = \"127.0.0.1:1\", backup = true }]\n", 3, "no primary"),
            ("[[upstream]]\nname = \"a\"\nservers = [\"127.0.0.1:1\"]\n\nbalance = \"random\"\n", 5, "balancing method"),
            ("[[upstream]]\nname = \"a\"\nservers = [\"127.0.0.1:1\"]\nhash_key = \"uri\"\n", 4, "only for"),
            ("[[upstream]]\nname = \"a\"\nservers = [\"127.0.0.1:1\"]\nbalance = \"hash\"\nhash_key = \"cookie\"\n", 5, "hash key"),
            ("[[upstream]]\nname = \"a\"\nservers = [\"127.0.0.1:1\"]\nprotocol = \"h3\"\n", 4, "not supported"),
            ("[[upstream]]\nname = \"a\"\nservers = [\"127.0.0.1:1\"]\nprotocol = \"h2\"\n", 4, "needs tls"),
            ("[[upstream]]\nname = \"a\"\nservers = [\"127.0.0.1:1\"]\nprotocol = \"h2c\"\ntls = {}\n", 4, "has tls"),
            ("[[upstream]]\nname = \"a\"\nservers = [\"127.0.0.1:1\"]\ntls = { ca = \"ca.pem\", verify = false }\n", 4, "not used when verify = false"),
            ("[[upstream]]\nname = \"a\"\nservers = [\"127.0.0.1:1\"]\ntls = { server_name = \"a b\" }\n", 4, "not a DNS name"),
            ("[[upstream]]\nname = \"a\"\nservers = [\"127.0.0.1:1\"]\n\ntls = { ca = \"/nonexistent/ca.pem\" }\n", 5, "/nonexistent/ca.pem"),
            ("[[upstream]]\nname = \"a\"\nservers = [\"127.0.0.1:1\"]\ntls = { sni = \"x\" }\n", 4, "unknown field"),
            ("[[upstream]]\nname = \"a\"\nservers = [\"127.0.0.1:1\"]\ntls = { cert = \"c.pem\" }\n", 4, "cert and key go together"),
            ("[[upstream]]\nname = \"a\"\nservers = [\"127.0.0.1:1\"]\ntls = { cert = \"/nonexistent/c.pem\", key = \"/nonexistent/c.key\" }\n", 4, "cannot read"),
            ("[[upstream]]\nname = \"a\"\nservers = [\"127.0.0.1:1\"]\ntimeouts = { connect = \"soon\" }\n", 4, "not a duration"),
            ("[[upstream]]\nname = \"a\"\nservers = [\"127.0.0.1:1\"]\n[[upstream]]\nname = \"a\"\nservers = [\"127.0.0.1:2\"]\n", 5, "used twice"),
            ("[[server]]\nnames = [\"x\"]\n[[server.route]]\npath = \"api\"\nroot = \"/srv\"\n", 4, "does not start with /"),
            ("[[upstream]]\nname = \"a\"\nservers = [\"127.0.0.1:1\"]\nhealth = { path = \"healthz\" }\n", 4, "does not start with /"),
            ("[[upstream]]\nname = \"a\"\nservers = [\"127.0.0.1:1\"]\nhealth = { passes = 3 }\n", 2, "need a path"),
            ("[[upstream]]\nname = \"a\"\nservers = [\"127.0.0.1:1\"]\nproxy_protocol = \"v3\"\n", 4, "PROXY protocol version"),
            ("\nlisten = [{ address = \"127.0.0.1:1\", proxy_protocol = true }]\n", 2, "needs the balancers' networks"),
            ("listen = [{ address = \"127.0.0.1:1\", proxy_protocol = true, trusted = [\"10.0.0.0/40\"] }]\n", 1, "trusted network \"10.0.0.0/40\" has a prefix longer"),
            ("listen = [{ address = \"127.0.0.1:1\", trusted = [\"10.0.0.0/8\"] }]\n", 1, "for proxy_protocol"),
            ("[[upstream]]\nname = \"a\"\nservers = [\"127.0.0.1:1\"]\nprotocol = \"h2c\"\nproxy_protocol = \"v2\"\n", 5, "for http1 upstreams"),
            ("[[server]]\nnames = [\"x\"]\n[[server.route]]\npath = \"/a/\"\nupstream = \"nope\"\n", 5, "no [[upstream]]"),
            ("[[server]]\nnames = [\"x\"]\n[[server.route]]\npath = \"/a/\"\n", 4, "needs one of upstream, root or redirect"),
            ("[[server]]\nnames = [\"x\"]\nroot = \"/srv\"\n[[server.route]]\npath = \"/\"\nroot = \"/other\"\n", 3, "both say"),
        ] {
            let e = parse(text).unwrap_err();
            assert_eq!(e.line, Some(line), "{text:?}: {e}");
            assert!(e.to_string().contains(says), "{text:?}: {e}");
        }
    }
}
