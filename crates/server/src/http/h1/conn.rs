//! One HTTP/1.1 connection: requests read with their deadlines, bodies discarded, responses
//! written (files by the transport's `send_file`), keep-alive and shutdown.

use std::io;
use std::time::{Duration, Instant};

use hyper::{Method, Request, Response, StatusCode, Uri, Version};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::watch;

use super::codec::{
    encode_response_head, parse, request_body, wants_keep_alive, RequestBody, MAX_HEAD,
};
use super::{Transport, FILE_CHUNK};
use crate::http::body::Body;
use crate::http::{error_response, handle, record, ConnectionInfo};

/// File bodies are sent in steps of this size, each with its own stall timeout.
const SEND_STEP: u64 = 1 << 20;
/// Bodies up to this size are copied after the header in one write.
const INLINE_BODY: usize = 16 * 1024;

/// What reading the next request gave.
enum Next {
    Request(Box<Request<()>>),
    /// The client is gone, idle too long, or the server is shutting down between requests.
    Closed,
    /// A request the server answers with this status and then closes.
    Reject(StatusCode),
}

/// Serves HTTP/1.1 on `io` until the client is done, a timeout, an error or shutdown.
pub(crate) async fn serve<S: Transport>(
    mut io: S,
    info: &ConnectionInfo,
    shutdown: &mut watch::Receiver<bool>,
) {
    let timeouts = info.site.timeouts;
    let mut buf: Vec<u8> = Vec::with_capacity(4096);
    let mut scratch = Vec::new();
    let mut idle_since = Instant::now();
    loop {
        let req = match read_request(&mut io, &mut buf, idle_since, &timeouts, shutdown).await {
            Next::Request(req) => req,
            Next::Closed => break,
            Next::Reject(status) => {
                let request = (&Method::GET, "-", Version::HTTP_11);
                refuse(&mut io, info, request, status, &mut scratch).await;
                break;
            }
        };
        let mut keep_alive = wants_keep_alive(&req);
        let body = match request_body(req.headers()) {
            Ok(b) => b,
            Err(status) => {
                let request = (req.method(), path_of(req.uri()), req.version());
                refuse(&mut io, info, request, status, &mut scratch).await;
                break;
            }
        };
        match body {
            RequestBody::None => {}
            RequestBody::LeftUnread => keep_alive = false,
            RequestBody::Discard(n) => {
                let read = discard(&mut io, &mut buf, n, &mut scratch);
                if !matches!(
                    tokio::time::timeout(timeouts.request_header, read).await,
                    Ok(Ok(()))
                ) {
                    break;
                }
            }
        }
        let resp = handle(&req, info);
        record(info, req.method(), path_of(req.uri()), req.version(), &resp);
        keep_alive &= !*shutdown.borrow();
        let http10 = req.version() == Version::HTTP_10;
        if let Err(e) = respond(
            &mut io,
            resp,
            keep_alive,
            http10,
            &mut scratch,
            timeouts.keepalive,
        )
        .await
        {
            tracing::debug!(peer = %info.peer, "response not completed: {e}");
            return;
        }
        if !keep_alive {
            break;
        }
        idle_since = Instant::now();
    }
    // close_notify, then FIN; a client that does not read gets a second to take it.
    let _ = tokio::time::timeout(Duration::from_secs(1), io.shutdown()).await;
}

/// Answers a request the server will not serve with an error page, and closes.
async fn refuse<S: Transport>(
    io: &mut S,
    info: &ConnectionInfo,
    (method, path, version): (&Method, &str, Version),
    status: StatusCode,
    scratch: &mut Vec<u8>,
) {
    let resp = error_response(status, method);
    record(info, method, path, version, &resp);
    let stall = info.site.timeouts.keepalive;
    let _ = respond(io, resp, false, false, scratch, stall).await;
}

fn path_of(uri: &Uri) -> &str {
    uri.path_and_query().map_or("/", |p| p.as_str())
}

/// Reads until `buf` holds a whole request head, and parses it.
async fn read_request<S: Transport>(
    io: &mut S,
    buf: &mut Vec<u8>,
    idle_since: Instant,
    timeouts: &crate::site::Timeouts,
    shutdown: &mut watch::Receiver<bool>,
) -> Next {
    let mut first_byte = (!buf.is_empty()).then(Instant::now);
    loop {
        if !buf.is_empty() {
            match parse(buf) {
                Ok(Some(req)) => return Next::Request(Box::new(req)),
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
        if idle && *shutdown.borrow() {
            return Next::Closed;
        }
        buf.reserve(4096);
        tokio::select! {
            read = io.read_buf(buf) => match read {
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
            _ = shutdown.wait_for(|&stop| stop), if idle => return Next::Closed,
        }
    }
}

/// Reads and drops `n` body bytes: first what is buffered, then from the socket.
async fn discard<S: Transport>(
    io: &mut S,
    buf: &mut Vec<u8>,
    mut n: u64,
    scratch: &mut Vec<u8>,
) -> io::Result<()> {
    let buffered = (n as usize).min(buf.len());
    buf.drain(..buffered);
    n -= buffered as u64;
    scratch.resize(FILE_CHUNK, 0);
    while n > 0 {
        let want = (n as usize).min(scratch.len());
        match io.read(&mut scratch[..want]).await? {
            0 => return Err(io::ErrorKind::UnexpectedEof.into()),
            got => n -= got as u64,
        }
    }
    Ok(())
}

/// Writes the response: head and a small body in one write, a file by `send_file` with
/// the head before it.
/// Each step must progress within `stall`.
async fn respond<S: Transport>(
    io: &mut S,
    resp: Response<Body>,
    keep_alive: bool,
    http10: bool,
    scratch: &mut Vec<u8>,
    stall: Duration,
) -> io::Result<()> {
    let (parts, body) = resp.into_parts();
    let body_len = match &body {
        Body::Empty => 0,
        Body::Bytes(b) => b.as_ref().map_or(0, |b| b.len() as u64),
        Body::File { remaining, .. } => *remaining,
    };
    let mut head = Vec::with_capacity(512);
    encode_response_head(&mut head, &parts, body_len, keep_alive, http10);
    let stalled = || io::Error::new(io::ErrorKind::TimedOut, "client stopped reading");
    match body {
        Body::Empty => write_all(io, &head, stall).await?,
        Body::Bytes(None) => write_all(io, &head, stall).await?,
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
                tokio::time::timeout(stall, io.send_file(first, &file, at, step, scratch))
                    .await
                    .map_err(|_| stalled())??;
                at += step;
            }
        }
    }
    tokio::time::timeout(stall, io.flush())
        .await
        .map_err(|_| stalled())?
}

async fn write_all<S: Transport>(io: &mut S, data: &[u8], stall: Duration) -> io::Result<()> {
    tokio::time::timeout(stall, io.write_all(data))
        .await
        .map_err(|_| io::Error::new(io::ErrorKind::TimedOut, "client stopped reading"))?
}
