//! HTTP/2 by hyper, on the worker's task set: each stream's request goes to the
//! responder with its body (hyper's flow control is the back-pressure), and the
//! connection closes with GOAWAY after `timeouts.keepalive` without traffic or on
//! shutdown. Extended CONNECT (RFC 8441) is on: a WebSocket the proxy accepted upstream
//! turns its stream into a tunnel to the upstream connection.

use std::cell::Cell;
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::rc::Rc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use hyper::body::Incoming;
use hyper::{Method, Request};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::watch;

use super::body::{Body, RequestBody};
use super::Responder;

/// Serves HTTP/2 on `stream` until the client is done, the connection idles out, or
/// `shutdown` fires (then in-flight streams finish and the connection closes).
pub(crate) async fn serve<S, R>(
    stream: S,
    responder: Rc<R>,
    keepalive: Duration,
    mut shutdown: watch::Receiver<bool>,
) where
    S: AsyncRead + AsyncWrite + Unpin + 'static,
    R: Responder + 'static,
{
    let activity = Rc::new(Activity {
        last: Cell::new(Instant::now()),
    });
    let io = TokioIo::new(Tracked {
        inner: stream,
        activity: activity.clone(),
    });
    let service = hyper::service::service_fn(move |mut req: Request<Incoming>| {
        let responder = responder.clone();
        async move {
            let (method, uri, version) = (req.method().clone(), req.uri().clone(), req.version());
            let upgrading = (method == Method::CONNECT).then(|| hyper::upgrade::on(&mut req));
            let mut resp = responder.respond(req.map(RequestBody::h2), None).await;
            if let Some(upgrading) = upgrading {
                let upgrade = resp.extensions_mut().remove::<terminus_proxy::Upgrade>();
                if let Some(upgrade) = upgrade.filter(|_| resp.status().is_success()) {
                    tokio::task::spawn_local(tunnel(upgrading, upgrade));
                }
            }
            // HTTP/2 requests carry an absolute URI; log what nginx's $request shows.
            let path = uri.path_and_query().map_or("/", |p| p.as_str());
            responder.record(&method, path, version, &resp);
            Ok::<_, std::convert::Infallible>(resp)
        }
    });
    let conn = hyper::server::conn::http2::Builder::new(LocalExec)
        .timer(TokioTimer::new())
        .enable_connect_protocol()
        .serve_connection(io, service);
    drive(Box::pin(conn), &activity, keepalive, &mut shutdown).await;
}

/// Carries a stream hyper has handed over after a 2xx to its CONNECT, to and from the
/// upstream connection the proxy opened for it.
async fn tunnel(upgrading: hyper::upgrade::OnUpgrade, upgrade: terminus_proxy::Upgrade) {
    let ended = match upgrading.await {
        Ok(stream) => upgrade
            .tunnel(&mut TokioIo::new(stream), &[])
            .await
            .map(drop),
        Err(e) => Err(io::Error::other(e)),
    };
    if let Err(e) = ended {
        tracing::debug!("HTTP/2 WebSocket stream ended: {e}");
    }
}

/// Spawns HTTP/2 stream tasks on the worker's local task set.
#[derive(Clone, Copy)]
struct LocalExec;

impl<F: Future + 'static> hyper::rt::Executor<F> for LocalExec {
    fn execute(&self, fut: F) {
        // Boxed: hyper's stream futures are kilobytes (the server's some 5 KB), and a
        // spawned future is moved by value three times on its way into its task.
        tokio::task::spawn_local(Box::pin(fut));
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
