//! Request bodies as a stream the responder pulls: nothing, an HTTP/2 stream's data (its
//! flow control is the back-pressure), or HTTP/1.1 frames handed over by the connection
//! one at a time (the connection reads the socket only when the responder asks for the
//! next frame, so a client cannot push more than one frame ahead of it).

use std::io;
use std::pin::Pin;
use std::task::{ready, Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use hyper::body::{Body as _, Frame, SizeHint};
use tokio::sync::mpsc;

/// What the HTTP/1.1 connection hands over: a frame, the end, or why there is no end.
pub(crate) enum Piece {
    Frame(Frame<Bytes>),
    End,
    Failed(io::Error),
}

/// Where the HTTP/1.1 connection sends a request's body, a frame per permit.
pub(crate) type Feed = mpsc::Sender<Piece>;

/// A request's body, read as the responder wants it.
pub struct RequestBody(Kind);

enum Kind {
    Empty,
    /// From the HTTP/1.1 connection. The feed closing before [`Piece::End`] means the
    /// connection gave up on the body: an error, so that a truncated body is never taken
    /// for a whole one.
    Fed {
        rx: mpsc::Receiver<Piece>,
        hint: SizeHint,
        ended: bool,
    },
    H2(crate::h2::server::RequestStream),
}

impl RequestBody {
    /// No body.
    pub fn empty() -> Self {
        RequestBody(Kind::Empty)
    }

    /// A body the HTTP/1.1 connection feeds, frame by frame; `hint` comes from its
    /// framing (exact for a content-length).
    pub(crate) fn fed(hint: SizeHint) -> (Feed, Self) {
        // One frame in flight: the connection reads the next only once this one is taken.
        let (tx, rx) = mpsc::channel(1);
        let body = Kind::Fed {
            rx,
            hint,
            ended: false,
        };
        (tx, RequestBody(body))
    }

    pub(crate) fn h2(body: crate::h2::server::RequestStream) -> Self {
        RequestBody(Kind::H2(body))
    }

    /// Reads and drops the body, as nginx does for a request whose handler takes none,
    /// so that the client sees a clean answer instead of a reset stream (HTTP/2) or a
    /// closed connection (HTTP/1.1). Gives up without reading on a body announced longer
    /// than `limit`, after `limit` bytes of one that was not, and when the whole of it
    /// has not arrived `within` (a total, so a dribbled body cannot hold the connection):
    /// the connection then closes (HTTP/1.1) or resets the stream (HTTP/2) after the
    /// answer, which bounds the work. True when the whole body was read.
    pub async fn discard(self, limit: u64, within: Duration) -> bool {
        tokio::time::timeout(within, self.drain(limit))
            .await
            .unwrap_or(false)
    }

    async fn drain(mut self, limit: u64) -> bool {
        use http_body_util::BodyExt;
        if self.size_hint().lower() > limit {
            return false;
        }
        let mut seen = 0;
        while !self.is_end_stream() {
            match self.frame().await {
                Some(Ok(frame)) => seen += frame.data_ref().map_or(0, |d| d.len() as u64),
                Some(Err(_)) => return false,
                None => return true,
            }
            if seen > limit {
                return false;
            }
        }
        true
    }
}

impl hyper::body::Body for RequestBody {
    type Data = Bytes;
    type Error = io::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, io::Error>>> {
        match &mut self.0 {
            Kind::Empty => Poll::Ready(None),
            Kind::Fed { ended: true, .. } => Poll::Ready(None),
            Kind::Fed { rx, ended, .. } => Poll::Ready(match ready!(rx.poll_recv(cx)) {
                Some(Piece::Frame(frame)) => Some(Ok(frame)),
                Some(Piece::End) => {
                    *ended = true;
                    None
                }
                Some(Piece::Failed(e)) => {
                    *ended = true;
                    Some(Err(e))
                }
                None => {
                    *ended = true;
                    Some(Err(io::Error::new(
                        io::ErrorKind::UnexpectedEof,
                        "the request body was abandoned",
                    )))
                }
            }),
            Kind::H2(body) => body.poll_frame(cx),
        }
    }

    fn is_end_stream(&self) -> bool {
        match &self.0 {
            Kind::Empty => true,
            Kind::Fed { ended, .. } => *ended,
            Kind::H2(body) => body.is_end_stream(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.0 {
            Kind::Empty => SizeHint::with_exact(0),
            Kind::Fed { hint, .. } => *hint,
            Kind::H2(body) => body.size_hint(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::BodyExt;

    const LONG: Duration = Duration::from_secs(60);

    #[tokio::test]
    async fn a_fed_body_ends_only_when_told() {
        // One frame in flight: the feed waits for the body to take each one.
        let (tx, body) = RequestBody::fed(SizeHint::new());
        let feed = async {
            let frame = Frame::data(Bytes::from_static(b"abc"));
            tx.send(Piece::Frame(frame)).await.unwrap();
            tx.send(Piece::End).await.unwrap();
        };
        let ((), body) = tokio::join!(feed, body.collect());
        assert_eq!(body.unwrap().to_bytes(), "abc");

        // The feed dropped mid-body: an error, not a short body.
        let (tx, body) = RequestBody::fed(SizeHint::new());
        let feed = async move {
            let frame = Frame::data(Bytes::from_static(b"ab"));
            tx.send(Piece::Frame(frame)).await.unwrap();
        };
        let ((), body) = tokio::join!(feed, body.collect());
        assert_eq!(body.unwrap_err().kind(), io::ErrorKind::UnexpectedEof);
    }

    #[tokio::test]
    async fn discard_reads_up_to_its_limit() {
        let (tx, body) = RequestBody::fed(SizeHint::with_exact(10));
        assert!(!body.discard(9, LONG).await, "announced too long: not read");
        drop(tx);

        let (tx, body) = RequestBody::fed(SizeHint::new());
        let feeder = tokio::spawn(async move {
            for _ in 0..4 {
                let frame = Frame::data(Bytes::from_static(b"12345"));
                if tx.send(Piece::Frame(frame)).await.is_err() {
                    return false;
                }
            }
            tx.send(Piece::End).await.is_ok()
        });
        assert!(!body.discard(12, LONG).await, "over the limit: given up");
        assert!(!feeder.await.unwrap(), "the feed sees the body dropped");

        let (tx, body) = RequestBody::fed(SizeHint::new());
        tokio::spawn(async move {
            let frame = Frame::data(Bytes::from_static(b"12345"));
            tx.send(Piece::Frame(frame)).await.unwrap();
            tx.send(Piece::End).await.unwrap();
        });
        assert!(body.discard(12, LONG).await);
        assert!(RequestBody::empty().discard(0, LONG).await);

        // A body that stops arriving is given up at the deadline, however small.
        let (tx, body) = RequestBody::fed(SizeHint::with_exact(5));
        tx.send(Piece::Frame(Frame::data(Bytes::from_static(b"12"))))
            .await
            .unwrap();
        assert!(!body.discard(12, Duration::from_millis(50)).await);
    }
}
