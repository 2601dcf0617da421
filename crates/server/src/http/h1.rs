//! HTTP/1.1 connections, served by terminus itself rather than hyper: a file body leaves
//! through the transport's `send_file` (sendfile(2) on a kernel TLS socket, a
//! read-and-encrypt loop with one reused buffer on rustls), which hyper's body-as-chunks
//! model cannot express. hyper still serves HTTP/2.
//!
//! Behaviour follows nginx: keep-alive by default on HTTP/1.1 and on request on 1.0;
//! pipelined requests are answered in order; a request's header must be complete within
//! `timeouts.request_header` of its first byte and the next request must start within
//! `timeouts.keepalive`; a response that makes no progress for `timeouts.keepalive` is
//! abandoned; request bodies up to 64 KiB are read and dropped, longer or chunked ones end
//! the connection after the answer; Content-Length together with Transfer-Encoding is
//! refused (request smuggling). On shutdown an idle connection closes at once and a busy
//! one after its response.

use std::fs::File;
use std::future::Future;
use std::io;
use std::os::unix::fs::FileExt;
use std::time::{Duration, Instant};

use hyper::header::{self, HeaderMap, HeaderName, HeaderValue};
use hyper::{Method, Request, Response, StatusCode, Uri, Version};
use terminus_tls::{KtlsStream, TlsStream};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::watch;

use super::body::Body;
use super::{error_response, DISCARD_LIMIT};

/// Longest request line plus headers, like nginx's large_client_header_buffers.
const MAX_HEAD: usize = 16 * 1024;
const MAX_HEADERS: usize = 100;
/// Userspace file sends read this much at a time (four TLS records).
const FILE_CHUNK: usize = 64 * 1024;
/// File bodies are sent in steps of this size, each with its own stall timeout.
const SEND_STEP: u64 = 1 << 20;
/// Bodies up to this size are copied after the header in one write.
const INLINE_BODY: usize = 16 * 1024;

/// A connection's byte stream that can also send a range of a file.
pub(crate) trait Transport: AsyncRead + AsyncWrite + Unpin {
    /// Sends `head` (the response head, or nothing) and then `len` (> 0) bytes of `file`
    /// from `offset`, in as few TLS records as they fit; `scratch` is the connection's
    /// buffer.
    fn send_file(
        &mut self,
        head: &[u8],
        file: &File,
        offset: u64,
        len: u64,
        scratch: &mut Vec<u8>,
    ) -> impl Future<Output = io::Result<()>>;
}

impl Transport for KtlsStream {
    /// sendfile(2): the kernel reads the page cache and encrypts; no user-space copy.
    async fn send_file(
        &mut self,
        head: &[u8],
        file: &File,
        offset: u64,
        len: u64,
        _scratch: &mut Vec<u8>,
    ) -> io::Result<()> {
        KtlsStream::send_file(self, head, file, offset, len).await
    }
}

impl Transport for TlsStream {
    /// Reads into the connection's one buffer and lets rustls encrypt from it; the
    /// stream packs head and body into full records.
    async fn send_file(
        &mut self,
        head: &[u8],
        file: &File,
        mut offset: u64,
        len: u64,
        scratch: &mut Vec<u8>,
    ) -> io::Result<()> {
        self.write_all(head).await?;
        scratch.resize(FILE_CHUNK, 0);
        let end = offset + len;
        while offset < end {
            let want = ((end - offset) as usize).min(FILE_CHUNK);
            let n = file.read_at(&mut scratch[..want], offset)?;
            if n == 0 {
                return Err(truncated());
            }
            self.write_all(&scratch[..n]).await?;
            offset += n as u64;
        }
        Ok(())
    }
}

fn truncated() -> io::Error {
    io::Error::new(
        io::ErrorKind::UnexpectedEof,
        "file truncated while being sent",
    )
}

thread_local! {
    /// The `date` header of this second, formatted once per second per worker.
    static DATE: std::cell::RefCell<Date> = const { std::cell::RefCell::new(Date { second: 0, text: Vec::new() }) };
}

struct Date {
    second: u64,
    text: Vec<u8>,
}

impl Date {
    fn now(&mut self) -> &[u8] {
        let now = std::time::SystemTime::now();
        let second = now
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        if second != self.second || self.text.is_empty() {
            self.second = second;
            self.text = httpdate::fmt_http_date(now).into_bytes();
        }
        &self.text
    }
}

/// What reading the next request gave.
enum Next {
    Request(Box<Request<()>>),
    /// The client is gone, idle too long, or the server is shutting down between requests.
    Closed,
    /// A request the server answers with this status and then closes.
    Reject(StatusCode),
}

/// How the request body is delimited, and what to do with it.
enum RequestBody {
    None,
    Discard(u64),
    /// Unread (too long, or chunked): the connection closes after the answer.
    LeftUnread,
}

/// Serves HTTP/1.1 on `io` until the client is done, a timeout, an error or shutdown.
pub(crate) async fn serve<S: Transport>(
    mut io: S,
    info: &super::ConnectionInfo,
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
        let resp = super::handle(&req, info);
        super::record(info, req.method(), path_of(req.uri()), req.version(), &resp);
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
    info: &super::ConnectionInfo,
    (method, path, version): (&Method, &str, Version),
    status: StatusCode,
    scratch: &mut Vec<u8>,
) {
    let resp = error_response(status, method);
    super::record(info, method, path, version, &resp);
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

/// Parses a request head at the start of `buf` and removes it from `buf`.
/// `Ok(None)`: not complete yet.
fn parse(buf: &mut Vec<u8>) -> Result<Option<Request<()>>, StatusCode> {
    let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut parsed = httparse::Request::new(&mut headers);
    let len = match parsed.parse(buf) {
        Ok(httparse::Status::Complete(len)) => len,
        Ok(httparse::Status::Partial) => return Ok(None),
        Err(httparse::Error::TooManyHeaders) => {
            return Err(StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE)
        }
        Err(_) => return Err(StatusCode::BAD_REQUEST),
    };
    let method = Method::from_bytes(parsed.method.unwrap_or("").as_bytes())
        .map_err(|_| StatusCode::BAD_REQUEST)?;
    let uri: Uri = parsed
        .path
        .unwrap_or("")
        .parse()
        .map_err(|_| StatusCode::BAD_REQUEST)?;
    let version = match parsed.version {
        Some(0) => Version::HTTP_10,
        _ => Version::HTTP_11,
    };
    let mut map = HeaderMap::with_capacity(parsed.headers.len());
    for h in parsed.headers.iter() {
        map.append(
            HeaderName::from_bytes(h.name.as_bytes()).map_err(|_| StatusCode::BAD_REQUEST)?,
            HeaderValue::from_bytes(h.value).map_err(|_| StatusCode::BAD_REQUEST)?,
        );
    }
    let mut req = Request::builder()
        .method(method)
        .uri(uri)
        .version(version)
        .body(())
        .map_err(|_| StatusCode::BAD_REQUEST)?;
    *req.headers_mut() = map;
    buf.drain(..len);
    Ok(Some(req))
}

fn has_token(headers: &HeaderMap, name: header::HeaderName, token: &str) -> bool {
    headers
        .get_all(name)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|t| t.trim().eq_ignore_ascii_case(token))
}

fn wants_keep_alive(req: &Request<()>) -> bool {
    match req.version() {
        Version::HTTP_11 => !has_token(req.headers(), header::CONNECTION, "close"),
        _ => has_token(req.headers(), header::CONNECTION, "keep-alive"),
    }
}

fn request_body(headers: &HeaderMap) -> Result<RequestBody, StatusCode> {
    let lengths: Vec<&HeaderValue> = headers.get_all(header::CONTENT_LENGTH).iter().collect();
    if headers.contains_key(header::TRANSFER_ENCODING) {
        // Both framings at once is how requests are smuggled past a proxy: refuse.
        if !lengths.is_empty() {
            return Err(StatusCode::BAD_REQUEST);
        }
        return Ok(RequestBody::LeftUnread);
    }
    let mut length = None;
    for v in lengths {
        let n: u64 = v
            .to_str()
            .ok()
            .filter(|s| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()))
            .and_then(|s| s.parse().ok())
            .ok_or(StatusCode::BAD_REQUEST)?;
        if length.is_some_and(|l| l != n) {
            return Err(StatusCode::BAD_REQUEST);
        }
        length = Some(n);
    }
    Ok(match length {
        None | Some(0) => RequestBody::None,
        Some(n) if n <= DISCARD_LIMIT as u64 => RequestBody::Discard(n),
        Some(_) => RequestBody::LeftUnread,
    })
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
    let mut head = Vec::with_capacity(512);
    let status = parts.status;
    head.extend_from_slice(b"HTTP/1.1 ");
    head.extend_from_slice(status.as_str().as_bytes());
    head.push(b' ');
    head.extend_from_slice(status.canonical_reason().unwrap_or("").as_bytes());
    head.extend_from_slice(b"\r\n");
    for (name, value) in &parts.headers {
        head.extend_from_slice(name.as_str().as_bytes());
        head.extend_from_slice(b": ");
        head.extend_from_slice(value.as_bytes());
        head.extend_from_slice(b"\r\n");
    }
    if !parts.headers.contains_key(header::DATE) {
        head.extend_from_slice(b"date: ");
        DATE.with_borrow_mut(|date| head.extend_from_slice(date.now()));
        head.extend_from_slice(b"\r\n");
    }
    let bodiless = status.is_informational()
        || status == StatusCode::NO_CONTENT
        || status == StatusCode::NOT_MODIFIED;
    if !bodiless && !parts.headers.contains_key(header::CONTENT_LENGTH) {
        let len = match &body {
            Body::Empty => 0,
            Body::Bytes(b) => b.as_ref().map_or(0, |b| b.len() as u64),
            Body::File { remaining, .. } => *remaining,
        };
        head.extend_from_slice(format!("content-length: {len}\r\n").as_bytes());
    }
    if !keep_alive {
        head.extend_from_slice(b"connection: close\r\n");
    } else if http10 {
        head.extend_from_slice(b"connection: keep-alive\r\n");
    }
    head.extend_from_slice(b"\r\n");
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

#[cfg(test)]
mod tests {
    use super::*;

    fn head(text: &str) -> Result<Option<Request<()>>, StatusCode> {
        parse(&mut text.as_bytes().to_vec())
    }

    #[test]
    fn parses_heads_and_leaves_the_rest() {
        let mut buf =
            b"GET /a?b=1 HTTP/1.1\r\nHost: x\r\nX-A: 1\r\nX-A: 2\r\n\r\nGET /next".to_vec();
        let req = parse(&mut buf).unwrap().unwrap();
        assert_eq!(req.method(), Method::GET);
        assert_eq!(req.uri().path_and_query().unwrap().as_str(), "/a?b=1");
        assert_eq!(req.headers().get_all("x-a").iter().count(), 2);
        assert_eq!(buf, b"GET /next");
        assert!(parse(&mut buf).unwrap().is_none());
        assert_eq!(
            head("GET / HTTP/1.0\r\n\r\n").unwrap().unwrap().version(),
            Version::HTTP_10
        );
    }

    #[test]
    fn malformed_heads_are_bad_requests() {
        assert_eq!(
            head("GET / HTTP/1.1\r\nBad Header: x\r\n\r\n").unwrap_err(),
            StatusCode::BAD_REQUEST
        );
        assert_eq!(
            head("G\0T / HTTP/1.1\r\n\r\n").unwrap_err(),
            StatusCode::BAD_REQUEST
        );
        assert_eq!(
            head("GET / HTTP/9.9\r\n\r\n").unwrap_err(),
            StatusCode::BAD_REQUEST
        );
        let many: String = (0..200).map(|i| format!("h{i}: v\r\n")).collect();
        assert_eq!(
            head(&format!("GET / HTTP/1.1\r\n{many}\r\n")).unwrap_err(),
            StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE
        );
    }

    #[test]
    fn body_framing() {
        let h = |pairs: &[(&str, &str)]| {
            let mut m = HeaderMap::new();
            for (k, v) in pairs {
                m.append(
                    HeaderName::from_bytes(k.as_bytes()).unwrap(),
                    HeaderValue::from_str(v).unwrap(),
                );
            }
            m
        };
        assert!(matches!(request_body(&h(&[])), Ok(RequestBody::None)));
        assert!(matches!(
            request_body(&h(&[("content-length", "10")])),
            Ok(RequestBody::Discard(10))
        ));
        assert!(matches!(
            request_body(&h(&[("content-length", "10000000")])),
            Ok(RequestBody::LeftUnread)
        ));
        assert!(matches!(
            request_body(&h(&[("transfer-encoding", "chunked")])),
            Ok(RequestBody::LeftUnread)
        ));
        for bad in [
            h(&[("transfer-encoding", "chunked"), ("content-length", "3")]),
            h(&[("content-length", "3"), ("content-length", "4")]),
            h(&[("content-length", "-1")]),
            h(&[("content-length", "+3")]),
        ] {
            assert_eq!(
                request_body(&bad).err(),
                Some(StatusCode::BAD_REQUEST),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn keep_alive_defaults_by_version() {
        let req = |v: &str, conn: Option<&str>| {
            let c = conn.map_or(String::new(), |c| format!("Connection: {c}\r\n"));
            head(&format!("GET / HTTP/{v}\r\n{c}\r\n"))
                .unwrap()
                .unwrap()
        };
        assert!(wants_keep_alive(&req("1.1", None)));
        assert!(!wants_keep_alive(&req("1.1", Some("Close"))));
        assert!(!wants_keep_alive(&req("1.0", None)));
        assert!(wants_keep_alive(&req("1.0", Some("keep-alive"))));
    }

    mod properties {
        use super::super::parse;
        use proptest::prelude::*;
        use proptest::sample::Index;

        /// A well-formed request head: method, target, headers.
        fn request() -> impl Strategy<Value = (&'static str, String, Vec<(String, String)>)> {
            (
                prop::sample::select(vec!["GET", "HEAD", "POST", "PUT", "DELETE", "OPTIONS"]),
                "/[a-zA-Z0-9._~/-]{0,24}(\\?[a-z0-9=&]{0,12})?",
                prop::collection::vec(("[a-z][a-z0-9-]{0,12}", "[!-~]([ -~]{0,20}[!-~])?"), 0..8),
            )
        }

        proptest! {
            #![proptest_config(ProptestConfig::with_cases(512))]

            /// Any bytes: a request, "need more", or a 4xx; the buffer is consumed only
            /// by a complete head.
            #[test]
            fn any_bytes_are_answered_without_panicking(buf in prop::collection::vec(any::<u8>(), 0..512)) {
                let mut b = buf.clone();
                match parse(&mut b) {
                    Ok(Some(_)) => prop_assert!(b.len() < buf.len()),
                    Ok(None) => prop_assert_eq!(&b, &buf),
                    Err(status) => {
                        prop_assert!(status.is_client_error());
                        prop_assert_eq!(&b, &buf);
                    }
                }
            }

            /// A head split across reads is never refused, and parses whole to what was sent,
            /// leaving the next request's bytes in the buffer.
            #[test]
            fn a_head_split_anywhere_parses_to_what_was_sent(
                (method, target, headers) in request(),
                cut in any::<Index>(),
            ) {
                let head: String = headers.iter().map(|(n, v)| format!("{n}: {v}\r\n")).collect();
                let text = format!("{method} {target} HTTP/1.1\r\n{head}\r\n");
                let prefix = &text.as_bytes()[..cut.index(text.len())];
                prop_assert!(matches!(parse(&mut prefix.to_vec()), Ok(None)), "prefix {:?}", String::from_utf8_lossy(prefix));
                let mut all = format!("{text}GET /next").into_bytes();
                let req = parse(&mut all).unwrap().unwrap();
                prop_assert_eq!(req.method().as_str(), method);
                prop_assert_eq!(req.uri().path_and_query().map(|p| p.as_str()), Some(target.as_str()));
                for (name, value) in &headers {
                    prop_assert!(req.headers().get_all(name.as_str()).iter().any(|v| v.as_bytes() == value.as_bytes()));
                }
                prop_assert_eq!(all, b"GET /next".to_vec());
            }
        }
    }
}
