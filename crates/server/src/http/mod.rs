//! HTTP/1.1 and HTTP/2 (by ALPN) over an established TLS stream, with hyper.

pub mod body;
pub mod files;
mod mime;

use std::cell::Cell;
use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::rc::Rc;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use hyper::body::Incoming;
use hyper::header::{self, HeaderValue};
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::watch;

use crate::metrics::Metrics;
use crate::site::{Content, Site};
use body::Body;

const SERVER: HeaderValue = HeaderValue::from_static("terminus");

const BUILTIN_PAGE: &str = "<!DOCTYPE html>\n<html><head><title>terminus</title></head>\n<body><h1>terminus is serving HTTPS</h1>\n<p>This is the built-in page of the embedded default configuration. Give <code>--root DIR</code> or a config file to serve your own files.</p>\n</body></html>\n";

pub(crate) fn with_common_headers(mut resp: Response<Body>) -> Response<Body> {
    resp.headers_mut().insert(header::SERVER, SERVER);
    resp
}

/// A small HTML error page, nginx-style; HEAD gets the headers only.
pub(crate) fn error_response(status: StatusCode, method: &Method) -> Response<Body> {
    let reason = status.canonical_reason().unwrap_or("");
    let text = format!(
        "<html>\r\n<head><title>{code} {reason}</title></head>\r\n<body>\r\n<center><h1>{code} {reason}</h1></center>\r\n<hr><center>terminus</center>\r\n</body>\r\n</html>\r\n",
        code = status.as_u16()
    );
    let len = text.len();
    let body = if method == Method::HEAD {
        Body::Empty
    } else {
        Body::bytes(text)
    };
    let resp = Response::builder()
        .status(status)
        .header(header::CONTENT_TYPE, "text/html; charset=utf-8")
        .header(header::CONTENT_LENGTH, len)
        .body(body)
        .expect("valid response");
    with_common_headers(resp)
}

fn builtin_page(method: &Method, path: &str) -> Response<Body> {
    if path != "/" && path != "/index.html" {
        return error_response(StatusCode::NOT_FOUND, method);
    }
    let body = if method == Method::HEAD {
        Body::Empty
    } else {
        Body::bytes(BUILTIN_PAGE)
    };
    with_common_headers(
        Response::builder()
            .header(header::CONTENT_TYPE, "text/html; charset=utf-8")
            .header(header::CONTENT_LENGTH, BUILTIN_PAGE.len())
            .body(body)
            .expect("valid response"),
    )
}

/// What the request handler needs to know about its connection.
pub struct ConnectionInfo {
    pub site: Arc<Site>,
    pub sni: Option<String>,
    /// The virtual host SNI chose, fixed for the connection; without SNI each request's
    /// Host header chooses.
    pub sni_host: Option<usize>,
    pub peer: SocketAddr,
    pub metrics: Arc<Metrics>,
}

fn handle(req: &Request<Incoming>, info: &ConnectionInfo) -> Response<Body> {
    let method = req.method();
    if method != Method::GET && method != Method::HEAD {
        let mut resp = error_response(StatusCode::METHOD_NOT_ALLOWED, method);
        resp.headers_mut()
            .insert(header::ALLOW, HeaderValue::from_static("GET, HEAD"));
        return resp;
    }
    let index = info.sni_host.unwrap_or_else(|| {
        let host = req
            .headers()
            .get(header::HOST)
            .and_then(|h| h.to_str().ok())
            .or(req.uri().host())
            .map(|h| h.rsplit_once(':').map_or(h, |(name, _)| name));
        info.site.resolver.lookup(host)
    });
    let path = req.uri().path();
    match &info.site.hosts[index].content {
        Content::Files(root) => files::serve(root, method, path, req.headers()),
        Content::BuiltinPage => builtin_page(method, path),
    }
}

/// Request bodies read and thrown away before answering, at most.
const DISCARD_LIMIT: usize = 64 * 1024;

/// Reads and drops a request body nobody will use, as nginx does, so that clients see
/// a clean answer instead of a reset stream (HTTP/2) or a closed connection (HTTP/1.1).
/// Larger bodies are left unread: hyper then resets or closes, which bounds the work.
async fn discard_body(body: &mut Incoming) {
    use http_body_util::BodyExt;
    let mut seen = 0;
    while !hyper::body::Body::is_end_stream(body) && seen <= DISCARD_LIMIT {
        match body.frame().await {
            Some(Ok(frame)) => seen += frame.data_ref().map_or(0, |d| d.len()),
            _ => break,
        }
    }
}

/// Spawns HTTP/2 stream tasks on the worker's local task set.
#[derive(Clone, Copy)]
struct LocalExec;

impl<F: Future + 'static> hyper::rt::Executor<F> for LocalExec {
    fn execute(&self, fut: F) {
        tokio::task::spawn_local(fut);
    }
}

/// What the connection's timers need to know, shared by the I/O wrapper, the request
/// handler and [`drive`].
struct Activity {
    /// When bytes last moved in either direction (keep-alive idle timeout).
    last: Cell<Instant>,
    /// When the first byte of a request arrived whose headers are not complete yet
    /// (request header timeout, HTTP/1.1). None between requests and while one is served.
    header_started: Cell<Option<Instant>>,
    in_request: Cell<bool>,
    /// Wakes [`drive`] when a request starts, so its header deadline applies at once.
    request_began: tokio::sync::Notify,
}

impl Activity {
    fn new() -> Self {
        Self {
            last: Cell::new(Instant::now()),
            header_started: Cell::new(None),
            in_request: Cell::new(false),
            request_began: tokio::sync::Notify::new(),
        }
    }

    fn read(&self, n: usize) {
        let now = Instant::now();
        self.last.set(now);
        if n > 0 && !self.in_request.get() && self.header_started.get().is_none() {
            self.header_started.set(Some(now));
            self.request_began.notify_one();
        }
    }

    fn request_started(&self) {
        self.header_started.set(None);
        self.in_request.set(true);
    }

    fn request_done(&self) {
        self.in_request.set(false);
    }
}

/// The stream, feeding [`Activity`].
struct Tracked<T> {
    inner: T,
    activity: Rc<Activity>,
}

impl<T: AsyncRead + Unpin> AsyncRead for Tracked<T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let r = Pin::new(&mut self.inner).poll_read(cx, buf);
        if r.is_ready() {
            self.activity.read(buf.filled().len() - before);
        }
        r
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for Tracked<T> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let r = Pin::new(&mut self.inner).poll_write(cx, buf);
        if r.is_ready() {
            self.activity.last.set(Instant::now());
        }
        r
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let r = Pin::new(&mut self.inner).poll_write_vectored(cx, bufs);
        if r.is_ready() {
            self.activity.last.set(Instant::now());
        }
        r
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

/// Serves HTTP on `stream` until the client is done, the connection idles out, or
/// `shutdown` fires (then in-flight requests finish and the connection closes).
pub async fn serve<S>(
    stream: S,
    h2: bool,
    info: ConnectionInfo,
    mut shutdown: watch::Receiver<bool>,
) where
    S: AsyncRead + AsyncWrite + Unpin + 'static,
{
    let timeouts = info.site.timeouts;
    let activity = Rc::new(Activity::new());
    let io = TokioIo::new(Tracked {
        inner: stream,
        activity: activity.clone(),
    });
    let info = Rc::new(info);
    let service_activity = activity.clone();
    let service = hyper::service::service_fn(move |mut req: Request<Incoming>| {
        let info = info.clone();
        let activity = service_activity.clone();
        activity.request_started();
        async move {
            discard_body(req.body_mut()).await;
            let resp = handle(&req, &info);
            info.metrics.response(resp.status().as_u16());
            if let Some(log) = &info.site.access_log {
                let len = resp
                    .headers()
                    .get(header::CONTENT_LENGTH)
                    .and_then(|v| v.to_str().ok())
                    .unwrap_or("-");
                log.write(format_args!(
                    "{} \"{} {} {:?}\" {} {} \"{}\"",
                    info.peer,
                    req.method(),
                    // HTTP/2 requests carry an absolute URI; log what nginx's $request shows.
                    req.uri().path_and_query().map_or("/", |p| p.as_str()),
                    req.version(),
                    resp.status().as_u16(),
                    len,
                    info.sni.as_deref().unwrap_or("-"),
                ));
            }
            activity.request_done();
            Ok::<_, std::convert::Infallible>(resp)
        }
    });

    let conn: Pin<Box<dyn GracefulConnection>> = if h2 {
        Box::pin(
            hyper::server::conn::http2::Builder::new(LocalExec)
                .timer(TokioTimer::new())
                .serve_connection(io, service),
        )
    } else {
        Box::pin(
            // hyper's own header timer would also run while a keep-alive connection
            // waits for its next request; `drive` keeps the two timeouts apart.
            hyper::server::conn::http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(None)
                .keep_alive(true)
                .serve_connection(io, service),
        )
    };
    let header_timeout = (!h2).then_some(timeouts.request_header);
    drive(
        conn,
        &activity,
        timeouts.keepalive,
        header_timeout,
        &mut shutdown,
    )
    .await;
}

/// The part of hyper's h1/h2 connections we drive.
trait GracefulConnection: Future<Output = Result<(), hyper::Error>> {
    fn graceful_shutdown(self: Pin<&mut Self>);
}

impl<I, S> GracefulConnection for hyper::server::conn::http1::Connection<I, S>
where
    I: hyper::rt::Read + hyper::rt::Write + Unpin + 'static,
    S: hyper::service::HttpService<Incoming, ResBody = Body>,
{
    fn graceful_shutdown(self: Pin<&mut Self>) {
        hyper::server::conn::http1::Connection::graceful_shutdown(self)
    }
}

impl<I, S> GracefulConnection for hyper::server::conn::http2::Connection<I, S, LocalExec>
where
    I: hyper::rt::Read + hyper::rt::Write + Unpin + 'static,
    S: hyper::service::HttpService<Incoming, ResBody = Body> + 'static,
    S::Future: 'static,
{
    fn graceful_shutdown(self: Pin<&mut Self>) {
        hyper::server::conn::http2::Connection::graceful_shutdown(self)
    }
}

/// Runs the connection to completion, enforcing the keep-alive idle timeout (nothing
/// moved for `keepalive`), the request header timeout (a request's headers not complete
/// `header_timeout` after its first byte: dropped, as nginx does) and shutdown.
async fn drive(
    mut conn: Pin<Box<dyn GracefulConnection>>,
    activity: &Activity,
    keepalive: Duration,
    header_timeout: Option<Duration>,
    shutdown: &mut watch::Receiver<bool>,
) {
    // Set once the connection has been asked to close (idle or shutdown). Idle twice in a
    // row means the client ignores the close: drop it. The worker's shutdown grace
    // period bounds the rest.
    let mut closing = false;
    let mut shutdown_seen = false;
    loop {
        if !shutdown_seen && *shutdown.borrow() {
            shutdown_seen = true;
            if !closing {
                conn.as_mut().graceful_shutdown();
                closing = true;
            }
        }
        let idle_deadline = activity.last.get() + keepalive;
        let header_deadline = header_timeout
            .zip(activity.header_started.get())
            .map(|(t, s)| s + t);
        let deadline = header_deadline.map_or(idle_deadline, |h| h.min(idle_deadline));
        tokio::select! {
            result = conn.as_mut() => {
                if let Err(e) = result {
                    tracing::debug!("http connection ended: {e}");
                }
                return;
            }
            _ = activity.request_began.notified() => {}
            changed = shutdown.changed(), if !shutdown_seen => {
                // A dropped sender means the process is going away: treat it as shutdown.
                if changed.is_err() {
                    shutdown_seen = true;
                    conn.as_mut().graceful_shutdown();
                    closing = true;
                }
            }
            _ = tokio::time::sleep_until(deadline.into()) => {
                let now = Instant::now();
                if header_deadline.is_some_and(|h| h <= now) && activity.header_started.get().is_some() {
                    tracing::debug!("request header timeout");
                    return;
                }
                if activity.last.get() + keepalive > now {
                    continue;
                }
                if closing {
                    return;
                }
                conn.as_mut().graceful_shutdown();
                closing = true;
                activity.last.set(now);
            }
        }
    }
}
