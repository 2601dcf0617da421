//! HTTP/2 to upstream servers, over TLS (ALPN `h2`) or in cleartext (h2c with prior
//! knowledge, what gRPC backends often speak): one connection per server per worker, multiplexing every request to it, driven
//! by hyper's client on the worker's own event loop. Bodies stream both ways with h2's
//! flow control as back-pressure, trailers included (gRPC's status travels in them).

use std::cell::RefCell;
use std::collections::HashMap;
use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::Bytes;
use hyper::body::{Body, Frame, Incoming, SizeHint};
use hyper::client::conn::http2::{self, SendRequest};
use hyper::header::{self, HeaderValue};
use hyper::{Request, Response, Uri};
use hyper_util::rt::TokioIo;

use crate::connect::{connect, Stream};
use crate::forward::Attempt;
use crate::headers::remove_hop_by_hop;
use crate::http1::{Failed, Stale};
use crate::metrics::{Failure, Phase};
use crate::stall::Stall;
use crate::upstream::InProgress;
use terminus_http::Upstreamed;

/// Runs hyper's connection tasks on the worker's `LocalSet`: nothing here is `Send`.
#[derive(Clone, Copy)]
pub(crate) struct LocalExec;

impl<F: Future + 'static> hyper::rt::Executor<F> for LocalExec {
    fn execute(&self, fut: F) {
        // Boxed: hyper's stream futures are kilobytes (the server's some 5 KB), and a
        // spawned future is moved by value three times on its way into its task.
        tokio::task::spawn_local(Box::pin(fut));
    }
}

/// One worker's HTTP/2 connections, one per server of each upstream (by upstream id).
#[derive(Default)]
pub(crate) struct Connections(
    RefCell<HashMap<(u64, SocketAddr), SendRequest<terminus_http::Body>>>,
);

impl std::fmt::Debug for Connections {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} h2 connections", self.0.borrow().len())
    }
}

impl Connections {
    /// The open connection for `key` that can take another stream, if there is one.
    fn open(&self, key: (u64, SocketAddr)) -> Option<SendRequest<terminus_http::Body>> {
        let mut conns = self.0.borrow_mut();
        match conns.get(&key) {
            Some(send) if !send.is_closed() => Some(send.clone()),
            Some(_) => {
                conns.remove(&key);
                None
            }
            None => None,
        }
    }
}

/// Sends one request to server `progress.server` over HTTP/2, on the worker's connection
/// to it (made first if there is none).
pub(crate) async fn send<B>(
    conns: &Connections,
    parts: &hyper::http::request::Parts,
    body: B,
    progress: InProgress,
    attempt: &Attempt,
) -> Result<Response<terminus_http::Body>, Failed<B>>
where
    B: Body<Data = Bytes, Error = io::Error> + 'static,
{
    let server = progress.server();
    let (address, metrics) = (server.spec.address, server.metrics.clone());
    let fail = |failure, detail: String, body| Failed {
        failure: Some(failure),
        detail,
        body,
        stale: None,
    };
    let tls = progress.upstream.spec.tls.as_ref();
    let key = (progress.upstream.id, address);
    let (mut send, reused) = match conns.open(key) {
        Some(send) => (send, true),
        None => {
            let connected = Instant::now();
            let stream = match connect(&server.spec, tls, attempt.timeouts.connect).await {
                Ok((stream, _)) => stream,
                Err(failed) => return Err(fail(failed.failure, failed.detail, Some(body))),
            };
            let (send, conn) = match tokio::time::timeout(
                attempt.timeouts.connect,
                handshake::<terminus_http::Body>(stream),
            )
            .await
            {
                Ok(Ok(pair)) => pair,
                Ok(Err(e)) => {
                    return Err(fail(
                        Failure::ConnectError,
                        format!("h2 handshake: {e}"),
                        Some(body),
                    ))
                }
                Err(_) => {
                    return Err(fail(
                        Failure::ConnectTimeout,
                        "h2 handshake timed out".into(),
                        Some(body),
                    ))
                }
            };
            tokio::task::spawn_local(async move {
                if let Err(e) = conn.await {
                    tracing::debug!(%address, "upstream h2 connection ended: {e}");
                }
            });
            metrics.latency(Phase::Connect, connected.elapsed());
            conns.0.borrow_mut().insert(key, send.clone());
            (send, false)
        }
    };
    metrics.connection(reused);
    if send.ready().await.is_err() {
        conns.0.borrow_mut().remove(&key);
        return Err(Failed {
            stale: reused.then_some(Stale::Unsent),
            ..fail(
                Failure::Closed,
                "the h2 connection closed".into(),
                Some(body),
            )
        });
    }

    let mut req = Request::new(terminus_http::Body::stream(body));
    *req.method_mut() = parts.method.clone();
    *req.uri_mut() = h2_uri(parts, tls.is_some());
    *req.headers_mut() = parts.headers.clone();
    // The authority travels as :authority; `te: trailers` is the one TE h2 allows, and
    // gRPC servers want it.
    req.headers_mut().remove(header::HOST);
    req.headers_mut().remove(header::TRANSFER_ENCODING);
    if attempt.trailers {
        req.headers_mut()
            .insert(header::TE, HeaderValue::from_static("trailers"));
    }
    let sent = Instant::now();
    let resp = match tokio::time::timeout(attempt.timeouts.response_header, send.send_request(req))
        .await
    {
        Ok(Ok(resp)) => resp,
        Ok(Err(e)) => {
            // hyper gives the body back only when the request was never sent.
            let detail = format!("h2 request: {e}");
            let failure = if e.is_timeout() {
                Failure::ResponseTimeout
            } else {
                Failure::Io
            };
            return Err(Failed {
                failure: Some(failure),
                detail,
                body: None,
                stale: None,
            });
        }
        Err(_) => {
            return Err(Failed {
                failure: Some(Failure::ResponseTimeout),
                detail: format!(
                    "no response head within {:?}",
                    attempt.timeouts.response_header
                ),
                body: None,
                stale: None,
            })
        }
    };
    let header_time = sent.elapsed();
    metrics.latency(Phase::ResponseHeader, header_time);
    metrics.response(resp.status().as_u16());
    let (mut parts, incoming) = resp.into_parts();
    remove_hop_by_hop(&mut parts.headers);
    parts.extensions.insert(Upstreamed {
        server: address,
        status: parts.status.as_u16(),
        header_time,
    });
    let body = terminus_http::Body::stream(H2Body {
        incoming,
        progress: Some(progress),
        started: attempt.started,
        stall: Stall::new(attempt.timeouts.idle),
    });
    Ok(Response::from_parts(parts, body))
}

/// The HTTP/2 handshake on a new connection to a server; the connection's task runs on
/// the worker's event loop until the connection ends.
pub(crate) async fn handshake<B>(stream: Stream) -> hyper::Result<(SendRequest<B>, Driven<B>)>
where
    B: Body + 'static,
    B::Data: Send,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    http2::Builder::new(LocalExec)
        .timer(hyper_util::rt::TokioTimer::new())
        .keep_alive_interval(Some(Duration::from_secs(30)))
        .handshake::<_, B>(TokioIo::new(stream))
        .await
}

/// A client connection's task, to be spawned.
pub(crate) type Driven<B> = http2::Connection<TokioIo<Stream>, B, LocalExec>;

/// `https://authority/path` (`http://` in cleartext): hyper's h2 client takes :scheme and
/// :authority from the URI, the authority from `Host` (which the prepared fields always
/// carry when the client named one).
fn h2_uri(parts: &hyper::http::request::Parts, tls: bool) -> Uri {
    let authority = parts
        .headers
        .get(header::HOST)
        .and_then(|h| h.to_str().ok())
        .unwrap_or("localhost");
    let path = parts.uri.path_and_query().map_or("/", |p| p.as_str());
    Uri::builder()
        .scheme(if tls { "https" } else { "http" })
        .authority(authority)
        .path_and_query(path)
        .build()
        .unwrap_or_else(|_| Uri::from_static("/"))
}

/// A response body from an h2 upstream; the request counts as in progress until it ends,
/// or until the stream has sent nothing for `timeouts.idle` (as over HTTP/1.1).
pub(crate) struct H2Body {
    incoming: Incoming,
    progress: Option<InProgress>,
    started: Instant,
    stall: Stall,
}

impl Body for H2Body {
    type Data = Bytes;
    type Error = io::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, io::Error>>> {
        let polled = Pin::new(&mut self.incoming).poll_frame(cx);
        match &polled {
            Poll::Ready(Some(Ok(frame))) => {
                self.stall.progressed();
                if let (Some(p), Some(data)) = (&self.progress, frame.data_ref()) {
                    p.server().metrics.received(data.len() as u64);
                }
            }
            Poll::Ready(None) => {
                if let Some(p) = self.progress.take() {
                    p.server()
                        .metrics
                        .latency(Phase::Total, self.started.elapsed());
                    p.upstream.succeeded(p.server);
                }
            }
            Poll::Ready(Some(Err(e))) => {
                if let Some(p) = self.progress.take() {
                    p.upstream.failed(p.server, Failure::Io);
                    tracing::warn!(upstream = %p.upstream.name(), server = %p.server().spec.address, "upstream h2 response broken off: {e}");
                }
            }
            Poll::Pending if self.stall.expired(cx) => {
                let idle = self.stall.idle();
                if let Some(p) = self.progress.take() {
                    p.upstream.failed(p.server, Failure::IdleTimeout);
                    tracing::warn!(upstream = %p.upstream.name(), server = %p.server().spec.address, "upstream h2 response stalled: no body bytes for {idle:?}");
                }
                let stalled = format!("no body bytes for {idle:?}");
                return Poll::Ready(Some(Err(io::Error::new(io::ErrorKind::TimedOut, stalled))));
            }
            Poll::Pending => {}
        }
        polled
            .map(|f| f.map(|r| r.map_err(|e| io::Error::new(io::ErrorKind::ConnectionAborted, e))))
    }

    fn is_end_stream(&self) -> bool {
        self.incoming.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.incoming.size_hint()
    }
}
