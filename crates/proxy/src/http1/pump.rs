//! The request body on its way to the server: read from the client frame by frame (the
//! client's side supplies the back-pressure) and written with content-length or chunked
//! framing, trailers included. A body sent by its length is held to it whatever the
//! client's protocol checked: a byte past it would be the start of another request to
//! the server (smuggling), and a body that ends short of it would leave the server
//! waiting; either fails the pump, and with it the connection. The pump is a future the exchange, then the response body,
//! polls alongside their reading, so it needs no task of its own and ends with them.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use hyper::body::Body;
use tokio::io::AsyncWriteExt;

use crate::connect::WriteHalf;
use crate::metrics::ServerMetrics;

/// Why the body did not all go out.
#[derive(Debug)]
pub(crate) enum PumpError {
    /// The client's body failed (it went away, stalled, or was malformed).
    Client(io::Error),
    /// Writing to the server failed or stalled.
    Upstream(io::Error),
}

type Running = Pin<Box<dyn Future<Output = Result<WriteHalf, PumpError>>>>;

/// The request body's progress; when it is done the write half is back.
pub(crate) enum Pump {
    Running(Running),
    Done(WriteHalf),
    /// Failed: the connection cannot carry another request.
    Failed,
}

impl Pump {
    pub(crate) fn start<B>(
        write: WriteHalf,
        body: B,
        length: Option<u64>,
        idle: Duration,
        metrics: Arc<ServerMetrics>,
    ) -> Self
    where
        B: Body<Data = Bytes, Error = io::Error> + 'static,
    {
        Pump::Running(Box::pin(send(write, body, length, idle, metrics)))
    }

    pub(crate) fn is_done(&self) -> bool {
        !matches!(self, Pump::Running(_))
    }

    /// Drives the pump; ready when it is no longer running, with how it ended.
    pub(crate) fn poll_done(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), PumpError>> {
        let Pump::Running(running) = self else {
            return Poll::Ready(Ok(()));
        };
        match running.as_mut().poll(cx) {
            Poll::Pending => Poll::Pending,
            Poll::Ready(Ok(write)) => {
                *self = Pump::Done(write);
                Poll::Ready(Ok(()))
            }
            Poll::Ready(Err(e)) => {
                *self = Pump::Failed;
                Poll::Ready(Err(e))
            }
        }
    }

    /// Waits until the pump is no longer running.
    pub(crate) async fn wait(&mut self) -> Result<(), PumpError> {
        std::future::poll_fn(|cx| self.poll_done(cx)).await
    }
}

/// Sends `body` by its `length` (`Content-Length` was sent) or, without one, chunked.
async fn send<B>(
    mut write: WriteHalf,
    body: B,
    length: Option<u64>,
    idle: Duration,
    metrics: Arc<ServerMetrics>,
) -> Result<WriteHalf, PumpError>
where
    B: Body<Data = Bytes, Error = io::Error>,
{
    let mut body = std::pin::pin!(body);
    let mut trailers = None;
    let mut out = Vec::new();
    let mut left = length;
    let chunked = length.is_none();
    let timed = |r: Result<io::Result<()>, tokio::time::error::Elapsed>| match r {
        Ok(r) => r.map_err(PumpError::Upstream),
        Err(_) => Err(PumpError::Upstream(io::Error::new(
            io::ErrorKind::TimedOut,
            format!("the server took no request body for {idle:?}"),
        ))),
    };
    while let Some(frame) = std::future::poll_fn(|cx| body.as_mut().poll_frame(cx)).await {
        let frame = frame.map_err(PumpError::Client)?;
        let frame = match frame.into_data() {
            Ok(data) if data.is_empty() => continue,
            Ok(data) => {
                if let Some(left) = &mut left {
                    *left = left
                        .checked_sub(data.len() as u64)
                        .ok_or_else(|| PumpError::Client(mismatch("longer")))?;
                }
                metrics.sent(data.len() as u64);
                if chunked {
                    // One write per chunk: its head, data and CRLF in one segment.
                    out.clear();
                    terminus_http::h1::chunk_head(&mut out, data.len());
                    out.extend_from_slice(&data);
                    out.extend_from_slice(b"\r\n");
                    timed(tokio::time::timeout(idle, write.write_all(&out)).await)?;
                } else {
                    timed(tokio::time::timeout(idle, write.write_all(&data)).await)?;
                }
                continue;
            }
            Err(frame) => frame,
        };
        if let Ok(t) = frame.into_trailers() {
            trailers = Some(t);
        }
    }
    if left.is_some_and(|left| left > 0) {
        return Err(PumpError::Client(mismatch("shorter")));
    }
    if chunked {
        out.clear();
        terminus_http::h1::chunked_end(&mut out, trailers.as_ref());
        timed(tokio::time::timeout(idle, write.write_all(&out)).await)?;
    }
    timed(tokio::time::timeout(idle, write.flush()).await)?;
    Ok(write)
}

/// A body that disagrees with the length the server was told.
fn mismatch(how: &str) -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidData,
        format!("the request body is {how} than its content-length"),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::connect::Stream;
    use crate::metrics::ProxyMetrics;
    use http_body_util::StreamBody;
    use hyper::body::Frame;
    use tokio::io::AsyncReadExt;
    use tokio::net::{TcpListener, TcpStream};

    /// Pumps `frames` by `length` over a real loopback connection; how the pump ended and
    /// every byte the server side received.
    async fn pump(frames: &[&'static [u8]], length: Option<u64>) -> (Result<(), String>, Vec<u8>) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (client, server) = tokio::join!(TcpStream::connect(addr), listener.accept());
        let (read, write) = tokio::io::split(Stream::Tcp(client.unwrap()));
        let (mut server, _) = server.unwrap();
        let frames: Vec<io::Result<Frame<Bytes>>> = frames
            .iter()
            .map(|f| Ok(Frame::data(Bytes::from_static(f))))
            .collect();
        let body = StreamBody::new(futures_util::stream::iter(frames));
        let metrics = ProxyMetrics::default().server("u", addr).0;
        let mut pump = Pump::start(write, body, length, Duration::from_secs(5), metrics);
        let ended = pump.wait().await.map_err(|e| format!("{e:?}"));
        // The connection closes with both halves gone.
        drop((pump, read));
        let mut got = Vec::new();
        server.read_to_end(&mut got).await.unwrap();
        (ended, got)
    }

    #[tokio::test]
    async fn a_body_is_sent_by_its_length_and_never_past_it() {
        let smuggled: &'static [u8] = b"GET /SMUGGLED HTTP/1.1\r\nHost: x\r\n\r\n";
        let (ended, got) = pump(&[b"hel", b"lo"], Some(5)).await;
        assert_eq!((ended, got.as_slice()), (Ok(()), b"hello".as_slice()));

        // Longer than announced, in the frame that completes it or in one after: none of
        // what is past the length goes out, and the pump fails.
        let frame: &'static [u8] = b"helloGET /SMUGGLED HTTP/1.1\r\nHost: x\r\n\r\n";
        let (ended, got) = pump(&[frame], Some(5)).await;
        assert!(ended.unwrap_err().contains("longer"));
        assert_eq!(got, b"");
        let (ended, got) = pump(&[b"hello", smuggled], Some(5)).await;
        assert!(ended.unwrap_err().contains("longer"));
        assert_eq!(got, b"hello");

        // Shorter than announced: the pump fails rather than leave the server waiting.
        let (ended, got) = pump(&[b"hel"], Some(5)).await;
        assert!(ended.unwrap_err().contains("shorter"));
        assert_eq!(got, b"hel");

        // Chunked: as long as it comes.
        let (ended, got) = pump(&[b"hello"], None).await;
        assert_eq!(
            (ended, got.as_slice()),
            (Ok(()), b"5\r\nhello\r\n0\r\n\r\n".as_slice())
        );
    }
}
