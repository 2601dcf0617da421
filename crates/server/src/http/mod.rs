//! HTTP/1.1 and HTTP/2 (by ALPN) over an established TLS stream: HTTP/1.1 by [`h1`]
//! (so that files can leave by sendfile), HTTP/2 by hyper.

pub mod body;
pub mod files;
mod h1;
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
    /// The worker's open-file cache.
    pub files: Rc<files::FileCache>,
}

fn handle<B>(req: &Request<B>, info: &ConnectionInfo) -> Response<Body> {
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
        Content::Files(root) => files::serve(
            root,
            &info.files,
            &info.site.files,
            method,
            path,
            req.headers(),
        ),
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

/// When bytes last moved in either direction on an HTTP/2 connection (its keep-alive
/// idle timeout).
struct Activity {
    last: Cell<Instant>,
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
        if r.is_ready() && buf.filled().len() > before {
            self.activity.last.set(Instant::now());
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

/// Records a response in the metrics and the access log.
fn record(
    info: &ConnectionInfo,
    method: &Method,
    path: &str,
    version: hyper::Version,
    resp: &Response<Body>,
) {
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
            method,
            path,
            version,
            resp.status().as_u16(),
            len,
            info.sni.as_deref().unwrap_or("-"),
        ));
    }
}

/// Serves HTTP on `stream` until the client is done, the connection idles out, or
/// `shutdown` fires (then in-flight requests finish and the connection closes).
pub(crate) async fn serve<S>(
    stream: S,
    h2: bool,
    info: ConnectionInfo,
    mut shutdown: watch::Receiver<bool>,
) where
    S: h1::Transport + 'static,
{
    if !h2 {
        return h1::serve(stream, &info, &mut shutdown).await;
    }
    let keepalive = info.site.timeouts.keepalive;
    let activity = Rc::new(Activity {
        last: Cell::new(Instant::now()),
    });
    let io = TokioIo::new(Tracked {
        inner: stream,
        activity: activity.clone(),
    });
    let info = Rc::new(info);
    let service = hyper::service::service_fn(move |req: Request<Incoming>| {
        let info = info.clone();
        async move {
            let (parts, mut body) = req.into_parts();
            discard_body(&mut body).await;
            let req = Request::from_parts(parts, ());
            let resp = handle(&req, &info);
            // HTTP/2 requests carry an absolute URI; log what nginx's $request shows.
            let path = req.uri().path_and_query().map_or("/", |p| p.as_str());
            record(&info, req.method(), path, req.version(), &resp);
            Ok::<_, std::convert::Infallible>(resp)
        }
    });
    let conn = hyper::server::conn::http2::Builder::new(LocalExec)
        .timer(TokioTimer::new())
        .serve_connection(io, service);
    drive(Box::pin(conn), &activity, keepalive, &mut shutdown).await;
}

/// Runs an HTTP/2 connection to completion, enforcing the keep-alive idle timeout
/// (nothing moved for `keepalive`: GOAWAY) and shutdown (GOAWAY, in-flight streams
/// finish). Idle twice in a row means the client ignores the GOAWAY: dropped. The
/// worker's shutdown grace period bounds the rest.
async fn drive<C>(
    mut conn: Pin<Box<C>>,
    activity: &Activity,
    keepalive: Duration,
    shutdown: &mut watch::Receiver<bool>,
) where
    C: GracefulShutdown,
{
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
        tokio::select! {
            result = conn.as_mut() => {
                if let Err(e) = result {
                    tracing::debug!("http connection ended: {e}");
                }
                return;
            }
            changed = shutdown.changed(), if !shutdown_seen => {
                // A dropped sender means the process is going away: treat it as shutdown.
                if changed.is_err() {
                    shutdown_seen = true;
                    conn.as_mut().graceful_shutdown();
                    closing = true;
                }
            }
            _ = tokio::time::sleep_until(idle_deadline.into()) => {
                let now = Instant::now();
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

/// hyper's HTTP/2 connection, as [`drive`] sees it.
trait GracefulShutdown: Future<Output = Result<(), hyper::Error>> {
    fn graceful_shutdown(self: Pin<&mut Self>);
}

impl<I, S> GracefulShutdown for hyper::server::conn::http2::Connection<I, S, LocalExec>
where
    I: hyper::rt::Read + hyper::rt::Write + Unpin + 'static,
    S: hyper::service::HttpService<Incoming, ResBody = Body> + 'static,
    S::Future: 'static,
{
    fn graceful_shutdown(self: Pin<&mut Self>) {
        hyper::server::conn::http2::Connection::graceful_shutdown(self)
    }
}
