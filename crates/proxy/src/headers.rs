//! Header rewriting at the proxy: hop-by-hop fields removed both ways (they describe one
//! connection, and the proxy's connections are not the client's), and the client's
//! address, scheme and host passed on (`X-Forwarded-*` and RFC 7239 `Forwarded`), and
//! where the server asks for client certificates, the client's as RFC 9440 or Envoy's
//! XFCC has it (the client's own copies of those fields never pass).

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use hyper::header::{self, Entry, HeaderMap, HeaderName, HeaderValue};
use terminus_http::h1::Fields;

use crate::spec::ClientCertHeader;

/// Fields that belong to one connection (RFC 9110 section 7.6.1), and `Expect`, which
/// the proxy answers itself. `Proxy-Authorization` is the proxy's, not the server's.
/// `Keep-Alive` and `Proxy-Connection` are pre-standard hop-by-hop fields.
const HOP_BY_HOP: &[&str] = &[
    "connection",
    "te",
    "transfer-encoding",
    "upgrade",
    "proxy-authorization",
    "proxy-authenticate",
    "expect",
    "keep-alive",
    "proxy-connection",
];

/// Whether `name` (any case) is one of [`HOP_BY_HOP`].
fn is_hop_by_hop(name: &[u8]) -> bool {
    HOP_BY_HOP
        .iter()
        .any(|h| terminus_http::h1::is_name(name, h))
}

/// Which of a message's fields belong to its connection: the hop-by-hop ones and the
/// ones its `Connection` names, but never `Host`: the request was routed by it and the
/// server must be told the same host (`Connection: host` would otherwise send it none,
/// and the server would pick its own). `Connection` is read once per message, whether it
/// is held in a map or as bytes, so that checking each field costs the same whatever
/// `Connection` holds (a 16 KiB list of names must not be read again for every field).
pub(crate) struct HopByHop {
    /// The names `Connection` lists besides options (`close`, `keep-alive`) and hop-by-hop
    /// names, the first [`MAX_NAMED`] of them: none in ordinary traffic, so nothing is
    /// allocated then. Names past the first ones are not removed: a field a client or
    /// upstream sent and asked to have dropped reaches the other side as if it had not
    /// asked, which it could have done anyway.
    named: Vec<Box<[u8]>>,
}

/// Names a message's `Connection` may have removed.
const MAX_NAMED: usize = 16;

impl HopByHop {
    pub(crate) fn of(headers: &impl Fields) -> Self {
        let named = terminus_http::h1::token_bytes(headers, header::CONNECTION)
            .filter(|t| !t.eq_ignore_ascii_case(b"close") && !is_hop_by_hop(t))
            .filter(|t| !terminus_http::h1::is_name(t, "host"))
            .take(MAX_NAMED)
            .map(Box::from)
            .collect();
        HopByHop { named }
    }

    /// Whether the field `name` is its message's connection's.
    pub(crate) fn drops(&self, name: &[u8]) -> bool {
        is_hop_by_hop(name) || self.named.iter().any(|t| t.eq_ignore_ascii_case(name))
    }
}

/// Removes the hop-by-hop fields, the ones `Connection` names included ([`HopByHop`]).
pub fn remove_hop_by_hop(headers: &mut impl Fields) {
    let hop = HopByHop::of(headers);
    headers.remove_if(|_, name| hop.drops(name));
}

/// Who the requests of one client connection came from, as the upstream is told. Made
/// once per connection: the address's text for the forwarding fields is written then,
/// not per request.
#[derive(Debug, Clone)]
pub struct Origin {
    /// The client's address (the TCP peer, or what a trusted PROXY header said).
    pub client: SocketAddr,
    /// The address the client connected to, for PROXY protocol headers.
    pub local: SocketAddr,
    /// The scheme the client used: "https" at a TLS terminator.
    pub scheme: &'static str,
    /// The client's IP address as X-Forwarded-For lists it.
    ip: HeaderValue,
    /// The RFC 7239 element without its host: `for=NODE;proto=SCHEME`.
    element: HeaderValue,
    /// The client's own X-Forwarded-For and Forwarded are appended to (a trusted hop's);
    /// else replaced, so that a client cannot name an address it is not.
    keeps_forwarded: bool,
    /// Where the server asks for client certificates: what the client showed.
    client_cert: Option<Arc<ClientCertFields>>,
}

/// A connection's client-certificate fields, written once per connection.
#[derive(Debug)]
struct ClientCertFields {
    /// `SUCCESS` (a certificate verified) or `NONE` (optional, none shown), as nginx's
    /// `$ssl_client_verify`.
    verify: &'static str,
    /// RFC 9440's `Client-Cert` and `Client-Cert-Chain`, and Envoy's XFCC.
    rfc9440: Option<(HeaderValue, Option<HeaderValue>)>,
    xfcc: Option<HeaderValue>,
    /// For the access log.
    subject: Option<String>,
}

/// The client-certificate fields the proxy sets: RFC 9440's two, Envoy's XFCC, and
/// nginx-style verification.
const IDENTITY: [&str; 4] = [
    "client-cert",
    "client-cert-chain",
    "x-forwarded-client-cert",
    "x-client-verify",
];
const CLIENT_CERT: HeaderName = HeaderName::from_static(IDENTITY[0]);
const CLIENT_CERT_CHAIN: HeaderName = HeaderName::from_static(IDENTITY[1]);
const XFCC: HeaderName = HeaderName::from_static(IDENTITY[2]);
const CLIENT_VERIFY: HeaderName = HeaderName::from_static(IDENTITY[3]);

impl ClientCertFields {
    fn of(identity: Option<&terminus_tls::ClientIdentity>) -> Self {
        let Some(id) = identity else {
            return Self {
                verify: "NONE",
                rfc9440: None,
                xfcc: None,
                subject: None,
            };
        };
        use base64::Engine;
        let b64 = |der: &[u8]| {
            format!(
                ":{}:",
                base64::engine::general_purpose::STANDARD.encode(der)
            )
        };
        let leaf = HeaderValue::from_str(&b64(&id.leaf)).ok();
        let chain = (!id.chain.is_empty())
            .then(|| {
                id.chain
                    .iter()
                    .map(|c| b64(c))
                    .collect::<Vec<_>>()
                    .join(", ")
            })
            .and_then(|c| HeaderValue::from_str(&c).ok());
        // Envoy's quoting: the subject always in double quotes; a SAN only where it holds a
        // separator or a quote (a URI may hold `;`, `,` and `=`: unquoted, the client's
        // CA-signed `spiffe://a;URI=evil` would read as two URIs).
        let mut xfcc = format!("Hash={};Subject={}", id.sha256, quoted(&id.subject));
        for uri in &id.uris {
            xfcc.push_str(";URI=");
            xfcc.push_str(&xfcc_value(uri));
        }
        for dns in &id.dns {
            xfcc.push_str(";DNS=");
            xfcc.push_str(&xfcc_value(dns));
        }
        Self {
            verify: "SUCCESS",
            rfc9440: leaf.map(|l| (l, chain)),
            xfcc: HeaderValue::from_str(&xfcc).ok(),
            subject: Some(id.subject.clone()),
        }
    }
}

/// `value` as an XFCC value: as it is, or double-quoted where it holds one of the
/// separators (`,` between elements, `;` between pairs, `=` in a pair) or a quote, as
/// Envoy writes it.
fn xfcc_value(value: &str) -> std::borrow::Cow<'_, str> {
    if value.contains([',', ';', '=', '"']) {
        quoted(value).into()
    } else {
        value.into()
    }
}

/// `value` in double quotes, its quotes and backslashes escaped with a backslash (a
/// backslash left bare before the closing quote would escape it).
fn quoted(value: &str) -> String {
    let mut out = String::with_capacity(value.len() + 2);
    out.push('"');
    for c in value.chars() {
        if c == '"' || c == '\\' {
            out.push('\\');
        }
        out.push(c);
    }
    out.push('"');
    out
}

impl Origin {
    /// The origin of a client at `client` that connected to `local` over `scheme`.
    pub fn new(client: SocketAddr, local: SocketAddr, scheme: &'static str) -> Self {
        let ip = client.ip();
        // RFC 7239: an IPv6 address is bracketed and the value quoted.
        let node = match ip {
            IpAddr::V4(v4) => v4.to_string(),
            IpAddr::V6(v6) => format!("\"[{v6}]\""),
        };
        Origin {
            client,
            local,
            scheme,
            ip: HeaderValue::from_str(&ip.to_string()).expect("an address is a valid value"),
            element: HeaderValue::from_str(&format!("for={node};proto={scheme}"))
                .expect("an address and a scheme are a valid value"),
            keeps_forwarded: true,
            client_cert: None,
        }
    }

    /// The same, for a connection whose server asks for client certificates: `identity`
    /// is the client's verified one, `None` where it showed none.
    pub fn with_client_cert(mut self, identity: Option<&terminus_tls::ClientIdentity>) -> Self {
        self.client_cert = Some(Arc::new(ClientCertFields::of(identity)));
        self
    }

    /// `SUCCESS` or `NONE`, and the client certificate's subject, where the server asks
    /// for client certificates (for the access log).
    pub fn client_verify(&self) -> Option<(&'static str, Option<&str>)> {
        self.client_cert
            .as_ref()
            .map(|c| (c.verify, c.subject.as_deref()))
    }

    /// The same, the client's own forwarding fields kept (`true`, nginx's default) or
    /// replaced (a client outside the listener's `forwarded_from`).
    pub fn keeping_forwarded(mut self, keep: bool) -> Self {
        self.keeps_forwarded = keep;
        self
    }
}

/// Whether `name` (any case) is `field` spelled with any of its dashes as underscores
/// (`x_client_verify`, `x-client_verify`): CGI, WSGI and PHP read every spelling as the
/// same variable (`HTTP_X_CLIENT_VERIFY`), so a client's copy under any of them would
/// stand beside, or in for, the one the proxy sets.
fn spells(name: &[u8], field: &str) -> bool {
    let field = field.as_bytes();
    name.len() == field.len()
        && name
            .iter()
            .zip(field)
            .all(|(n, f)| n.eq_ignore_ascii_case(f) || (*n == b'_' && *f == b'-'))
}

/// Whether `name` holds an underscore: such fields are removed, as nginx does by default
/// (`underscores_in_headers off`): CGI, WSGI and PHP map `-` and `_` alike to `_`, so
/// `X_Client_Verify` would read upstream as the `X-Client-Verify` the proxy sets, or
/// beside it.
pub(crate) fn is_underscored(name: &[u8]) -> bool {
    name.contains(&b'_')
}

/// Removes every field whose name holds an underscore ([`is_underscored`]).
pub fn remove_underscored(headers: &mut impl Fields) {
    headers.remove_if(|_, name| is_underscored(name));
}

/// Whether `name` is one of the client-certificate fields the proxy sets, under any
/// spelling. A name of another length than the four is passed over at its length.
pub(crate) fn is_identity(name: &[u8]) -> bool {
    IDENTITY.iter().any(|field| spells(name, field))
}

/// Removes the client-certificate fields the proxy sets, under every spelling.
fn remove_identity(headers: &mut impl Fields) {
    headers.remove_if(|_, name| is_identity(name));
}

/// Fields a trailer section must not carry (RFC 9110 section 6.5.1: framing, routing,
/// request modifiers, authentication, content description), and the forwarding fields
/// the proxy sets in the head.
const NOT_IN_TRAILERS: &[&str] = &[
    "content-length",
    "content-encoding",
    "content-type",
    "content-range",
    "trailer",
    "host",
    "authorization",
    "cookie",
    "set-cookie",
    "cache-control",
    "max-forwards",
    "range",
    "if-match",
    "if-none-match",
    "if-modified-since",
    "if-unmodified-since",
    "if-range",
    "forwarded",
    "x-forwarded-for",
    "x-forwarded-proto",
    "x-forwarded-host",
    "x-real-ip",
];

/// A request's trailer section as the server may get it: what is taken out of the head
/// (hop-by-hop fields, names with underscores, every spelling of the client-certificate
/// fields) and what a trailer must not carry ([`NOT_IN_TRAILERS`]) taken out here too,
/// since a server that merges trailers into the request's fields (CGI-style ones do)
/// would otherwise take a client's trailer for a field the proxy vouches for.
pub fn clean_trailers(trailers: &mut HeaderMap) {
    remove_hop_by_hop(trailers);
    remove_underscored(trailers);
    remove_identity(trailers);
    for name in NOT_IN_TRAILERS {
        trailers.remove(*name);
    }
}

/// Tells the server who the client's certificate says it is, in `format`, where the
/// client's server asks for certificates; the client's own copies of these fields are
/// removed always, under any spelling (dashes as underscores), so that a client cannot
/// claim an identity it did not prove.
pub fn add_client_cert(headers: &mut HeaderMap, origin: &Origin, format: ClientCertHeader) {
    remove_identity(headers);
    for (name, value) in client_cert_fields(origin, format).into_iter().flatten() {
        headers.insert(name, value);
    }
}

/// The client-certificate fields the proxy sets for `origin`'s client in `format`: none
/// where the server asks for no certificates.
pub(crate) fn client_cert_fields(
    origin: &Origin,
    format: ClientCertHeader,
) -> [Option<(HeaderName, HeaderValue)>; 3] {
    let Some(fields) = &origin.client_cert else {
        return [None, None, None];
    };
    let verify = Some((CLIENT_VERIFY, HeaderValue::from_static(fields.verify)));
    match format {
        ClientCertHeader::Rfc9440 => match &fields.rfc9440 {
            Some((leaf, chain)) => [
                verify,
                Some((CLIENT_CERT, leaf.clone())),
                chain.clone().map(|c| (CLIENT_CERT_CHAIN, c)),
            ],
            None => [verify, None, None],
        },
        ClientCertHeader::Xfcc => [verify, fields.xfcc.clone().map(|x| (XFCC, x)), None],
    }
}

/// `X-Forwarded-For`, `X-Forwarded-Proto`, `X-Forwarded-Host`: the forwarding fields
/// besides RFC 7239's.
pub(crate) const XFF: HeaderName = HeaderName::from_static("x-forwarded-for");
pub(crate) const XFP: HeaderName = HeaderName::from_static("x-forwarded-proto");
pub(crate) const XFH: HeaderName = HeaderName::from_static("x-forwarded-host");

/// Adds the forwarding fields: `X-Forwarded-For` appended to (the client's list kept,
/// as nginx's `$proxy_add_x_forwarded_for`, where the origin keeps it; else replaced),
/// `X-Forwarded-Proto` and `X-Forwarded-Host` set, and an RFC 7239 `Forwarded` element
/// appended the same way. The host is the request's `Host`.
pub fn add_forwarding(headers: &mut HeaderMap, origin: &Origin) {
    if !origin.keeps_forwarded {
        headers.remove(XFF);
        headers.remove(header::FORWARDED);
    }
    append_list(headers, XFF, origin.ip.clone());
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
    let element = match host {
        Some(h) => {
            let mut element = Vec::new();
            forwarded_element(&mut element, origin, Some(h.as_bytes()));
            HeaderValue::from_maybe_shared(bytes::Bytes::from(element))
                .unwrap_or_else(|_| origin.element.clone())
        }
        None => origin.element.clone(),
    };
    append_list(headers, header::FORWARDED, element);
}

impl Origin {
    /// Whether the client's own `X-Forwarded-For` and `Forwarded` are appended to.
    pub(crate) fn keeps_forwarded(&self) -> bool {
        self.keeps_forwarded
    }

    /// The client's address as `X-Forwarded-For` lists it.
    pub(crate) fn forwarded_for(&self) -> &[u8] {
        self.ip.as_bytes()
    }
}

/// Appends this hop's RFC 7239 element to `out`: `for=NODE;proto=SCHEME`, and the
/// request's `host` where it has one that can be said (a host with characters outside a
/// token is quoted; one that cannot be quoted is left out).
pub(crate) fn forwarded_element(out: &mut Vec<u8>, origin: &Origin, host: Option<&[u8]>) {
    out.extend_from_slice(origin.element.as_bytes());
    let quote = match host {
        Some(h) if h.iter().copied().all(is_token) => Some(&b""[..]),
        Some(h)
            if h.iter()
                .all(|&b| b.is_ascii_graphic() && b != b'"' && b != b'\\') =>
        {
            Some(&b"\""[..])
        }
        _ => None,
    };
    if let (Some(h), Some(q)) = (host, quote) {
        out.extend_from_slice(b";host=");
        out.extend_from_slice(q);
        out.extend_from_slice(h);
        out.extend_from_slice(q);
    }
}

fn is_token(b: u8) -> bool {
    matches!(b, b'0'..=b'9' | b'a'..=b'z' | b'A'..=b'Z' | b'!' | b'#'..=b'\'' | b'*' | b'+' | b'-' | b'.' | b'^' | b'_' | b'`' | b'|' | b'~')
}

/// Appends to `out` each of `values` and a `, ` after it, for an item to follow: repeated
/// fields folded into one list, as the forwarding lists are passed on.
pub(crate) fn write_list_before<'a>(out: &mut Vec<u8>, values: impl Iterator<Item = &'a [u8]>) {
    for v in values {
        out.extend_from_slice(v);
        out.extend_from_slice(b", ");
    }
}

/// Appends `item` to the comma-separated list in `name`, folding repeated fields into one.
fn append_list(headers: &mut HeaderMap, name: HeaderName, item: HeaderValue) {
    let mut present = match headers.entry(name) {
        Entry::Vacant(e) => {
            e.insert(item);
            return;
        }
        Entry::Occupied(e) => e,
    };
    let mut list = Vec::new();
    write_list_before(&mut list, present.iter().map(HeaderValue::as_bytes));
    list.extend_from_slice(item.as_bytes());
    if let Ok(v) = HeaderValue::from_maybe_shared(bytes::Bytes::from(list)) {
        present.insert(v);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn trailers_lose_what_the_head_loses_and_what_no_trailer_may_carry() {
        let mut trailers = HeaderMap::new();
        for (name, value) in [
            ("x-client-verify", "SUCCESS"),
            ("x_client_verify", "SUCCESS"),
            ("x-forwarded-client-cert", "Hash=forged"),
            ("client-cert", ":Zm9yZ2Vk:"),
            ("x_anything", "1"),
            ("connection", "close"),
            ("transfer-encoding", "chunked"),
            ("content-length", "5"),
            ("host", "elsewhere.test"),
            ("x-forwarded-for", "10.0.0.1"),
            ("authorization", "Basic Zm9yZ2Vk"),
            ("grpc-status", "0"),
            ("x-checksum", "abc"),
        ] {
            trailers.append(
                HeaderName::from_static(name),
                HeaderValue::from_static(value),
            );
        }
        clean_trailers(&mut trailers);
        let mut left: Vec<&str> = trailers.keys().map(|n| n.as_str()).collect();
        left.sort_unstable();
        assert_eq!(left, ["grpc-status", "x-checksum"]);
    }

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

    /// `Connection` is read once: the first names it lists are removed, the ones past
    /// them pass (as if the sender had not named them), and a long list costs each field
    /// one look at a few names, not a read of the whole list.
    #[test]
    fn connection_names_past_the_first_sixteen_are_not_removed() {
        let names: Vec<String> = (0..20).map(|i| format!("x-n{i}")).collect();
        let mut pairs = vec![("connection".to_owned(), names.join(", "))];
        pairs.extend(names.iter().map(|n| (n.clone(), "1".to_owned())));
        let pairs: Vec<(&str, &str)> = pairs.iter().map(|(k, v)| (&k[..], &v[..])).collect();
        let mut h = map(&pairs);
        remove_hop_by_hop(&mut h);
        let mut left: Vec<&str> = h.keys().map(|n| n.as_str()).collect();
        left.sort_unstable();
        assert_eq!(left, ["x-n16", "x-n17", "x-n18", "x-n19"]);
        assert_eq!(HopByHop::of(&map(&pairs)).named.len(), MAX_NAMED);
    }

    #[test]
    fn hop_by_hop_fields_go_with_the_ones_connection_names() {
        let mut h = map(&[
            ("connection", "keep-alive, X-Secret, Host"),
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
        let origin = Origin::new(
            "192.0.2.7:5555".parse().unwrap(),
            "127.0.0.1:443".parse().unwrap(),
            "https",
        );
        add_forwarding(&mut h, &origin);
        assert_eq!(h["x-forwarded-for"], "10.0.0.1, 192.0.2.7");
        assert_eq!(h["x-forwarded-proto"], "https");
        assert_eq!(h["x-forwarded-host"], "app.example.com");
        assert_eq!(
            h["forwarded"],
            "for=10.0.0.1, for=192.0.2.7;proto=https;host=app.example.com"
        );
        let mut h = map(&[("host", "app:8443")]);
        let origin = Origin::new(
            "[2001:db8::1]:5555".parse().unwrap(),
            "127.0.0.1:443".parse().unwrap(),
            "https",
        );
        add_forwarding(&mut h, &origin);
        assert_eq!(h["x-forwarded-for"], "2001:db8::1");
        assert_eq!(
            h["forwarded"],
            "for=\"[2001:db8::1]\";proto=https;host=\"app:8443\""
        );
        // From an untrusted client, its own values are replaced.
        let mut h = map(&[
            ("host", "app"),
            ("x-forwarded-for", "10.0.0.1"),
            ("forwarded", "for=10.0.0.1"),
        ]);
        let untrusted = origin.clone().keeping_forwarded(false);
        add_forwarding(&mut h, &untrusted);
        assert_eq!(h["x-forwarded-for"], "2001:db8::1");
        assert_eq!(h["forwarded"], "for=\"[2001:db8::1]\";proto=https;host=app");
    }
    /// An XFCC element as Envoy's parser reads it: pairs split at `;` and keys at `=`
    /// outside quotes, quoted values unescaped.
    fn xfcc_pairs(element: &str) -> Vec<(String, String)> {
        let (mut pairs, mut field, mut quoted, mut escaped) =
            (Vec::new(), String::new(), false, false);
        let mut fields = Vec::new();
        for c in element.chars() {
            match c {
                _ if escaped => {
                    field.push(c);
                    escaped = false;
                }
                '\\' if quoted => escaped = true,
                '"' => quoted = !quoted,
                ';' | ',' if !quoted => fields.push(std::mem::take(&mut field)),
                '=' if !quoted && !field.contains('\0') => field.push('\0'),
                _ => field.push(c),
            }
        }
        fields.push(field);
        for f in fields {
            let (k, v) = f.split_once('\0').expect("key=value");
            pairs.push((k.to_owned(), v.to_owned()));
        }
        pairs
    }

    fn identity(uris: &[&str], dns: &[&str]) -> terminus_tls::ClientIdentity {
        terminus_tls::ClientIdentity {
            leaf: vec![0x30, 0x00].into(),
            chain: Vec::new(),
            subject: "CN=a \"b\" \\c".to_owned(),
            sha256: "ab".repeat(32),
            uris: uris.iter().map(|u| u.to_string()).collect(),
            dns: dns.iter().map(|d| d.to_string()).collect(),
        }
    }

    /// A SAN with `;`, `,` or `=` in it is one value, quoted as Envoy does, not fields of
    /// the client's choosing.
    #[test]
    fn an_xfcc_san_holding_separators_is_quoted_whole() {
        let san = "spiffe://a;URI=evil,By=x";
        let id = identity(&[san, "spiffe://plain/b"], &["ok.example", "a\"=b"]);
        let fields = ClientCertFields::of(Some(&id));
        let xfcc = fields.xfcc.unwrap();
        let xfcc = xfcc.to_str().unwrap();
        let pairs = xfcc_pairs(xfcc);
        let uris: Vec<&str> = pairs
            .iter()
            .filter(|(k, _)| k == "URI")
            .map(|(_, v)| v.as_str())
            .collect();
        assert_eq!(uris, [san, "spiffe://plain/b"], "{xfcc}");
        assert!(!pairs.iter().any(|(k, _)| k == "By"), "{xfcc}");
        let dns: Vec<&str> = pairs
            .iter()
            .filter(|(k, _)| k == "DNS")
            .map(|(_, v)| v.as_str())
            .collect();
        assert_eq!(dns, ["ok.example", "a\"=b"], "{xfcc}");
        assert_eq!(
            pairs.iter().find(|(k, _)| k == "Subject").unwrap().1,
            id.subject
        );
        // Only what needs quotes is quoted.
        assert!(
            xfcc.contains(";URI=spiffe://plain/b;") && xfcc.contains(";DNS=ok.example;"),
            "{xfcc}"
        );
        assert!(
            xfcc.contains(";URI=\"spiffe://a;URI=evil,By=x\";"),
            "{xfcc}"
        );
    }

    #[test]
    fn underscored_fields_are_removed_and_the_rest_kept() {
        let mut h = map(&[
            ("x_client_verify", "SUCCESS"),
            ("x-client_verify", "SUCCESS"),
            ("x_forwarded_client_cert", "Hash=forged"),
            ("client_cert", ":Zm9yZ2Vk:"),
            ("client_cert_chain", ":Zm9yZ2Vk:"),
            ("x_anything", "1"),
            ("x-kept", "yes"),
            ("host", "app"),
        ]);
        remove_underscored(&mut h);
        let mut left: Vec<&str> = h.keys().map(|k| k.as_str()).collect();
        left.sort_unstable();
        assert_eq!(left, ["host", "x-kept"]);
        // Without any, nothing changes.
        let mut h = map(&[("x-kept", "yes"), ("host", "app")]);
        remove_underscored(&mut h);
        assert_eq!(h.len(), 2);
    }

    /// The client's copies of the identity fields go under every spelling, whatever the
    /// server asks for; the proxy's own are the only ones left.
    #[test]
    fn identity_fields_are_removed_under_every_spelling() {
        let forged = [
            ("x-client-verify", "SUCCESS"),
            ("x_client_verify", "SUCCESS"),
            ("x-client_verify", "SUCCESS"),
            ("x_forwarded_client_cert", "Hash=forged"),
            ("x-forwarded-client_cert", "Hash=forged"),
            ("client_cert", ":Zm9yZ2Vk:"),
            ("client-cert", ":Zm9yZ2Vk:"),
            ("client_cert_chain", ":Zm9yZ2Vk:"),
            ("client-cert_chain", ":Zm9yZ2Vk:"),
            ("x-kept", "yes"),
        ];
        let plain = Origin::new(
            "192.0.2.7:5555".parse().unwrap(),
            "127.0.0.1:443".parse().unwrap(),
            "https",
        );
        let mut h = map(&forged);
        add_client_cert(&mut h, &plain, ClientCertHeader::Rfc9440);
        let left: Vec<&str> = h.keys().map(|k| k.as_str()).collect();
        assert_eq!(left, ["x-kept"]);
        let verified = plain.clone().with_client_cert(Some(&identity(&[], &[])));
        let mut h = map(&forged);
        add_client_cert(&mut h, &verified, ClientCertHeader::Xfcc);
        let mut left: Vec<&str> = h.keys().map(|k| k.as_str()).collect();
        left.sort_unstable();
        assert_eq!(
            left,
            ["x-client-verify", "x-forwarded-client-cert", "x-kept"]
        );
        assert_eq!(h.get_all("x-client-verify").iter().count(), 1);
        assert!(h["x-forwarded-client-cert"]
            .to_str()
            .unwrap()
            .starts_with(&format!("Hash={};", "ab".repeat(32))));
    }
}
