//! `rate`: how many requests a client may make to a server or to one of its routes, as
//! nginx's `limit_req` with `nodelay`: `requests` per `per` and `burst` more at once;
//! beyond that a request is refused (429), never delayed. A route's `rate` replaces its
//! server's (`"off"`: none), as a route's `access` does. And `[limits]`'s per-client
//! settings: `connections_per_client` (nginx's `limit_conn`) and `rate_keys`, the most
//! clients the rate limits remember at once.

use std::time::Duration;

use http::header::HeaderName;
use toml::Spanned;

use super::{parse_duration, ConfigError, Ctx};

/// A request rate per client.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RateLimit {
    /// Requests a client may make per `per`...
    pub requests: u32,
    /// ...this long (`"1s"` unless given).
    pub per: Duration,
    /// Requests beyond the rate a client may make at once (0 unless given).
    pub burst: u32,
    /// Who counts as one client.
    pub key: RateKey,
}

/// Whose requests a rate counts together.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RateKey {
    /// The client's address (after a trusted PROXY header; IPv6 by its /64).
    Client,
    /// This request header's value (an API key); a request without it counts by its
    /// address.
    Header(HeaderName),
}

/// The most requests, burst or clients a setting may name: beyond it a typo is likelier
/// than a limit.
const MOST: i64 = 10_000_000;

const KEYS_HINT: &str =
    "rate = { requests = 10, per = \"1s\", burst = 20, key = \"client\" } (per, burst and key may be left out; key = \"header:X-Api-Key\" counts by a header)";

/// A server's or a route's `rate` as written: `None` when left out; a route's `"off"` is
/// `Some(None)`.
pub(crate) fn resolve_rate(
    rate: Option<&Spanned<toml::Value>>,
    route: bool,
    ctx: &Ctx<'_>,
) -> Result<Option<Option<RateLimit>>, ConfigError> {
    let Some(rate) = rate else {
        return Ok(None);
    };
    let err =
        |message: String, hint: &str| ctx.err(Some(rate.span()), message, Some(hint.to_owned()));
    let table = match rate.get_ref() {
        toml::Value::String(off) if off == "off" && route => return Ok(Some(None)),
        toml::Value::Table(table) => table,
        other => {
            return Err(err(
                format!("rate = {other} is not a rate"),
                if route {
                    "a table, or \"off\" for none on this route: rate = { requests = 10, per = \"1s\", burst = 20 }"
                } else {
                    KEYS_HINT
                },
            ))
        }
    };
    if let Some(unknown) = table
        .keys()
        .find(|k| !["requests", "per", "burst", "key"].contains(&k.as_str()))
    {
        return Err(err(format!("rate has no setting {unknown:?}"), KEYS_HINT));
    }
    let count = |name: &str, least: i64| -> Result<Option<u32>, ConfigError> {
        match table.get(name) {
            None => Ok(None),
            Some(toml::Value::Integer(n)) if (least..=MOST).contains(n) => Ok(Some(*n as u32)),
            Some(other) => Err(err(
                format!("rate {name} = {other} is not a whole number from {least} to {MOST}"),
                KEYS_HINT,
            )),
        }
    };
    let requests =
        count("requests", 1)?.ok_or_else(|| err("rate needs requests".to_owned(), KEYS_HINT))?;
    let burst = count("burst", 0)?.unwrap_or(0);
    let per = match table.get("per") {
        None => Duration::from_secs(1),
        Some(toml::Value::String(text)) => parse_duration(text)
            .filter(|d| *d >= Duration::from_millis(1) && *d <= Duration::from_secs(86_400))
            .ok_or_else(|| {
                err(
                    format!("rate per = {text:?} is not a duration from 1ms to 24h"),
                    "per = \"1s\", \"1m\" or \"1h\" (nginx's r/s and r/m)",
                )
            })?,
        Some(other) => {
            return Err(err(
                format!("rate per = {other} is not a duration"),
                "per = \"1s\", \"1m\" or \"1h\" (nginx's r/s and r/m)",
            ))
        }
    };
    let key = match table.get("key") {
        None => RateKey::Client,
        Some(toml::Value::String(k)) if k == "client" => RateKey::Client,
        Some(toml::Value::String(k)) if k.starts_with("header:") => {
            let name = k["header:".len()..].trim();
            RateKey::Header(HeaderName::from_bytes(name.as_bytes()).map_err(|_| {
                err(
                    format!("rate key {k:?}: {name:?} is not a header name"),
                    "key = \"header:X-Api-Key\"",
                )
            })?)
        }
        Some(other) => {
            return Err(err(
                format!("rate key = {other} is not \"client\" or \"header:NAME\""),
                "key = \"client\" (the client's address) or \"header:X-Api-Key\"",
            ))
        }
    };
    Ok(Some(Some(RateLimit {
        requests,
        per,
        burst,
        key,
    })))
}

/// The first `rate` written that counts clients by their address, a server's or a
/// route's (for the check of settings judged on the client's address against HTTP/3
/// behind a balancer).
pub(crate) fn first_by_address(raw: &crate::schema::ConfigFile) -> Option<&Spanned<toml::Value>> {
    let by_address = |rate: &&Spanned<toml::Value>| match rate.get_ref() {
        toml::Value::Table(t) => t.get("key").is_none_or(|k| k.as_str() == Some("client")),
        _ => false,
    };
    raw.server.iter().find_map(|s| {
        s.rate.as_ref().filter(by_address).or_else(|| {
            s.route
                .iter()
                .find_map(|r| r.rate.as_ref().filter(by_address))
        })
    })
}

/// `[limits] connections_per_client`: `None` when left out.
pub(crate) fn connections_per_client(
    value: Option<&Spanned<i64>>,
    ctx: &Ctx<'_>,
) -> Result<Option<u32>, ConfigError> {
    value
        .map(|v| {
            u32::try_from(*v.get_ref())
                .ok()
                .filter(|n| (1..=MOST as u32).contains(n))
                .ok_or_else(|| {
                    ctx.err(
                        Some(v.span()),
                        format!(
                            "connections_per_client = {} is not from 1 to {MOST}",
                            v.get_ref()
                        ),
                        Some("leave it out for no limit per client".to_owned()),
                    )
                })
        })
        .transpose()
}

/// `[limits] rate_keys`: 100,000 unless given.
pub(crate) fn rate_keys(value: Option<&Spanned<i64>>, ctx: &Ctx<'_>) -> Result<usize, ConfigError> {
    let Some(v) = value else {
        return Ok(100_000);
    };
    usize::try_from(*v.get_ref())
        .ok()
        .filter(|n| (64..=MOST as usize).contains(n))
        .ok_or_else(|| {
            ctx.err(
                Some(v.span()),
                format!("rate_keys = {} is not from 64 to {MOST}", v.get_ref()),
                Some("the clients the rate limits remember at once, 32 bytes each: 100000 is about 3 MB".to_owned()),
            )
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Config, Overrides};

    fn parse(text: &str) -> Result<Config, ConfigError> {
        Config::parse(text, "t.toml", &Overrides::default())
    }

    const SERVER: &str = "[[server]]\nnames = [\"x\"]\nroot = \"/tmp\"\n";

    #[test]
    fn a_server_s_rate_and_a_route_s_own_or_off() {
        let c = parse(&format!(
            "[limits]\nconnections_per_client = 50\nrate_keys = 1000\n{SERVER}rate = {{ requests = 10, burst = 20 }}\n\
             [[server.route]]\npath = \"/api/\"\nroot = \"/tmp\"\nrate = {{ requests = 100, per = \"1m\", key = \"header:X-Api-Key\" }}\n\
             [[server.route]]\npath = \"/health\"\nroot = \"/tmp\"\nrate = \"off\"\n"
        ))
        .unwrap();
        assert_eq!(c.connections_per_client, Some(50));
        assert_eq!(c.rate_keys, 1000);
        let s = &c.servers[0];
        assert_eq!(
            s.rate,
            Some(RateLimit {
                requests: 10,
                per: Duration::from_secs(1),
                burst: 20,
                key: RateKey::Client
            })
        );
        let api = s.routes.iter().find(|r| r.path == "/api/").unwrap();
        assert_eq!(
            api.rate,
            Some(Some(RateLimit {
                requests: 100,
                per: Duration::from_secs(60),
                burst: 0,
                key: RateKey::Header(HeaderName::from_static("x-api-key"))
            }))
        );
        let health = s.routes.iter().find(|r| r.path == "/health").unwrap();
        assert_eq!(health.rate, Some(None));
        let root = s.routes.iter().find(|r| r.path == "/").unwrap();
        assert_eq!(root.rate, None, "the server's");
        let plain = parse(SERVER).unwrap();
        assert_eq!(plain.connections_per_client, None);
        assert_eq!(plain.rate_keys, 100_000);
        assert_eq!(plain.servers[0].rate, None);
    }

    #[test]
    fn a_bad_rate_is_refused_at_its_line_with_what_to_write() {
        for (bad, says) in [
            ("{ burst = 5 }", "needs requests"),
            ("{ requests = 0 }", "requests = 0 is not a whole number"),
            ("{ requests = -3 }", "requests = -3"),
            ("{ requests = 1.5 }", "requests = 1.5"),
            ("{ requests = 10, per = \"soon\" }", "not a duration"),
            ("{ requests = 10, per = \"0s\" }", "from 1ms to 24h"),
            ("{ requests = 10, per = 1 }", "per = 1 is not a duration"),
            ("{ requests = 10, burst = -1 }", "burst = -1"),
            (
                "{ requests = 10, key = \"ip\" }",
                "not \"client\" or \"header:NAME\"",
            ),
            (
                "{ requests = 10, key = \"header:Bad Name\" }",
                "not a header name",
            ),
            (
                "{ requests = 10, nodelay = true }",
                "no setting \"nodelay\"",
            ),
            ("\"off\"", "is not a rate"),
            ("\"10r/s\"", "is not a rate"),
        ] {
            let e = parse(&format!("{SERVER}\nrate = {bad}\n")).unwrap_err();
            assert_eq!(e.line, Some(5), "{bad}: {e}");
            assert!(e.to_string().contains(says), "{bad}: {e}");
            assert!(e.hint.is_some(), "{bad}: {e}");
        }
        // On a route, at the route's line.
        let e = parse(&format!(
            "{SERVER}[[server.route]]\npath = \"/a/\"\nroot = \"/tmp\"\nrate = {{ requests = 0 }}\n"
        ))
        .unwrap_err();
        assert_eq!(e.line, Some(7), "{e}");
    }

    #[test]
    fn bad_limits_are_refused_at_their_line() {
        for (bad, says) in [
            ("connections_per_client = 0", "not from 1"),
            ("connections_per_client = -1", "not from 1"),
            ("rate_keys = 10", "not from 64"),
        ] {
            let e = parse(&format!("workers = 1\n[limits]\n{bad}\n")).unwrap_err();
            assert_eq!(e.line, Some(3), "{bad}: {e}");
            assert!(e.to_string().contains(says), "{bad}: {e}");
        }
    }

    #[test]
    fn a_client_rate_with_http3_behind_a_balancer_is_refused() {
        let balanced = "listen = [{ address = \"127.0.0.1:8443\", http3 = true, proxy_protocol = true, trusted = [\"10.0.0.0/8\"] }]\n[[server]]\nnames = [\"x\"]\n";
        let e = parse(&format!("{balanced}rate = {{ requests = 1 }}\n")).unwrap_err();
        assert_eq!(e.line, Some(4), "{e}");
        assert!(e.to_string().contains("balancer"), "{e}");
        // Counted by a header, the balancer's address does not matter.
        parse(&format!(
            "{balanced}rate = {{ requests = 1, key = \"header:X-Api-Key\" }}\n"
        ))
        .expect("a header's rate");
        // Connections counted by address: the balancer's too, for QUIC.
        let e = parse(&format!("{balanced}[limits]\nconnections_per_client = 4\n")).unwrap_err();
        assert_eq!(e.line, Some(5), "{e}");
        assert!(e.to_string().contains("balancer"), "{e}");
    }
}
