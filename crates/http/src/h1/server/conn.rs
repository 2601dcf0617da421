//! One HTTP/1.1 connection: requests read with their deadlines, each handed to the
//! responder with its body fed as it asks, responses written, keep-alive and shutdown.
//! A responder that answers while it still reads the body (a proxied upstream streaming
//! its answer to an upload) keeps being fed as the answer goes out: full duplex, on the
//! connection's two halves, and the connection closes after it.

use std::task::Poll;
use std::time::{Duration, Instant};

use hyper::body::SizeHint;
use hyper::{Method, Request, Response, StatusCode, Uri, Version};
use std::future::Future;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};
use tokio::sync::watch;

use super::request_body::feed;
use super::respond::{respond, Answering};
use super::{ReadReady, Transport};
use crate::body::{Body, Feed, RequestBody};
use crate::h1::{
    expects_continue, parse_request_head, request_framing, wants_keep_alive, Decoder, Framing,
    RawHead, MAX_HEAD,
};
use crate::Timeouts;
use crate::{buffers, error_response, Responder};

/// What reading the next request gave.
enum Next {
    /// The request, and its head's bytes for a proxy to pass on.
    Request(Box<(Request<()>, RawHead)>),
    /// The client is gone, idle too long, or the server is shutting down between requests.
    Closed,
    /// A request the server answers with this status and then closes.
    Reject(StatusCode),
}

/// Serves HTTP/1.1 on `io` until the client is done, a timeout, an error or shutdown.
pub async fn serve<S: Transport + ReadReady, R: Responder>(
    mut io: S,
    responder: &R,
    timeouts: Timeouts,
    shutdown: &mut watch::Receiver<bool>,
) {
    let mut buf: Vec<u8> = Vec::new();
    let mut idle_since = Instant::now();
    // The connection ends with some of a request body unread.
    let mut unread_body = false;
    loop {
        // What a request holds (the responder's future, the response's) lives on the
        // heap for the request's time only: between requests the connection's future
        // keeps just what waits for the next one.
        let after = match read_request(&mut io, &mut buf, idle_since, &timeouts, shutdown).await {
            Next::Request(request) => {
                Box::pin(exchange(
                    &mut io, responder, *request, &mut buf, &timeouts, shutdown,
                ))
                .await
            }
            Next::Closed => break,
            Next::Reject(status) => {
                let request = (&Method::GET, "-", Version::HTTP_11);
                let scratch = &mut Vec::new();
                Box::pin(refuse(
                    &mut io, responder, request, status, scratch, &timeouts,
                ))
                .await;
                break;
            }
        };
        match after {
            After::Next => idle_since = Instant::now(),
            After::Close {
                unread_body: unread,
            } => {
                unread_body = unread;
                break;
            }
            After::Abort => return,
        }
    }
    // close_notify, then FIN; a client that does not read gets a second to take it.
    let _ = tokio::time::timeout(Duration::from_secs(1), io.shutdown()).await;
    if unread_body {
        linger(&mut io).await;
    }
}

/// What a request leaves its connection to do.
enum After {
    /// Wait for the next request.
    Next,
    /// Close, lingering first if the client may still be sending (`unread_body`).
    Close { unread_body: bool },
    /// Drop the connection: its response could not be completed.
    Abort,
}

/// One request: the responder's answer, written; `buf` holds what was read past it. The
/// rare paths (a refusal, a body still coming in, an upgrade's tunnel) are boxed apart:
/// inline they would size, and be copied with, every request's boxed exchange.
async fn exchange<S: Transport + AsyncRead, R: Responder>(
    io: &mut S,
    responder: &R,
    (req, head): (Request<()>, RawHead),
    buf: &mut Vec<u8>,
    timeouts: &Timeouts,
    shutdown: &watch::Receiver<bool>,
) -> After {
    // The response's head and chunk framing: the request's, gone with it.
    let scratch = &mut Vec::new();
    let (method, uri, version) = (req.method().clone(), req.uri().clone(), req.version());
    let framing = match request_framing(req.headers(), version) {
        Ok(framing) => framing,
        Err(status) => {
            let request = (&method, path_of(&uri), version);
            Box::pin(refuse(io, responder, request, status, scratch, timeouts)).await;
            return After::Close { unread_body: false };
        }
    };
    let keep_alive = wants_keep_alive(&req);
    let mut decoder = Decoder::new(framing);
    let exchange = Exchange {
        framing,
        expect_continue: framing != Framing::None && expects_continue(&req),
        stall: timeouts.request_header,
    };
    let (mut resp, feed) = exchange
        .run(io, buf, &mut decoder, (req, head), responder)
        .await;
    responder.record(&method, path_of(&uri), version, &resp);
    // A 101 from an upstream: after its head the connection is the upstream's.
    let upgrade = (resp.status() == StatusCode::SWITCHING_PROTOCOLS)
        .then(|| resp.extensions_mut().remove::<crate::Upgrade>())
        .flatten();
    let answering = Answering {
        head_only: method == Method::HEAD,
        http10: version == Version::HTTP_10,
        // A body the responder left unread cannot be told from the next request
        // without reading it: the connection ends with this answer, and so it does
        // after terminus refused a request as malformed (its own 400, as nginx; an
        // upstream's 400 is the application's business). An upgrade says its own
        // Connection.
        keep_alive: upgrade.is_some()
            || keep_alive
                && decoder.is_done()
                && !refused_as_malformed(&resp)
                && !*shutdown.borrow(),
    };
    // Still wanted: the body goes on while the answer goes out (and keep_alive is
    // off, the body not being done).
    let duplex = feed.filter(|f| !f.is_closed() && !decoder.is_done() && upgrade.is_none());
    let responded = match duplex {
        Some(feed) => {
            let feeding = (&mut *buf, &mut decoder, &feed, timeouts.request_header);
            Box::pin(respond_duplex(
                io,
                resp,
                answering,
                scratch,
                timeouts.keepalive,
                feeding,
            ))
            .await
        }
        None => respond(io, resp, answering, scratch, timeouts.keepalive).await,
    };
    match responded {
        Ok(true) => {}
        Ok(false) => {
            return After::Close {
                unread_body: !decoder.is_done(),
            }
        }
        Err(e) => {
            tracing::debug!("response not completed: {e}");
            return After::Abort;
        }
    }
    if let Some(upgrade) = upgrade {
        if let Err(e) = Box::pin(upgrade.tunnel(io, buf)).await {
            tracing::debug!("upgraded connection ended: {e}");
        }
        return After::Close { unread_body: false };
    }
    After::Next
}

/// Reads away what a client still sends after its answer and our close (the rest of a
/// body nobody wanted), until it closes too, for a second and a megabyte at most: closing
/// a socket with unread bytes resets the connection, and a reset can destroy the end of
/// the answer before the client has read it (nginx's lingering close).
async fn linger<S: AsyncRead + Unpin>(io: &mut S) {
    const MOST: usize = 1 << 20;
    let drain = async {
        // On the heap: an array here would be part of every connection's future, idle
        // or not, for the rare connection that lingers.
        let mut away = vec![0u8; 16 * 1024];
        let mut read = 0;
        while read < MOST {
            match io.read(&mut away).await {
                Ok(0) | Err(_) => return,
                Ok(n) => read += n,
            }
        }
    };
    let _ = tokio::time::timeout(Duration::from_secs(1), drain).await;
}

/// One request handed to the responder, with its body.
struct Exchange {
    framing: Framing,
    expect_continue: bool,
    /// How long each read of the body may take.
    stall: Duration,
}

impl Exchange {
    /// Runs the responder, feeding it the body as it reads it, until it answers; with the
    /// answer, the body's feed while the body goes on.
    async fn run<S: Transport + AsyncRead, R: Responder>(
        self,
        io: &mut S,
        buf: &mut Vec<u8>,
        decoder: &mut Decoder,
        (req, head): (Request<()>, RawHead),
        responder: &R,
    ) -> (Response<Body>, Option<Feed>) {
        if decoder.is_done() {
            let req = req.map(|()| RequestBody::empty());
            let resp = responder.respond(req, Some(head)).await;
            return (resp, None);
        }
        let hint = match self.framing {
            Framing::Length(n) => SizeHint::with_exact(n),
            _ => SizeHint::new(),
        };
        let (tx, body) = RequestBody::fed(hint);
        // Boxed: held inline, the responder's future beside the body's feed would size
        // every request's exchange, most of which have no body (and the exchange is
        // boxed, so moved whole, per request).
        let resp = Box::pin(async {
            let answer = responder.respond(req.map(|()| body), Some(head));
            let (mut read, mut write) = tokio::io::split(io);
            let continue_to = self.expect_continue.then_some(&mut write);
            let feeding = feed(&mut read, continue_to, buf, decoder, &tx, self.stall);
            until_answered(answer, feeding).await
        })
        .await;
        (resp, Some(tx))
    }
}

/// `answer`'s output, with `feeding` driven alongside until then.
async fn until_answered<T>(
    answer: impl Future<Output = T>,
    feeding: impl Future<Output = ()>,
) -> T {
    tokio::pin!(answer, feeding);
    let mut fed = false;
    loop {
        tokio::select! {
            out = &mut answer => return out,
            () = &mut feeding, if !fed => fed = true,
        }
    }
}

/// Writes `resp` on the write half while the body goes on feeding its reader from the
/// read half. Done when the response is: its reader (the proxy's request pump) has then
/// ended too.
async fn respond_duplex<S: Transport + AsyncRead>(
    io: &mut S,
    resp: Response<Body>,
    answering: Answering,
    scratch: &mut Vec<u8>,
    stall: Duration,
    (buf, decoder, fed, body_stall): (&mut Vec<u8>, &mut Decoder, &Feed, Duration),
) -> std::io::Result<bool> {
    let (mut read, mut write) = tokio::io::split(io);
    let writing = respond(&mut write, resp, answering, scratch, stall);
    let no_continue: Option<&mut tokio::io::WriteHalf<&mut S>> = None;
    let feeding = feed(&mut read, no_continue, buf, decoder, fed, body_stall);
    until_answered(writing, feeding).await
}

/// Answers a request the server will not serve with an error page, and closes. The
/// request never reached the responder: the page is signed with the connection's token.
async fn refuse<S: Transport, R: Responder>(
    io: &mut S,
    responder: &R,
    (method, path, version): (&Method, &str, Version),
    status: StatusCode,
    scratch: &mut Vec<u8>,
    timeouts: &Timeouts,
) {
    let resp = error_response(status, method, responder.server_token());
    responder.record(method, path, version, &resp);
    let answering = Answering {
        head_only: method == Method::HEAD,
        http10: false,
        keep_alive: false,
    };
    let _ = respond(io, resp, answering, scratch, timeouts.keepalive).await;
}

/// terminus's own 400, not one an upstream sent.
fn refused_as_malformed(resp: &Response<Body>) -> bool {
    resp.status() == StatusCode::BAD_REQUEST
        && resp.extensions().get::<crate::Upstreamed>().is_none()
}

fn path_of(uri: &Uri) -> &str {
    uri.path_and_query().map_or("/", |p| p.as_str())
}

/// Set once this process has handed over to a successor: a connection idle at
/// shutdown is not closed then (its client may be sending a request that very moment,
/// and would lose it), but waits for its next request, answered with `Connection:
/// close`, or its keep-alive timeout, as any idle connection. Process-wide: a process
/// hands over once, and then only drains.
static GENTLY: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// From now on, shutdown closes idle HTTP/1.1 connections at their next request's end
/// or their keep-alive timeout, not at once ([`GENTLY`]): the drain after a handover.
pub fn drain_gently() {
    GENTLY.store(true, std::sync::atomic::Ordering::Relaxed);
}

/// Reads until `buf` holds a whole request head, and parses it. With nothing of it yet,
/// `buf` is released until the transport has bytes.
async fn read_request<S: Transport + ReadReady>(
    io: &mut S,
    buf: &mut Vec<u8>,
    idle_since: Instant,
    timeouts: &crate::Timeouts,
    shutdown: &mut watch::Receiver<bool>,
) -> Next {
    let mut first_byte = (!buf.is_empty()).then(Instant::now);
    loop {
        if !buf.is_empty() {
            match parse_request_head(buf) {
                Ok(Some(request)) => return Next::Request(Box::new(request)),
                Ok(None) if buf.len() >= MAX_HEAD => {
                    return Next::Reject(StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE)
                }
                Ok(None) => {}
                Err(status) => return Next::Reject(status),
            }
        }
        let deadline = match first_byte {
            Some(t) => t + timeouts.request_header,
            None => idle_since + timeouts.keepalive,
        };
        let idle = first_byte.is_none();
        let close_idle = !GENTLY.load(std::sync::atomic::Ordering::Relaxed);
        if idle && close_idle && *shutdown.borrow() {
            return Next::Closed;
        }
        // With nothing of a request yet, no buffer until the transport has bytes; and
        // none kept when it said so and a read found nothing (readiness can be stale).
        let read = std::future::poll_fn(|cx| {
            if buf.is_empty() && io.poll_read_ready(cx)?.is_pending() {
                buffers::give_back_head(buf);
                return Poll::Pending;
            }
            buffers::lend_head(buf);
            // read_buf is cancel-safe: a pending one dropped has taken nothing.
            let polled = std::pin::pin!(io.read_buf(&mut *buf)).poll(cx);
            if polled.is_pending() && buf.is_empty() {
                buffers::give_back_head(buf);
            }
            polled
        });
        tokio::select! {
            read = read => match read {
                Ok(0) | Err(_) => return Next::Closed,
                Ok(_) => {
                    first_byte.get_or_insert_with(Instant::now);
                }
            },
            _ = tokio::time::sleep_until(deadline.into()) => {
                if !idle {
                    tracing::debug!("request header timeout");
                }
                return Next::Closed;
            }
            _ = shutdown.wait_for(|&stop| stop), if idle && close_idle => {
                // Handed over while this connection waited: it waits on, gently.
                if GENTLY.load(std::sync::atomic::Ordering::Relaxed) {
                    continue;
                }
                return Next::Closed;
            }
        }
    }
}
