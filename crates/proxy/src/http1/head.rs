//! The request head an HTTP/1.1 upstream gets, written straight from an HTTP/1.1
//! client's head bytes ([`RawHead`]): its fields in the order and spelling they came,
//! less what [`crate::headers`] takes out of any request (hop-by-hop fields, the ones
//! `Connection` names, names with underscores, the client's copies of the fields the
//! proxy sets), with the forwarding fields, the client-certificate fields, the body's
//! framing and a passed upgrade added, and the request line in the normal form the server
//! routed by. No map is built for it; a request from an h2 or h3 client, which has no
//! such bytes, is edited as a map by the same rules ([`crate::forward`]).

use hyper::header::{self, HeaderName, HeaderValue};
use hyper::http::request::Parts;
use hyper::{Method, Uri};
use terminus_http::h1::{Fields, RawHead};

use super::BodyFraming;
use crate::headers::{
    client_cert_fields, forwarded_element, is_identity, is_underscored, write_list_before,
    HopByHop, Origin, XFF, XFH, XFP,
};
use crate::spec::ClientCertHeader;

/// What the upstream request says besides the client's fields.
pub(crate) struct Outgoing<'a> {
    /// The request as the server settled it: method, normal-form target, and in its map
    /// the one `Host` it was routed by (which may differ from the bytes': an absolute
    /// form's host wins over the field).
    pub(crate) parts: &'a Parts,
    pub(crate) origin: &'a Origin,
    pub(crate) client_cert: ClientCertHeader,
    pub(crate) framing: BodyFraming,
    /// The `Upgrade` tokens passed on, if any.
    pub(crate) upgrade: Option<&'a HeaderValue>,
}

/// The request-target an upstream gets: the origin form of the settled URI.
pub(crate) fn origin_form(uri: &Uri) -> &str {
    match uri.path_and_query().map(|p| p.as_str()) {
        None | Some("") => "/",
        Some(target) => target,
    }
}

/// The `Host` a request without the field is given: its target's authority (HTTP/2's
/// `:authority`, HTTP/1.1's absolute form).
pub(crate) fn authority_host(uri: &Uri) -> Option<HeaderValue> {
    uri.authority()
        .and_then(|a| HeaderValue::from_str(a.as_str()).ok())
}

/// What the head declares of the body it goes with.
pub(crate) enum Declared {
    Length(u64),
    Chunked,
}

/// The framing field the upstream request carries: the body's exact length, chunked
/// when it is unknown, and `Content-Length: 0` for a method that normally carries a body
/// but has none, so that the server does not wait for one or answer 411 (as nginx).
pub(crate) fn declared(framing: BodyFraming, method: &Method) -> Option<Declared> {
    match framing {
        BodyFraming::Length(n) => Some(Declared::Length(n)),
        BodyFraming::Chunked => Some(Declared::Chunked),
        BodyFraming::None if matches!(*method, Method::POST | Method::PUT | Method::PATCH) => {
            Some(Declared::Length(0))
        }
        BodyFraming::None => None,
    }
}

/// Fields of the client's the proxy sets itself, whatever the client sent: framing and
/// the forwarding fields it replaces (`X-Forwarded-For` and `Forwarded` are folded into
/// the proxy's own, or replaced, apart).
fn set_by_proxy(name: &[u8]) -> bool {
    const SET: [&str; 5] = [
        "content-length",
        "x-forwarded-proto",
        "x-forwarded-host",
        "x-forwarded-for",
        "forwarded",
    ];
    SET.iter().any(|n| terminus_http::h1::is_name(name, n))
}

/// Appends the upstream request head for `raw`, the client's head, to `out`.
pub(crate) fn write_request_head(out: &mut Vec<u8>, raw: &RawHead, req: &Outgoing<'_>) {
    let parts = req.parts;
    out.extend_from_slice(parts.method.as_str().as_bytes());
    out.push(b' ');
    out.extend_from_slice(origin_form(&parts.uri).as_bytes());
    out.extend_from_slice(b" HTTP/1.1\r\n");
    let hop = HopByHop::of(raw);
    // Taken out of any request (the map path's `remove_hop_by_hop`, `remove_underscored`
    // and `add_client_cert`'s removal).
    let passes = |name: &[u8]| !hop.drops(name) && !is_underscored(name) && !is_identity(name);
    let host = parts
        .headers
        .get(header::HOST)
        .cloned()
        .or_else(|| authority_host(&parts.uri));
    let mut host_said = false;
    for (name, value) in raw.fields() {
        if !passes(name) || set_by_proxy(name) {
            continue;
        }
        if terminus_http::h1::is_name(name, "host") {
            // The settled host, in the field's place (the target.rs rules left one).
            if let (Some(h), false) = (&host, host_said) {
                field(out, name, h.as_bytes());
                host_said = true;
            }
            continue;
        }
        field(out, name, value);
    }
    if let (Some(h), false) = (&host, host_said) {
        field(out, b"host", h.as_bytes());
    }
    write_forwarding(out, raw, req.origin, host.as_ref(), &passes);
    for (name, value) in client_cert_fields(req.origin, req.client_cert)
        .into_iter()
        .flatten()
    {
        field(out, name.as_str().as_bytes(), value.as_bytes());
    }
    match declared(req.framing, &parts.method) {
        Some(Declared::Length(n)) => {
            field(
                out,
                b"content-length",
                terminus_http::h1::itoa(n, &mut [0; 20]),
            );
        }
        Some(Declared::Chunked) => field(out, b"transfer-encoding", b"chunked"),
        None => {}
    }
    if let Some(to) = req.upgrade {
        field(out, b"upgrade", to.as_bytes());
        field(out, b"connection", b"upgrade");
    }
    out.extend_from_slice(b"\r\n");
}

/// The forwarding fields ([`crate::headers::add_forwarding`]'s): the client's own
/// `X-Forwarded-For` and `Forwarded` (those that `passes`) folded before this hop's item
/// where the origin keeps them, `X-Forwarded-Proto`, and `X-Forwarded-Host` where the
/// request has a host.
fn write_forwarding(
    out: &mut Vec<u8>,
    raw: &RawHead,
    origin: &Origin,
    host: Option<&HeaderValue>,
    passes: &impl Fn(&[u8]) -> bool,
) {
    let kept = |name: HeaderName| {
        let keep = origin.keeps_forwarded() && passes(name.as_str().as_bytes());
        raw.values_of(name).filter(move |_| keep)
    };
    start_field(out, XFF.as_str().as_bytes());
    write_list_before(out, kept(XFF));
    out.extend_from_slice(origin.forwarded_for());
    out.extend_from_slice(b"\r\n");
    field(out, XFP.as_str().as_bytes(), origin.scheme.as_bytes());
    if let Some(h) = host {
        field(out, XFH.as_str().as_bytes(), h.as_bytes());
    }
    start_field(out, b"forwarded");
    write_list_before(out, kept(header::FORWARDED));
    forwarded_element(out, origin, host.map(HeaderValue::as_bytes));
    out.extend_from_slice(b"\r\n");
}

fn start_field(out: &mut Vec<u8>, name: &[u8]) {
    out.extend_from_slice(name);
    out.extend_from_slice(b": ");
}

fn field(out: &mut Vec<u8>, name: &[u8], value: &[u8]) {
    start_field(out, name);
    out.extend_from_slice(value);
    out.extend_from_slice(b"\r\n");
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::forward::{http1_head, upstream_headers};
    use crate::headers::{add_client_cert, remove_hop_by_hop};
    use hyper::HeaderMap;
    use proptest::prelude::*;
    use terminus_http::h1::{parse_request_head, parse_response, parse_response_head};

    /// Names a head draws its fields from: hop-by-hop ones, the ones the proxy sets,
    /// underscored and identity spellings, and ordinary ones, in odd case.
    const NAMES: &[&str] = &[
        "Connection",
        "keep-alive",
        "Proxy-Connection",
        "TE",
        "Trailer",
        "Transfer-Encoding",
        "upgrade",
        "Expect",
        "proxy-authorization",
        "X-Forwarded-For",
        "forwarded",
        "X-Forwarded-Proto",
        "x-forwarded-host",
        "Content-Length",
        "X_Under",
        "x-client-verify",
        "Client_Cert",
        "X-FORWARDED-CLIENT-CERT",
        "X-A",
        "x-b",
        "X-c",
        "Accept",
        "cookie",
        "Close",
    ];

    /// A field: a name from [`NAMES`] (or a `Connection` listing some of them) in random
    /// case, and a value with optional whitespace around it.
    fn field() -> impl Strategy<Value = (String, String)> {
        let name = (prop::sample::select(NAMES), any::<u32>()).prop_map(|(n, case)| {
            n.chars()
                .enumerate()
                .map(|(i, c)| match case >> (i % 32) & 1 {
                    1 => c.to_ascii_uppercase(),
                    _ => c.to_ascii_lowercase(),
                })
                .collect::<String>()
        });
        let tokens = prop::collection::vec(
            prop::sample::select([NAMES, &["close", "keep-alive", "host", "Upgrade"]].concat()),
            1..4,
        )
        .prop_map(|t| t.join(", "));
        let value = ("[!-~]([ -~]{0,12}[!-~])?", "[ \t]{0,2}", "[ \t]{0,2}")
            .prop_map(|(v, before, after)| format!("{before}{v}{after}"));
        prop_oneof![
            (name, value),
            tokens.prop_map(|t| ("Connection".to_owned(), format!(" {t} "))),
        ]
    }

    /// A client's request head: a method, a target, one Host (first, last or between) and
    /// the fields.
    fn request() -> impl Strategy<Value = String> {
        (
            prop::sample::select(vec!["GET", "HEAD", "POST", "PUT", "DELETE"]),
            "/[a-z0-9/._-]{0,16}(\\?[a-z0-9=&]{0,8})?",
            prop::collection::vec(field(), 0..12),
            any::<prop::sample::Index>(),
        )
            .prop_map(|(method, target, mut fields, at)| {
                let at = at.index(fields.len() + 1);
                fields.insert(at, ("Host".into(), "app.test".into()));
                let fields: String = fields.iter().map(|(n, v)| format!("{n}:{v}\r\n")).collect();
                format!("{method} {target} HTTP/1.1\r\n{fields}\r\n")
            })
    }

    fn origin(keeps: bool, cert: bool, v6: bool) -> Origin {
        let client = if v6 {
            "[2001:db8::7]:5555"
        } else {
            "192.0.2.7:5555"
        };
        let origin = Origin::new(
            client.parse().unwrap(),
            "127.0.0.1:443".parse().unwrap(),
            "https",
        )
        .keeping_forwarded(keeps);
        if !cert {
            return origin;
        }
        let id = terminus_tls::ClientIdentity {
            leaf: vec![0x30, 0x00].into(),
            chain: vec![vec![0x30, 0x01].into()],
            subject: "CN=client".to_owned(),
            sha256: "ab".repeat(32),
            uris: vec!["spiffe://a/b".to_owned()],
            dns: Vec::new(),
        };
        origin.with_client_cert(Some(&id))
    }

    fn parsed(head: &[u8]) -> (hyper::Request<()>, RawHead) {
        parse_request_head(&mut head.to_vec())
            .unwrap()
            .unwrap_or_else(|| panic!("incomplete: {:?}", String::from_utf8_lossy(head)))
    }

    /// The client's fields as (lower-case name, value), in order, that `head` passes
    /// through unchanged (every field but those the proxy sets or rewrites).
    fn passed_through(head: &[u8]) -> Vec<(String, Vec<u8>)> {
        let (_, raw) = parsed(head);
        raw.fields()
            .map(|(n, v)| (String::from_utf8_lossy(n).to_ascii_lowercase(), v.to_vec()))
            .filter(|(n, _)| {
                !set_by_proxy(n.as_bytes())
                    && !is_identity(n.as_bytes())
                    && !["host", "upgrade", "connection", "transfer-encoding"].contains(&n.as_str())
            })
            .collect()
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2000))]

        /// What the byte path writes for an HTTP/1.1 client parses back to what editing
        /// the map writes (the path h2 and h3 clients take), whatever the head holds;
        /// and the fields it passes keep their order and duplicates.
        #[test]
        fn the_byte_path_forwards_what_the_map_path_does(
            text in request(),
            keeps in any::<bool>(),
            cert in any::<bool>(),
            v6 in any::<bool>(),
            xfcc in any::<bool>(),
            framing in prop_oneof![
                Just(BodyFraming::None), (0u64..1 << 40).prop_map(BodyFraming::Length), Just(BodyFraming::Chunked)
            ],
            upgrade in any::<bool>(),
            settled_host in prop::option::of("[a-z]{1,8}(:[0-9]{1,4})?"),
        ) {
            let Ok(Some((req, raw))) = parse_request_head(&mut text.clone().into_bytes()) else {
                return Err(TestCaseError::reject("not a request head"));
            };
            let (mut parts, ()) = req.into_parts();
            // What target.rs may settle: another host than the field's (absolute form).
            if let Some(h) = &settled_host {
                parts.headers.insert(header::HOST, HeaderValue::from_str(h).unwrap());
            }
            let origin = origin(keeps, cert, v6);
            let client_cert = if xfcc { ClientCertHeader::Xfcc } else { ClientCertHeader::Rfc9440 };
            let to = HeaderValue::from_static("websocket");
            let upgrade = upgrade.then_some(&to);

            let mut bytes = Vec::new();
            let outgoing = Outgoing { parts: &parts, origin: &origin, client_cert, framing, upgrade };
            write_request_head(&mut bytes, &raw, &outgoing);

            let mut map = parts;
            upstream_headers(&mut map, &origin, framing);
            add_client_cert(&mut map.headers, &origin, client_cert);
            if let Some(to) = upgrade {
                map.headers.insert(header::UPGRADE, to.clone());
                map.headers.insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
            }
            let mapped = http1_head(&map);

            let ((by_bytes, _), (by_map, _)) = (parsed(&bytes), parsed(&mapped));
            prop_assert_eq!(by_bytes.method(), by_map.method());
            prop_assert_eq!(by_bytes.uri(), by_map.uri());
            prop_assert_eq!(
                by_bytes.headers(), by_map.headers(),
                "\nclient: {:?}\nbytes: {:?}\nmap: {:?}",
                text, String::from_utf8_lossy(&bytes), String::from_utf8_lossy(&mapped)
            );
            // Order and duplicates: what passes through comes out as it went in.
            let hop = HopByHop::of(&raw);
            let sent: Vec<(String, Vec<u8>)> = passed_through(text.as_bytes())
                .into_iter()
                .filter(|(n, _)| !hop.drops(n.as_bytes()) && !is_underscored(n.as_bytes()))
                .collect();
            prop_assert_eq!(passed_through(&bytes), sent);
        }

        /// A response's hop-by-hop fields are taken out of its bytes as out of its map.
        #[test]
        fn responses_lose_the_same_fields_either_way(
            fields in prop::collection::vec(field(), 0..12),
        ) {
            let fields: String = fields.iter().map(|(n, v)| format!("{n}:{v}\r\n")).collect();
            let text = format!("HTTP/1.1 200 OK\r\n{fields}\r\n");
            let Ok(Some(resp)) = parse_response(&mut text.clone().into_bytes()) else {
                return Err(TestCaseError::reject("not a response head"));
            };
            let mut map: HeaderMap = resp.into_parts().0.headers;
            remove_hop_by_hop(&mut map);
            let mut raw = parse_response_head(&mut text.clone().into_bytes()).unwrap().unwrap().fields;
            remove_hop_by_hop(&mut raw);
            prop_assert_eq!(raw.to_header_map().unwrap(), map, "{:?}", text);
        }
    }

    /// The guarantee at its plainest: nothing that names the connection passes.
    #[test]
    fn connection_fields_never_pass() {
        let text = "GET /x HTTP/1.1\r\nConnection: keep-alive, X-Secret\r\nHost: a\r\nX-Secret: 1\r\nKeep-Alive: 5\r\nTE: trailers\r\nX-A: 1\r\nx-a: 2\r\n\r\n";
        let (req, raw) = parsed(text.as_bytes());
        let (parts, ()) = req.into_parts();
        let origin = origin(true, false, false);
        let outgoing = Outgoing {
            parts: &parts,
            origin: &origin,
            client_cert: ClientCertHeader::Rfc9440,
            framing: BodyFraming::None,
            upgrade: None,
        };
        let mut out = Vec::new();
        write_request_head(&mut out, &raw, &outgoing);
        let out = String::from_utf8(out).unwrap();
        assert!(
            out.starts_with("GET /x HTTP/1.1\r\nHost: a\r\nX-A: 1\r\nx-a: 2\r\n"),
            "{out}"
        );
        for gone in ["connection", "x-secret", "keep-alive", "te:"] {
            assert!(!out.to_ascii_lowercase().contains(gone), "{gone} in {out}");
        }
    }
}
