//! What passes between the connection task and one stream's handler: the request body
//! the connection receives and the handler reads ([`Inbound`]), and for a stream turned
//! into a tunnel (an RFC 8441 WebSocket), the bytes the handler writes back
//! ([`Outbound`]). Both are shared on the worker's thread (`Rc<RefCell>`): the handler
//! runs in the connection's task, or a task of the same worker.
//!
//! Flow control is the back-pressure: the connection gives a stream's window back only
//! for bytes the handler took ([`Shared::take_released`]), so a handler that stops
//! reading stops the client within one window; and the connection's window only for
//! bytes no stream holds any more ([`Consumed`]: taken, or dropped with their stream),
//! so that all the streams of a connection hold no more than its window.

use std::cell::{Cell, RefCell};
use std::collections::VecDeque;
use std::io;
use std::pin::Pin;
use std::rc::Rc;
use std::task::{Context, Poll, Waker};

use bytes::{Buf, Bytes, BytesMut};
use hyper::body::{Frame, SizeHint};
use hyper::HeaderMap;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// Frames smaller than this are joined to the ones before them.
const SMALL_FRAME: usize = 4096;

/// How a request body ended, if it has.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum End {
    /// Still coming.
    No,
    /// Whole (END_STREAM, or trailers).
    Whole,
    /// The stream was reset or the connection lost: never taken for a whole body.
    Aborted,
}

/// Body bytes of any of a connection's streams that left its buffers (the handler took
/// them, or they were dropped with their stream or reader), for the connection's window:
/// counted whenever that happens, after the stream is gone too.
#[derive(Debug, Default)]
pub(crate) struct Consumed {
    bytes: Cell<usize>,
    /// The connection task, woken when there is window to give back.
    conn: RefCell<Option<Waker>>,
}

impl Consumed {
    fn add(&self, n: usize) {
        if n == 0 {
            return;
        }
        self.bytes.set(self.bytes.get() + n);
        if let Some(w) = &*self.conn.borrow() {
            w.wake_by_ref();
        }
    }

    /// What left the buffers since last asked; `conn` is woken when more does.
    pub(crate) fn take(&self, conn: &Waker) -> usize {
        let mut slot = self.conn.borrow_mut();
        if !slot.as_ref().is_some_and(|w| w.will_wake(conn)) {
            *slot = Some(conn.clone());
        }
        self.bytes.replace(0)
    }
}

/// One stream's request body between the connection and the handler.
#[derive(Debug)]
pub(crate) struct Shared {
    chunks: VecDeque<Bytes>,
    /// Small frames joined, after `chunks`: a body sent a byte a frame costs a byte a
    /// byte here, not a chunk's bookkeeping a byte (what the window bounds is bytes).
    tail: BytesMut,
    trailers: Option<HeaderMap>,
    end: End,
    /// Bytes the handler took that the connection has not yet given back to the
    /// stream's window.
    released: usize,
    /// What is left of a declared content-length.
    remaining: Option<u64>,
    /// The handler dropped its end: what still comes is thrown away.
    reader_gone: bool,
    reader: Option<Waker>,
    /// The connection task, woken when there is window to give back.
    conn: Option<Waker>,
    /// The connection's count of bytes out of every stream's buffers.
    consumed: Rc<Consumed>,
}

/// The connection's end of a stream's request body.
pub(crate) type Inbound = Rc<RefCell<Shared>>;

/// A request body for a stream whose HEADERS did not end it: the connection's end and
/// the handler's. `consumed` is the connection's count of bytes out of the buffers.
pub(crate) fn request_body(
    content_length: Option<u64>,
    consumed: &Rc<Consumed>,
) -> (Inbound, RequestStream) {
    let shared = Rc::new(RefCell::new(Shared {
        chunks: VecDeque::new(),
        tail: BytesMut::new(),
        trailers: None,
        end: End::No,
        released: 0,
        remaining: content_length,
        reader_gone: false,
        reader: None,
        conn: None,
        consumed: consumed.clone(),
    }));
    (shared.clone(), RequestStream(shared))
}

impl Shared {
    /// Body bytes arrived (copied out of the connection's read buffer). Returns false
    /// when the handler is gone, and the caller gives their stream window back at once
    /// (they count as consumed here).
    pub(crate) fn push(&mut self, data: &[u8], end: bool) -> bool {
        if end {
            self.end = End::Whole;
        }
        if self.reader_gone {
            self.consumed.add(data.len());
            return false;
        }
        if data.len() < SMALL_FRAME {
            self.tail.extend_from_slice(data);
        } else {
            if !self.tail.is_empty() {
                let joined = self.tail.split().freeze();
                self.chunks.push_back(joined);
            }
            self.chunks.push_back(Bytes::copy_from_slice(data));
        }
        self.wake_reader();
        true
    }

    /// The trailers, which end the body.
    pub(crate) fn trailers(&mut self, trailers: HeaderMap) {
        self.trailers = Some(trailers);
        self.end = End::Whole;
        self.wake_reader();
    }

    /// The stream was reset, or the connection is going: the body will never end.
    pub(crate) fn abort(&mut self) {
        if self.end == End::No {
            self.end = End::Aborted;
        }
        let dropped = self.unread();
        self.chunks.clear();
        self.tail = BytesMut::new();
        self.consumed.add(dropped);
        self.wake_reader();
    }

    /// The bytes received and not taken.
    fn unread(&self) -> usize {
        self.chunks.iter().map(Bytes::len).sum::<usize>() + self.tail.len()
    }

    /// Bytes the handler took since last asked, for the stream's window; `conn` is the
    /// task to wake when more are taken.
    pub(crate) fn take_released(&mut self, conn: &Waker) -> usize {
        if !self.conn.as_ref().is_some_and(|w| w.will_wake(conn)) {
            self.conn = Some(conn.clone());
        }
        std::mem::take(&mut self.released)
    }

    /// Whether the handler has dropped the body (a tunnel that stopped reading).
    pub(crate) fn reader_gone(&self) -> bool {
        self.reader_gone
    }

    /// Whether the body waits on the client: more is to come, and the handler has
    /// taken all that came (so the client is not held back by it).
    pub(crate) fn waits_on_client(&self) -> bool {
        self.end == End::No && !self.reader_gone && self.unread() == 0
    }

    /// Whether the client sent the whole body.
    pub(crate) fn ended(&self) -> bool {
        self.end == End::Whole
    }

    fn wake_reader(&mut self) {
        if let Some(w) = self.reader.take() {
            w.wake();
        }
    }

    fn taken(&mut self, n: usize) {
        self.released += n;
        self.consumed.add(n);
        if let Some(remaining) = &mut self.remaining {
            *remaining = remaining.saturating_sub(n as u64);
        }
        if let Some(w) = &self.conn {
            w.wake_by_ref();
        }
    }
}

/// The handler's end of a request body (a `RequestBody` variant).
#[derive(Debug)]
pub(crate) struct RequestStream(Inbound);

impl RequestStream {
    pub(crate) fn poll_frame(
        &mut self,
        cx: &mut Context<'_>,
    ) -> Poll<Option<io::Result<Frame<Bytes>>>> {
        let mut shared = self.0.borrow_mut();
        let chunk = match shared.chunks.pop_front() {
            Some(chunk) => Some(chunk),
            None if !shared.tail.is_empty() => Some(shared.tail.split().freeze()),
            None => None,
        };
        if let Some(chunk) = chunk {
            shared.taken(chunk.len());
            return Poll::Ready(Some(Ok(Frame::data(chunk))));
        }
        if let Some(trailers) = shared.trailers.take() {
            return Poll::Ready(Some(Ok(Frame::trailers(trailers))));
        }
        match shared.end {
            End::Whole => Poll::Ready(None),
            End::Aborted => Poll::Ready(Some(Err(io::Error::new(
                io::ErrorKind::ConnectionAborted,
                "the HTTP/2 stream was reset before its body ended",
            )))),
            End::No => {
                shared.reader = Some(cx.waker().clone());
                Poll::Pending
            }
        }
    }

    pub(crate) fn is_end_stream(&self) -> bool {
        let shared = self.0.borrow();
        shared.end == End::Whole
            && shared.chunks.is_empty()
            && shared.tail.is_empty()
            && shared.trailers.is_none()
    }

    /// What is left of the body: exact by its content-length, or without one, once the
    /// client ended the body with the last of it still unread here (a small body sent
    /// whole with its HEADERS), so that it can go on by its length. A body ending in
    /// trailers stays of unknown size: only chunked framing carries them on.
    pub(crate) fn size_hint(&self) -> SizeHint {
        let shared = self.0.borrow();
        match shared.remaining {
            Some(n) => SizeHint::with_exact(n),
            None if shared.end == End::Whole && shared.trailers.is_none() => {
                SizeHint::with_exact(shared.unread() as u64)
            }
            None => SizeHint::new(),
        }
    }
}

impl Drop for RequestStream {
    fn drop(&mut self) {
        let mut shared = self.0.borrow_mut();
        shared.reader_gone = true;
        // What was received but not read is given back to the windows as well.
        let unread = shared.unread();
        shared.chunks.clear();
        shared.tail = BytesMut::new();
        shared.released += unread;
        shared.consumed.add(unread);
        if let Some(w) = &shared.conn {
            w.wake_by_ref();
        }
    }
}

/// What a tunnel's handler writes to the client: bytes the connection sends as DATA
/// when the stream's window allows, and the end.
#[derive(Debug, Default)]
pub(crate) struct Outbound {
    bytes: Vec<u8>,
    ended: bool,
    writer: Option<Waker>,
    conn: Option<Waker>,
}

/// How much a tunnel's handler may write ahead of the connection sending it.
const OUTBOUND_LIMIT: usize = 64 << 10;

impl Outbound {
    /// The bytes waiting to be sent, and whether the handler ended its side; `conn` is
    /// the task to wake when more come.
    pub(crate) fn pending(&mut self, conn: &Waker) -> (&[u8], bool) {
        if !self.conn.as_ref().is_some_and(|w| w.will_wake(conn)) {
            self.conn = Some(conn.clone());
        }
        (&self.bytes, self.ended)
    }

    /// `n` bytes were sent.
    pub(crate) fn sent(&mut self, n: usize) {
        self.bytes.drain(..n);
        if n > 0 {
            if let Some(w) = self.writer.take() {
                w.wake();
            }
        }
    }

    /// The stream is gone: the handler's writes fail from now on.
    pub(crate) fn abort(&mut self) {
        self.ended = true;
        self.bytes = Vec::new();
        if let Some(w) = self.writer.take() {
            w.wake();
        }
    }

    fn wake_conn(&self) {
        if let Some(w) = &self.conn {
            w.wake_by_ref();
        }
    }
}

/// A stream as a byte stream, for a tunnel: reads the request body, writes DATA.
pub(crate) struct TunnelIo {
    pub(crate) inbound: RequestStream,
    pub(crate) outbound: Rc<RefCell<Outbound>>,
    /// A chunk read but not yet all copied out.
    pub(crate) unread: Bytes,
}

impl AsyncRead for TunnelIo {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        while self.unread.is_empty() {
            match self.inbound.poll_frame(cx) {
                Poll::Ready(Some(Ok(frame))) => {
                    if let Ok(data) = frame.into_data() {
                        self.unread = data;
                    }
                }
                Poll::Ready(Some(Err(e))) => return Poll::Ready(Err(e)),
                Poll::Ready(None) => return Poll::Ready(Ok(())),
                Poll::Pending => return Poll::Pending,
            }
        }
        let n = self.unread.len().min(buf.remaining());
        buf.put_slice(&self.unread[..n]);
        self.unread.advance(n);
        Poll::Ready(Ok(()))
    }
}

impl AsyncWrite for TunnelIo {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let mut out = self.outbound.borrow_mut();
        if out.ended {
            return Poll::Ready(Err(io::ErrorKind::BrokenPipe.into()));
        }
        let room = OUTBOUND_LIMIT.saturating_sub(out.bytes.len());
        if room == 0 {
            out.writer = Some(cx.waker().clone());
            return Poll::Pending;
        }
        let n = room.min(buf.len());
        out.bytes.extend_from_slice(&buf[..n]);
        out.wake_conn();
        Poll::Ready(Ok(n))
    }

    fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        let mut out = self.outbound.borrow_mut();
        out.ended = true;
        out.wake_conn();
        Poll::Ready(Ok(()))
    }
}
