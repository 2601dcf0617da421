//! The response body, read from the upstream connection as the client takes it: decoded
//! with the same codec the server uses toward clients, each read bounded by the idle
//! timeout, and ended either cleanly (the connection goes back to the pool if both sides
//! keep it) or with an error, so that a response the server broke off reaches the client
//! as a broken-off response, never as a short complete one.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::rc::Rc;
use std::task::{Context, Poll};
use std::time::Instant;

use bytes::Bytes;
use hyper::body::{Body, Frame, SizeHint};
use terminus_http::h1::{Decoded, Decoder};

use super::pump::Pump;
use crate::metrics::{Failure, Phase};
use crate::pool::{Conn, Pool};
use crate::spec::Keepalive;
use crate::stall::Stall;
use crate::upstream::InProgress;

/// Bytes asked of the socket per read.
const READ_SIZE: usize = 64 * 1024;

/// A response body read from an HTTP/1.1 upstream connection.
pub(crate) struct Http1Body(Option<Box<Reading>>);

pub(crate) struct Reading {
    pub(crate) read: crate::connect::ReadHalf,
    pub(crate) buf: Vec<u8>,
    pub(crate) decoder: Decoder,
    pub(crate) pump: Pump,
    /// Both sides said the connection may carry another exchange.
    pub(crate) keep_alive: bool,
    pub(crate) hint: SizeHint,
    pub(crate) stall: Stall,
    pub(crate) pool: Rc<Pool>,
    pub(crate) pool_key: crate::pool::Key,
    pub(crate) keepalive: Keepalive,
    pub(crate) progress: InProgress,
    pub(crate) started: Instant,
}

impl Http1Body {
    pub(crate) fn reading(reading: Reading) -> Self {
        let mut body = Http1Body(Some(Box::new(reading)));
        // A body already whole (none, or all in the head's read) ends here, so that the
        // connection is back in the pool before the client has even been answered.
        if body.0.as_ref().is_some_and(|r| r.decoder.is_done()) {
            body.finish();
        }
        body
    }

    /// Ends the exchange cleanly: the connection goes back to the pool when it can carry
    /// another one (both sides keep it, the request went out whole, nothing extra came).
    fn finish(&mut self) {
        let Some(mut r) = self.0.take() else { return };
        let server = r.progress.server();
        server.metrics.latency(Phase::Total, r.started.elapsed());
        r.progress.upstream.succeeded(r.progress.server);
        let write = match std::mem::replace(&mut r.pump, Pump::Failed) {
            Pump::Done(write) => Some(write),
            _ => None,
        };
        if let (true, true, Some(write)) = (r.keep_alive, r.buf.is_empty(), write) {
            let Reading {
                read,
                buf,
                pool,
                pool_key,
                keepalive,
                progress,
                ..
            } = *r;
            let server = progress.server();
            let conn = Conn { read, write, buf };
            pool.put(pool_key, conn, keepalive, &server.metrics);
        }
    }

    /// Ends the exchange with an error the client will see as a broken response.
    fn fail(&mut self, failure: Failure, detail: String) -> io::Error {
        if let Some(r) = self.0.take() {
            let up = &r.progress.upstream;
            up.failed(r.progress.server, failure);
            tracing::warn!(
                upstream = %up.name(),
                server = %r.progress.server().spec.address,
                cause = failure.name(),
                "upstream response broken off: {detail}",
            );
        }
        io::Error::new(io::ErrorKind::ConnectionAborted, detail)
    }
}

impl Body for Http1Body {
    type Data = Bytes;
    type Error = io::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, io::Error>>> {
        loop {
            let Some(r) = self.0.as_mut() else {
                return Poll::Ready(None);
            };
            // The rest of the request body, if the server answered before taking it all
            // (an HTTP/2 client may still be sending).
            if let Poll::Ready(Err(e)) = r.pump.poll_done(cx) {
                tracing::debug!("request body not sent whole: {e:?}");
            }
            match r.decoder.decode(&mut r.buf) {
                Ok(Some(Decoded::Data(data))) => {
                    r.progress.server().metrics.received(data.len() as u64);
                    return Poll::Ready(Some(Ok(Frame::data(data))));
                }
                Ok(Some(Decoded::Trailers(t))) => return Poll::Ready(Some(Ok(Frame::trailers(t)))),
                Ok(Some(Decoded::End)) => {
                    self.finish();
                    return Poll::Ready(None);
                }
                Ok(None) => {}
                Err(e) => {
                    let err = self.fail(Failure::BadResponse, format!("malformed body: {}", e.0));
                    return Poll::Ready(Some(Err(err)));
                }
            }
            r.buf.reserve(READ_SIZE);
            let read = {
                // A read_buf future keeps nothing between polls: one made per poll is
                // one read attempt into the buffer's spare capacity.
                let attempt = tokio::io::AsyncReadExt::read_buf(&mut r.read, &mut r.buf);
                std::pin::pin!(attempt).poll(cx)
            };
            match read {
                Poll::Pending => {
                    if r.stall.expired(cx) {
                        let idle = r.stall.idle();
                        let err =
                            self.fail(Failure::IdleTimeout, format!("no body bytes for {idle:?}"));
                        return Poll::Ready(Some(Err(err)));
                    }
                    return Poll::Pending;
                }
                Poll::Ready(Err(e)) => {
                    let err = self.fail(Failure::Io, format!("reading the body: {e}"));
                    return Poll::Ready(Some(Err(err)));
                }
                Poll::Ready(Ok(0)) => {
                    if r.decoder.at_eof().is_err() {
                        let err = self.fail(
                            Failure::Closed,
                            "closed the connection before the end of the body".into(),
                        );
                        return Poll::Ready(Some(Err(err)));
                    }
                    r.keep_alive = false;
                }
                Poll::Ready(Ok(_)) => r.stall.progressed(),
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.0.is_none()
    }

    fn size_hint(&self) -> SizeHint {
        self.0.as_ref().map_or(SizeHint::with_exact(0), |r| r.hint)
    }
}
