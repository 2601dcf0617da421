//! Static files from a docroot, with the semantics nginx users expect: conditional
//! requests, single ranges, index files, 301 for a directory without its slash, 403 for
//! one without an index.
//!
//! Paths are percent-decoded once, then normalised; NUL bytes and paths above the root
//! are refused before any system call. Every file is then opened through [`docroot`]
//! (the kernel confines it beneath the root) by way of the worker's [`cache`].
//!
//! A file can have compressed copies beside it (`app.js.br`, `app.js.zst`, `app.js.gz`),
//! made when the site is built: where the server names their codings (`precompressed`),
//! a client that accepts one gets the copy, with the file's type, `Content-Encoding` and
//! its own validators, and no compression at request time (nginx's `gzip_static`,
//! Caddy's `precompressed`). A file that has copies says `Vary: Accept-Encoding`
//! whichever one is sent. A range is always of the file itself.

mod cache;
mod docroot;

use hyper::header::{self, HeaderMap, HeaderValue};
use hyper::{Method, Response, StatusCode};

use super::body::Body;
use super::compress::{self, Coding};
use super::mime::content_type;
use super::{error_response, ServerToken};
pub use cache::{Caching, FileCache};
use cache::{Content, Kind, Opened};
pub use docroot::DocRoot;

/// Where files come from: the docroot, the worker's cache and its limits, and the
/// codings whose precompressed copies are looked for beside a file (none: no look-up).
#[derive(Clone, Copy)]
pub struct Source<'a> {
    /// The route's docroot.
    pub root: &'a DocRoot,
    /// The worker's open-file cache.
    pub cache: &'a FileCache,
    /// What the cache may keep.
    pub caching: &'a Caching,
    /// The server's `precompressed` codings, preferred first.
    pub precompressed: &'a [Coding],
    /// The server's token, which its error pages end with.
    pub token: &'a ServerToken,
}

/// Answers a GET or HEAD for `raw_path` (the URI path, still percent-encoded) from `from`:
/// its errors are `from.token`'s pages; the `Server` field of the rest is the
/// responder's to set ([`ServerToken::sign`]).
pub fn serve(
    from: Source<'_>,
    method: &Method,
    raw_path: &str,
    headers: &HeaderMap,
) -> Response<Body> {
    let Source {
        root,
        cache,
        caching: settings,
        token,
        ..
    } = from;
    let Some((rel, wants_dir)) = normalise(raw_path) else {
        return error_response(StatusCode::BAD_REQUEST, method, token);
    };
    let found = match cache.open(root, &rel, settings) {
        Ok(f) => f,
        Err(errno) => return error_response(status_for(errno), method, token),
    };
    match found.kind {
        Kind::Dir if !wants_dir => {
            let mut resp = error_response(StatusCode::MOVED_PERMANENTLY, method, token);
            let location = format!("{raw_path}/");
            if let Ok(v) = HeaderValue::from_str(&location) {
                resp.headers_mut().insert(header::LOCATION, v);
            }
            resp
        }
        Kind::Dir => {
            let mut index = rel;
            if !index.is_empty() {
                index.push(b'/');
            }
            index.extend_from_slice(b"index.html");
            match cache.open(root, &index, settings) {
                Ok(f) if f.kind == Kind::File => file_or_copy(from, &f, &index, method, headers),
                // nginx without autoindex: a directory without index is forbidden.
                Ok(_) | Err(libc::ENOENT) => error_response(StatusCode::FORBIDDEN, method, token),
                Err(errno) => error_response(status_for(errno), method, token),
            }
        }
        Kind::Other => error_response(StatusCode::FORBIDDEN, method, token),
        // "/file.txt/": the kernel would say ENOTDIR.
        Kind::File if wants_dir => error_response(StatusCode::NOT_FOUND, method, token),
        Kind::File => file_or_copy(from, &found, &rel, method, headers),
    }
}

/// `file` (at `rel`), or the precompressed copy of it the client prefers.
fn file_or_copy(
    from: Source<'_>,
    file: &Opened,
    rel: &[u8],
    method: &Method,
    headers: &HeaderMap,
) -> Response<Body> {
    if from.precompressed.is_empty() {
        return file_response(file, rel, method, headers, from.token);
    }
    let mut copies: [Option<(Coding, std::rc::Rc<Opened>)>; 3] = [None, None, None];
    let mut name = rel.to_vec();
    for (slot, &coding) in copies.iter_mut().zip(from.precompressed) {
        name.truncate(rel.len());
        name.extend_from_slice(coding.suffix().as_bytes());
        *slot = match from.cache.open(from.root, &name, from.caching) {
            Ok(copy) if copy.kind == Kind::File => Some((coding, copy)),
            _ => None,
        };
    }
    let present: Vec<Coding> = copies.iter().flatten().map(|(c, _)| *c).collect();
    if present.is_empty() {
        return file_response(file, rel, method, headers, from.token);
    }
    let chosen = match headers.get(header::RANGE) {
        Some(_) => None,
        None => compress::negotiate(compress::accept_encoding(headers).as_ref(), &present),
    };
    let copy = chosen.and_then(|c| copies.iter().flatten().find(|(k, _)| *k == c));
    let mut resp = match copy {
        Some((coding, copy)) => {
            let mut resp = file_response(copy, rel, method, headers, from.token);
            // The copy's validators are its own: nothing to make of its 304 later.
            resp.extensions_mut().remove::<compress::Unmodified>();
            if resp.status().is_success() {
                resp.headers_mut().insert(
                    header::CONTENT_ENCODING,
                    HeaderValue::from_static(coding.token()),
                );
                // A range would be of the copy's bytes: only the file's are served.
                resp.headers_mut().remove(header::ACCEPT_RANGES);
            }
            resp
        }
        None => file_response(file, rel, method, headers, from.token),
    };
    compress::add_vary(&mut resp);
    resp
}

fn status_for(errno: i32) -> StatusCode {
    match errno {
        libc::ENOENT | libc::ENOTDIR | libc::ENAMETOOLONG => StatusCode::NOT_FOUND,
        // EXDEV: RESOLVE_BENEATH refused a path that leaves the root; ELOOP: a magic link.
        libc::EACCES | libc::EPERM | libc::EXDEV | libc::ELOOP => StatusCode::FORBIDDEN,
        _ => StatusCode::INTERNAL_SERVER_ERROR,
    }
}

/// Percent-decodes and normalises a URI path. Returns the path relative to the root and
/// whether it named a directory (trailing slash), or None for a path that is refused.
fn normalise(raw_path: &str) -> Option<(Vec<u8>, bool)> {
    if !raw_path.starts_with('/') {
        return None;
    }
    let decoded: Vec<u8> = percent_encoding::percent_decode_str(raw_path).collect();
    if decoded.contains(&0) {
        return None;
    }
    let wants_dir = decoded.ends_with(b"/");
    let mut segments: Vec<&[u8]> = Vec::new();
    for seg in decoded.split(|&b| b == b'/') {
        match seg {
            b"" | b"." => {}
            b".." => {
                segments.pop()?;
            }
            s => segments.push(s),
        }
    }
    Some((segments.join(&b'/'), wants_dir))
}

/// The byte range a `Range` header asks for, if it is one we honour.
enum RangeRequest {
    None,
    Satisfiable(u64, u64),
    Unsatisfiable,
}

fn parse_range(value: &str, len: u64) -> RangeRequest {
    let Some(spec) = value.trim().strip_prefix("bytes=") else {
        return RangeRequest::None;
    };
    if spec.contains(',') {
        // Multiple ranges: answering with the whole file is allowed (RFC 9110 14.2).
        return RangeRequest::None;
    }
    let Some((start, end)) = spec.trim().split_once('-') else {
        return RangeRequest::None;
    };
    let (start, end) = (start.trim(), end.trim());
    let range = if start.is_empty() {
        match end.parse::<u64>() {
            Ok(0) | Err(_) => return RangeRequest::Unsatisfiable,
            Ok(n) => (len.saturating_sub(n), len.saturating_sub(1)),
        }
    } else {
        let Ok(first) = start.parse::<u64>() else {
            return RangeRequest::None;
        };
        let last = if end.is_empty() {
            len.saturating_sub(1)
        } else {
            match end.parse::<u64>() {
                Ok(l) if l >= first => l.min(len.saturating_sub(1)),
                _ => return RangeRequest::None,
            }
        };
        (first, last)
    };
    if len == 0 || range.0 >= len {
        RangeRequest::Unsatisfiable
    } else {
        RangeRequest::Satisfiable(range.0, range.1)
    }
}

fn etag_matches(list: &str, tag: &str) -> bool {
    list.split(',').any(|t| {
        let t = t.trim();
        t == "*" || t.trim_start_matches("W/") == tag
    })
}

fn file_response(
    file: &Opened,
    name: &[u8],
    method: &Method,
    headers: &HeaderMap,
    token: &ServerToken,
) -> Response<Body> {
    let len = file.len;
    let tag = file.etag.to_str().unwrap_or_default();
    let last_modified = file.last_modified.to_str().unwrap_or_default();
    let header_str = |h: header::HeaderName| headers.get(h).and_then(|v| v.to_str().ok());

    let not_modified = match header_str(header::IF_NONE_MATCH) {
        Some(list) => etag_matches(list, tag),
        None => header_str(header::IF_MODIFIED_SINCE)
            .and_then(|d| httpdate::parse_http_date(d).ok())
            .is_some_and(|since| file.mtime <= since),
    };
    let mut builder = Response::builder()
        .header(header::LAST_MODIFIED, file.last_modified.clone())
        .header(header::ETAG, file.etag.clone());
    if not_modified {
        let mut resp = builder
            .status(StatusCode::NOT_MODIFIED)
            .body(Body::Empty)
            .expect("valid response");
        resp.extensions_mut().insert(compress::Unmodified {
            content_type: content_type(name),
            len,
        });
        return resp;
    }
    builder = builder
        .header(
            header::CONTENT_TYPE,
            HeaderValue::from_static(content_type(name)),
        )
        .header(header::ACCEPT_RANGES, "bytes");

    let range_applies = header_str(header::IF_RANGE).is_none_or(|v| v == tag || v == last_modified);
    let range = match header_str(header::RANGE) {
        Some(r) if range_applies => parse_range(r, len),
        _ => RangeRequest::None,
    };
    let (status, start, count) = match range {
        RangeRequest::None => (StatusCode::OK, 0, len),
        RangeRequest::Satisfiable(first, last) => {
            builder = builder.header(header::CONTENT_RANGE, format!("bytes {first}-{last}/{len}"));
            (StatusCode::PARTIAL_CONTENT, first, last - first + 1)
        }
        RangeRequest::Unsatisfiable => {
            let mut resp = error_response(StatusCode::RANGE_NOT_SATISFIABLE, method, token);
            resp.headers_mut().insert(
                header::CONTENT_RANGE,
                HeaderValue::from_str(&format!("bytes */{len}")).expect("ascii"),
            );
            return resp;
        }
    };
    builder = builder.status(status).header(header::CONTENT_LENGTH, count);
    let body = match &file.content {
        _ if method == Method::HEAD || count == 0 => Body::Empty,
        Content::Memory(bytes) => {
            Body::bytes(bytes.slice(start as usize..(start + count) as usize))
        }
        Content::Fd(fd) => Body::file_range(fd.clone(), start, count),
        Content::None => unreachable!("only files get a file response"),
    };
    builder.body(body).expect("valid response")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn normalise_refuses_escapes_and_nul() {
        assert_eq!(normalise("/a/b/../c"), Some((b"a/c".to_vec(), false)));
        assert_eq!(normalise("/a/./b/"), Some((b"a/b".to_vec(), true)));
        assert_eq!(normalise("/"), Some((Vec::new(), true)));
        assert_eq!(normalise("/../etc/passwd"), None);
        assert_eq!(normalise("/%2e%2e/etc/passwd"), None);
        assert_eq!(normalise("/a/%2E%2E%2F%2e%2e%2Fetc"), None);
        assert_eq!(normalise("/a%00.txt"), None);
        assert_eq!(normalise("relative"), None);
    }

    #[test]
    fn ranges() {
        assert!(matches!(
            parse_range("bytes=0-9", 100),
            RangeRequest::Satisfiable(0, 9)
        ));
        assert!(matches!(
            parse_range("bytes=90-", 100),
            RangeRequest::Satisfiable(90, 99)
        ));
        assert!(matches!(
            parse_range("bytes=-10", 100),
            RangeRequest::Satisfiable(90, 99)
        ));
        assert!(matches!(
            parse_range("bytes=50-500", 100),
            RangeRequest::Satisfiable(50, 99)
        ));
        assert!(matches!(
            parse_range("bytes=100-", 100),
            RangeRequest::Unsatisfiable
        ));
        assert!(matches!(
            parse_range("bytes=0-1,5-6", 100),
            RangeRequest::None
        ));
        assert!(matches!(parse_range("items=0-1", 100), RangeRequest::None));
        assert!(matches!(
            parse_range("bytes=0-", 0),
            RangeRequest::Unsatisfiable
        ));
    }

    #[test]
    fn etags() {
        assert!(etag_matches("\"a\", W/\"b\"", "\"b\""));
        assert!(etag_matches("*", "\"x\""));
        assert!(!etag_matches("\"a\"", "\"b\""));
    }
}
