//! A response head and trailers as HPACK field blocks, encoded straight into the
//! connection's output (the hpack module's table-less encoder), and a request's trailers as
//! the map a handler reads.

use crate::h1::PassedFields;
use crate::h2::hpack::encoder;
use crate::h2::server::state::FieldList;
use hyper::body::Body as _;
use hyper::header::{HeaderName, HeaderValue};
use hyper::http::response::Parts;
use hyper::HeaderMap;

use crate::body::Body;

/// Fields HTTP/2 forbids (RFC 9113 section 8.2.2): an HTTP/1.1 upstream's may come
/// this far, and a client would take the response for malformed.
fn connection_specific(name: &[u8]) -> bool {
    matches!(
        name,
        b"connection" | b"keep-alive" | b"proxy-connection" | b"transfer-encoding" | b"upgrade"
    )
}

/// Appends the response head's field block: `:status`, the map's fields, the fields a
/// proxied HTTP/1.1 head passed as bytes (names lower-cased), and a content-length
/// from the body's exact size when the responder set none (as hyper did), unless
/// `no_length` (an answer to HEAD, a tunnel's 200: its DATA are no body of a length).
pub(super) fn encode_head(parts: &Parts, body: &Body, no_length: bool, out: &mut Vec<u8>) {
    encoder::status(parts.status.as_u16(), out);
    // RFC 9110 section 8.6: no content-length on a 204 (an upstream's may say one).
    let no_content = parts.status == hyper::StatusCode::NO_CONTENT;
    let mut has_length = false;
    for (name, value) in &parts.headers {
        let name = name.as_str().as_bytes();
        if connection_specific(name) || (no_content && name == b"content-length") {
            continue;
        }
        has_length |= name == b"content-length";
        field(name, value.as_bytes(), value.is_sensitive(), out);
    }
    if let Some(PassedFields(passed)) = parts.extensions.get::<PassedFields>() {
        let mut lower = Vec::new();
        for (name, value) in passed.fields() {
            lower.clear();
            lower.extend(name.iter().map(u8::to_ascii_lowercase));
            if connection_specific(&lower) || (no_content && lower == b"content-length") {
                continue;
            }
            has_length |= lower == b"content-length";
            field(&lower, value, false, out);
        }
    }
    let bodiless_status = parts.status.is_informational()
        || parts.status == hyper::StatusCode::NO_CONTENT
        || parts.status == hyper::StatusCode::NOT_MODIFIED;
    if !has_length && !no_length && !bodiless_status {
        if let Some(len) = body.size_hint().exact() {
            let mut digits = [0u8; 20];
            field(b"content-length", decimal(len, &mut digits), false, out);
        }
    }
}

/// `n` in decimal, written at the end of `buf`.
fn decimal(mut n: u64, buf: &mut [u8; 20]) -> &[u8] {
    let mut at = buf.len();
    loop {
        at -= 1;
        buf[at] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            return &buf[at..];
        }
    }
}

/// Appends trailers' field block.
pub(super) fn encode_trailers(trailers: &HeaderMap, out: &mut Vec<u8>) {
    for (name, value) in trailers {
        let name = name.as_str().as_bytes();
        if !connection_specific(name) {
            field(name, value.as_bytes(), value.is_sensitive(), out);
        }
    }
}

/// Values go as they are (see [`encoder::field_plain`]).
fn field(name: &[u8], value: &[u8], sensitive: bool, out: &mut Vec<u8>) {
    if sensitive {
        encoder::sensitive_field(name, value, out);
    } else {
        encoder::field_plain(name, value, out);
    }
}

/// A request's trailers as a map (fields a map cannot hold are left out).
pub(super) fn trailers_map(fields: &FieldList) -> HeaderMap {
    let mut map = HeaderMap::new();
    for f in fields.fields() {
        if let (Ok(name), Ok(value)) = (
            HeaderName::from_bytes(f.name),
            HeaderValue::from_bytes(f.value),
        ) {
            map.append(name, value);
        }
    }
    map
}
