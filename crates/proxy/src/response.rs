//! A proxied response's body, from either kind of upstream connection: decoded from an
//! HTTP/1.1 connection by [`crate::http1`], or an HTTP/2 stream's data by [`crate::h2`].

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use hyper::body::{Body, Frame, SizeHint};

use crate::h2::H2Body;
use crate::http1::Http1Body;

/// A proxied response's body.
pub struct ResponseBody(Kind);

enum Kind {
    Empty,
    Http1(Http1Body),
    H2(H2Body),
}

impl ResponseBody {
    pub(crate) fn http1(body: Http1Body) -> Self {
        ResponseBody(Kind::Http1(body))
    }

    pub(crate) fn h2(body: H2Body) -> Self {
        ResponseBody(Kind::H2(body))
    }

    /// No body (a 101: what follows is the upgraded connection's).
    pub(crate) fn empty() -> Self {
        ResponseBody(Kind::Empty)
    }
}

impl Body for ResponseBody {
    type Data = Bytes;
    type Error = io::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, io::Error>>> {
        match &mut self.0 {
            Kind::Empty => Poll::Ready(None),
            Kind::Http1(b) => Pin::new(b).poll_frame(cx),
            Kind::H2(b) => b.poll_frame(cx),
        }
    }

    fn is_end_stream(&self) -> bool {
        match &self.0 {
            Kind::Empty => true,
            Kind::Http1(b) => b.is_end_stream(),
            Kind::H2(b) => b.is_end_stream(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.0 {
            Kind::Empty => SizeHint::with_exact(0),
            Kind::Http1(b) => b.size_hint(),
            Kind::H2(b) => b.size_hint(),
        }
    }
}
