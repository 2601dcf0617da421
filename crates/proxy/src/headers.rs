//! Header rewriting at the proxy: hop-by-hop fields removed both ways (they describe one
//! connection, and the proxy's connections are not the client's), and the client's
//! address, scheme and host passed on (`X-Forwarded-*` and RFC 7239 `Forwarded`).

use std::net::{IpAddr, SocketAddr};

use hyper::header::{self, HeaderMap, HeaderName, HeaderValue};

/// Fields that belong to one connection (RFC 9110 section 7.6.1), and `Expect`, which
/// the proxy answers itself. `Proxy-Authorization` is the proxy's, not the server's.
const HOP_BY_HOP: &[HeaderName] = &[
    header::CONNECTION,
    header::TE,
    header::TRANSFER_ENCODING,
    header::UPGRADE,
    header::PROXY_AUTHORIZATION,
    header::PROXY_AUTHENTICATE,
    header::EXPECT,
];

/// Hop-by-hop names that `http` has no constant for.
const HOP_BY_HOP_NAMES: &[&str] = &["keep-alive", "proxy-connection"];

/// Removes the hop-by-hop fields, the ones `Connection` names included.
pub fn remove_hop_by_hop(headers: &mut HeaderMap) {
    let named: Vec<HeaderName> = headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|t| HeaderName::from_bytes(t.trim().as_bytes()).ok())
        .collect();
    for name in named.iter().chain(HOP_BY_HOP) {
        headers.remove(name);
    }
    for name in HOP_BY_HOP_NAMES {
        headers.remove(*name);
    }
}

/// Who the request came from, as the upstream is told.
#[derive(Debug, Clone, Copy)]
pub struct Origin {
    /// The client's address (the TCP peer, or what a trusted PROXY header said).
    pub client: SocketAddr,
    /// The address the client connected to, for PROXY protocol headers.
    pub local: SocketAddr,
    /// The scheme the client used: "https" at a TLS terminator.
    pub scheme: &'static str,
}

/// Adds the forwarding fields: `X-Forwarded-For` appended to (the client's list kept,
/// as nginx's `$proxy_add_x_forwarded_for`), `X-Forwarded-Proto` and `X-Forwarded-Host`
/// set, and an RFC 7239 `Forwarded` element appended. The host is the request's `Host`.
pub fn add_forwarding(headers: &mut HeaderMap, origin: &Origin) {
    const XFF: HeaderName = HeaderName::from_static("x-forwarded-for");
    const XFP: HeaderName = HeaderName::from_static("x-forwarded-proto");
    const XFH: HeaderName = HeaderName::from_static("x-forwarded-host");
    let ip = origin.client.ip();
    append_list(headers, XFF, &ip.to_string());
    headers.insert(XFP, HeaderValue::from_static(origin.scheme));
    let host = headers.get(header::HOST).cloned();
    match &host {
        Some(h) => {
            headers.insert(XFH, h.clone());
        }
        None => {
            headers.remove(XFH);
        }
    }
    // RFC 7239: an IPv6 address is bracketed and the value quoted; a host with
    // characters outside a token is quoted too.
    let node = match ip {
        IpAddr::V4(v4) => v4.to_string(),
        IpAddr::V6(v6) => format!("\"[{v6}]\""),
    };
    let mut element = format!("for={node};proto={}", origin.scheme);
    if let Some(h) = host.as_ref().and_then(|h| h.to_str().ok()) {
        if h.bytes().all(is_token) {
            element.push_str(&format!(";host={h}"));
        } else if h
            .bytes()
            .all(|b| b.is_ascii_graphic() && b != b'"' && b != b'\\')
        {
            element.push_str(&format!(";host=\"{h}\""));
        }
    }
    append_list(headers, header::FORWARDED, &element);
}

fn is_token(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b)
}

/// Appends `item` to the comma-separated list in `name`, folding repeated fields into one.
fn append_list(headers: &mut HeaderMap, name: HeaderName, item: &str) {
    let mut list = String::new();
    for v in headers
        .get_all(&name)
        .iter()
        .filter_map(|v| v.to_str().ok())
    {
        list.push_str(v);
        list.push_str(", ");
    }
    let value = if list.is_empty() {
        HeaderValue::from_str(item)
    } else {
        list.push_str(item);
        HeaderValue::from_str(&list)
    };
    if let Ok(v) = value {
        headers.insert(name, v);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut m = HeaderMap::new();
        for (k, v) in pairs {
            m.append(
                HeaderName::from_bytes(k.as_bytes()).unwrap(),
                HeaderValue::from_str(v).unwrap(),
            );
        }
        m
    }

    #[test]
    fn hop_by_hop_fields_go_with_the_ones_connection_names() {
        let mut h = map(&[
            ("connection", "keep-alive, X-Secret"),
            ("x-secret", "1"),
            ("keep-alive", "timeout=5"),
            ("te", "trailers"),
            ("transfer-encoding", "chunked"),
            ("upgrade", "websocket"),
            ("proxy-connection", "keep-alive"),
            ("proxy-authorization", "Basic x"),
            ("host", "app"),
            ("x-kept", "yes"),
        ]);
        remove_hop_by_hop(&mut h);
        let mut left: Vec<&str> = h.keys().map(|k| k.as_str()).collect();
        left.sort_unstable();
        assert_eq!(left, ["host", "x-kept"]);
    }

    #[test]
    fn forwarding_fields_append_to_the_clients() {
        let mut h = map(&[
            ("host", "app.example.com"),
            ("x-forwarded-for", "10.0.0.1"),
            ("forwarded", "for=10.0.0.1"),
        ]);
        let origin = Origin {
            client: "192.0.2.7:5555".parse().unwrap(),
            local: "127.0.0.1:443".parse().unwrap(),
            scheme: "https",
        };
        add_forwarding(&mut h, &origin);
        assert_eq!(h["x-forwarded-for"], "10.0.0.1, 192.0.2.7");
        assert_eq!(h["x-forwarded-proto"], "https");
        assert_eq!(h["x-forwarded-host"], "app.example.com");
        assert_eq!(
            h["forwarded"],
            "for=10.0.0.1, for=192.0.2.7;proto=https;host=app.example.com"
        );
        let mut h = map(&[("host", "app:8443")]);
        let origin = Origin {
            client: "[2001:db8::1]:5555".parse().unwrap(),
            local: "127.0.0.1:443".parse().unwrap(),
            scheme: "https",
        };
        add_forwarding(&mut h, &origin);
        assert_eq!(h["x-forwarded-for"], "2001:db8::1");
        assert_eq!(
            h["forwarded"],
            "for=\"[2001:db8::1]\";proto=https;host=\"app:8443\""
        );
    }
}
