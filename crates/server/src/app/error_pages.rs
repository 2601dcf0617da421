//! A server's error pages (nginx's `error_page`, Caddy's `handle_errors`, HAProxy's
//! `errorfile`): a file per status, read when the site loads, in place of the built-in
//! text of the errors terminus answers itself (404, 403, 421, 502, 503, 504 ...).
//! An upstream's own error responses are its to word and pass as they are, unless its
//! route says `intercept_errors` (nginx's `proxy_intercept_errors`).

use std::collections::HashMap;
use std::path::Path;

use bytes::Bytes;
use hyper::header::{self, HeaderValue};
use hyper::{Method, Response};

use terminus_http::body::Body;
use terminus_http::h1::{Fields, PassedFields};
use terminus_http::Upstreamed;

/// Pages larger than this are refused at load: an error page is a page, and each is held
/// in memory for the server's life.
pub const MAX_PAGE: u64 = 1024 * 1024;

/// One page: its bytes and their type.
#[derive(Debug, Clone)]
struct Page {
    body: Bytes,
    content_type: HeaderValue,
}

/// A server's pages by status.
#[derive(Debug, Clone, Default)]
pub struct ErrorPages(HashMap<u16, Page>);

/// Fields an intercepted upstream answer keeps: what a client needs to act on the error
/// (every value: a 401 may offer several challenges).
const KEPT: [header::HeaderName; 5] = [
    header::RETRY_AFTER,
    header::WWW_AUTHENTICATE,
    header::PROXY_AUTHENTICATE,
    header::ALLOW,
    header::CONTENT_RANGE,
];

impl ErrorPages {
    /// Whether there are none (then nothing need be asked).
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Reads each `(status, file)`; an error says which file and why.
    pub fn load<'a>(
        pages: impl IntoIterator<Item = (u16, &'a Path)>,
    ) -> Result<Self, (u16, String)> {
        let mut out = HashMap::new();
        for (status, path) in pages {
            let read = std::fs::metadata(path).and_then(|m| {
                if m.len() > MAX_PAGE {
                    Err(std::io::Error::other(format!(
                        "{} bytes, more than an error page's {MAX_PAGE}",
                        m.len()
                    )))
                } else {
                    std::fs::read(path)
                }
            });
            let body = read.map_err(|e| (status, format!("{}: {e}", path.display())))?;
            let name = path.as_os_str().as_encoded_bytes();
            out.insert(
                status,
                Page {
                    body: body.into(),
                    content_type: HeaderValue::from_static(terminus_http::mime::content_type(name)),
                },
            );
        }
        Ok(ErrorPages(out))
    }

    /// `resp` with its body the page for its status, if there is one and the answer is
    /// terminus's own (or `intercept` and the upstream's); else `resp` as it is.
    pub fn apply(&self, resp: Response<Body>, method: &Method, intercept: bool) -> Response<Body> {
        let Some(page) = self.0.get(&resp.status().as_u16()) else {
            return resp;
        };
        let upstreamed = resp.extensions().get::<Upstreamed>().cloned();
        if upstreamed.is_some() && !intercept {
            return resp;
        }
        let body = if method == Method::HEAD {
            Body::Empty
        } else {
            Body::bytes(page.body.clone())
        };
        let (mut parts, _) = resp.into_parts();
        if let Some(upstreamed) = upstreamed {
            // The upstream's answer goes (its body unread: the connection to it is not
            // kept), and its fields with it but for the few that say what to do next.
            let mut fresh = Response::builder()
                .status(parts.status)
                .body(())
                .expect("valid response")
                .into_parts()
                .0;
            for name in KEPT {
                let passed = parts
                    .extensions
                    .get::<PassedFields>()
                    .into_iter()
                    .flat_map(|PassedFields(p)| p.values_of(name.clone()))
                    .filter_map(|v| HeaderValue::from_bytes(v).ok());
                for v in parts.headers.get_all(&name).iter().cloned().chain(passed) {
                    fresh.headers.append(name.clone(), v);
                }
            }
            fresh.extensions.insert(upstreamed);
            parts = fresh;
        }
        for name in [
            header::CONTENT_ENCODING,
            header::ETAG,
            header::LAST_MODIFIED,
        ] {
            parts.headers.remove(name);
        }
        parts
            .headers
            .insert(header::CONTENT_TYPE, page.content_type.clone());
        parts
            .headers
            .insert(header::CONTENT_LENGTH, HeaderValue::from(page.body.len()));
        Response::from_parts(parts, body)
    }
}
