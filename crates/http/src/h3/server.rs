//! HTTP/3's server side by the h3 crate, over a QUIC connection the worker drives
//! (`terminus-quic`): each
//! request stream's request goes to the responder with its body fed frame by frame, as
//! HTTP/1.1's is, and the response's frames are sent as the body yields them.

use std::cell::Cell;
use std::io;
use std::rc::Rc;
use std::task::{Context, Poll, Waker};

use bytes::{Buf, Bytes};
use http_body_util::BodyExt;
use hyper::body::{Frame, SizeHint};
use hyper::{header, Request, Response, StatusCode};
use terminus_quic::{Early, H3Connection};
use tokio::sync::watch;

use crate::body::{Feed, Piece, RequestBody};
use crate::{error_response, Responder};

/// The largest request head taken (its fields, QPACK-decoded): nginx's default
/// `large_client_header_buffers` allow 4 of 8 KiB.
const MAX_FIELD_SECTION: u64 = 32 * 1024;

/// Serves HTTP/3 on `conn` until the client closes it, it idles out, or `shutdown` fires
/// (then a GOAWAY, and the requests in progress finish). `open`, the caller's count of
/// the connection, is held until its last request's task is done, not only its accept
/// loop. While its
/// handshake is `early`, requests are early data (RFC 8470): see [`too_early`].
pub async fn serve<R: Responder + 'static, O: 'static>(
    conn: H3Connection,
    responder: Rc<R>,
    early: Early,
    mut shutdown: watch::Receiver<bool>,
    open: O,
) {
    let open = Rc::new(open);
    let built = h3::server::builder()
        .max_field_section_size(MAX_FIELD_SECTION)
        .build(conn)
        .await;
    let mut h3 = match built {
        Ok(h3) => h3,
        Err(e) => {
            tracing::debug!("h3: connection not set up: {e}");
            return;
        }
    };
    // Told to stop: a GOAWAY went, and the connection is closed (h3 closes it when
    // dropped) once the requests in progress are done. Each request's task says when it
    // is (its `open` dropped).
    //
    // The GOAWAY names the first request not processed (RFC 9114 section 5.2): the one
    // after the last accepted, which a client sends again on a new connection. h3 takes
    // streams up to and including the ID it sends (`shutdown(1)`: one past the last), so
    // a request with that ID or above is refused here, never served and retried both.
    let mut closing: Option<h3::quic::StreamId> = None;
    let mut last = None;
    let finished = Rc::new(tokio::sync::Notify::new());
    loop {
        if closing.is_some() && Rc::strong_count(&open) == 1 {
            return;
        }
        let accepted = tokio::select! {
            accepted = h3.accept() => accepted,
            _ = shutdown.wait_for(|&stop| stop), if closing.is_none() => {
                let _ = h3.shutdown(1).await;
                let first = h3::quic::StreamId::try_from(0).expect("stream 0");
                closing = Some(last.map_or(first, |l: h3::quic::StreamId| l + 1));
                continue;
            }
            _ = finished.notified(), if closing.is_some() => continue,
        };
        match accepted {
            Ok(Some(resolver))
                if closing.is_some_and(|goaway| resolver.frame_stream.id() >= goaway) =>
            {
                tokio::task::spawn_local(reject(resolver));
            }
            Ok(Some(resolver)) => {
                last = Some(resolver.frame_stream.id());
                let (responder, open, early) = (responder.clone(), open.clone(), early.clone());
                let finished = finished.clone();
                tokio::task::spawn_local(async move {
                    request(resolver, responder, early).await;
                    drop(open);
                    finished.notify_one();
                });
            }
            Ok(None) => return,
            Err(e) => {
                tracing::debug!("h3: connection ended: {e}");
                return;
            }
        }
    }
}

/// A request past the GOAWAY's ID: refused unprocessed (H3_REQUEST_REJECTED), for the
/// client to send again on a new connection.
async fn reject(resolver: h3::server::RequestResolver<H3Connection, Bytes>) {
    if let Ok((_, mut stream)) = resolver.resolve_request().await {
        stream.stop_sending(h3::error::Code::H3_REQUEST_REJECTED);
        stream.stop_stream(h3::error::Code::H3_REQUEST_REJECTED);
    }
}

/// A request read before the handshake completed may be 0-RTT data someone replayed
/// (RFC 8470). A safe method's is served, marked `Early-Data: 1` for the upstream to
/// refuse with 425 if it must (RFC 8470 section 5.1, what an intermediary does); any
/// other is answered 425 Too Early here, and the client sends it again after the
/// handshake. nginx leaves this to the configuration (`$ssl_early_data`), HAProxy to a
/// `wait-for-handshake` rule. Whether the request is to be answered 425.
fn too_early(early: &Early, req: &mut Request<RequestBody>) -> bool {
    if !early.now() {
        return false;
    }
    if !req.method().is_safe() {
        return true;
    }
    req.headers_mut().insert(
        header::HeaderName::from_static("early-data"),
        header::HeaderValue::from_static("1"),
    );
    false
}

/// One request stream: the request to the responder, the response back.
async fn request<R: Responder>(
    resolver: h3::server::RequestResolver<H3Connection, Bytes>,
    responder: Rc<R>,
    early: Early,
) {
    let (req, stream) = match resolver.resolve_request().await {
        Ok(resolved) => resolved,
        Err(e) => {
            tracing::debug!("h3: request not read: {e}");
            return;
        }
    };
    let (mut send, mut recv) = stream.split();
    let Ok(declared) = declared_length(req.headers()) else {
        tracing::debug!("h3: a request with a malformed content-length, reset");
        recv.stop_sending(h3::error::Code::H3_MESSAGE_ERROR);
        send.stop_stream(h3::error::Code::H3_MESSAGE_ERROR);
        return;
    };
    let malformed = Rc::new(Cell::new(false));
    let body = match first_data(&mut recv) {
        // The stream ended with its headers (every GET): no body, so the upstream is
        // sent no framing for one, as from HTTP/2 and HTTP/1.1.
        First::End if declared.unwrap_or(0) == 0 => RequestBody::empty(),
        first => {
            let hint = declared.map_or_else(SizeHint::default, SizeHint::with_exact);
            let (feed, body) = RequestBody::fed(hint);
            let malformed = malformed.clone();
            tokio::task::spawn_local(feed_body(recv, first, declared, feed, malformed));
            body
        }
    };
    let (method, uri, version) = (req.method().clone(), req.uri().clone(), req.version());
    let mut req: Request<RequestBody> = req.map(|()| body);
    let resp = if too_early(&early, &mut req) {
        // Its body is stopped unread with H3_NO_ERROR as the request is dropped.
        error_response(StatusCode::TOO_EARLY, &method, responder.server_token())
    } else {
        responder.respond(req, None).await
    };
    if malformed.get() {
        // Its DATA disagreed with its content-length: a stream error, not an answer
        // (RFC 9114 section 4.1.2), whatever the responder made of the failed body.
        tracing::debug!("h3: a request whose DATA disagree with its content-length, reset");
        send.stop_stream(h3::error::Code::H3_MESSAGE_ERROR);
        return;
    }
    let path = uri.path_and_query().map_or("/", |p| p.as_str());
    responder.record(&method, path, version, &resp);
    let (mut parts, mut body) = resp.into_parts();
    // Connection-specific fields are malformed in HTTP/3 (RFC 9114 section 4.2).
    for name in [
        header::CONNECTION,
        header::TRANSFER_ENCODING,
        header::UPGRADE,
        header::HeaderName::from_static("keep-alive"),
        header::HeaderName::from_static("proxy-connection"),
    ] {
        parts.headers.remove(name);
    }
    if let Err(e) = send.send_response(Response::from_parts(parts, ())).await {
        tracing::debug!("h3: response head not sent: {e}");
        return;
    }
    while let Some(frame) = body.frame().await {
        if malformed.get() {
            // Found out while the answer went: reset, so that the client does not take
            // an answer to a request it did not send whole.
            send.stop_stream(h3::error::Code::H3_MESSAGE_ERROR);
            return;
        }
        let sent = match frame {
            Ok(frame) => match frame.into_data() {
                Ok(data) => send.send_data(data).await,
                Err(frame) => match frame.into_trailers() {
                    Ok(trailers) => send.send_trailers(trailers).await,
                    Err(_) => Ok(()),
                },
            },
            Err(e) => {
                tracing::debug!("h3: response body failed: {e}");
                send.stop_stream(h3::error::Code::H3_INTERNAL_ERROR);
                return;
            }
        };
        if let Err(e) = sent {
            tracing::debug!("h3: response body not sent: {e}");
            return;
        }
    }
    let _ = send.finish().await;
}

/// The one length a request's content-length fields declare, if any: several that
/// disagree, or one that is not a number, make the request malformed (RFC 9114 section
/// 4.1.2, RFC 9110 section 8.6).
fn declared_length(headers: &header::HeaderMap) -> Result<Option<u64>, ()> {
    let mut declared = None;
    for value in headers.get_all(header::CONTENT_LENGTH) {
        let digits = value.as_bytes();
        if digits.is_empty() || !digits.iter().all(u8::is_ascii_digit) {
            return Err(());
        }
        let n = std::str::from_utf8(digits)
            .ok()
            .and_then(|d| d.parse::<u64>().ok())
            .ok_or(())?;
        if declared.is_some_and(|d| d != n) {
            return Err(());
        }
        declared = Some(n);
    }
    Ok(declared)
}

/// A request stream's receiving half.
type RequestRecv = h3::server::RequestStream<terminus_quic::transport::RecvStream, Bytes>;

/// What a request stream holds once its head is read, looked at without waiting.
enum First {
    /// The stream has ended: the request has no body.
    End,
    Data(Bytes),
    Failed(io::Error),
    /// Nothing yet: the body, if any, is still to come.
    Pending,
}

/// How many times running h3 must answer "no more DATA", without waiting, before that is
/// taken for the end of the request stream (see [`settled`]).
const END_CONFIRMATIONS: usize = 8;

/// The request stream's first DATA or its end, if QUIC has them already (a request
/// that ends with its headers usually comes in one packet with them). Polled with a
/// waker that does nothing: `poll_recv_data` keeps its state in the stream, and the
/// task that feeds the body polls it again with its own.
fn first_data(recv: &mut RequestRecv) -> First {
    let mut cx = Context::from_waker(Waker::noop());
    match recv.poll_recv_data(&mut cx) {
        Poll::Ready(Ok(None)) => settled(recv),
        Poll::Ready(Ok(Some(mut data))) => First::Data(data.copy_to_bytes(data.remaining())),
        Poll::Ready(Err(e)) => First::Failed(io::Error::other(e.to_string())),
        Poll::Pending => First::Pending,
    }
}

/// What follows an answer of "no more DATA". h3 0.0.8 gives that answer for an empty DATA
/// frame too, not only at the end of the stream (or at its trailers, which are not
/// passed on); the end gives it every time it is asked, at once, where an empty frame
/// gives it once and then what follows it. So it is the end only when repeated
/// [`END_CONFIRMATIONS`] times without waiting: a client would have to send that many
/// empty frames in a row to cut its own body short, and a body with a declared length
/// would then be reset, not passed on short.
fn settled(recv: &mut RequestRecv) -> First {
    let mut cx = Context::from_waker(Waker::noop());
    for _ in 0..END_CONFIRMATIONS {
        match recv.poll_recv_data(&mut cx) {
            Poll::Ready(Ok(None)) => {}
            Poll::Ready(Ok(Some(mut data))) => {
                return First::Data(data.copy_to_bytes(data.remaining()))
            }
            Poll::Ready(Err(e)) => return First::Failed(io::Error::other(e.to_string())),
            Poll::Pending => return First::Pending,
        }
    }
    First::End
}

/// The request stream's next DATA, its end, or its failure, waiting for them.
async fn next_data(recv: &mut RequestRecv) -> First {
    loop {
        match recv.recv_data().await {
            Ok(Some(mut data)) => return First::Data(data.copy_to_bytes(data.remaining())),
            Ok(None) => match settled(recv) {
                First::Pending => continue,
                settled => return settled,
            },
            Err(e) => return First::Failed(io::Error::other(e.to_string())),
        }
    }
}

/// Feeds the request's DATA to its body, frame by frame, holding them to the declared
/// content-length: a frame that would go past it, or an end short of it, is never fed
/// as data but as a failure (the body's reader, the proxy among them, then stops), the
/// stream is stopped with H3_MESSAGE_ERROR and `malformed` is set for the response side
/// (RFC 9114 section 4.1.2). An HTTP/1.1 upstream that was sent `Content-Length: N`
/// therefore never receives byte N+1 from us: a request cannot be smuggled behind it.
async fn feed_body(
    mut recv: RequestRecv,
    first: First,
    declared: Option<u64>,
    feed: Feed,
    malformed: Rc<Cell<bool>>,
) {
    let mut received: u64 = 0;
    let mut next = Some(first);
    loop {
        let got = match next.take() {
            Some(First::Pending) | None => next_data(&mut recv).await,
            Some(first) => first,
        };
        let piece = match got {
            First::Data(data) => {
                received = received.saturating_add(data.len() as u64);
                if declared.is_some_and(|n| received > n) {
                    disagree(&mut recv, &malformed, "more DATA than its content-length")
                } else {
                    Piece::Frame(Frame::data(data))
                }
            }
            First::End if declared.is_some_and(|n| received != n) => {
                disagree(&mut recv, &malformed, "less DATA than its content-length")
            }
            First::End => Piece::End,
            First::Failed(e) => Piece::Failed(e),
            First::Pending => unreachable!("a wait's outcome is never Pending"),
        };
        let last = !matches!(piece, Piece::Frame(_));
        if feed.send(piece).await.is_err() || last {
            return;
        }
    }
}

/// The failure a body whose DATA disagree with its content-length ends with.
fn disagree(recv: &mut RequestRecv, malformed: &Cell<bool>, what: &str) -> Piece {
    malformed.set(true);
    recv.stop_sending(h3::error::Code::H3_MESSAGE_ERROR);
    Piece::Failed(io::Error::new(
        io::ErrorKind::InvalidData,
        format!("the request had {what}"),
    ))
}
