//! Routes: what answers a request once its virtual host is known, chosen by the longest
//! matching path prefix (nginx's prefix `location`s): files, the built-in page, or an
//! upstream the reverse proxy forwards to.

use std::sync::Arc;

use hyper::header::{self, HeaderValue};
use hyper::{Method, Request, Response, StatusCode};
use terminus_config::Access;
use terminus_http::compress::Compression;
use terminus_http::h1::RawHead;
use terminus_proxy::Upstream;

use super::ConnectionInfo;
use terminus_http::body::{Body, RequestBody};
use terminus_http::files::{self, DocRoot};
use terminus_http::{error_response, Responder, ServerToken, DISCARD_LIMIT};

const BUILTIN_PAGE: &str = "<!DOCTYPE html>\n<html><head><title>terminus</title></head>\n<body><h1>terminus is serving HTTPS</h1>\n<p>This is the built-in page of the embedded default configuration. Give <code>--root DIR</code> or a config file to serve your own files.</p>\n</body></html>\n";

/// What answers the requests a path prefix matches.
#[derive(Debug)]
pub enum Route {
    Files(DocRoot),
    /// The embedded default's page.
    BuiltinPage,
    /// Forwarded to an upstream, the path's prefix rewritten first where asked.
    Proxy {
        upstream: Arc<Upstream>,
        rewrite: Option<Rewrite>,
        /// The upstream's error statuses get the server's error pages.
        intercept_errors: bool,
    },
    /// Sent elsewhere: `to` with the request's placeholders filled in, and `status`.
    Redirect {
        to: String,
        status: StatusCode,
    },
}

/// What an upstream route's path prefix becomes before the upstream sees it (nginx's
/// `proxy_pass http://app/v2/;` in `location /api/`, Caddy's `uri strip_prefix`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rewrite {
    /// The route's prefix.
    pub from: String,
    /// What takes its place.
    pub to: String,
}

impl Rewrite {
    /// `path` (settled, as routing saw it) with `from` replaced by `to`; None if `path`
    /// does not start with `from`. `from` is matched as routing matches it, each
    /// segment's `;` parameters skipped: `/api;v=1/x` under `/api/` is `x` after it (the
    /// parameters of a segment that goes, go with it).
    pub fn apply(&self, path: &str) -> Option<String> {
        let (bytes, from) = (path.as_bytes(), self.from.as_bytes());
        let (mut i, mut j) = (0, 0);
        let skip_parameters = |mut i: usize| {
            while i < bytes.len() && bytes[i] != b'/' {
                i += 1;
            }
            i
        };
        while j < from.len() {
            match bytes.get(i) {
                Some(b';') => i = skip_parameters(i),
                Some(&b) if b == from[j] => (i, j) = (i + 1, j + 1),
                _ => return None,
            }
        }
        // A prefix that ends where its last segment does takes that segment's
        // parameters too.
        if bytes.get(i) == Some(&b';') && !self.from.ends_with('/') {
            i = skip_parameters(i);
        }
        Some(format!("{}{}", self.to, &path[i..]))
    }
}

/// A route and what goes with it.
#[derive(Debug)]
pub struct Entry {
    /// The path prefix it answers under.
    pub prefix: String,
    pub route: Route,
    /// Its own `access` rules, in place of its server's.
    pub access: Option<Access>,
    /// Its own `rate`, in place of its server's (`Some(None)`: none).
    pub rate: Option<Option<super::limits::RateRule>>,
    /// How its responses are compressed, if they are.
    pub compression: Option<Compression>,
}

impl Entry {
    /// `route` under `prefix`, with no rules of its own and no compression.
    pub fn new(prefix: impl Into<String>, route: Route) -> Self {
        Entry {
            prefix: prefix.into(),
            route,
            access: None,
            rate: None,
            compression: None,
        }
    }
}

/// A host's routes, longest prefix first.
#[derive(Debug)]
pub struct Routes(Vec<Entry>);

impl Routes {
    pub fn new(mut routes: Vec<Entry>) -> Self {
        routes.sort_by_key(|e| std::cmp::Reverse(e.prefix.len()));
        Routes(routes)
    }

    /// One route for every path.
    pub fn everything(route: Route) -> Self {
        Self::new(vec![Entry::new("/", route)])
    }

    /// The route whose prefix is the longest that `path` starts with, its segments' `;`
    /// parameters left out: Tomcat, Jetty and Spring strip them before they route, so
    /// `/admin;x/env` is their `/admin/env` and must be the `/admin/` route's here too,
    /// never the broader route beside it (which may send it to the same application).
    pub fn choose(&self, path: &str) -> Option<&Entry> {
        let path = without_parameters(path);
        self.0.iter().find(|e| path.starts_with(e.prefix.as_str()))
    }
}

/// `path` with each segment's `;` parameters (RFC 3986 section 3.3) removed; most paths
/// have none and are not copied.
fn without_parameters(path: &str) -> std::borrow::Cow<'_, str> {
    if !path.contains(';') {
        return std::borrow::Cow::Borrowed(path);
    }
    let mut out = String::with_capacity(path.len());
    for (i, segment) in path.split('/').enumerate() {
        if i > 0 {
            out.push('/');
        }
        out.push_str(segment.split(';').next().unwrap_or_default());
    }
    std::borrow::Cow::Owned(out)
}

impl Route {
    /// Answers `req` on the connection `cx`; `head` is its HTTP/1.1 head's bytes, if any
    /// (a proxied request passes them on).
    pub(crate) async fn respond(
        &self,
        req: Request<RequestBody>,
        head: Option<RawHead>,
        cx: &ConnectionInfo,
    ) -> Response<Body> {
        match self {
            // Boxed: forwarding's state is kilobytes, and held inline it would be moved,
            // whole, into every request's future (a file's or the page's too): three
            // copies of some 3.7 KB per request measured before.
            Route::Proxy {
                upstream, rewrite, ..
            } => {
                let mut req = req;
                if let Some(rewrite) = rewrite {
                    if let Err(status) = rewritten(&mut req, rewrite) {
                        return cx.refuse(req, status).await;
                    }
                }
                Box::pin(proxy(upstream, req, head, cx)).await
            }
            Route::Files(root) => {
                let from = files::Source {
                    root,
                    cache: &cx.files,
                    caching: &cx.site.files,
                    precompressed: &cx.site.hosts[cx.host].precompressed,
                    token: cx.server_token(),
                };
                answer_locally(req, cx, |method, path, headers| {
                    files::serve(from, method, path, headers)
                })
                .await
            }
            Route::BuiltinPage => {
                answer_locally(req, cx, |method, path, _| {
                    builtin_page(method, path, cx.server_token())
                })
                .await
            }
            Route::Redirect { to, status } => redirect(req, cx, to, *status).await,
        }
    }
}

/// `req` with its path's prefix rewritten, its query kept.
fn rewritten(req: &mut Request<RequestBody>, rewrite: &Rewrite) -> Result<(), StatusCode> {
    let uri = req.uri();
    // The route matched, so the prefix is there; a path it is not in is not ours to send.
    let path = rewrite
        .apply(uri.path())
        .ok_or(StatusCode::INTERNAL_SERVER_ERROR)?;
    let target = match uri.query() {
        Some(q) => format!("{path}?{q}"),
        None => path,
    };
    let mut parts = uri.clone().into_parts();
    parts.path_and_query = Some(target.try_into().map_err(|_| StatusCode::BAD_REQUEST)?);
    *req.uri_mut() = hyper::Uri::from_parts(parts).map_err(|_| StatusCode::BAD_REQUEST)?;
    Ok(())
}

/// Answers from terminus itself (files, the page): GET and HEAD only, and no body.
async fn answer_locally(
    req: Request<RequestBody>,
    cx: &ConnectionInfo,
    answer: impl FnOnce(&Method, &str, &hyper::HeaderMap) -> Response<Body>,
) -> Response<Body> {
    let (parts, body) = req.into_parts();
    // Neither files nor the page take a body: read a small one away (the connection
    // then stays usable), give up on a large one.
    body.discard(DISCARD_LIMIT, cx.site.timeouts.http.request_header)
        .await;
    let method = &parts.method;
    if method != Method::GET && method != Method::HEAD {
        let mut resp = error_response(StatusCode::METHOD_NOT_ALLOWED, method, cx.server_token());
        resp.headers_mut()
            .insert(header::ALLOW, HeaderValue::from_static("GET, HEAD"));
        return resp;
    }
    answer(method, parts.uri.path(), &parts.headers)
}

/// Forwards `req` to `upstream`; its failures become nginx's error pages (502, 503, 504).
async fn proxy(
    upstream: &Arc<Upstream>,
    req: Request<RequestBody>,
    head: Option<RawHead>,
    cx: &ConnectionInfo,
) -> Response<Body> {
    let method = req.method().clone();
    match terminus_proxy::forward(upstream, &cx.upstream_pool, req, head, &cx.origin).await {
        Ok(resp) => resp,
        Err(e) => {
            terminus_error::log(&e, Some(&cx.peer), "");
            error_response(e.status, &method, cx.server_token())
        }
    }
}

/// Answers `req` with `status` and a Location of `to`, its placeholders the request's:
/// `{uri}` the path and query, `{path}`, `{query}` (without `?`), `{host}` (nginx's
/// `return 301 https://new.example$request_uri`).
async fn redirect(
    req: Request<RequestBody>,
    cx: &ConnectionInfo,
    to: &str,
    status: StatusCode,
) -> Response<Body> {
    let (parts, body) = req.into_parts();
    body.discard(DISCARD_LIMIT, cx.site.timeouts.http.request_header)
        .await;
    let uri = &parts.uri;
    let path = uri.path();
    let query = uri.query().unwrap_or("");
    let path_and_query = uri.path_and_query().map_or(path, |p| p.as_str());
    // The settled host's name, without its port, lowercased (nginx's `$host`); a
    // request that named none was given its server's (`ConnectionInfo::default_host`)
    // where it has one.
    let named = uri
        .authority()
        .map(|a| a.host().to_owned())
        .or_else(|| {
            let host = parts.headers.get(header::HOST)?.to_str().ok()?;
            Some(
                host.parse::<hyper::http::uri::Authority>()
                    .ok()?
                    .host()
                    .to_owned(),
            )
        })
        .filter(|h| !h.is_empty());
    let host = match named {
        Some(name) => name.to_ascii_lowercase(),
        // No host to send the client to (the plain listener's answer too).
        None if to.contains("{host}") => {
            return error_response(StatusCode::BAD_REQUEST, &parts.method, cx.server_token())
        }
        None => String::new(),
    };
    let host = host.as_str();
    // One pass over `to`: what a placeholder brings in is never read as one.
    let mut location = String::with_capacity(to.len() + path_and_query.len());
    let mut rest = to;
    while let Some(open) = rest.find('{') {
        location.push_str(&rest[..open]);
        rest = &rest[open..];
        let (value, len) = [
            ("{uri}", path_and_query),
            ("{path}", path),
            ("{query}", query),
            ("{host}", host),
        ]
        .into_iter()
        .find(|(name, _)| rest.starts_with(name))
        .map_or(("{", 1), |(name, value)| (value, name.len()));
        push_encoded(&mut location, value);
        rest = &rest[len..];
    }
    location.push_str(rest);
    let Ok(location) = HeaderValue::try_from(location) else {
        return error_response(StatusCode::BAD_REQUEST, &parts.method, cx.server_token());
    };
    let mut resp = error_response(status, &parts.method, cx.server_token());
    resp.headers_mut().insert(header::LOCATION, location);
    resp
}

/// Appends `value` with its bytes outside ASCII percent-encoded (a Location is ASCII,
/// and a path or query can carry UTF-8).
fn push_encoded(out: &mut String, value: &str) {
    for c in value.chars() {
        if c.is_ascii() {
            out.push(c);
        } else {
            let mut bytes = [0u8; 4];
            for b in c.encode_utf8(&mut bytes).bytes() {
                out.push_str(&format!("%{b:02X}"));
            }
        }
    }
}

fn builtin_page(method: &Method, path: &str, token: &ServerToken) -> Response<Body> {
    if path != "/" && path != "/index.html" {
        return error_response(StatusCode::NOT_FOUND, method, token);
    }
    let body = if method == Method::HEAD {
        Body::Empty
    } else {
        Body::bytes(BUILTIN_PAGE)
    };
    Response::builder()
        .header(header::CONTENT_TYPE, "text/html; charset=utf-8")
        .header(header::CONTENT_LENGTH, BUILTIN_PAGE.len())
        .body(body)
        .expect("valid response")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_longest_prefix_wins() {
        let routes = Routes::new(vec![
            Entry::new("/", Route::BuiltinPage),
            Entry::new("/api/v2/", Route::BuiltinPage),
            Entry::new("/api/", Route::BuiltinPage),
        ]);
        let chosen = |path| routes.choose(path).map(|e| e.prefix.as_str());
        assert_eq!(chosen("/api/v2/x"), Some("/api/v2/"));
        assert_eq!(chosen("/api/v1"), Some("/api/"));
        assert_eq!(chosen("/api"), Some("/"));
        assert_eq!(chosen("/index.html"), Some("/"));
        // Matched without `;` parameters, as servers that strip them route.
        assert_eq!(chosen("/api;x/v2;y=1/z"), Some("/api/v2/"));
        assert_eq!(chosen("/api;jsessionid=1/x"), Some("/api/"));
        assert_eq!(chosen("/index.html;x"), Some("/"));
        let partial = Routes::new(vec![Entry::new("/only/", Route::BuiltinPage)]);
        assert!(partial.choose("/elsewhere").is_none());
    }

    #[test]
    fn a_rewrite_replaces_the_prefix_routing_matched() {
        let rewrite = |from: &str, to: &str, path: &str| {
            Rewrite {
                from: from.into(),
                to: to.into(),
            }
            .apply(path)
        };
        assert_eq!(
            rewrite("/api/", "/", "/api/users/7").as_deref(),
            Some("/users/7")
        );
        assert_eq!(rewrite("/api/", "/", "/api/").as_deref(), Some("/"));
        assert_eq!(
            rewrite("/api/", "/v2/", "/api/x?").as_deref(),
            Some("/v2/x?")
        );
        assert_eq!(rewrite("/api", "/v2", "/api/x").as_deref(), Some("/v2/x"));
        assert_eq!(rewrite("/api", "/v2", "/api").as_deref(), Some("/v2"));
        assert_eq!(rewrite("/api", "/v2", "/apix").as_deref(), Some("/v2x"));
        assert_eq!(rewrite("/", "/app/", "/x/y").as_deref(), Some("/app/x/y"));
        // Matched as routing matches, the parameters of the segments that go gone too.
        assert_eq!(
            rewrite("/api/", "/", "/api;v=1/x;p").as_deref(),
            Some("/x;p")
        );
        assert_eq!(
            rewrite("/api", "/v2", "/api;v=1/x").as_deref(),
            Some("/v2/x")
        );
        assert_eq!(rewrite("/a/b/", "/", "/a;1/b;2/c").as_deref(), Some("/c"));
        assert_eq!(rewrite("/api/", "/", "/other/x"), None);
        assert_eq!(rewrite("/api/", "/", "/ap"), None);
        // Whatever routing chose, the rewrite agrees that the prefix is there.
        let routes = Routes::new(vec![Entry::new("/api/", Route::BuiltinPage)]);
        for path in ["/api;x/y", "/api/;/z", "/api;a;b/c;d"] {
            let prefix = &routes.choose(path).unwrap().prefix;
            assert!(rewrite(prefix, "/", path).is_some(), "{path}");
        }
    }
}
