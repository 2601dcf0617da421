//! HTTP for terminus: each protocol's codec without I/O and, beside it, its server side
//! over an established TLS stream (as Pingora's `protocols/http/v1|v2` and hyper's role
//! split): [`h1`] (heads and framing, shared with the proxy's upstream side and the load
//! generator's client; [`h1::server`], so that files can leave by sendfile), [`h2`]
//! (frames, HPACK, [`h2::server`]), [`h3`] ([`h3::server`] over terminus's QUIC).
//!
//! A connection reads requests and writes responses; a [`Responder`] answers them (the
//! server's application: files, redirects, the proxy). Every answer's `Server` field, the
//! connection's own refusals' too, comes from one [`ServerToken`]. Around that: request and
//! response bodies, one type each whatever the protocol ([`body`]); the request's host
//! and path settled against smuggling and path tricks ([`target`]); static files with
//! their open-file cache ([`files`], [`mime`]); the worker's lent buffers
//! ([`buffers`]); and what the proxy leaves on a response for the connection
//! ([`upstream`]).

pub mod body;
pub mod buffers;
pub mod compress;
pub mod files;
pub mod h1;
pub mod h2;
pub mod h3;
pub mod mime;
pub mod target;
pub mod upstream;

use std::borrow::Cow;
use std::future::Future;
use std::rc::Rc;

use hyper::header::{self, HeaderName, HeaderValue};
use hyper::{Method, Request, Response, StatusCode, Version};
use std::time::Duration;

use crate::h1::{Fields, PassedFields, RawHead};
use tokio::sync::watch;

pub use body::{Body, RequestBody};
pub use h1::server::{ReadReady, Transport};
pub use h2::server::Http2Trouble;
pub use upstream::{Upgrade, Upstreamed};

/// The `Server` field every answer carries unless its server says otherwise (the one
/// definition: the config's default for a server's `Server` is this).
pub const SERVER_TOKEN: HeaderValue = HeaderValue::from_static("terminus");

/// What terminus's own answers say of the server that made them: the `Server` field
/// (terminus's token, a `[[server]]`'s own, or none: `headers = { Server = ... }`) and
/// the last line of the built-in error pages, which names what `Server` names (nothing
/// without one: an operator who took the token out does not want the page to say it).
///
/// The one place answers get their `Server` field: a responder signs each of its
/// answers ([`ServerToken::sign`], an upstream's own field replaced), an error page is
/// signed as it is made ([`error_response`]), and a connection's own refusals, made
/// before a request reaches the responder, take [`Responder::server_token`]; what is
/// written as bytes (HTTP on a TLS port, HTTP/2's 431) takes [`ServerToken::field`].
#[derive(Debug, Clone)]
pub struct ServerToken {
    field: Option<HeaderValue>,
    /// The error pages' last line, the token HTML-escaped; empty without a token.
    footer: Cow<'static, str>,
}

/// terminus's own token: `Server: terminus`, and pages that end with `terminus`.
pub static TERMINUS: ServerToken = ServerToken {
    field: Some(SERVER_TOKEN),
    footer: Cow::Borrowed("<hr><center>terminus</center>\r\n"),
};

impl ServerToken {
    /// A server's token: `field` in `Server` and at the foot of its error pages; None:
    /// no `Server` field, and pages that name no server.
    pub fn new(field: Option<HeaderValue>) -> ServerToken {
        match field {
            Some(token) if token == SERVER_TOKEN => TERMINUS.clone(),
            Some(token) => {
                let text = String::from_utf8_lossy(token.as_bytes());
                let footer = format!("<hr><center>{}</center>\r\n", html_escaped(&text));
                ServerToken {
                    field: Some(token),
                    footer: Cow::Owned(footer),
                }
            }
            None => ServerToken {
                field: None,
                footer: Cow::Borrowed(""),
            },
        }
    }

    /// The `Server` field's value; None: no field.
    pub fn field(&self) -> Option<&HeaderValue> {
        self.field.as_ref()
    }

    /// `resp` with this `Server` field, or none, in place of any it had (a proxied
    /// application's own too, in the map or among the fields its head passed as bytes).
    /// terminus's token is a static value: setting it costs no allocation.
    pub fn sign(&self, resp: &mut Response<Body>) {
        if let Some(PassedFields(passed)) = resp.extensions_mut().get_mut::<PassedFields>() {
            passed.remove(&header::SERVER);
        }
        match &self.field {
            Some(token) => {
                resp.headers_mut().insert(header::SERVER, token.clone());
            }
            None => {
                resp.headers_mut().remove(header::SERVER);
            }
        }
    }
}

/// `text` with `&`, `<`, `>`, `"` and `'` as character references: safe in a page's
/// text and in a quoted attribute value (the error page, the admin status page).
pub fn html_escaped(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

/// Request bodies read and thrown away before answering, at most, by a route that takes
/// none (nginx reads such bodies too, so that the client sees a clean answer).
pub const DISCARD_LIMIT: u64 = 64 * 1024;

/// What answers requests: the connection reads a request, hands it here, and writes what
/// comes back, whatever the HTTP version.
pub trait Responder {
    /// Answers `req`. The body is the responder's to read as it likes; one it drops
    /// unread costs the client its HTTP/1.1 connection (after this answer) or its HTTP/2
    /// stream's remaining upload. `head` is the request's head as an HTTP/1.1 client sent
    /// it (HTTP/2 and HTTP/3 have none), for a proxy to pass on as bytes.
    fn respond(
        &self,
        req: Request<RequestBody>,
        head: Option<RawHead>,
    ) -> impl Future<Output = Response<Body>>;

    /// The token of the answers the connection makes itself, before a request reaches
    /// [`Responder::respond`] (a malformed or oversized head's 400 or 431, HTTP/3's 425,
    /// HTTP/2's 431): the server the connection is known to be for so far (its SNI's,
    /// else the default server's). What `respond` answers it signs itself, for the
    /// server the request turned out to be for.
    fn server_token(&self) -> &ServerToken;

    /// Notes a response as it is sent, the connection's own refusals of malformed
    /// requests included (metrics, access log). `target` is the request-target.
    fn record(&self, method: &Method, target: &str, version: Version, resp: &Response<Body>);

    /// Notes what an HTTP/2 client did that its connection refused or ended on (a
    /// metric).
    fn http2_trouble(&self, _trouble: Http2Trouble) {}
}

/// An HTTP connection's timeouts.
#[derive(Debug, Clone, Copy)]
pub struct Timeouts {
    /// A request's head from its first byte, and each read of its body.
    pub request_header: Duration,
    /// Between requests, and a response that makes no progress.
    pub keepalive: Duration,
}

/// The first value of `resp`'s field `name`, in its map or among the fields a proxied
/// HTTP/1.1 head passed as bytes ([`PassedFields`]).
pub fn field<'a>(resp: &'a Response<Body>, name: &HeaderName) -> Option<&'a [u8]> {
    if let Some(v) = resp.headers().get(name) {
        return Some(v.as_bytes());
    }
    let PassedFields(passed) = resp.extensions().get::<PassedFields>()?;
    passed.values_of(name.clone()).next()
}

/// Every value of `resp`'s field `name`, in its map and among a proxied head's passed
/// fields.
pub fn values<'a>(
    resp: &'a Response<Body>,
    name: &'a HeaderName,
) -> impl Iterator<Item = &'a [u8]> + 'a {
    let passed = resp
        .extensions()
        .get::<PassedFields>()
        .into_iter()
        .flat_map(move |PassedFields(p)| p.values_of(name.clone()));
    resp.headers()
        .get_all(name)
        .into_iter()
        .map(HeaderValue::as_bytes)
        .chain(passed)
}

/// Adds the field names of `vary` to `resp`'s `Vary`, those it does not name yet (a
/// response that varies by `*` already varies by everything).
pub fn vary_by(resp: &mut Response<Body>, vary: &HeaderValue) {
    let has = |name: &[u8]| {
        values(resp, &header::VARY).any(|v| {
            v.split(|&b| b == b',').any(|f| {
                let f = f.trim_ascii();
                f == b"*" || f.eq_ignore_ascii_case(name)
            })
        })
    };
    let missing: Vec<&[u8]> = vary
        .as_bytes()
        .split(|&b| b == b',')
        .map(<[u8]>::trim_ascii)
        .filter(|f| !f.is_empty() && !has(f))
        .collect();
    if missing.is_empty() {
        return;
    }
    if let Ok(v) = HeaderValue::from_bytes(&missing.join(&b", "[..])) {
        resp.headers_mut().append(header::VARY, v);
    }
}

/// Adds the field `name` to `resp` unless it has one (an upstream's own wins).
pub fn add_unless_present(resp: &mut Response<Body>, name: &HeaderName, value: &HeaderValue) {
    if field(resp, name).is_none() {
        resp.headers_mut().insert(name.clone(), value.clone());
    }
}

/// Answers `req` with `token`'s error page, its small body read away first (within
/// `within`).
pub async fn refuse(
    req: Request<RequestBody>,
    status: StatusCode,
    within: std::time::Duration,
    token: &ServerToken,
) -> Response<Body> {
    let method = req.method().clone();
    req.into_body().discard(DISCARD_LIMIT, within).await;
    error_response(status, &method, token)
}

/// A small HTML error page, nginx-style, ending with `token` and signed with it; HEAD
/// gets the headers only.
pub fn error_response(status: StatusCode, method: &Method, token: &ServerToken) -> Response<Body> {
    let reason = status.canonical_reason().unwrap_or("");
    let text = format!(
        "<html>\r\n<head><title>{code} {reason}</title></head>\r\n<body>\r\n<center><h1>{code} {reason}</h1></center>\r\n{footer}</body>\r\n</html>\r\n",
        code = status.as_u16(),
        footer = token.footer,
    );
    let len = text.len();
    let body = if method == Method::HEAD {
        Body::Empty
    } else {
        Body::bytes(text)
    };
    let mut resp = Response::builder()
        .status(status)
        .header(header::CONTENT_TYPE, "text/html; charset=utf-8")
        .header(header::CONTENT_LENGTH, len)
        .body(body)
        .expect("valid response");
    token.sign(&mut resp);
    resp
}

/// Answers plain HTTP that came to a TLS port as nginx does, with a 400 page that says
/// so, signed with `token` (the listener's default server's: no SNI, no Host read),
/// then closes: the write side at once, the read side once the client is done
/// sending (or by `deadline`), so that its unread request does not turn the close into a
/// reset that could destroy the answer before it is read.
pub async fn plain_http_refused(
    socket: &mut tokio::net::TcpStream,
    deadline: tokio::time::Instant,
    token: &ServerToken,
) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let text = format!(
        "<html>\r\n<head><title>400 The plain HTTP request was sent to HTTPS port</title></head>\r\n<body>\r\n<center><h1>400 Bad Request</h1></center>\r\n<center>The plain HTTP request was sent to HTTPS port</center>\r\n{}</body>\r\n</html>\r\n",
        token.footer
    );
    let mut page = b"HTTP/1.1 400 Bad Request\r\n".to_vec();
    if let Some(field) = token.field() {
        page.extend_from_slice(b"Server: ");
        page.extend_from_slice(field.as_bytes());
        page.extend_from_slice(b"\r\n");
    }
    page.extend_from_slice(
        format!(
            "Content-Type: text/html; charset=utf-8\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{text}",
            text.len()
        )
        .as_bytes(),
    );
    let sent = tokio::time::timeout_at(deadline, async {
        socket.write_all(&page).await?;
        socket.shutdown().await
    })
    .await;
    if !matches!(sent, Ok(Ok(()))) {
        return;
    }
    // What nginx's lingering close allows: a second, 64 KiB.
    let linger = deadline.min(tokio::time::Instant::now() + std::time::Duration::from_secs(1));
    let _ = tokio::time::timeout_at(linger, async {
        let mut sink = [0u8; 4096];
        let mut left: usize = 64 * 1024;
        while left > 0 {
            match socket.read(&mut sink).await? {
                0 => break,
                n => left = left.saturating_sub(n),
            }
        }
        std::io::Result::Ok(())
    })
    .await;
}

/// Serves plain HTTP/1.1 (no TLS) on `socket` with `responder` until the client is
/// done, the connection idles out, or `shutdown` fires.
pub async fn serve_plain<R: Responder>(
    socket: tokio::net::TcpStream,
    responder: &R,
    timeouts: Timeouts,
    mut shutdown: watch::Receiver<bool>,
) {
    h1::server::serve(socket, responder, timeouts, &mut shutdown).await
}

/// Serves HTTP on `stream` (HTTP/2 if `h2`, else HTTP/1.1) with `responder` until the
/// client is done, the connection idles out, or `shutdown` fires (then in-flight
/// requests finish and the connection closes).
pub async fn serve<S, R>(
    stream: S,
    h2: bool,
    responder: R,
    timeouts: Timeouts,
    mut shutdown: watch::Receiver<bool>,
) where
    S: Transport + ReadReady + 'static,
    R: Responder + 'static,
{
    if h2 {
        h2::server::serve(stream, Rc::new(responder), timeouts.keepalive, shutdown).await
    } else {
        h1::server::serve(stream, &responder, timeouts, &mut shutdown).await
    }
}
