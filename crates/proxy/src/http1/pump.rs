//! The request body on its way to the server: read from the client frame by frame (the
//! client's side supplies the back-pressure) and written with content-length or chunked
//! framing, trailers included. The pump is a future the exchange, then the response body,
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
        chunked: bool,
        idle: Duration,
        metrics: Arc<ServerMetrics>,
    ) -> Self
    where
        B: Body<Data = Bytes, Error = io::Error> + 'static,
    {
        Pump::Running(Box::pin(send(write, body, chunked, idle, metrics)))
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

async fn send<B>(
    mut write: WriteHalf,
    body: B,
    chunked: bool,
    idle: Duration,
    metrics: Arc<ServerMetrics>,
) -> Result<WriteHalf, PumpError>
where
    B: Body<Data = Bytes, Error = io::Error>,
{
    let mut body = std::pin::pin!(body);
    let mut trailers = None;
    let mut out = Vec::new();
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
                metrics.sent(data.len() as u64);
                if chunked {
                    // One write per chunk: its head, data and CRLF in one segment.
                    out.clear();
                    terminus_h1::chunk_head(&mut out, data.len());
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
    if chunked {
        out.clear();
        terminus_h1::chunked_end(&mut out, trailers.as_ref());
        timed(tokio::time::timeout(idle, write.write_all(&out)).await)?;
    }
    timed(tokio::time::timeout(idle, write.flush()).await)?;
    Ok(write)
}
