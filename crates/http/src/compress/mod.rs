//! Response compression, as nginx's `gzip` and Caddy's `encode`: a coding chosen from the
//! request's `Accept-Encoding` (q-values, the server's order breaking ties), and a
//! response body compressed as it streams ([`encoder`]). Static files can instead have
//! their compressed copies beside them (`file.br`, `file.zst`, `file.gz`: nginx's
//! `gzip_static`, Caddy's `precompressed`), which [`crate::files`] serves at no CPU cost.
//!
//! Only what compression helps and cannot break is compressed: a 200 of a compressible
//! type (text, JSON, JavaScript, XML, SVG, WebAssembly by default) and of at least
//! `min_length` bytes (or of a length not known in advance, as a proxied stream's), never
//! a HEAD, a range (206), a response already encoded, or one whose `Cache-Control` says
//! `no-transform`. Such responses say `Vary: Accept-Encoding` whether compressed or not,
//! so that a cache keeps the two apart; a compressed one's `ETag` is made weak (as nginx
//! does), its `Content-Length` dropped (the length is known only at the end), and its
//! `Accept-Ranges` too (ranges of a compressed stream are not served).
//!
//! BREACH: a compressed response's length tells what its plain text repeats. A page that
//! holds a secret (a CSRF token) and reflects attacker-chosen input beside it leaks the
//! secret to an attacker who can watch lengths and make the victim send requests.
//! terminus cannot tell which responses carry secrets, so compression is off unless a
//! server asks for it, and a route can turn it off again (`compress = []`); pages that
//! carry secrets should mask them per response (as Rails' and Django's CSRF tokens are)
//! or not be compressed.

pub mod encoder;
pub mod memory;
pub mod stats;

use std::rc::Rc;

use hyper::header::{self, HeaderValue};
use hyper::{Method, Response, StatusCode};

use crate::body::Body;
use crate::h1::{Fields, PassedFields};

pub use encoder::Compressed;
pub use memory::{ConnectionMemory, WorkerMemory};

/// A content coding terminus can produce.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Coding {
    /// Zstandard (RFC 8878).
    Zstd,
    /// Brotli (RFC 7932).
    Brotli,
    /// gzip (RFC 1952).
    Gzip,
}

impl Coding {
    /// Every coding, in the order a server prefers them when it does not say.
    pub const ALL: [Coding; 3] = [Coding::Zstd, Coding::Brotli, Coding::Gzip];

    /// Its `Content-Encoding` token.
    pub fn token(self) -> &'static str {
        match self {
            Coding::Zstd => "zstd",
            Coding::Brotli => "br",
            Coding::Gzip => "gzip",
        }
    }

    /// The suffix of a file's precompressed copy.
    pub fn suffix(self) -> &'static str {
        match self {
            Coding::Zstd => ".zst",
            Coding::Brotli => ".br",
            Coding::Gzip => ".gz",
        }
    }

    /// The coding a config's word names: its token, or `brotli`.
    pub fn from_name(name: &str) -> Option<Coding> {
        match name {
            "zstd" => Some(Coding::Zstd),
            "br" | "brotli" => Some(Coding::Brotli),
            "gzip" => Some(Coding::Gzip),
            _ => None,
        }
    }

    /// Its place in [`Coding::ALL`].
    fn index(self) -> usize {
        self as usize
    }

    fn header_value(self) -> HeaderValue {
        HeaderValue::from_static(self.token())
    }
}

/// How hard each coding works: levels chosen for CPU, as a server compressing every
/// response must (bench/compress measures them).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Levels {
    /// 1-9; nginx's `gzip_comp_level` defaults to 1.
    pub gzip: u32,
    /// 0-11.
    pub brotli: u32,
    /// 1-19 (negative levels are faster still).
    pub zstd: i32,
}

/// A server's compression: on the fly, of which types and sizes, and at which levels.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Compression {
    /// The codings produced on the fly, preferred first; empty: none.
    pub codings: Vec<Coding>,
    /// Responses shorter than this are sent as they are.
    pub min_length: u64,
    /// Compressible media types: `text/*`-style prefixes or exact types, parameters
    /// ignored.
    pub types: Vec<String>,
    /// Each coding's level.
    pub levels: Levels,
}

/// What compression the default settings take: Caddy's `encode` list, and XML.
pub const DEFAULT_TYPES: [&str; 9] = [
    "text/*",
    "application/json",
    "application/javascript",
    "application/xml",
    "application/xhtml+xml",
    "application/atom+xml",
    "application/rss+xml",
    "application/wasm",
    "image/svg+xml",
];

impl Compression {
    /// Compresses `resp` (the answer to a `method` request that said `accept`) if it
    /// should be and its encoder fits in `memory` (its connection's), and says
    /// `Vary: Accept-Encoding` on any response that could have been.
    pub fn apply(
        &self,
        mut resp: Response<Body>,
        method: &Method,
        accept: Option<&HeaderValue>,
        memory: &Rc<ConnectionMemory>,
    ) -> Response<Body> {
        if self.codings.is_empty() || method == Method::CONNECT {
            return resp;
        }
        if let Some(&Unmodified { content_type, len }) = resp.extensions().get::<Unmodified>() {
            // A file's 304 says what its 200 would: Vary, and the weak validator of the
            // compressed representation the client holds.
            if resp.status() == StatusCode::NOT_MODIFIED
                && len >= self.min_length
                && compressible(content_type.as_bytes(), &self.types)
            {
                add_vary(&mut resp);
                if negotiate(accept, &self.codings).is_some() {
                    weaken_etag(resp.headers_mut());
                }
            }
            return resp;
        }
        // A HEAD's answer varies as its GET's would, but it has no body to compress.
        let head = method == Method::HEAD;
        if !self.eligible(&resp, head) {
            return resp;
        }
        add_vary(&mut resp);
        if head {
            return resp;
        }
        let Some(coding) = negotiate(accept, &self.codings) else {
            return resp;
        };
        match memory.reserve(coding, self.levels) {
            Some(reserved) => compress(resp, coding, self.levels, reserved),
            None => {
                stats::STATS.no_memory();
                resp
            }
        }
    }

    /// Whether `resp` is one to compress: a 200 of a compressible type and length, not
    /// encoded, not to be transformed.
    /// (`head`: the answer to a HEAD, without the body it describes.)
    fn eligible(&self, resp: &Response<Body>, head: bool) -> bool {
        if resp.status() != StatusCode::OK || (!head && matches!(resp.body(), Body::Empty)) {
            return false;
        }
        if crate::field(resp, &header::CONTENT_ENCODING).is_some()
            || crate::field(resp, &header::CONTENT_RANGE).is_some()
        {
            return false;
        }
        if crate::values(resp, &header::CACHE_CONTROL).any(|v| {
            v.split(|&b| b == b',')
                .any(|d| d.trim_ascii().eq_ignore_ascii_case(b"no-transform"))
        }) {
            return false;
        }
        let Some(kind) = crate::field(resp, &header::CONTENT_TYPE) else {
            return false;
        };
        // gRPC frames its messages itself (and compresses them itself, per message):
        // whatever `types` says.
        if kind
            .get(..16)
            .is_some_and(|k| k.eq_ignore_ascii_case(b"application/grpc"))
            || !compressible(kind, &self.types)
        {
            return false;
        }
        let length = crate::field(resp, &header::CONTENT_LENGTH)
            .and_then(|v| std::str::from_utf8(v).ok()?.trim().parse::<u64>().ok());
        length.is_none_or(|n| n >= self.min_length)
    }
}

/// Whether a `Content-Type` value is one of `types` (`text/*` matches any text).
fn compressible(content_type: &[u8], types: &[String]) -> bool {
    let Ok(kind) = std::str::from_utf8(content_type) else {
        return false;
    };
    let kind = kind.split(';').next().unwrap_or_default().trim();
    types.iter().any(|t| match t.strip_suffix('*') {
        Some(prefix) => kind
            .get(..prefix.len())
            .is_some_and(|k| k.eq_ignore_ascii_case(prefix)),
        None => kind.eq_ignore_ascii_case(t),
    })
}

/// Adds `Vary: Accept-Encoding` unless the response already varies by it (or by all).
pub fn add_vary(resp: &mut Response<Body>) {
    crate::vary_by(resp, &HeaderValue::from_static("Accept-Encoding"));
}

/// Every `Accept-Encoding` field line of a request as one value (a client may split the
/// list over several lines, RFC 9110 section 5.3).
pub fn accept_encoding(headers: &hyper::HeaderMap) -> Option<HeaderValue> {
    let mut lines = headers.get_all(header::ACCEPT_ENCODING).iter();
    let first = lines.next()?;
    let mut joined = first.as_bytes().to_vec();
    let mut more = false;
    for line in lines {
        joined.extend_from_slice(b", ");
        joined.extend_from_slice(line.as_bytes());
        more = true;
    }
    if more {
        HeaderValue::from_bytes(&joined).ok()
    } else {
        Some(first.clone())
    }
}

/// What a file's `304` would have been as a `200`, for the compression that would have
/// applied to it to say the same `Vary` and `ETag` (a response extension).
#[derive(Debug, Clone, Copy)]
pub struct Unmodified {
    /// The file's media type.
    pub content_type: &'static str,
    /// Its length.
    pub len: u64,
}

/// The coding of `offered` (the server's, preferred first) that `accept` ranks highest,
/// ties going to the server's order; None for none acceptable (identity then).
/// RFC 9110 section 12.5.3: a coding not named is acceptable only through `*`, and
/// `q=0` refuses it; `x-gzip` is gzip.
pub fn negotiate(accept: Option<&HeaderValue>, offered: &[Coding]) -> Option<Coding> {
    let accept = accept?.to_str().ok()?;
    let mut named: [Option<u16>; 3] = [None; 3];
    let mut star = None;
    for item in accept.split(',') {
        let mut parts = item.split(';');
        let token = parts.next().unwrap_or_default().trim();
        if token.is_empty() {
            continue;
        }
        let q = parts
            .filter_map(|p| {
                let (k, v) = p.split_once('=')?;
                k.trim().eq_ignore_ascii_case("q").then(|| qvalue(v.trim()))
            })
            .next()
            .unwrap_or(Some(1000));
        let Some(q) = q else {
            // A malformed weight: that item is ignored.
            continue;
        };
        if token == "*" {
            star = Some(q);
            continue;
        }
        let coding = if token.eq_ignore_ascii_case("x-gzip") {
            Some(Coding::Gzip)
        } else {
            Coding::ALL
                .into_iter()
                .find(|c| token.eq_ignore_ascii_case(c.token()))
        };
        if let Some(c) = coding {
            let slot = &mut named[Coding::ALL.iter().position(|a| *a == c).expect("listed")];
            // Named twice: the higher weight (a client that lists a coding twice is
            // confused; neither reading is wrong).
            *slot = Some(slot.map_or(q, |old| old.max(q)));
        }
    }
    let mut best: Option<(Coding, u16)> = None;
    for &c in offered {
        let q = named[Coding::ALL.iter().position(|a| *a == c).expect("listed")]
            .or(star)
            .unwrap_or(0);
        if q > 0 && best.is_none_or(|(_, b)| q > b) {
            best = Some((c, q));
        }
    }
    best.map(|(c, _)| c)
}

/// A q-value (RFC 9110 section 12.4.2) in thousandths, or None if it is not one.
fn qvalue(v: &str) -> Option<u16> {
    let (whole, frac) = v.split_once('.').unwrap_or((v, ""));
    if frac.len() > 3 || !frac.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let thousandths = frac
        .bytes()
        .chain(std::iter::repeat(b'0'))
        .take(3)
        .fold(0u16, |n, d| n * 10 + u16::from(d - b'0'));
    match whole {
        "0" => Some(thousandths),
        "1" if thousandths == 0 => Some(1000),
        _ => None,
    }
}

/// `resp` with its body compressed in `coding`: `Content-Encoding` set, `Content-Length`
/// and `Accept-Ranges` dropped, its `ETag` weak.
fn compress(
    resp: Response<Body>,
    coding: Coding,
    levels: Levels,
    reserved: memory::Reserved,
) -> Response<Body> {
    let (mut parts, body) = resp.into_parts();
    let length = parts
        .headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok()?.parse::<u64>().ok());
    let etag = parts.headers.get(header::ETAG).cloned().or_else(|| {
        let PassedFields(p) = parts.extensions.get::<PassedFields>()?;
        HeaderValue::from_bytes(p.values_of(header::ETAG).next()?).ok()
    });
    // Digests of the content are of the uncompressed bytes: wrong for these.
    for name in [
        header::CONTENT_LENGTH,
        header::ACCEPT_RANGES,
        header::ETAG,
        header::HeaderName::from_static("content-digest"),
        header::HeaderName::from_static("repr-digest"),
        header::HeaderName::from_static("content-md5"),
    ] {
        parts.headers.remove(&name);
        if let Some(PassedFields(p)) = parts.extensions.get_mut::<PassedFields>() {
            p.remove(&name);
        }
    }
    if let Some(tag) = etag {
        parts.headers.insert(header::ETAG, tag);
        weaken_etag(&mut parts.headers);
    }
    parts
        .headers
        .insert(header::CONTENT_ENCODING, coding.header_value());
    stats::STATS.response(coding);
    let body = Body::stream(Compressed::new(
        body,
        coding,
        levels,
        length,
        Some(reserved),
    ));
    Response::from_parts(parts, body)
}

/// The `ETag` in `headers` made weak, if it is strong.
fn weaken_etag(headers: &mut hyper::HeaderMap) {
    let Some(tag) = headers.get(header::ETAG) else {
        return;
    };
    if tag.as_bytes().starts_with(b"W/") {
        return;
    }
    let mut weak = b"W/".to_vec();
    weak.extend_from_slice(tag.as_bytes());
    if let Ok(weak) = HeaderValue::from_bytes(&weak) {
        headers.insert(header::ETAG, weak);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chosen(accept: &str, offered: &[Coding]) -> Option<Coding> {
        negotiate(Some(&HeaderValue::from_str(accept).unwrap()), offered)
    }

    #[test]
    fn negotiation_follows_q_values_then_the_servers_order() {
        use Coding::*;
        let all = [Zstd, Brotli, Gzip];
        assert_eq!(chosen("gzip, deflate, br, zstd", &all), Some(Zstd));
        assert_eq!(chosen("gzip, deflate, br", &all), Some(Brotli));
        assert_eq!(chosen("gzip", &all), Some(Gzip));
        assert_eq!(chosen("GZIP", &all), Some(Gzip));
        assert_eq!(chosen("x-gzip", &all), Some(Gzip));
        assert_eq!(chosen("br;q=0.5, gzip;q=0.8", &all), Some(Gzip));
        assert_eq!(chosen("br;q=1.0, gzip;q=1", &all), Some(Brotli));
        assert_eq!(chosen("gzip;q=0", &all), None);
        assert_eq!(chosen("gzip;q=0.000", &all), None);
        assert_eq!(chosen("identity", &all), None);
        assert_eq!(chosen("", &all), None);
        assert_eq!(chosen("*", &all), Some(Zstd));
        assert_eq!(chosen("*;q=0.5, zstd;q=0", &all), Some(Brotli));
        assert_eq!(chosen("*;q=0", &all), None);
        assert_eq!(chosen("gzip, *;q=0", &[Zstd, Gzip]), Some(Gzip));
        // The server's order breaks ties.
        assert_eq!(chosen("gzip, br", &[Gzip, Brotli]), Some(Gzip));
        // Malformed weights are ignored, not read as 1.
        assert_eq!(chosen("br;q=2, gzip", &all), Some(Gzip));
        assert_eq!(chosen("br;q=0.5x, gzip;q=0.1", &all), Some(Gzip));
        assert_eq!(chosen("br;q=1.5", &all), None);
        // Only what the server offers.
        assert_eq!(chosen("br, zstd", &[Gzip]), None);
        assert_eq!(negotiate(None, &all), None);
    }

    #[test]
    fn q_values() {
        assert_eq!(qvalue("1"), Some(1000));
        assert_eq!(qvalue("1.000"), Some(1000));
        assert_eq!(qvalue("0.5"), Some(500));
        assert_eq!(qvalue("0.05"), Some(50));
        assert_eq!(qvalue("0"), Some(0));
        assert_eq!(qvalue("1.001"), None);
        assert_eq!(qvalue("0.1234"), None);
        assert_eq!(qvalue(".5"), None);
        assert_eq!(qvalue("-1"), None);
    }

    #[test]
    fn types_match_exactly_or_by_prefix_without_parameters() {
        let types: Vec<String> = DEFAULT_TYPES.iter().map(|t| t.to_string()).collect();
        assert!(compressible(b"text/html; charset=utf-8", &types));
        assert!(compressible(b"Text/CSS", &types));
        assert!(compressible(b"application/json", &types));
        assert!(!compressible(b"application/json-seq", &types));
        assert!(!compressible(b"image/png", &types));
        assert!(!compressible(b"application/octet-stream", &types));
    }
}
