//! The URL under load: parsed once, resolved once, and checked against the loopback guard
//! before a single packet is sent.

use std::net::{IpAddr, SocketAddr, ToSocketAddrs};

use rustls::pki_types::ServerName;

use crate::LoadError;

/// An `https://` URL (or a plain `http://` one: HTTP/1.1 without TLS, the baseline for
/// what a TLS terminator in front of a server adds) resolved to the addresses the load
/// goes to.
#[derive(Debug, Clone)]
pub struct Target {
    /// Host as written in the URL (brackets removed from IPv6 literals).
    pub host: String,
    pub port: u16,
    /// Path and query, at least `/`.
    pub path: String,
    /// The `Host` header / `:authority`: host, and port when it is not 443.
    pub authority: String,
    /// SNI and certificate name (an IP address literal sends no SNI).
    pub server_name: ServerName<'static>,
    /// Where new connections go, each in turn: every `--address` given, or the first
    /// address the host resolves to.
    pub addrs: Vec<SocketAddr>,
    /// `https://`: TLS; `http://`: none.
    pub tls: bool,
}

impl Target {
    /// Parses `https://HOST[:PORT][/PATH]` (or `http://`) without resolving it.
    pub fn parse(url: &str) -> Result<Target, LoadError> {
        let bad = |why: &str| LoadError::Url {
            url: url.to_owned(),
            why: why.to_owned(),
        };
        let (rest, tls) = match url.split_once("://") {
            Some((scheme, rest)) if scheme.eq_ignore_ascii_case("https") => (rest, true),
            Some((scheme, rest)) if scheme.eq_ignore_ascii_case("http") => (rest, false),
            Some((scheme, _)) => {
                return Err(bad(&format!(
                    "scheme {scheme:?} is not supported; terminus load speaks https:// (and http:// for baselines)"
                )))
            }
            None => return Err(bad("expected https://HOST[:PORT]/PATH")),
        };
        let (hostport, path) = match rest.find(['/', '?']) {
            Some(i) if rest.as_bytes()[i] == b'/' => (&rest[..i], rest[i..].to_owned()),
            Some(i) => (&rest[..i], format!("/{}", &rest[i..])),
            None => (rest, "/".to_owned()),
        };
        if hostport.contains('@') {
            return Err(bad("user information in the URL is not supported"));
        }
        let (host, port) = if let Some(v6) = hostport.strip_prefix('[') {
            let (h, after) = v6
                .split_once(']')
                .ok_or_else(|| bad("unclosed '[' in an IPv6 address"))?;
            let port = match after {
                "" => None,
                p => Some(
                    p.strip_prefix(':')
                        .ok_or_else(|| bad("expected ':PORT' after ']'"))?,
                ),
            };
            (h, port)
        } else {
            match hostport.rsplit_once(':') {
                Some((h, p)) => (h, Some(p)),
                None => (hostport, None),
            }
        };
        if host.is_empty() {
            return Err(bad("the host is empty"));
        }
        let default_port = if tls { 443 } else { 80 };
        let port: u16 = match port {
            None => default_port,
            Some(p) => p
                .parse()
                .ok()
                .filter(|p| *p != 0)
                .ok_or_else(|| bad(&format!("{p:?} is not a port number (1-65535)")))?,
        };
        let server_name = ServerName::try_from(host.to_owned())
            .map_err(|_| bad(&format!("{host:?} is neither a DNS name nor an IP address")))?;
        let authority = match (host.parse::<IpAddr>(), port == default_port) {
            (Ok(IpAddr::V6(_)), true) => format!("[{host}]"),
            (Ok(IpAddr::V6(_)), false) => format!("[{host}]:{port}"),
            (_, true) => host.to_owned(),
            (_, false) => format!("{host}:{port}"),
        };
        Ok(Target {
            host: host.to_owned(),
            port,
            path,
            authority,
            server_name,
            addrs: Vec::new(),
            tls,
        })
    }

    /// Resolves the host (or takes `addresses` for it, the host still naming the server
    /// in SNI and `Host`; several are taken in turn, as a balancer spreads connections)
    /// and applies the loopback guard: unless `allow_remote`, every address it resolves
    /// to must be a loopback address, so a typo cannot aim a load test at somebody else's
    /// server.
    pub fn resolve(
        mut self,
        addresses: &[IpAddr],
        allow_remote: bool,
    ) -> Result<Target, LoadError> {
        let given = !addresses.is_empty();
        let mut addrs: Vec<SocketAddr> = match self.host.parse() {
            _ if given => addresses
                .iter()
                .map(|ip| SocketAddr::new(*ip, self.port))
                .collect(),
            Ok(ip) => vec![SocketAddr::new(ip, self.port)],
            Err(_) => (self.host.as_str(), self.port)
                .to_socket_addrs()
                .map_err(|e| LoadError::Resolve {
                    host: self.host.clone(),
                    why: e.to_string(),
                })?
                .collect(),
        };
        if addrs.is_empty() {
            return Err(LoadError::Resolve {
                host: self.host.clone(),
                why: "no addresses".into(),
            });
        }
        if !allow_remote {
            if let Some(remote) = addrs.iter().find(|a| !is_loopback(a.ip())) {
                return Err(LoadError::RemoteTarget {
                    host: self.host.clone(),
                    addr: remote.ip(),
                });
            }
        }
        if !given {
            addrs.truncate(1);
        }
        self.addrs = addrs;
        Ok(self)
    }
}

/// 127.0.0.0/8, ::1, and IPv4-mapped loopback (::ffff:127.x.y.z).
pub fn is_loopback(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => v4.is_loopback(),
        IpAddr::V6(v6) => {
            v6.is_loopback() || v6.to_ipv4_mapped().is_some_and(|v4| v4.is_loopback())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_host_port_and_path() {
        let t = Target::parse("https://localhost:8443/a/b?c=1").unwrap();
        assert_eq!(
            (t.host.as_str(), t.port, t.path.as_str()),
            ("localhost", 8443, "/a/b?c=1")
        );
        assert_eq!(t.authority, "localhost:8443");
        let t = Target::parse("https://example.test").unwrap();
        assert_eq!(
            (t.port, t.path.as_str(), t.authority.as_str()),
            (443, "/", "example.test")
        );
        let t = Target::parse("https://[::1]:9000?x").unwrap();
        assert_eq!(
            (t.host.as_str(), t.port, t.path.as_str()),
            ("::1", 9000, "/?x")
        );
        assert_eq!(t.authority, "[::1]:9000");
    }

    #[test]
    fn rejects_what_it_cannot_load() {
        let plain = Target::parse("http://localhost:8080/x").unwrap();
        assert!(!plain.tls);
        assert_eq!(
            (plain.port, plain.authority.as_str()),
            (8080, "localhost:8080")
        );
        assert_eq!(Target::parse("http://localhost/").unwrap().port, 80);
        for url in [
            "ftp://localhost/",
            "localhost:8443",
            "https://:8443/",
            "https://localhost:0/",
            "https://localhost:99999/",
            "https://user@localhost/",
            "https://[::1/",
        ] {
            assert!(
                matches!(Target::parse(url), Err(LoadError::Url { .. })),
                "{url} was accepted"
            );
        }
    }

    #[test]
    fn loopback_guard_refuses_remote_targets() {
        // 192.0.2.0/24 is TEST-NET-1: refused before anything is sent.
        for url in [
            "https://192.0.2.10:443/",
            "https://[2001:db8::1]/",
            "https://10.1.2.3/",
        ] {
            let err = Target::parse(url).unwrap().resolve(&[], false).unwrap_err();
            assert!(
                matches!(err, LoadError::RemoteTarget { .. }),
                "{url}: {err}"
            );
            assert!(err.to_string().contains("--allow-remote"), "{err}");
        }
        let ok = Target::parse("https://192.0.2.10/")
            .unwrap()
            .resolve(&[], true)
            .unwrap();
        assert_eq!(ok.addrs, vec!["192.0.2.10:443".parse().unwrap()]);
        for url in [
            "https://127.0.0.1:1/",
            "https://127.9.9.9:1/",
            "https://[::1]:1/",
            "https://[::ffff:127.0.0.1]:1/",
            "https://localhost:1/",
        ] {
            let t = Target::parse(url).unwrap().resolve(&[], false).unwrap();
            assert!(t.addrs.iter().all(|a| is_loopback(a.ip())), "{url}");
        }
    }
}
