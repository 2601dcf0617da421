//! What a request asks for, settled once before it is routed, whatever its HTTP version:
//! the one host it names and its path in normal form. Routing, files and the proxy (which
//! sends the normal form upstream) all see the same two values, so a request cannot match
//! one route and mean another to an upstream that normalises differently
//! (`/api/../admin`). The access log keeps the request line as the client sent it.

use std::borrow::Cow;

use hyper::header::{self, HeaderValue};
use hyper::http::uri::{Authority, PathAndQuery};
use hyper::{Request, StatusCode, Uri, Version};

/// The request's one host (`.host()` is its name). Where the request names it in its target (HTTP/2's
/// `:authority`, HTTP/1.1's absolute form) and in a `Host` field that disagrees, the
/// field is rewritten to it, so that an upstream is told the host it was routed by. A request that names no
/// host, two, or two different ones is a 400 (RFC 9112 section 3.2, RFC 9113 section
/// 8.3.1).
pub fn settle_host<B>(req: &mut Request<B>) -> Result<Option<Authority>, StatusCode> {
    let mut fields = req.headers().get_all(header::HOST).iter();
    let field = fields.next();
    if fields.next().is_some() {
        return Err(StatusCode::BAD_REQUEST);
    }
    let field = match field {
        Some(v) => Some(authority(v.as_bytes())?),
        None => None,
    };
    // Every HTTP/1.1 request carries Host, the absolute form too (RFC 9112 section 3.2).
    if field.is_none() && req.version() == Version::HTTP_11 {
        return Err(StatusCode::BAD_REQUEST);
    }
    let host = match (req.uri().authority(), field) {
        // HTTP/2's :authority, or HTTP/1.1's absolute form (whose Host a proxy must
        // ignore and replace: RFC 9112 section 3.2.2). HTTP/2 and HTTP/3 with both must
        // agree (RFC 9113 section 8.3.1, RFC 9114 section 4.3.1).
        (Some(uri), field) => {
            let same = field
                .as_ref()
                .is_some_and(|f| f.as_str().eq_ignore_ascii_case(uri.as_str()));
            let multiplexed = matches!(req.version(), Version::HTTP_2 | Version::HTTP_3);
            if multiplexed && field.is_some() && !same {
                return Err(StatusCode::BAD_REQUEST);
            }
            let host = authority(uri.as_str().as_bytes())?;
            // Without a Host field the proxy names the authority itself.
            if field.is_some() && !same {
                let value =
                    HeaderValue::from_str(host.as_str()).map_err(|_| StatusCode::BAD_REQUEST)?;
                req.headers_mut().insert(header::HOST, value);
            }
            host
        }
        // The usual HTTP/1.1 request: its one Host stays as it is.
        (None, Some(field)) => field,
        // HTTP/1.0 may name none.
        (None, None) => return Ok(None),
    };
    Ok(Some(host))
}

/// A host field's value: `name[:port]`, no user information, no path.
fn authority(value: &[u8]) -> Result<Authority, StatusCode> {
    let parsed = Authority::try_from(value).map_err(|_| StatusCode::BAD_REQUEST)?;
    if parsed.as_str().contains('@') || parsed.host().is_empty() {
        return Err(StatusCode::BAD_REQUEST);
    }
    Ok(parsed)
}

/// Rewrites the request's path in normal form ([`normalise_path`]), its query kept.
pub fn settle_path<B>(req: &mut Request<B>) -> Result<(), StatusCode> {
    let path = req.uri().path();
    let normal = match normalise_path(path)? {
        Cow::Borrowed(_) => return Ok(()),
        Cow::Owned(p) => p,
    };
    let with_query = match req.uri().query() {
        Some(q) => format!("{normal}?{q}"),
        None => normal,
    };
    let mut parts = req.uri().clone().into_parts();
    parts.path_and_query =
        Some(PathAndQuery::try_from(with_query).map_err(|_| StatusCode::BAD_REQUEST)?);
    *req.uri_mut() = Uri::from_parts(parts).map_err(|_| StatusCode::BAD_REQUEST)?;
    Ok(())
}

/// A path in normal form, as nginx matches locations and RFC 3986 section 6.2.2 compares
/// URIs: percent-encoded unreserved characters decoded (`%7E` is `~`, `%2e` is `.`), other
/// escapes kept with upper-case hex, `.` and `..` segments resolved, runs of slashes
/// merged. A path that climbs above the root, a malformed escape or an encoded NUL is a
/// 400. Paths that are not absolute (`*`, an authority) are left alone: no route matches
/// them.
///
/// So are the paths whose segments mean one thing here and another behind us, since a
/// route is matched on this form and files and upstreams must see the same segments:
/// an encoded slash or backslash (`%2F`, `%5C`: a files route decodes them into
/// separators, as do many application servers; Apache's `AllowEncodedSlashes Off`), a
/// backslash itself (a separator to Windows and IIS-style servers), and a `.` or `..`
/// segment carrying `;` parameters (`..;`: Tomcat and Jetty strip the parameters and
/// then climb). All are 400s, so `/static/..%2F.env` cannot match `/static/` and read
/// beside it.
pub fn normalise_path(path: &str) -> Result<Cow<'_, str>, StatusCode> {
    if !path.starts_with('/') || already_normal(path.as_bytes()) {
        return Ok(Cow::Borrowed(path));
    }
    let bytes = path.as_bytes();
    let mut out: Vec<u8> = Vec::with_capacity(bytes.len());
    // Where each kept segment starts in `out` (its leading slash), to pop on `..`.
    let mut starts: Vec<usize> = Vec::new();
    let mut segment = Vec::new();
    let mut rest = &bytes[1..];
    loop {
        let end = rest.iter().position(|&b| b == b'/').unwrap_or(rest.len());
        let last = end == rest.len();
        segment.clear();
        decode_unreserved(&rest[..end], &mut segment)?;
        let before_parameters = segment.split(|&b| b == b';').next().unwrap_or_default();
        if segment.contains(&b';') && matches!(before_parameters, b"." | b"..") {
            return Err(StatusCode::BAD_REQUEST);
        }
        match segment.as_slice() {
            b"" | b"." => {}
            b".." => {
                let start = starts.pop().ok_or(StatusCode::BAD_REQUEST)?;
                out.truncate(start);
            }
            s => {
                starts.push(out.len());
                out.push(b'/');
                out.extend_from_slice(s);
            }
        }
        if last {
            // A trailing slash, `.` or `..` leaves the path naming a directory.
            if matches!(segment.as_slice(), b"" | b"." | b"..") {
                out.push(b'/');
            }
            break;
        }
        rest = &rest[end + 1..];
    }
    if out.is_empty() {
        out.push(b'/');
    }
    Ok(Cow::Owned(String::from_utf8(out).expect(
        "UTF-8 in, UTF-8 out: only ASCII escapes are decoded",
    )))
}

/// Whether `path` is already in normal form: no escape, no `.` or `..` segment, no run
/// of slashes, and nothing [`normalise_path`] must look at more closely (a backslash, a
/// `;`). Most paths are; they cost a pass and no allocation.
fn already_normal(path: &[u8]) -> bool {
    !path.iter().any(|b| matches!(b, b'%' | b'\\' | b';'))
        && !path.windows(2).any(|w| w == b"//")
        && path.split(|&b| b == b'/').all(|s| s != b"." && s != b"..")
}

/// Appends `segment` to `out` with its unreserved escapes decoded and the rest upper-cased.
/// A backslash, or an escape of one or of a slash, is refused (see [`normalise_path`]).
fn decode_unreserved(segment: &[u8], out: &mut Vec<u8>) -> Result<(), StatusCode> {
    let mut i = 0;
    while i < segment.len() {
        if segment[i] == b'\\' {
            return Err(StatusCode::BAD_REQUEST);
        }
        if segment[i] != b'%' {
            out.push(segment[i]);
            i += 1;
            continue;
        }
        let hex = |b: Option<&u8>| b.and_then(|&b| (b as char).to_digit(16));
        let (Some(hi), Some(lo)) = (hex(segment.get(i + 1)), hex(segment.get(i + 2))) else {
            return Err(StatusCode::BAD_REQUEST);
        };
        let byte = (hi * 16 + lo) as u8;
        if matches!(byte, 0 | b'/' | b'\\') {
            return Err(StatusCode::BAD_REQUEST);
        }
        if byte.is_ascii_alphanumeric() || b"-._~".contains(&byte) {
            out.push(byte);
        } else {
            out.push(b'%');
            out.extend_from_slice(format!("{byte:02X}").as_bytes());
        }
        i += 3;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn normal(path: &str) -> Result<String, StatusCode> {
        normalise_path(path).map(|p| p.into_owned())
    }

    #[test]
    fn paths_take_their_normal_form() {
        for (raw, want) in [
            ("/", "/"),
            ("/api/v1/users", "/api/v1/users"),
            ("/api/", "/api/"),
            ("/api/../admin", "/admin"),
            ("/api/./x", "/api/x"),
            ("//api///x//", "/api/x/"),
            ("/api/%2e%2e/admin", "/admin"),
            ("/api/%2E%2E/admin", "/admin"),
            ("/%7euser/%41%62", "/~user/Ab"),
            ("/a%20b", "/a%20b"),
            ("/a%3bb", "/a%3Bb"),
            ("/a;jsessionid=1/b", "/a;jsessionid=1/b"),
            ("/a/..x;y/b", "/a/..x;y/b"),
            ("/a/b/..", "/a/"),
            ("/a/.", "/a/"),
            ("/a/b/../../", "/"),
            ("*", "*"),
        ] {
            assert_eq!(normal(raw).as_deref(), Ok(want), "{raw}");
        }
    }

    #[test]
    fn a_path_above_the_root_or_a_bad_escape_is_refused() {
        for raw in [
            "/..",
            "/../etc/passwd",
            "/a/../../b",
            "/%2e%2e/x",
            "/a%zz",
            "/a%2",
            "/a%00b",
        ] {
            assert_eq!(normal(raw), Err(StatusCode::BAD_REQUEST), "{raw}");
        }
    }

    #[test]
    fn an_encoded_slash_a_backslash_or_a_climb_with_parameters_is_refused() {
        for raw in [
            "/a%2fb",
            "/static/..%2f.env",
            "/static/..%2F.env",
            "/static/%2e%2e%2f.env",
            "/static/..%5c.env",
            "/static/..%5C.env",
            "/static/..\\.env",
            "/static\\x",
            "/static/..;/admin",
            "/static/%2e%2e;x/admin",
            "/static/.;/x",
        ] {
            assert_eq!(normal(raw), Err(StatusCode::BAD_REQUEST), "{raw}");
        }
    }

    #[test]
    fn a_normal_path_is_not_copied() {
        assert!(matches!(
            normalise_path("/a/b/c.html"),
            Ok(Cow::Borrowed(_))
        ));
        assert!(matches!(normalise_path("/a/b/"), Ok(Cow::Borrowed(_))));
        assert!(matches!(normalise_path("/a//b"), Ok(Cow::Owned(_))));
    }

    fn request(version: Version, uri: &str, hosts: &[&str]) -> Request<()> {
        let mut req = Request::builder().version(version).uri(uri);
        for h in hosts {
            req = req.header(header::HOST, *h);
        }
        req.body(()).unwrap()
    }

    #[test]
    fn one_host_per_request() {
        let host = |mut req: Request<()>| {
            settle_host(&mut req).map(|h| (h.map(|a| a.host().to_owned()), req))
        };
        let (h, _) = host(request(Version::HTTP_11, "/", &["a.test:8443"])).unwrap();
        assert_eq!(h.as_deref(), Some("a.test"));
        for hosts in [
            &[][..],
            &["a.test", "a.test"],
            &["a@b.test"],
            &["a.test/x"],
            &[""],
        ] {
            let r = host(request(Version::HTTP_11, "/", hosts));
            assert_eq!(r.err(), Some(StatusCode::BAD_REQUEST), "{hosts:?}");
        }
        // The absolute form still needs Host in HTTP/1.1.
        let r = host(request(Version::HTTP_11, "https://b.test/x", &[]));
        assert_eq!(r.err(), Some(StatusCode::BAD_REQUEST));
        // HTTP/1.0 may leave Host out.
        assert_eq!(host(request(Version::HTTP_10, "/", &[])).unwrap().0, None);
        // The absolute form wins over Host, and Host is rewritten to it.
        let (h, req) = host(request(Version::HTTP_11, "https://b.test/x", &["a.test"])).unwrap();
        assert_eq!(h.as_deref(), Some("b.test"));
        assert_eq!(req.headers()[header::HOST], "b.test");
        // HTTP/2: :authority and Host must agree.
        let r = host(request(Version::HTTP_2, "https://b.test/x", &["a.test"]));
        assert_eq!(r.err(), Some(StatusCode::BAD_REQUEST));
        let (h, _) = host(request(Version::HTTP_2, "https://b.test/x", &["B.test"])).unwrap();
        assert_eq!(h.as_deref(), Some("b.test"));
    }
}
