//! Writing one response on an HTTP/1.1 connection: the head and a small body in one
//! write, a file by the transport's `send_file`, a stream frame by frame as it yields
//! them (chunked when its length is unknown; flushed whenever it has nothing ready, so a
//! slow source's bytes are not held back). Every write must progress within the stall
//! timeout; waiting for a stream's next frame has no timeout here (its source has its own).

use std::future::poll_fn;
use std::io;
use std::task::Poll;
use std::time::Duration;

use bytes::Bytes;
use hyper::body::Body as _;
use hyper::header::{self, HeaderMap};
use hyper::{Response, StatusCode};
use tokio::io::AsyncWriteExt;

use super::Transport;
use crate::body::Body;
use crate::h1::{
    chunk_head, chunked_end, encode_response_head, Fields, PassedFields, RawHead, ResponseFraming,
};

/// File bodies are sent in steps of this size, each with its own stall timeout.
const SEND_STEP: u64 = 1 << 20;
/// Bodies up to this size are copied after the header in one write.
const INLINE_BODY: usize = 16 * 1024;

/// How the request being answered shapes its response.
#[derive(Clone, Copy)]
pub(super) struct Answering {
    /// A HEAD request: the head only, whatever the body.
    pub head_only: bool,
    pub http10: bool,
    pub keep_alive: bool,
}

/// Writes `resp` and flushes it. Returns whether the connection can carry another
/// request (a body delimited by closing the connection means it cannot).
pub(super) async fn respond<S: Transport>(
    io: &mut S,
    resp: Response<Body>,
    answering: Answering,
    scratch: &mut Vec<u8>,
    stall: Duration,
) -> io::Result<bool> {
    let (mut parts, body) = resp.into_parts();
    // A proxied head passed as bytes: its fields go out as they came, before the map's.
    let mut passed = parts.extensions.remove::<PassedFields>().map(|p| p.0);
    let fields = (&mut parts.headers, passed.as_mut());
    let framing = framing(parts.status, fields, &body, answering);
    let keep_alive = answering.keep_alive && framing != ResponseFraming::Close;
    let mut head = Vec::with_capacity(512 + passed.as_ref().map_or(0, |p| p.as_bytes().len()));
    encode_response_head(
        &mut head,
        &parts,
        passed.as_ref(),
        framing,
        keep_alive,
        answering.http10,
    );
    let stalled = || io::Error::new(io::ErrorKind::TimedOut, "client stopped reading");
    match body {
        _ if framing == ResponseFraming::Bodiless => write_all(io, &head, stall).await?,
        Body::Empty | Body::Bytes(None) => write_all(io, &head, stall).await?,
        Body::Bytes(Some(b)) if b.len() <= INLINE_BODY => {
            head.extend_from_slice(&b);
            write_all(io, &head, stall).await?;
        }
        Body::Bytes(Some(b)) => {
            write_all(io, &head, stall).await?;
            write_all(io, &b, stall).await?;
        }
        Body::File {
            file,
            offset,
            remaining,
        } => {
            let end = offset + remaining;
            let mut at = offset;
            if remaining == 0 {
                write_all(io, &head, stall).await?;
            }
            while at < end {
                let step = (end - at).min(SEND_STEP);
                let first = if at == offset { &head[..] } else { &[] };
                tokio::time::timeout(stall, io.send_file(first, &file, at, step))
                    .await
                    .map_err(|_| stalled())??;
                at += step;
            }
        }
        Body::Stream(stream) => {
            write_all(io, &head, stall).await?;
            send_stream(io, stream, framing, scratch, stall).await?;
        }
    }
    tokio::time::timeout(stall, io.flush())
        .await
        .map_err(|_| stalled())??;
    Ok(keep_alive)
}

/// How the body will be delimited. A stream's length is its `content-length` (a bad one
/// is removed), else its exact size hint, else unknown: chunked for HTTP/1.1, the
/// connection's close for HTTP/1.0. The fields are the response's map and those passed
/// as bytes, if any.
fn framing(
    status: StatusCode,
    (headers, passed): (&mut HeaderMap, Option<&mut RawHead>),
    body: &Body,
    answering: Answering,
) -> ResponseFraming {
    let bodiless = status.is_informational()
        || status == StatusCode::NO_CONTENT
        || status == StatusCode::NOT_MODIFIED;
    if answering.head_only || bodiless {
        return ResponseFraming::Bodiless;
    }
    match body {
        Body::Empty | Body::Bytes(None) => ResponseFraming::Length(0),
        Body::Bytes(Some(b)) => ResponseFraming::Length(b.len() as u64),
        Body::File { remaining, .. } => ResponseFraming::Length(*remaining),
        Body::Stream(s) => {
            // Whatever the responder copied, the framing is this writer's to choose.
            headers.remove(header::TRANSFER_ENCODING);
            let mut passed = passed;
            if let Some(p) = passed.as_deref_mut() {
                p.remove(&header::TRANSFER_ENCODING);
            }
            let declared = headers
                .values_of(header::CONTENT_LENGTH)
                .next()
                .or_else(|| passed.as_deref()?.values_of(header::CONTENT_LENGTH).next())
                .map(|v| {
                    std::str::from_utf8(v)
                        .ok()
                        .filter(|s| s.bytes().all(|b| b.is_ascii_digit()))
                        .and_then(|s| s.parse::<u64>().ok())
                });
            match declared {
                Some(Some(n)) => return ResponseFraming::Length(n),
                Some(None) => {
                    headers.remove(header::CONTENT_LENGTH);
                    if let Some(p) = passed {
                        p.remove(&header::CONTENT_LENGTH);
                    }
                }
                None => {}
            }
            match s.size_hint().exact() {
                Some(n) => ResponseFraming::Length(n),
                None if answering.http10 => ResponseFraming::Close,
                None => ResponseFraming::Chunked,
            }
        }
    }
}

/// Sends a stream's frames under `framing`. A stream that fails, or yields more or less
/// than its declared length, aborts the response (an error: the connection is dropped).
async fn send_stream<S: Transport>(
    io: &mut S,
    mut stream: std::pin::Pin<Box<dyn hyper::body::Body<Data = Bytes, Error = io::Error>>>,
    framing: ResponseFraming,
    scratch: &mut Vec<u8>,
    stall: Duration,
) -> io::Result<()> {
    let mut sent: u64 = 0;
    let mut trailers = None;
    loop {
        // Flush only when the stream has nothing ready: a burst of frames shares records.
        let next = match poll_fn(|cx| Poll::Ready(stream.as_mut().poll_frame(cx))).await {
            Poll::Ready(next) => next,
            Poll::Pending => {
                tokio::time::timeout(stall, io.flush())
                    .await
                    .map_err(|_| {
                        io::Error::new(io::ErrorKind::TimedOut, "client stopped reading")
                    })??;
                poll_fn(|cx| stream.as_mut().poll_frame(cx)).await
            }
        };
        let frame = match next {
            None => break,
            Some(frame) => frame?,
        };
        let frame = match frame.into_data() {
            Ok(data) if data.is_empty() => continue,
            Ok(data) => data,
            Err(frame) => {
                trailers = frame.into_trailers().ok();
                continue;
            }
        };
        sent += frame.len() as u64;
        match framing {
            ResponseFraming::Length(n) if sent > n => {
                return Err(io::Error::other(
                    "response body longer than its content-length",
                ));
            }
            ResponseFraming::Chunked => {
                // One write per chunk: on kernel TLS each write is a record.
                scratch.clear();
                chunk_head(scratch, frame.len());
                scratch.extend_from_slice(&frame);
                scratch.extend_from_slice(b"\r\n");
                write_all(io, scratch, stall).await?;
            }
            _ => write_all(io, &frame, stall).await?,
        }
    }
    match framing {
        ResponseFraming::Length(n) if sent < n => Err(io::Error::new(
            io::ErrorKind::UnexpectedEof,
            "response body shorter than its content-length",
        )),
        ResponseFraming::Chunked => {
            scratch.clear();
            chunked_end(scratch, trailers.as_ref());
            write_all(io, scratch, stall).await
        }
        _ => Ok(()),
    }
}

async fn write_all<S: Transport>(io: &mut S, data: &[u8], stall: Duration) -> io::Result<()> {
    tokio::time::timeout(stall, io.write_all(data))
        .await
        .map_err(|_| io::Error::new(io::ErrorKind::TimedOut, "client stopped reading"))?
}
