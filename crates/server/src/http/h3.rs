//! HTTP/3 by the h3 crate, over a QUIC connection the worker drives (crates/quic): each
//! request stream's request goes to the responder with its body fed frame by frame, as
//! HTTP/1.1's is, and the response's frames are sent as the body yields them.

use std::io;
use std::rc::Rc;

use bytes::{Buf, Bytes};
use http_body_util::BodyExt;
use hyper::body::{Frame, SizeHint};
use hyper::{header, Request, Response, StatusCode};
use terminus_quic::{Early, H3Connection};
use tokio::sync::watch;

use super::body::{Piece, RequestBody};
use super::{error_response, Responder};
use crate::worker::OpenConnection;

/// The largest request head taken (its fields, QPACK-decoded): nginx's default
/// `large_client_header_buffers` allow 4 of 8 KiB.
const MAX_FIELD_SECTION: u64 = 32 * 1024;

/// Serves HTTP/3 on `conn` until the client closes it, it idles out, or `shutdown` fires
/// (then a GOAWAY, and the requests in progress finish). The connection counts as open
/// (`open`) until its last request's task is done, not only its accept loop. While its
/// handshake is `early`, requests are early data (RFC 8470): see [`too_early`].
pub(crate) async fn serve<R: Responder + 'static>(
    conn: H3Connection,
    responder: Rc<R>,
    early: Early,
    mut shutdown: watch::Receiver<bool>,
    open: OpenConnection,
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
    loop {
        let accepted = tokio::select! {
            accepted = h3.accept() => accepted,
            _ = shutdown.wait_for(|&stop| stop) => {
                let _ = h3.shutdown(0).await;
                return;
            }
        };
        match accepted {
            Ok(Some(resolver)) => {
                let (responder, open, early) = (responder.clone(), open.clone(), early.clone());
                tokio::task::spawn_local(async move {
                    request(resolver, responder, early).await;
                    drop(open);
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
    let hint = req
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok())
        .map_or_else(SizeHint::default, SizeHint::with_exact);
    let (feed, body) = RequestBody::fed(hint);
    tokio::task::spawn_local(async move {
        loop {
            let piece = match recv.recv_data().await {
                Ok(Some(mut data)) => {
                    Piece::Frame(Frame::data(data.copy_to_bytes(data.remaining())))
                }
                Ok(None) => Piece::End,
                Err(e) => Piece::Failed(io::Error::other(e.to_string())),
            };
            let last = !matches!(piece, Piece::Frame(_));
            if feed.send(piece).await.is_err() || last {
                return;
            }
        }
    });
    let (method, uri, version) = (req.method().clone(), req.uri().clone(), req.version());
    let mut req: Request<RequestBody> = req.map(|()| body);
    let resp = if too_early(&early, &mut req) {
        // Its body is stopped unread with H3_NO_ERROR as the request is dropped.
        error_response(StatusCode::TOO_EARLY, &method)
    } else {
        responder.respond(req).await
    };
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
