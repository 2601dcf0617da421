//! h3's QUIC traits over a connection this worker drives: the seam between the HTTP/3
//! layer (the `h3` crate) and quinn-proto.
//!
//! After its handshake a connection lives in a [`Shared`] cell that both its driver task
//! ([`crate::connection`]) and the HTTP/3 side hold, on one thread. The HTTP/3 side
//! polls streams; what it cannot have yet leaves a waker, which the driver wakes when
//! quinn-proto reports the stream opened, readable or writable. What the HTTP/3 side
//! writes or closes makes data to send, so it wakes the driver ([`State::kick`]), which
//! flushes. Nothing here computes handshake crypto: the handshake's asymmetric crypto is
//! done (only a 0-RTT connection's Finished may still be to come).

use std::cell::RefCell;
use std::collections::HashMap;
use std::rc::Rc;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::time::Instant;

use bytes::{Buf, Bytes};
use h3::quic::{self, ConnectionErrorIncoming, StreamErrorIncoming, WriteBuf};
use quinn_proto::{Connection, Dir, FinishError, ReadError, StreamId, VarInt, WriteError};
use tokio::sync::Notify;

/// One connection, shared by its driver and its HTTP/3 side.
pub(crate) type Shared = Rc<RefCell<State>>;

/// The connection and who waits on it.
pub(crate) struct State {
    pub(crate) conn: Box<Connection>,
    accept: [Option<Waker>; 2],
    open: [Option<Waker>; 2],
    readers: HashMap<StreamId, Waker>,
    writers: HashMap<StreamId, Waker>,
    /// Why the connection is closed, once it is.
    closed: Option<ConnectionErrorIncoming>,
    /// Wakes the driver to send what was written.
    driver: Rc<Notify>,
}

fn index(dir: Dir) -> usize {
    match dir {
        Dir::Bi => 0,
        Dir::Uni => 1,
    }
}

impl State {
    pub(crate) fn new(conn: Box<Connection>, driver: Rc<Notify>) -> Shared {
        Rc::new(RefCell::new(Self {
            conn,
            accept: [None, None],
            open: [None, None],
            readers: HashMap::new(),
            writers: HashMap::new(),
            closed: None,
            driver,
        }))
    }

    /// Tells the driver there is something to send.
    fn kick(&self) {
        self.driver.notify_one();
    }

    /// Wakes whoever waits on what `event` says changed.
    pub(crate) fn stream_event(&mut self, event: quinn_proto::StreamEvent) {
        use quinn_proto::StreamEvent as E;
        let wake = |w: Option<Waker>| {
            if let Some(w) = w {
                w.wake();
            }
        };
        match event {
            E::Opened { dir } => wake(self.accept[index(dir)].take()),
            E::Available { dir } => wake(self.open[index(dir)].take()),
            E::Readable { id } => wake(self.readers.remove(&id)),
            E::Writable { id } | E::Finished { id } | E::Stopped { id, .. } => {
                wake(self.writers.remove(&id))
            }
        }
    }

    /// The connection is gone: everyone waiting is told.
    pub(crate) fn lost(&mut self, why: ConnectionErrorIncoming) {
        self.closed.get_or_insert(why);
        for w in self.accept.iter_mut().chain(self.open.iter_mut()) {
            if let Some(w) = w.take() {
                w.wake();
            }
        }
        for (_, w) in self.readers.drain().chain(self.writers.drain()) {
            w.wake();
        }
    }

    fn stream_closed(&self) -> StreamErrorIncoming {
        StreamErrorIncoming::ConnectionErrorIncoming {
            connection_error: self.connection_closed(),
        }
    }

    fn connection_closed(&self) -> ConnectionErrorIncoming {
        self.closed
            .clone()
            .unwrap_or(ConnectionErrorIncoming::InternalError(
                "the connection closed".into(),
            ))
    }
}

/// Why a connection ended, as h3 names it.
pub(crate) fn lost_reason(reason: &quinn_proto::ConnectionError) -> ConnectionErrorIncoming {
    use quinn_proto::ConnectionError as E;
    match reason {
        E::ApplicationClosed(close) => ConnectionErrorIncoming::ApplicationClose {
            error_code: close.error_code.into_inner(),
        },
        E::TimedOut => ConnectionErrorIncoming::Timeout,
        other => ConnectionErrorIncoming::Undefined(Arc::new(other.clone())),
    }
}

fn h3_id(id: StreamId) -> quic::StreamId {
    quic::StreamId::try_from(u64::from(VarInt::from(id))).expect("a QUIC stream id")
}

/// The connection, as h3 accepts and opens streams on it.
#[derive(Clone)]
pub struct H3Connection(pub(crate) Shared);

impl H3Connection {
    fn accept(
        &mut self,
        dir: Dir,
        cx: &mut Context<'_>,
    ) -> Poll<Result<StreamId, ConnectionErrorIncoming>> {
        let mut state = self.0.borrow_mut();
        if let Some(id) = state.conn.streams().accept(dir) {
            // Accepting may raise the peer's stream limit: a MAX_STREAMS to send.
            state.kick();
            return Poll::Ready(Ok(id));
        }
        if state.closed.is_some() {
            return Poll::Ready(Err(state.connection_closed()));
        }
        state.accept[index(dir)] = Some(cx.waker().clone());
        Poll::Pending
    }

    fn open(
        &mut self,
        dir: Dir,
        cx: &mut Context<'_>,
    ) -> Poll<Result<StreamId, StreamErrorIncoming>> {
        let mut state = self.0.borrow_mut();
        if state.closed.is_some() {
            return Poll::Ready(Err(state.stream_closed()));
        }
        match state.conn.streams().open(dir) {
            Some(id) => Poll::Ready(Ok(id)),
            None => {
                state.open[index(dir)] = Some(cx.waker().clone());
                Poll::Pending
            }
        }
    }
}

impl quic::Connection<Bytes> for H3Connection {
    type RecvStream = RecvStream;
    type OpenStreams = H3Connection;

    fn poll_accept_recv(
        &mut self,
        cx: &mut Context<'_>,
    ) -> Poll<Result<RecvStream, ConnectionErrorIncoming>> {
        self.accept(Dir::Uni, cx)
            .map_ok(|id| RecvStream::new(self.0.clone(), id))
    }

    fn poll_accept_bidi(
        &mut self,
        cx: &mut Context<'_>,
    ) -> Poll<Result<BidiStream, ConnectionErrorIncoming>> {
        self.accept(Dir::Bi, cx)
            .map_ok(|id| BidiStream::new(self.0.clone(), id))
    }

    fn opener(&self) -> H3Connection {
        self.clone()
    }
}

impl quic::OpenStreams<Bytes> for H3Connection {
    type BidiStream = BidiStream;
    type SendStream = SendStream;

    fn poll_open_bidi(
        &mut self,
        cx: &mut Context<'_>,
    ) -> Poll<Result<BidiStream, StreamErrorIncoming>> {
        self.open(Dir::Bi, cx)
            .map_ok(|id| BidiStream::new(self.0.clone(), id))
    }

    fn poll_open_send(
        &mut self,
        cx: &mut Context<'_>,
    ) -> Poll<Result<SendStream, StreamErrorIncoming>> {
        self.open(Dir::Uni, cx)
            .map_ok(|id| SendStream::new(self.0.clone(), id))
    }

    fn close(&mut self, code: h3::error::Code, reason: &[u8]) {
        let mut state = self.0.borrow_mut();
        let code = VarInt::from_u64(code.value()).unwrap_or(VarInt::MAX);
        state
            .conn
            .close(Instant::now(), code, Bytes::copy_from_slice(reason));
        state.kick();
    }
}

/// The sending half of a stream.
pub struct SendStream {
    state: Shared,
    id: StreamId,
    /// What h3 handed over and quinn-proto has not taken yet.
    pending: Option<WriteBuf<Bytes>>,
    /// Finished or reset: nothing more to do when dropped.
    ended: bool,
}

impl SendStream {
    fn new(state: Shared, id: StreamId) -> Self {
        Self {
            state,
            id,
            pending: None,
            ended: false,
        }
    }
}

/// HTTP/3's code for "nothing wrong" (RFC 9114 section 8.1): a request body the server
/// stops reading once it has its answer (section 4.1.2).
const H3_NO_ERROR: VarInt = h3_code(h3::error::Code::H3_NO_ERROR);
/// HTTP/3's code for a stream the server gave up on.
const H3_INTERNAL_ERROR: VarInt = h3_code(h3::error::Code::H3_INTERNAL_ERROR);

/// An HTTP/3 error code as QUIC carries it (every code RFC 9114 defines is below 2^32).
const fn h3_code(code: h3::error::Code) -> VarInt {
    assert!(code.value() <= u32::MAX as u64);
    VarInt::from_u32(code.value() as u32)
}

fn stopped(code: VarInt) -> StreamErrorIncoming {
    StreamErrorIncoming::StreamTerminated {
        error_code: code.into_inner(),
    }
}

impl quic::SendStream<Bytes> for SendStream {
    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), StreamErrorIncoming>> {
        let Some(pending) = self.pending.as_mut() else {
            return Poll::Ready(Ok(()));
        };
        let mut state = self.state.borrow_mut();
        let mut wrote = false;
        while pending.has_remaining() {
            match state.conn.send_stream(self.id).write(pending.chunk()) {
                Ok(n) => {
                    pending.advance(n);
                    wrote = true;
                }
                Err(WriteError::Blocked) => {
                    // quinn-proto says Blocked on a closed connection too: nothing would
                    // ever wake this writer.
                    if state.closed.is_some() {
                        return Poll::Ready(Err(state.stream_closed()));
                    }
                    state.writers.insert(self.id, cx.waker().clone());
                    if wrote {
                        state.kick();
                    }
                    return Poll::Pending;
                }
                Err(WriteError::Stopped(code)) => return Poll::Ready(Err(stopped(code))),
                Err(WriteError::ClosedStream) => return Poll::Ready(Err(state.stream_closed())),
            }
        }
        state.kick();
        drop(state);
        self.pending = None;
        Poll::Ready(Ok(()))
    }

    fn send_data<T: Into<WriteBuf<Bytes>>>(&mut self, data: T) -> Result<(), StreamErrorIncoming> {
        if self.pending.is_some() {
            return Err(StreamErrorIncoming::Unknown(
                "data sent before the last was taken".into(),
            ));
        }
        self.pending = Some(data.into());
        Ok(())
    }

    /// Finishes the stream; a request stream's (bidirectional) then waits until the
    /// client has acknowledged all of it: a response is done only when it has arrived.
    /// What holds the request (the connection's count, a drain) holds it until then, and
    /// a connection closed once its last request is done (a GOAWAY's, a drain's) does not
    /// cut an answer whose end is still in flight: a CONNECTION_CLOSE ends
    /// retransmission. A unidirectional stream's (h3's grease) returns at once: h3 polls
    /// it in the middle of reading its control stream, and would drop what it read.
    fn poll_finish(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), StreamErrorIncoming>> {
        if !self.ended {
            if self.poll_ready(cx)?.is_pending() {
                return Poll::Pending;
            }
            let mut state = self.state.borrow_mut();
            let finished = state.conn.send_stream(self.id).finish();
            self.ended = true;
            state.kick();
            match finished {
                Ok(()) => {}
                Err(FinishError::Stopped(code)) => return Poll::Ready(Err(stopped(code))),
                Err(FinishError::ClosedStream) => return Poll::Ready(Err(state.stream_closed())),
            }
        }
        if self.id.dir() == quinn_proto::Dir::Uni {
            return Poll::Ready(Ok(()));
        }
        let mut state = self.state.borrow_mut();
        match state.conn.send_stream(self.id).stopped() {
            // Freed: every byte and the end acknowledged.
            Err(_) => Poll::Ready(Ok(())),
            Ok(Some(code)) => Poll::Ready(Err(stopped(code))),
            Ok(None) if state.closed.is_some() => Poll::Ready(Err(state.stream_closed())),
            // Woken by its Finished (or Stopped) event, or the connection's end.
            Ok(None) => {
                state.writers.insert(self.id, cx.waker().clone());
                Poll::Pending
            }
        }
    }

    fn reset(&mut self, reset_code: u64) {
        let mut state = self.state.borrow_mut();
        let code = VarInt::from_u64(reset_code).unwrap_or(VarInt::MAX);
        let _ = state.conn.send_stream(self.id).reset(code);
        self.ended = true;
        state.kick();
    }

    fn send_id(&self) -> quic::StreamId {
        h3_id(self.id)
    }
}

impl Drop for SendStream {
    /// A send half dropped unfinished (a response given up on) is reset, so that the
    /// client is not left waiting, cannot take a truncated response for a whole one,
    /// and the stream is freed.
    fn drop(&mut self) {
        let mut state = self.state.borrow_mut();
        if !self.ended {
            let _ = state.conn.send_stream(self.id).reset(H3_INTERNAL_ERROR);
        }
        state.writers.remove(&self.id);
        state.kick();
    }
}

/// The receiving half of a stream.
pub struct RecvStream {
    state: Shared,
    id: StreamId,
}

impl RecvStream {
    fn new(state: Shared, id: StreamId) -> Self {
        Self { state, id }
    }
}

impl quic::RecvStream for RecvStream {
    type Buf = Bytes;

    fn poll_data(
        &mut self,
        cx: &mut Context<'_>,
    ) -> Poll<Result<Option<Bytes>, StreamErrorIncoming>> {
        let mut state = self.state.borrow_mut();
        let mut stream = state.conn.recv_stream(self.id);
        let mut chunks = match stream.read(true) {
            Ok(chunks) => chunks,
            Err(_) => return Poll::Ready(Ok(None)),
        };
        let next = chunks.next(usize::MAX);
        let more_credit = chunks.finalize().should_transmit();
        if more_credit {
            state.kick();
        }
        match next {
            Ok(Some(chunk)) => Poll::Ready(Ok(Some(chunk.bytes))),
            Ok(None) => Poll::Ready(Ok(None)),
            Err(ReadError::Blocked) => {
                if state.closed.is_some() {
                    return Poll::Ready(Err(state.stream_closed()));
                }
                state.readers.insert(self.id, cx.waker().clone());
                Poll::Pending
            }
            Err(ReadError::Reset(code)) => Poll::Ready(Err(stopped(code))),
        }
    }

    fn stop_sending(&mut self, error_code: u64) {
        let mut state = self.state.borrow_mut();
        let code = VarInt::from_u64(error_code).unwrap_or(VarInt::MAX);
        let _ = state.conn.recv_stream(self.id).stop(code);
        state.kick();
    }

    fn recv_id(&self) -> quic::StreamId {
        h3_id(self.id)
    }
}

impl Drop for RecvStream {
    /// A receive half dropped before its end (a body not read) is stopped, so that the
    /// stream is freed and the peer gets its stream credit back; with H3_NO_ERROR, so
    /// that the client keeps the response (a response that is not whole is reset on its
    /// own side).
    fn drop(&mut self) {
        let mut state = self.state.borrow_mut();
        let _ = state.conn.recv_stream(self.id).stop(H3_NO_ERROR);
        state.readers.remove(&self.id);
        state.kick();
    }
}

/// Both halves of a request stream.
pub struct BidiStream {
    send: SendStream,
    recv: RecvStream,
}

impl BidiStream {
    fn new(state: Shared, id: StreamId) -> Self {
        Self {
            send: SendStream::new(state.clone(), id),
            recv: RecvStream::new(state, id),
        }
    }
}

impl quic::SendStream<Bytes> for BidiStream {
    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), StreamErrorIncoming>> {
        self.send.poll_ready(cx)
    }

    fn send_data<T: Into<WriteBuf<Bytes>>>(&mut self, data: T) -> Result<(), StreamErrorIncoming> {
        self.send.send_data(data)
    }

    fn poll_finish(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), StreamErrorIncoming>> {
        self.send.poll_finish(cx)
    }

    fn reset(&mut self, reset_code: u64) {
        self.send.reset(reset_code)
    }

    fn send_id(&self) -> quic::StreamId {
        self.send.send_id()
    }
}

impl quic::RecvStream for BidiStream {
    type Buf = Bytes;

    fn poll_data(
        &mut self,
        cx: &mut Context<'_>,
    ) -> Poll<Result<Option<Bytes>, StreamErrorIncoming>> {
        self.recv.poll_data(cx)
    }

    fn stop_sending(&mut self, error_code: u64) {
        self.recv.stop_sending(error_code)
    }

    fn recv_id(&self) -> quic::StreamId {
        self.recv.recv_id()
    }
}

impl quic::BidiStream<Bytes> for BidiStream {
    type SendStream = SendStream;
    type RecvStream = RecvStream;

    fn split(self) -> (SendStream, RecvStream) {
        (self.send, self.recv)
    }
}
