//! Response bodies: nothing, bytes in memory, a byte range of an open file, or a stream
//! of frames from elsewhere (an upstream, a request body).

use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::pin::Pin;
use std::rc::Rc;
use std::task::{Context, Poll};

use bytes::{Bytes, BytesMut};
use hyper::body::{Frame, SizeHint};

/// File data is read in chunks of this size; a few TLS records each.
const FILE_CHUNK: usize = 64 * 1024;

/// A response's body. The first three are known whole when the head is written; a
/// [`Body::Stream`] is pulled frame by frame as the client takes them (its back-pressure).
pub enum Body {
    /// No body.
    Empty,
    /// Bytes in memory (taken as they are sent).
    Bytes(Option<Bytes>),
    /// `remaining` bytes of `file` from `offset`. Over HTTP/1.1 the connection sends
    /// them itself (sendfile(2) on kernel TLS, see `h1`); over HTTP/2 they are read here.
    /// Files are read synchronously on the worker, as nginx does without `aio`: page-cache
    /// hits cost less than a hand-off to a blocking pool.
    File {
        /// Shared with the worker's open-file cache.
        file: Rc<File>,
        /// Where the bytes left to send start.
        offset: u64,
        /// How many are left.
        remaining: u64,
    },
    /// Frames as some other body yields them, trailers included. Its length is the
    /// `content-length` the responder set, else its exact size hint, else unknown
    /// (HTTP/1.1 then sends it chunked). An error aborts the response: the client sees
    /// a truncated message, never a short one passed off as complete.
    Stream(Pin<Box<dyn hyper::body::Body<Data = Bytes, Error = io::Error>>>),
}

impl Body {
    /// A body of `b`.
    pub fn bytes(b: impl Into<Bytes>) -> Self {
        Body::Bytes(Some(b.into()))
    }

    /// `len` bytes of `file` from `offset`.
    pub fn file_range(file: Rc<File>, offset: u64, len: u64) -> Self {
        Body::File {
            file,
            offset,
            remaining: len,
        }
    }

    /// A body that streams `body`'s frames.
    pub fn stream(body: impl hyper::body::Body<Data = Bytes, Error = io::Error> + 'static) -> Self {
        Body::Stream(Box::pin(body))
    }
}

impl hyper::body::Body for Body {
    type Data = Bytes;
    type Error = io::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, io::Error>>> {
        match &mut *self {
            Body::Empty => Poll::Ready(None),
            Body::Bytes(b) => Poll::Ready(b.take().map(|b| Ok(Frame::data(b)))),
            Body::File {
                file,
                offset,
                remaining,
            } => {
                if *remaining == 0 {
                    return Poll::Ready(None);
                }
                let want = (*remaining).min(FILE_CHUNK as u64) as usize;
                let mut buf = BytesMut::zeroed(want);
                let mut filled = 0;
                while filled < want {
                    match file.read_at(&mut buf[filled..], *offset + filled as u64) {
                        Ok(0) => {
                            // The file shrank after Content-Length was sent: abort the
                            // response rather than send a short body as if complete.
                            return Poll::Ready(Some(Err(io::Error::new(
                                io::ErrorKind::UnexpectedEof,
                                "file truncated while being sent",
                            ))));
                        }
                        Ok(n) => filled += n,
                        Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                        Err(e) => return Poll::Ready(Some(Err(e))),
                    }
                }
                *remaining -= want as u64;
                *offset += want as u64;
                Poll::Ready(Some(Ok(Frame::data(buf.freeze()))))
            }
            Body::Stream(s) => s.as_mut().poll_frame(cx),
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            Body::Empty => true,
            Body::Bytes(b) => b.is_none(),
            Body::File { remaining, .. } => *remaining == 0,
            Body::Stream(s) => s.is_end_stream(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            Body::Empty => SizeHint::with_exact(0),
            Body::Bytes(b) => SizeHint::with_exact(b.as_ref().map_or(0, |b| b.len() as u64)),
            Body::File { remaining, .. } => SizeHint::with_exact(*remaining),
            Body::Stream(s) => s.size_hint(),
        }
    }
}
