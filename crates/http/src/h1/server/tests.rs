//! The HTTP/1.1 connection against test responders over an in-memory pipe: streamed
//! responses in each framing, trailers, a stream that breaks its length, and request
//! bodies that reach the responder only as fast as it reads them.

use std::cell::Cell;
use std::io;
use std::rc::Rc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, StreamBody};
use hyper::body::Frame;
use hyper::header::{HeaderMap, HeaderValue};
use hyper::{Method, Request, Response, Version};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::body::{Body, RequestBody};
use crate::h1::{Decoded, Decoder, Framing};
use crate::Responder;
use crate::Timeouts;

const TIMEOUTS: Timeouts = Timeouts {
    request_header: Duration::from_secs(5),
    keepalive: Duration::from_secs(5),
};

/// A body of these frames, each ready at once, of unknown length.
fn frames(parts: Vec<Frame<Bytes>>) -> Body {
    Body::stream(StreamBody::new(futures_util::stream::iter(
        parts.into_iter().map(Ok::<_, io::Error>),
    )))
}

/// Answers with the request body it read whole, streamed back in two frames, and its
/// length as a trailer; or, with `declare`, under a content-length it then breaks.
struct Echo {
    declare: Option<u64>,
}

impl Responder for Echo {
    async fn respond(
        &self,
        req: Request<RequestBody>,
        _head: Option<crate::h1::RawHead>,
    ) -> Response<Body> {
        let body = req.into_body().collect().await.unwrap().to_bytes();
        let mid = body.len() / 2;
        let mut trailers = HeaderMap::new();
        trailers.insert("x-length", HeaderValue::from(body.len()));
        let mut resp = Response::new(frames(vec![
            Frame::data(body.slice(..mid)),
            Frame::data(body.slice(mid..)),
            Frame::trailers(trailers),
        ]));
        if let Some(n) = self.declare {
            resp.headers_mut()
                .insert("content-length", HeaderValue::from(n));
            // As a proxy might copy it from a chunked upstream: the writer frames anew.
            resp.headers_mut()
                .insert("transfer-encoding", HeaderValue::from_static("chunked"));
        }
        resp
    }

    fn record(&self, _: &Method, _: &str, _: Version, _: &Response<Body>) {}

    fn server_token(&self) -> &crate::ServerToken {
        &crate::TERMINUS
    }
}

/// Runs a connection with `responder` and a client that writes `request` and reads
/// until the server closes.
async fn exchange<R: Responder>(responder: &R, request: &[u8]) -> Vec<u8> {
    let (server, mut client) = tokio::io::duplex(64 * 1024);
    let (_tx, mut shutdown) = tokio::sync::watch::channel(false);
    let client = async {
        client.write_all(request).await.unwrap();
        // Done sending: a kept-alive connection then ends at once.
        client.shutdown().await.unwrap();
        let mut reply = Vec::new();
        let _ = client.read_to_end(&mut reply).await;
        reply
    };
    let (_, reply) = tokio::join!(
        super::serve(server, responder, TIMEOUTS, &mut shutdown),
        client
    );
    reply
}

/// The head and the body bytes after it.
fn split(reply: &[u8]) -> (String, Vec<u8>) {
    let end = reply.windows(4).position(|w| w == b"\r\n\r\n").unwrap() + 4;
    (
        String::from_utf8_lossy(&reply[..end]).to_ascii_lowercase(),
        reply[end..].to_vec(),
    )
}

#[tokio::test]
async fn a_stream_of_unknown_length_is_sent_chunked_with_its_trailers() {
    let request = b"POST /echo HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n3\r\nabc\r\n4\r\ndefg\r\n0\r\n\r\n";
    let (head, body) = split(&exchange(&Echo { declare: None }, request).await);
    assert!(head.starts_with("http/1.1 200 ok\r\n"), "{head}");
    assert!(head.contains("transfer-encoding: chunked\r\n"), "{head}");
    assert!(!head.contains("content-length"), "{head}");
    let mut buf = body;
    let mut decoder = Decoder::new(Framing::Chunked);
    let (mut data, mut trailers) = (Vec::new(), None);
    loop {
        match decoder
            .decode(&mut buf)
            .unwrap()
            .expect("a whole chunked body")
        {
            Decoded::Data(d) => data.extend_from_slice(&d),
            Decoded::Trailers(t) => trailers = Some(t),
            Decoded::End => break,
        }
    }
    assert_eq!(data, b"abcdefg");
    assert_eq!(trailers.unwrap()["x-length"], "7");
    assert!(buf.is_empty());
}

#[tokio::test]
async fn http10_gets_a_stream_delimited_by_the_close() {
    let request =
        b"POST /echo HTTP/1.0\r\nConnection: keep-alive\r\nContent-Length: 5\r\n\r\nhello";
    let (head, body) = split(&exchange(&Echo { declare: None }, request).await);
    assert!(head.contains("connection: close\r\n"), "{head}");
    assert!(!head.contains("transfer-encoding"), "{head}");
    assert_eq!(body, b"hello");
}

#[tokio::test]
async fn a_declared_length_is_kept_and_a_stream_that_breaks_it_aborts() {
    let request = b"POST /echo HTTP/1.1\r\nContent-Length: 5\r\n\r\nhello";
    let (head, body) = split(&exchange(&Echo { declare: Some(5) }, request).await);
    assert!(head.contains("content-length: 5\r\n"), "{head}");
    assert!(!head.contains("transfer-encoding"), "{head}");
    assert!(!head.contains("connection: close"), "kept alive: {head}");
    assert_eq!(body, b"hello");

    // Five bytes promised, four given: the connection ends short of five, so the client
    // sees a truncated response rather than a complete wrong one.
    let request = b"POST /echo HTTP/1.1\r\nContent-Length: 4\r\n\r\nhell";
    let (_, body) = split(&exchange(&Echo { declare: Some(5) }, request).await);
    assert_eq!(body, b"hell");
    let (_, body) = split(&exchange(&Echo { declare: Some(3) }, request).await);
    assert!(body.len() < 4, "more than declared was sent: {body:?}");
}

/// Reads one frame of the body, then waits until told to answer.
struct Sluggish {
    read: Cell<usize>,
    answer: Rc<tokio::sync::Notify>,
}

impl Responder for Sluggish {
    async fn respond(
        &self,
        req: Request<RequestBody>,
        _head: Option<crate::h1::RawHead>,
    ) -> Response<Body> {
        let mut body = req.into_body();
        if let Some(Ok(frame)) = body.frame().await {
            self.read.set(frame.data_ref().map_or(0, Bytes::len));
        }
        self.answer.notified().await;
        Response::new(Body::bytes("done"))
    }

    fn record(&self, _: &Method, _: &str, _: Version, _: &Response<Body>) {}

    fn server_token(&self) -> &crate::ServerToken {
        &crate::TERMINUS
    }
}

#[tokio::test]
async fn a_request_body_comes_only_as_fast_as_the_responder_reads_it() {
    let answer = Rc::new(tokio::sync::Notify::new());
    let responder = Sluggish {
        read: Cell::new(0),
        answer: answer.clone(),
    };
    let (server, mut client) = tokio::io::duplex(64 * 1024);
    let (_tx, mut shutdown) = tokio::sync::watch::channel(false);
    let total: usize = 64 << 20;
    let client = async {
        client
            .write_all(format!("PUT /x HTTP/1.1\r\nContent-Length: {total}\r\n\r\n").as_bytes())
            .await
            .unwrap();
        let chunk = vec![0u8; 16 * 1024];
        let mut written = 0;
        // The server reads only what the responder asks for: the pipe fills and writing
        // stalls long before the body is all sent.
        while written < total {
            match tokio::time::timeout(Duration::from_millis(200), client.write(&chunk)).await {
                Ok(Ok(n)) => written += n,
                _ => break,
            }
        }
        answer.notify_one();
        let mut reply = Vec::new();
        let _ = client.read_to_end(&mut reply).await;
        (written, reply)
    };
    let (_, (written, reply)) = tokio::join!(
        super::serve(server, &responder, TIMEOUTS, &mut shutdown),
        client
    );
    assert!(
        responder.read.get() > 0,
        "the responder got its first frame"
    );
    assert!(
        written < 512 * 1024,
        "{written} bytes were taken for a responder that read {}",
        responder.read.get()
    );
    // The body left unread: answered, and the connection closed after it.
    let (head, body) = split(&reply);
    assert!(head.contains("connection: close"), "{head}");
    assert_eq!(body, b"done");
}

/// What an HTTP/1.1 connection's future holds besides its transport, idle or not, stays
/// small: a request's state lives on the heap for the request's time only. It was
/// 16,736 bytes with a 16 KiB lingering buffer and each request's futures inline.
#[tokio::test]
async fn a_connection_s_own_state_between_requests_is_small() {
    let (_client, server) = tokio::io::duplex(1024);
    let transport = std::mem::size_of_val(&server);
    let (_stop, mut shutdown) = tokio::sync::watch::channel(false);
    let responder = Echo { declare: None };
    let serving = super::serve(server, &responder, TIMEOUTS, &mut shutdown);
    let own = std::mem::size_of_val(&serving) - transport;
    assert!(own <= 1024, "{own} bytes besides the transport");
}
