//! An HTTP/2 request head as the responder takes it: `http::Request` built from the
//! fields the codec checked, its URI in absolute form when `:authority` came (as hyper
//! built it, and as the routing expects), cookies joined into one field.

use crate::h2::server::state::FieldList;
use bytes::Bytes;
use hyper::header::{HeaderName, HeaderValue, COOKIE};
use hyper::http::uri::{Authority, PathAndQuery, Scheme};
use hyper::{HeaderMap, Method, Request, Uri, Version};

use crate::body::RequestBody;

/// The request `head` describes, with `body`; `None` for a head `http` cannot hold (a
/// method, authority or path with bytes its types refuse), which is answered as
/// malformed.
pub(super) fn build(head: &FieldList, body: RequestBody) -> Option<Request<RequestBody>> {
    let method = Method::from_bytes(head.method()).ok()?;
    let mut uri = hyper::http::uri::Parts::default();
    // The authority and the path share one allocation, sliced by each.
    let authority = head.authority().unwrap_or_default();
    let path = head.path().unwrap_or_default();
    let mut both = Vec::with_capacity(authority.len() + path.len());
    both.extend_from_slice(authority);
    both.extend_from_slice(path);
    let both = Bytes::from(both);
    let authority = || Authority::from_maybe_shared(both.slice(..authority.len())).ok();
    if method == Method::CONNECT && head.protocol().is_none() {
        // A plain CONNECT names an authority alone (RFC 9113 section 8.5): the
        // authority form, for the responder to refuse as it does over HTTP/1.1.
        head.authority()?;
        uri.authority = Some(authority()?);
    } else if head.authority().is_some() {
        uri.authority = Some(authority()?);
        uri.scheme = Some(match head.scheme() {
            Some(b"https") | None => Scheme::HTTPS,
            Some(b"http") => Scheme::HTTP,
            Some(other) => std::str::from_utf8(other).ok()?.parse().ok()?,
        });
    }
    if head.path().is_some() {
        let at = both.len() - path.len();
        uri.path_and_query = Some(PathAndQuery::from_maybe_shared(both.slice(at..)).ok()?);
    }
    let uri = Uri::from_parts(uri).ok()?;
    let mut headers = HeaderMap::with_capacity(head.fields().size_hint().0);
    let mut cookies: Option<Vec<u8>> = None;
    let mut cookies_sensitive = false;
    for field in head.fields() {
        if field.name == b"cookie" {
            cookies_sensitive |= field.sensitive;
            // RFC 9113 section 8.2.3: cookie crumbs sent as fields of their own are one
            // field again for HTTP/1.1 (which allows one) and for the routes.
            match &mut cookies {
                Some(joined) => {
                    joined.extend_from_slice(b"; ");
                    joined.extend_from_slice(field.value);
                }
                None => cookies = Some(field.value.to_vec()),
            }
            continue;
        }
        let name = HeaderName::from_bytes(field.name).ok()?;
        let mut value = HeaderValue::from_bytes(field.value).ok()?;
        value.set_sensitive(field.sensitive);
        headers.append(name, value);
    }
    if let Some(cookies) = cookies {
        let mut value = HeaderValue::from_bytes(&cookies).ok()?;
        value.set_sensitive(cookies_sensitive);
        headers.insert(COOKIE, value);
    }
    let mut req = Request::new(body);
    *req.method_mut() = method;
    *req.uri_mut() = uri;
    *req.version_mut() = Version::HTTP_2;
    *req.headers_mut() = headers;
    if let Some(protocol) = head.protocol() {
        // The proxy asks hyper's type which protocol an extended CONNECT wants; it
        // tunnels WebSockets alone, and refuses the rest by that name's absence.
        let protocol = match protocol.eq_ignore_ascii_case(b"websocket") {
            true => hyper::ext::Protocol::from_static("websocket"),
            false => hyper::ext::Protocol::from_static("unsupported"),
        };
        req.extensions_mut().insert(protocol);
    }
    Some(req)
}
