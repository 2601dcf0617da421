//! Message heads, both ways: requests parsed (from clients) and encoded (to upstreams),
//! responses encoded (to clients) and parsed (from upstreams). [`crate::h1::framing`] does
//! bodies.

use std::mem::MaybeUninit;

use http::header::{self, HeaderMap};
use http::{Method, Request, Response, StatusCode, Uri, Version};

use crate::h1::framing::{Malformed, ResponseFraming};
use crate::h1::raw::{is_text, Fields, RawHead};

/// Longest request line plus headers, like nginx's large_client_header_buffers.
pub const MAX_HEAD: usize = 16 * 1024;
/// Most fields a head may have.
pub(crate) const MAX_HEADERS: usize = 100;

/// Parses a request head at the start of `buf` and removes it from `buf`.
/// `Ok(None)`: not complete yet.
pub fn parse_request(buf: &mut Vec<u8>) -> Result<Option<Request<()>>, StatusCode> {
    Ok(parse_request_head(buf)?.map(|(req, _)| req))
}

/// [`parse_request`], with the head's bytes kept ([`RawHead`]) for a proxy to pass its
/// fields on from; the request's map shares them.
pub fn parse_request_head(buf: &mut Vec<u8>) -> Result<Option<(Request<()>, RawHead)>, StatusCode> {
    // Left uninitialised: httparse fills what it parses (zeroing 100 would cost more
    // than parsing a small head).
    let mut headers = [const { MaybeUninit::uninit() }; MAX_HEADERS];
    let mut parsed = httparse::Request::new(&mut []);
    let len = match parsed.parse_with_uninit_headers(buf, &mut headers) {
        Ok(httparse::Status::Complete(len)) => len,
        Ok(httparse::Status::Partial) => return Ok(None),
        Err(httparse::Error::TooManyHeaders) => {
            return Err(StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE)
        }
        Err(_) => return Err(StatusCode::BAD_REQUEST),
    };
    let method = Method::from_bytes(parsed.method.unwrap_or("").as_bytes())
        .map_err(|_| StatusCode::BAD_REQUEST)?;
    let uri: Uri = parsed
        .path
        .unwrap_or("")
        .parse()
        .map_err(|_| StatusCode::BAD_REQUEST)?;
    let version = version_of(parsed.version);
    let raw = RawHead::new(parsed.headers, &buf[..len]).ok_or(StatusCode::BAD_REQUEST)?;
    let map = raw.to_header_map().ok_or(StatusCode::BAD_REQUEST)?;
    let mut req = Request::builder()
        .method(method)
        .uri(uri)
        .version(version)
        .body(())
        .map_err(|_| StatusCode::BAD_REQUEST)?;
    *req.headers_mut() = map;
    buf.drain(..len);
    Ok(Some((req, raw)))
}

/// A response head as parsed, its fields kept as bytes.
#[derive(Debug)]
pub struct ResponseHead {
    /// The status code.
    pub status: StatusCode,
    /// HTTP/1.0 or HTTP/1.1.
    pub version: Version,
    /// The fields, as they came.
    pub fields: RawHead,
}

/// Parses a response head at the start of `buf` and removes it from `buf`, its fields
/// kept as bytes. `Ok(None)`: not complete yet (the caller bounds how long it waits, e.g.
/// at [`MAX_HEAD`]). Anything but a well-formed HTTP/1.x status line and fields is
/// refused: a proxy passes on only what it understood.
pub fn parse_response_head(buf: &mut Vec<u8>) -> Result<Option<ResponseHead>, Malformed> {
    let mut headers = [const { MaybeUninit::uninit() }; MAX_HEADERS];
    let mut parsed = httparse::Response::new(&mut []);
    let config = httparse::ParserConfig::default();
    let len = match config.parse_response_with_uninit_headers(&mut parsed, buf, &mut headers) {
        Ok(httparse::Status::Complete(len)) => len,
        Ok(httparse::Status::Partial) => return Ok(None),
        Err(httparse::Error::TooManyHeaders) => return Err(Malformed("too many header fields")),
        Err(_) => return Err(Malformed("not an HTTP/1.x response head")),
    };
    let status = parsed
        .code
        .and_then(|c| StatusCode::from_u16(c).ok())
        .ok_or(Malformed("bad status code"))?;
    let version = version_of(parsed.version);
    let fields =
        RawHead::new(parsed.headers, &buf[..len]).ok_or(Malformed("bad field name or value"))?;
    buf.drain(..len);
    Ok(Some(ResponseHead {
        status,
        version,
        fields,
    }))
}

/// [`parse_response_head`], its fields in a map.
pub fn parse_response(buf: &mut Vec<u8>) -> Result<Option<Response<()>>, Malformed> {
    let Some(head) = parse_response_head(buf)? else {
        return Ok(None);
    };
    let map = head
        .fields
        .to_header_map()
        .ok_or(Malformed("bad field name or value"))?;
    let mut resp = Response::new(());
    *resp.status_mut() = head.status;
    *resp.version_mut() = head.version;
    *resp.headers_mut() = map;
    Ok(Some(resp))
}

fn version_of(minor: Option<u8>) -> Version {
    match minor {
        Some(0) => Version::HTTP_10,
        _ => Version::HTTP_11,
    }
}

/// Appends an HTTP/1.1 request head: `method target HTTP/1.1`, then `headers` as given
/// (the caller has already chosen them, `host` and framing included).
pub fn encode_request_head(out: &mut Vec<u8>, method: &Method, target: &str, headers: &HeaderMap) {
    out.extend_from_slice(method.as_str().as_bytes());
    out.push(b' ');
    out.extend_from_slice(target.as_bytes());
    out.extend_from_slice(b" HTTP/1.1\r\n");
    encode_fields(out, headers);
    out.extend_from_slice(b"\r\n");
}

fn encode_fields(out: &mut Vec<u8>, headers: &HeaderMap) {
    for (name, value) in headers {
        out.extend_from_slice(name.as_str().as_bytes());
        out.extend_from_slice(b": ");
        out.extend_from_slice(value.as_bytes());
        out.extend_from_slice(b"\r\n");
    }
}

/// Whether `name` lists `token` (comma-separated, any case), as `connection: close`.
pub fn has_token(headers: &impl Fields, name: header::HeaderName, token: &str) -> bool {
    token_bytes(headers, name).any(|t| t.eq_ignore_ascii_case(token.as_bytes()))
}

/// The items of the comma-separated list in every `name` field, in order, trimmed, empty
/// ones left out (`Connection`, `Upgrade`).
pub fn tokens(headers: &impl Fields, name: header::HeaderName) -> impl Iterator<Item = &str> {
    token_bytes(headers, name).filter_map(|t| std::str::from_utf8(t).ok())
}

/// [`tokens`] as bytes, for comparing them (no UTF-8 check per value): values that are
/// not text (tab and visible ASCII, as `HeaderValue::to_str` has it) are passed over.
pub fn token_bytes(headers: &impl Fields, name: header::HeaderName) -> impl Iterator<Item = &[u8]> {
    headers
        .values_of(name)
        .filter(|v| is_text(v))
        .flat_map(|v| v.split(|&b| b == b','))
        .map(<[u8]>::trim_ascii)
        .filter(|t| !t.is_empty())
}

/// Whether the client wants the connection kept after this request (HTTP/1.1 unless
/// `Connection: close`, HTTP/1.0 only with `Connection: keep-alive`).
pub fn wants_keep_alive(req: &Request<()>) -> bool {
    keeps_alive(req.version(), req.headers())
}

/// Whether a message of `version` with `headers` lets its connection carry another
/// (HTTP/1.1 unless `Connection: close`, HTTP/1.0 only with `Connection: keep-alive`).
pub fn keeps_alive(version: Version, headers: &impl Fields) -> bool {
    match version {
        Version::HTTP_11 => !has_token(headers, header::CONNECTION, "close"),
        _ => has_token(headers, header::CONNECTION, "keep-alive"),
    }
}

/// Whether the client waits for `100 Continue` before sending the body (HTTP/1.1 only).
pub fn expects_continue(req: &Request<()>) -> bool {
    req.version() == Version::HTTP_11 && has_token(req.headers(), header::EXPECT, "100-continue")
}

/// Appends the HTTP/1.1 head of a response with `parts` and a body framed by `framing`:
/// status line, the fields `passed` on as bytes (a proxied head's) and then `parts`'s,
/// `date` where neither has one, the framing's header, and the `connection` header the
/// keep-alive decision needs.
pub fn encode_response_head(
    head: &mut Vec<u8>,
    parts: &http::response::Parts,
    passed: Option<&RawHead>,
    framing: ResponseFraming,
    keep_alive: bool,
    http10: bool,
) {
    let status = parts.status;
    head.extend_from_slice(b"HTTP/1.1 ");
    head.extend_from_slice(status.as_str().as_bytes());
    head.push(b' ');
    head.extend_from_slice(status.canonical_reason().unwrap_or("").as_bytes());
    head.extend_from_slice(b"\r\n");
    if let Some(passed) = passed {
        passed.encode_fields(head);
    }
    encode_fields(head, &parts.headers);
    let has = |name: &header::HeaderName| {
        parts.headers.contains_key(name) || passed.is_some_and(|p| p.contains(name))
    };
    if !has(&header::DATE) {
        head.extend_from_slice(b"date: ");
        DATE.with_borrow_mut(|date| head.extend_from_slice(date.now()));
        head.extend_from_slice(b"\r\n");
    }
    match framing {
        ResponseFraming::Length(len) if !has(&header::CONTENT_LENGTH) => {
            head.extend_from_slice(b"content-length: ");
            head.extend_from_slice(itoa(len, &mut [0; 20]));
            head.extend_from_slice(b"\r\n");
        }
        ResponseFraming::Chunked => head.extend_from_slice(b"transfer-encoding: chunked\r\n"),
        _ => {}
    }
    if !keep_alive {
        head.extend_from_slice(b"connection: close\r\n");
    } else if http10 {
        head.extend_from_slice(b"connection: keep-alive\r\n");
    }
    head.extend_from_slice(b"\r\n");
}

/// `n` in decimal, written into `digits` (without `format!`'s allocation).
pub fn itoa(mut n: u64, digits: &mut [u8; 20]) -> &[u8] {
    let mut at = digits.len();
    loop {
        at -= 1;
        digits[at] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            return &digits[at..];
        }
    }
}

thread_local! {
    /// The `date` header of this second, formatted once per second per worker.
    static DATE: std::cell::RefCell<Date> = const { std::cell::RefCell::new(Date { second: 0, text: Vec::new() }) };
}

struct Date {
    second: u64,
    text: Vec<u8>,
}

impl Date {
    fn now(&mut self) -> &[u8] {
        let now = std::time::SystemTime::now();
        let second = now
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        if second != self.second || self.text.is_empty() {
            self.second = second;
            self.text = httpdate::fmt_http_date(now).into_bytes();
        }
        &self.text
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn head(text: &str) -> Result<Option<Request<()>>, StatusCode> {
        parse_request(&mut text.as_bytes().to_vec())
    }

    #[test]
    fn parses_heads_and_leaves_the_rest() {
        let mut buf =
            b"GET /a?b=1 HTTP/1.1\r\nHost: x\r\nX-A: 1\r\nX-A: 2\r\n\r\nGET /next".to_vec();
        let req = parse_request(&mut buf).unwrap().unwrap();
        assert_eq!(req.method(), Method::GET);
        assert_eq!(req.uri().path_and_query().unwrap().as_str(), "/a?b=1");
        assert_eq!(req.headers().get_all("x-a").iter().count(), 2);
        assert_eq!(buf, b"GET /next");
        assert!(parse_request(&mut buf).unwrap().is_none());
        assert_eq!(
            head("GET / HTTP/1.0\r\n\r\n").unwrap().unwrap().version(),
            Version::HTTP_10
        );
    }

    #[test]
    fn malformed_heads_are_bad_requests() {
        assert_eq!(
            head("GET / HTTP/1.1\r\nBad Header: x\r\n\r\n").unwrap_err(),
            StatusCode::BAD_REQUEST
        );
        assert_eq!(
            head("G\0T / HTTP/1.1\r\n\r\n").unwrap_err(),
            StatusCode::BAD_REQUEST
        );
        assert_eq!(
            head("GET / HTTP/9.9\r\n\r\n").unwrap_err(),
            StatusCode::BAD_REQUEST
        );
        let many: String = (0..200).map(|i| format!("h{i}: v\r\n")).collect();
        assert_eq!(
            head(&format!("GET / HTTP/1.1\r\n{many}\r\n")).unwrap_err(),
            StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE
        );
    }

    #[test]
    fn responses_parse_strictly() {
        let mut buf = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nX: 1\r\n\r\nhi".to_vec();
        let resp = parse_response(&mut buf).unwrap().unwrap();
        assert_eq!(resp.status(), StatusCode::OK);
        assert_eq!(resp.headers()["x"], "1");
        assert_eq!(buf, b"hi");
        let mut partial = b"HTTP/1.1 200 OK\r\nX: 1\r\n".to_vec();
        assert!(parse_response(&mut partial).unwrap().is_none());
        for bad in [
            &b"HTTP/2 200 OK\r\n\r\n"[..],
            b"HTTP/1.1 2000 OK\r\n\r\n",
            b"HTTP/1.1 200 OK\r\nBad Field: x\r\n\r\n",
            b"ICY 200 OK\r\n\r\n",
        ] {
            assert!(
                parse_response(&mut bad.to_vec()).is_err(),
                "{:?}",
                String::from_utf8_lossy(bad)
            );
        }
        let mut ten = b"HTTP/1.0 200 OK\r\n\r\n".to_vec();
        let resp = parse_response(&mut ten).unwrap().unwrap();
        assert!(!keeps_alive(resp.version(), resp.headers()));
    }

    #[test]
    fn request_heads_encode_to_what_parses() {
        use http::header::HeaderValue;
        let mut headers = HeaderMap::new();
        headers.insert(header::HOST, HeaderValue::from_static("app"));
        headers.append("x-a", HeaderValue::from_static("1"));
        headers.append("x-a", HeaderValue::from_static("2"));
        let mut out = Vec::new();
        encode_request_head(&mut out, &Method::PUT, "/p?q=1", &headers);
        let req = parse_request(&mut out).unwrap().unwrap();
        assert_eq!(req.method(), Method::PUT);
        assert_eq!(req.uri(), "/p?q=1");
        assert_eq!(req.headers(), &headers);
        assert!(out.is_empty());
    }

    #[test]
    fn keep_alive_defaults_by_version() {
        let req = |v: &str, conn: Option<&str>| {
            let c = conn.map_or(String::new(), |c| format!("Connection: {c}\r\n"));
            head(&format!("GET / HTTP/{v}\r\n{c}\r\n"))
                .unwrap()
                .unwrap()
        };
        assert!(wants_keep_alive(&req("1.1", None)));
        assert!(!wants_keep_alive(&req("1.1", Some("Close"))));
        assert!(!wants_keep_alive(&req("1.0", None)));
        assert!(wants_keep_alive(&req("1.0", Some("keep-alive"))));
    }

    mod properties {
        use super::super::parse_request;
        use proptest::prelude::*;
        use proptest::sample::Index;

        /// A well-formed request head: method, target, headers.
        fn request() -> impl Strategy<Value = (&'static str, String, Vec<(String, String)>)> {
            (
                prop::sample::select(vec!["GET", "HEAD", "POST", "PUT", "DELETE", "OPTIONS"]),
                "/[a-zA-Z0-9._~/-]{0,24}(\\?[a-z0-9=&]{0,12})?",
                prop::collection::vec(("[a-z][a-z0-9-]{0,12}", "[!-~]([ -~]{0,20}[!-~])?"), 0..8),
            )
        }

        proptest! {
            #![proptest_config(ProptestConfig::with_cases(512))]

            /// Any bytes: a request, "need more", or a 4xx; the buffer is consumed only
            /// by a complete head.
            #[test]
            fn any_bytes_are_answered_without_panicking(buf in prop::collection::vec(any::<u8>(), 0..512)) {
                let mut b = buf.clone();
                match parse_request(&mut b) {
                    Ok(Some(_)) => prop_assert!(b.len() < buf.len()),
                    Ok(None) => prop_assert_eq!(&b, &buf),
                    Err(status) => {
                        prop_assert!(status.is_client_error());
                        prop_assert_eq!(&b, &buf);
                    }
                }
            }

            /// A head split across reads is never refused, and parses whole to what was sent,
            /// leaving the next request's bytes in the buffer.
            #[test]
            fn a_head_split_anywhere_parses_to_what_was_sent(
                (method, target, headers) in request(),
                cut in any::<Index>(),
            ) {
                let head: String = headers.iter().map(|(n, v)| format!("{n}: {v}\r\n")).collect();
                let text = format!("{method} {target} HTTP/1.1\r\n{head}\r\n");
                let prefix = &text.as_bytes()[..cut.index(text.len())];
                prop_assert!(matches!(parse_request(&mut prefix.to_vec()), Ok(None)), "prefix {:?}", String::from_utf8_lossy(prefix));
                let mut all = format!("{text}GET /next").into_bytes();
                let req = parse_request(&mut all).unwrap().unwrap();
                prop_assert_eq!(req.method().as_str(), method);
                prop_assert_eq!(req.uri().path_and_query().map(|p| p.as_str()), Some(target.as_str()));
                for (name, value) in &headers {
                    prop_assert!(req.headers().get_all(name.as_str()).iter().any(|v| v.as_bytes() == value.as_bytes()));
                }
                prop_assert_eq!(all, b"GET /next".to_vec());
            }
        }
    }
}
