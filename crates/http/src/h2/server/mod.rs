//! HTTP/2's server side on terminus's own codec ([`state`] over [`crate::h2::frame`] and
//! [`crate::h2::hpack`]), one task per connection and none per
//! stream: the task reads the client's frames into the codec, polls each stream's
//! handler (the responder's future, then its response body) itself, and writes what
//! every stream produced in one pass in one write, so that a read's worth of requests
//! leaves in as few records as fit.
//!
//! A stream's request body goes to its handler through [`inbound`]; flow control is the
//! back-pressure (a window is given back only for bytes the handler took). What all the
//! streams of a connection may hold is its window, opened only toward what the streams
//! still receiving a body can send (so an idle connection holds nothing beyond the
//! protocol's 64 KiB, and no stream waits on another's unread bytes), and what all the
//! connections of a worker hold beyond each one's first 64 KiB is the worker's budget
//! ([`crate::body::budget`]): the connection's window opens only with bytes taken from
//! it, and waits for them when the worker holds its limit. An RFC 8441
//! WebSocket the proxy accepted upstream turns its stream into a tunnel, run as a task
//! of the worker with the stream as its byte stream.
//!
//! Between requests the connection holds the codec's state (the client's HPACK table,
//! the settings, the windows) and no buffer: the read buffer is lent by the worker when
//! bytes arrive and the write buffer while there is output, both given back when the
//! connection goes quiet. It closes with GOAWAY after `timeouts.keepalive` without
//! traffic, or on shutdown (streams in flight finish), and is dropped when idle twice
//! in a row (a client that ignores GOAWAY); a stream whose answer waits that long on a
//! window the client does not open is reset, whatever else the client sends.

mod inbound;
mod request;
mod response;
pub mod state;
mod trouble;

use std::cell::RefCell;
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::rc::Rc;
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use crate::h2::frame::ErrorCode;
use crate::h2::server::state::{Config, Connection, Event};
use bytes::{Buf, Bytes};
use hyper::body::Body as _;
use hyper::{Method, Response, StatusCode, Version};
use tokio::io::{AsyncWrite, ReadBuf};
use tokio::sync::watch;

pub(crate) use inbound::RequestStream;
use inbound::{Consumed, Inbound, Outbound, TunnelIo};
pub use trouble::Http2Trouble;

use crate::body::{budget, Body, RequestBody};
use crate::buffers::{self, Lent};
use crate::h1::server::ReadReady;
use crate::Responder;

/// The read buffer: a TLS record's plaintext, and room for the largest frame we accept
/// (SETTINGS_MAX_FRAME_SIZE's default, 16 KiB, and its 9-byte head), which a frame cut
/// across reads must find whole at the buffer's start.
const READ_SIZE: usize = 16 * 1024 + 16;

/// What one stream's body may add to a pass's output while other bodies are sending
/// too: a frame, so that the pass is shared.
const FRAME_BUDGET: usize = 16 * 1024;

/// Output waiting past this, the connection stops reading and stops polling bodies
/// until the client takes what was written: a client that does not read cannot make
/// the server buffer for it (PING and SETTINGS floods included).
const HIGH_WATER: usize = 64 * 1024;

/// The slowest a request body may come, in bytes a second, while its client could send
/// it (Apache's mod_reqtimeout `MinRate` is 500): slower, for a whole idle-timer
/// period, it is reset ([`H2::cut_stuck_streams`]).
const MIN_BODY_RATE: usize = 256;

/// The connection's window is opened by at least this much at a time (or not at all):
/// a WINDOW_UPDATE per 16 KiB frame's worth, not per frame.
const MIN_WINDOW_UPDATE: u32 = 16 * 1024;

/// The connection window every client has before any WINDOW_UPDATE (RFC 9113 section
/// 6.9.2), which no budget can refuse: the worker's budget covers what is beyond it.
const PROTOCOL_WINDOW: u64 = 65_535;

/// What a connection holds of its worker's request-body budget ([`budget`]); its place
/// on the budget's lists while it waits for more (and whether the budget itself keeps
/// it short), and while it holds room its streams cannot use (to be asked for it);
/// given back, and forgotten by the budget, when the connection ends.
#[derive(Default)]
struct Reserved {
    bytes: usize,
    waiting: Option<(Waker, budget::Ticket)>,
    short: bool,
    holding: Option<(Waker, budget::Ticket)>,
}

impl Reserved {
    /// Waiting for the budget to give back room (`short`: the budget itself, not the
    /// connection's fair share, keeps it short: counted until it has what it wants).
    fn wait(&mut self, waker: &Waker, short: bool) {
        if !self
            .waiting
            .as_ref()
            .is_some_and(|(w, _)| w.will_wake(waker))
        {
            self.stop_waiting();
            self.waiting = Some((waker.clone(), budget::Ticket::default()));
        }
        if let Some((waker, ticket)) = &mut self.waiting {
            budget::wait(waker, ticket);
        }
        if short != self.short {
            budget::waits(short);
            self.short = short;
        }
    }

    /// No longer waiting for the budget (nothing more is wanted).
    fn not_waiting(&mut self) {
        self.stop_waiting();
        if std::mem::take(&mut self.short) {
            budget::waits(false);
        }
    }

    fn stop_waiting(&mut self) {
        if let Some((waker, mut ticket)) = self.waiting.take() {
            budget::stop_waiting(&waker, &mut ticket);
        }
    }

    fn is_waiting(&self) -> bool {
        self.waiting.is_some()
    }

    /// Holding room its streams cannot use: `waker` is woken when another is kept
    /// short. Listed again at every call (a wake takes it off the budget's list, and
    /// one that found no one pressed by the time it ran must still be woken by the
    /// next taker kept short); the ticket makes that free within a round.
    fn holding(&mut self, waker: &Waker) {
        if !self
            .holding
            .as_ref()
            .is_some_and(|(w, _)| w.will_wake(waker))
        {
            self.not_holding();
            self.holding = Some((waker.clone(), budget::Ticket::default()));
        }
        if let Some((waker, ticket)) = &mut self.holding {
            budget::on_pressure(waker, ticket);
        }
    }

    fn not_holding(&mut self) {
        if let Some((waker, mut ticket)) = self.holding.take() {
            budget::stop_holding(&waker, &mut ticket);
        }
    }
}

impl Drop for Reserved {
    fn drop(&mut self) {
        self.not_waiting();
        self.not_holding();
        budget::give(self.bytes);
    }
}

/// A response's future, boxed: a stream's handler, polled by the connection task.
type Handler = Pin<Box<dyn Future<Output = Response<Body>>>>;

/// One stream the connection is answering.
struct Stream {
    id: u32,
    method: Method,
    uri: hyper::Uri,
    phase: Phase,
    /// Its request body's connection end, while the body is coming.
    inbound: Option<Inbound>,
    /// An extended CONNECT's body, kept for the tunnel the responder may accept.
    tunnel: Option<RequestStream>,
    /// Its answer moved since the idle timer last looked.
    moved: bool,
    /// Request-body bytes that came since the idle timer last looked.
    body_bytes: usize,
    /// Whether, when the idle timer last looked, the client could send a window
    /// update's worth of body on it.
    could_send: bool,
}

enum Phase {
    /// The responder is working on it.
    Responding(Handler),
    /// Its body is being sent; `chunk` is what flow control has not let out yet.
    Sending { body: Body, chunk: Bytes },
    /// A WebSocket: what its tunnel task writes goes out as DATA; `end_sent` once its
    /// upstream side ended (END_STREAM sent), while the client's may still be open.
    Tunnel {
        outbound: Rc<RefCell<Outbound>>,
        end_sent: bool,
    },
}

/// Serves HTTP/2 on `io` until the client is done, the connection idles out, or
/// `shutdown` fires (then in-flight streams finish and the connection closes).
pub async fn serve<S, R>(
    io: S,
    responder: Rc<R>,
    keepalive: Duration,
    mut shutdown: watch::Receiver<bool>,
) where
    S: ReadReady + AsyncWrite + Unpin,
    R: Responder + 'static,
{
    // The codec's first SETTINGS go in a buffer the worker lends.
    let mut out = Vec::new();
    buffers::lend_output(&mut out);
    let codec = Connection::new(config(responder.server_token()), &mut out);
    let mut conn = H2 {
        io,
        responder,
        out,
        flush_pending: false,
        next_turn: 0,
        done: Vec::new(),
        codec,
        input: None,
        streams: Vec::new(),
        consumed: Rc::default(),
        reserved: Reserved::default(),
        moved: false,
        body_came: 0,
        eof: false,
    };
    let mut closing = false;
    let mut shutdown_seen = false;
    // The idle timer is checked, not reset, by traffic: at each expiry, bytes that moved
    // since the last one re-arm it for a whole period (a clock read per keep-alive
    // period rather than per read and write), so a connection idles out between one
    // and two periods after its last bytes.
    let mut idle_deadline = Instant::now() + keepalive;
    loop {
        if !shutdown_seen && *shutdown.borrow() {
            shutdown_seen = true;
            closing = true;
            conn.go_away();
        }
        enum Woke {
            Done,
            Shutdown,
            Idle,
        }
        let woke = tokio::select! {
            () = std::future::poll_fn(|cx| conn.poll(cx)) => Woke::Done,
            changed = shutdown.changed(), if !shutdown_seen => {
                // A dropped sender means the process is going away: shutdown too.
                if changed.is_err() {
                    shutdown_seen = true;
                }
                Woke::Shutdown
            }
            () = tokio::time::sleep_until(idle_deadline.into()) => Woke::Idle,
        };
        match woke {
            Woke::Done => break,
            Woke::Shutdown => {
                // The sender dropped (the process going away): close as for shutdown.
                if shutdown_seen && !closing {
                    closing = true;
                    conn.go_away();
                }
            }
            Woke::Idle => {
                idle_deadline = Instant::now() + keepalive;
                conn.cut_stuck_streams(keepalive);
                if std::mem::take(&mut conn.moved) {
                    continue;
                }
                if closing {
                    break;
                }
                conn.go_away();
                closing = true;
            }
        }
    }
    conn.finish().await;
}

/// The settings terminus announces: the codec's defaults (nginx's where it has them:
/// 128 streams, a 64 KiB preread window per stream; 32 KiB of request fields, the limit
/// HTTP/3 keeps here too), and RFC 8441's extended CONNECT for WebSockets; the codec's
/// own answers signed with `token`.
fn config(token: &crate::ServerToken) -> Config {
    Config {
        connect_protocol: true,
        server: token.field().cloned(),
        ..Config::default()
    }
}

struct H2<S, R> {
    io: S,
    responder: Rc<R>,
    /// Frames to send (all of it unsent: what went is drained).
    out: Vec<u8>,
    /// The record layer holds what we wrote but has not sent it all: flush again.
    flush_pending: bool,
    /// Where the next pass over the streams starts, so that each gets its turn first.
    next_turn: usize,
    /// The streams a pass finished (kept between passes: its room is a few words).
    done: Vec<usize>,
    codec: Connection,
    /// The read buffer while a frame is incomplete or bytes are arriving, and how much
    /// of it is filled.
    input: Option<(Lent, usize)>,
    streams: Vec<Stream>,
    /// Body bytes out of the streams' buffers, for the connection's window.
    consumed: Rc<Consumed>,
    /// What the connection's window holds of the worker's budget.
    reserved: Reserved,
    /// Bytes moved since the idle timer last looked.
    moved: bool,
    /// Request-body bytes that came, all streams together, in the idle timer's last
    /// period.
    body_came: usize,
    eof: bool,
}

impl<S, R> H2<S, R>
where
    S: ReadReady + AsyncWrite + Unpin,
    R: Responder + 'static,
{
    /// Resets each stream the client has kept waiting a whole idle-timer period
    /// (`period`; RST_STREAM CANCEL), the connection and its other streams going on:
    /// - an answer waiting on a window the client did not open: a client that holds
    ///   answers, and what they hold (upstream connections, compression memory), while
    ///   it keeps its connection busy (PINGs, other requests) is cut as one that stops
    ///   reading is, stream by stream as nginx's `send_timeout` does;
    /// - a request body that came at less than [`MIN_BODY_RATE`] over the period (a
    ///   window update's worth at most), on a connection whose bodies together came at
    ///   less than that over this period and the last (a phone's uploads share its
    ///   link; a stall inside a period is made up in the next), or than a 1,024th of the
    ///   window it holds a second (so many streams cost in proportion), while
    ///   its client could send all along: a window update's worth open to it at this look
    ///   and the last, its handler having taken all that came. A client that opens
    ///   uploads and sends nothing, or a byte now and then, would hold their windows,
    ///   and the worker's budget with them (nginx's `client_body_timeout`, with
    ///   Apache's minimum rate). Not while its answer moves (a gRPC stream both ways),
    ///   nor a tunnel (a WebSocket may be quiet).
    fn cut_stuck_streams(&mut self, period: Duration) {
        let codec = &mut self.codec;
        let out = &mut self.out;
        let least = (MIN_BODY_RATE as u128 * period.as_millis() / 1000)
            .clamp(1, u128::from(MIN_WINDOW_UPDATE)) as usize;
        let came_here: usize = self.streams.iter().map(|s| s.body_bytes).sum();
        let came_before = std::mem::replace(&mut self.body_came, came_here);
        // Over two periods: twice the least, or the window it holds at a 1,024th a
        // second (the whole budget held costs its holder 12 KiB/s).
        let held = self.reserved.bytes as u128 * 2 * period.as_millis() / (1000 * 1024);
        let slow = ((came_here + came_before) as u128) < (2 * least as u128).max(held);
        let (mut answers, mut bodies) = (0, 0);
        self.streams.retain_mut(|stream| {
            let moved = std::mem::take(&mut stream.moved);
            let came = std::mem::take(&mut stream.body_bytes);
            let could_send = codec.receive_window(stream.id) >= MIN_WINDOW_UPDATE as usize;
            let could_have_sent = std::mem::replace(&mut stream.could_send, could_send);
            let answer_stuck = !moved
                && matches!(stream.phase, Phase::Sending { .. })
                && codec.send_window(stream.id) == 0;
            let tunnel = stream.tunnel.is_some() || matches!(stream.phase, Phase::Tunnel { .. });
            let body_stuck = slow
                && could_have_sent
                && could_send
                && came < least
                && !moved
                && !tunnel
                && (stream.inbound.as_ref()).is_some_and(|b| b.borrow().waits_on_client());
            if answer_stuck || body_stuck {
                buffers::lend_output(out);
                codec.cancel(stream.id, ErrorCode::Cancel, out);
                abort(stream);
                answers += usize::from(answer_stuck);
                bodies += usize::from(body_stuck && !answer_stuck);
            }
            !(answer_stuck || body_stuck)
        });
        if answers + bodies > 0 {
            tracing::debug!("h2: streams reset after a whole period: {answers} whose windows stayed shut, {bodies} whose request bodies did not come");
        }
    }

    fn go_away(&mut self) {
        buffers::lend_output(&mut self.out);
        self.codec.go_away(&mut self.out);
    }

    /// Runs the connection until it is over: Ready when the client has gone, the
    /// connection failed, or it is done after a GOAWAY.
    fn poll(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        loop {
            let mut progress = false;
            buffers::lend_output(&mut self.out);
            self.settle_window(cx);
            match self.poll_write(cx) {
                Poll::Ready(Ok(wrote)) => progress |= wrote,
                Poll::Ready(Err(_)) => return Poll::Ready(()),
                Poll::Pending => {}
            }
            let backlog = self.out.len();
            if backlog == 0 && !self.flush_pending && (self.eof || self.codec.is_done()) {
                return Poll::Ready(());
            }
            if !self.eof && backlog < HIGH_WATER {
                match self.poll_read(cx) {
                    Poll::Ready(Ok(())) => progress = true,
                    Poll::Ready(Err(_)) => return Poll::Ready(()),
                    Poll::Pending => {}
                }
            }
            progress |= self.poll_streams(cx);
            if !progress {
                if self.out.is_empty() && !self.flush_pending && self.codec.is_idle() {
                    // Quiet: the buffers go back to the worker.
                    buffers::give_back_output(&mut self.out);
                    self.codec.release_buffers();
                    if self.streams.capacity() > 1 {
                        self.streams = Vec::new();
                    }
                }
                return Poll::Pending;
            }
        }
    }

    /// Accounts the body bytes the streams gave up, and opens the connection's window
    /// again as far as the worker's budget allows, toward what its streams still
    /// receiving a body can send ([`Connection::connection_window_wanted`]): the
    /// budget covers the window beyond the protocol's first 65,535 bytes, so every
    /// connection can always take 64 KiB and one that wants more waits its turn.
    fn settle_window(&mut self, cx: &mut Context<'_>) {
        let consumed = self.consumed.take(cx.waker());
        if consumed > 0 {
            self.codec.consumed(consumed);
        }
        let allowance = self.codec.connection_allowance();
        // What the client can make us hold: its window, and once we go away (no new
        // stream) only what the open streams' own windows allow of it.
        let exposure = self.codec.connection_exposure();
        let mut covered = allowance.saturating_sub(PROTOCOL_WINDOW) as usize;
        if self.codec.is_going_away() {
            covered = covered.min(exposure.saturating_sub(PROTOCOL_WINDOW) as usize);
        }
        if self.reserved.bytes > covered {
            budget::give(self.reserved.bytes - covered);
            self.reserved.bytes = covered;
        }
        // With no stream open, whatever the window still holds is room for nothing (a
        // window cannot be taken back): when another connection is kept short of room,
        // this one goes, and gives it all back. Only once it has no stream open: a
        // GOAWAY with answers in flight is a gamble on the client finishing them after
        // it (python-h2, for one, fails at its next WINDOW_UPDATE).
        let unused = self.reserved.bytes > 0 && self.codec.is_idle();
        if unused && !self.reserved.is_waiting() && !self.codec.is_going_away() {
            if budget::give_way(self.reserved.bytes) {
                self.go_away();
                self.reserved.not_holding();
                return self.settle_window(cx);
            }
            self.reserved.holding(cx.waker());
        } else {
            self.reserved.not_holding();
        }
        let wanted = self.codec.connection_window_wanted();
        if wanted < MIN_WINDOW_UPDATE {
            // A connection kept waiting would make the idle ones go for nothing.
            self.reserved.not_waiting();
            return;
        }
        // What the window would hold beyond the protocol's, less what is reserved (past
        // a GOAWAY what is reserved can be less than the window allows, given back
        // above: that gap is covered before the window opens any further). The window
        // opens by what is wanted less what the budget could not give.
        let beyond = (allowance + u64::from(wanted)).saturating_sub(PROTOCOL_WINDOW) as usize;
        let needed = beyond.saturating_sub(self.reserved.bytes);
        let wanted = wanted as usize;
        // Nothing taken unless the window then opens a window update's worth: taking
        // less only to give it back would wake every waiter, this one too, for ever.
        let min = (needed + MIN_WINDOW_UPDATE as usize).saturating_sub(wanted);
        let taken = budget::take_up_to(needed, min, self.reserved.bytes);
        if taken.got < needed {
            self.reserved.wait(cx.waker(), taken.short);
        } else {
            self.reserved.not_waiting();
        }
        let open = (wanted + taken.got).saturating_sub(needed);
        if open >= MIN_WINDOW_UPDATE as usize {
            self.reserved.bytes += taken.got;
            self.codec
                .open_connection_window(open as u32, &mut self.out);
        }
    }

    /// Writes what is waiting and flushes it: Ready(true) when bytes went, Ready(false)
    /// when nothing is left to write or flush, Pending when the client is not taking
    /// them. What went is drained at once, so the buffer only ever holds the backlog.
    fn poll_write(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<bool>> {
        let mut written = 0;
        while written < self.out.len() {
            match Pin::new(&mut self.io).poll_write(cx, &self.out[written..]) {
                Poll::Ready(Ok(0)) => return Poll::Ready(Err(io::ErrorKind::WriteZero.into())),
                Poll::Ready(Ok(n)) => written += n,
                Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                Poll::Pending => break,
            }
        }
        if written > 0 {
            self.out.drain(..written);
            self.moved = true;
        }
        if written > 0 || self.flush_pending {
            match Pin::new(&mut self.io).poll_flush(cx) {
                Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                Poll::Ready(Ok(())) => self.flush_pending = false,
                Poll::Pending => self.flush_pending = true,
            }
        }
        if written > 0 {
            Poll::Ready(Ok(true))
        } else if self.out.is_empty() && !self.flush_pending {
            Poll::Ready(Ok(false))
        } else {
            Poll::Pending
        }
    }

    /// Reads what the client sent and hands it to the codec; Ready(Ok) when something
    /// was read (or the client ended).
    fn poll_read(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        if self.input.is_none() {
            // No buffer until there is something to read into it.
            std::task::ready!(self.io.poll_read_ready(cx))?;
        }
        let (buf, filled) = self.input.get_or_insert_with(|| (Lent::of(READ_SIZE), 0));
        if *filled == buf.len() {
            // A frame larger than the buffer (up to 16 KiB and its head).
            return Poll::Ready(Err(io::Error::other("a frame larger than the read buffer")));
        }
        let mut room = ReadBuf::new(&mut buf[*filled..]);
        std::task::ready!(Pin::new(&mut self.io).poll_read(cx, &mut room))?;
        let n = room.filled().len();
        if n == 0 {
            self.eof = true;
            return Poll::Ready(Ok(()));
        }
        *filled += n;
        self.moved = true;
        self.receive(cx);
        Poll::Ready(Ok(()))
    }

    /// Hands the read buffer's whole frames to the codec and acts on what they meant.
    fn receive(&mut self, cx: &mut Context<'_>) {
        let Some((buf, filled)) = self.input.as_mut() else {
            return;
        };
        let codec = &mut self.codec;
        let streams = &mut self.streams;
        let responder = &self.responder;
        let consumed = &self.consumed;
        let mut refused: Vec<u32> = Vec::new();
        let mut give_back: Vec<(u32, usize)> = Vec::new();
        // Body bytes no stream took in: consumed at once.
        let mut dropped = 0;
        let result = codec.receive(&buf[..*filled], &mut self.out, &mut |event| match event {
            Event::Request {
                stream,
                head,
                end_stream,
            } => {
                let connect = head.method() == b"CONNECT";
                let (inbound, body, tunnel) = if end_stream {
                    (None, RequestBody::empty(), None)
                } else if connect {
                    let (inbound, body) = inbound::request_body(None, consumed);
                    (Some(inbound), RequestBody::empty(), Some(body))
                } else {
                    let (inbound, body) = inbound::request_body(head.content_length(), consumed);
                    (Some(inbound), RequestBody::h2(body), None)
                };
                let Some(req) = request::build(head, body) else {
                    refused.push(stream);
                    return;
                };
                let (method, uri) = (req.method().clone(), req.uri().clone());
                let responder = responder.clone();
                let handler: Handler = Box::pin(async move { responder.respond(req, None).await });
                if streams.capacity() == 0 {
                    // One stream at a time is the common case: room for one, grown
                    // when more come (an idle connection keeps this slot).
                    streams.reserve_exact(1);
                }
                streams.push(Stream {
                    id: stream,
                    method,
                    uri,
                    phase: Phase::Responding(handler),
                    inbound,
                    tunnel,
                    moved: false,
                    body_bytes: 0,
                    could_send: false,
                });
            }
            Event::Data {
                stream,
                data,
                end_stream,
            } => {
                let stream_of = streams.iter_mut().find(|s| s.id == stream);
                let inbound = stream_of.and_then(|s| {
                    s.body_bytes += data.len();
                    s.inbound.as_ref()
                });
                // A reader gone counts what it is pushed as consumed itself.
                let taken = match inbound {
                    Some(i) => i.borrow_mut().push(data, end_stream),
                    None => {
                        dropped += data.len();
                        false
                    }
                };
                if !taken {
                    give_back.push((stream, data.len()));
                }
            }
            Event::Trailers { stream, fields } => {
                if let Some(inbound) = streams
                    .iter()
                    .find(|s| s.id == stream)
                    .and_then(|s| s.inbound.as_ref())
                {
                    inbound
                        .borrow_mut()
                        .trailers(response::trailers_map(fields));
                }
            }
            Event::Reset {
                stream, by_client, ..
            } => {
                responder.http2_trouble(match by_client {
                    true => Http2Trouble::ClientReset,
                    false => Http2Trouble::StreamReset,
                });
                if let Some(i) = streams.iter().position(|s| s.id == stream) {
                    abort(&streams.swap_remove(i));
                }
            }
            Event::Refused {
                stream,
                reason,
                why,
            } => {
                responder.http2_trouble(Http2Trouble::Refused(reason));
                tracing::debug!("h2: stream {stream} refused: {why}");
            }
            Event::WindowOpened | Event::GoAway { .. } => {}
        });
        match result {
            Ok(n) => {
                buf.copy_within(n..*filled, 0);
                *filled -= n;
            }
            Err(e) => {
                self.responder
                    .http2_trouble(Http2Trouble::Connection(e.code));
                tracing::debug!("h2: {e}");
                *filled = 0;
                self.eof = true;
            }
        }
        for id in refused {
            codec.cancel(id, ErrorCode::ProtocolError, &mut self.out);
        }
        for (id, n) in give_back {
            codec.release(id, n, &mut self.out);
        }
        codec.consumed(dropped);
        for stream in &self.streams {
            if let Some(inbound) = &stream.inbound {
                let n = inbound.borrow_mut().take_released(cx.waker());
                if n > 0 {
                    codec.release(stream.id, n, &mut self.out);
                }
            }
        }
        if *filled == 0 {
            // Between frames: the buffer goes back to the worker.
            self.input = None;
        }
    }

    /// Polls every stream's handler, and its body as far as flow control and the
    /// output backlog allow, starting each pass one stream further so that none waits
    /// behind another's large body; true when one moved.
    fn poll_streams(&mut self, cx: &mut Context<'_>) -> bool {
        let count = self.streams.len();
        if count == 0 {
            return false;
        }
        let sending = self
            .streams
            .iter()
            .filter(|s| !matches!(s.phase, Phase::Responding(_)))
            .count();
        // Several bodies share a pass a frame at a time; one alone may fill it.
        let budget = if sending > 1 {
            FRAME_BUDGET
        } else {
            HIGH_WATER
        };
        let first = self.next_turn % count;
        self.next_turn = self.next_turn.wrapping_add(1);
        let mut progress = false;
        let mut done = std::mem::take(&mut self.done);
        for k in 0..count {
            let i = (first + k) % count;
            let codec = &mut self.codec;
            let stream = &mut self.streams[i];
            // Window taken back from a handler that read its body.
            if let Some(inbound) = &stream.inbound {
                let n = inbound.borrow_mut().take_released(cx.waker());
                if n > 0 {
                    codec.release(stream.id, n, &mut self.out);
                    progress = true;
                }
            }
            let step = step(stream, codec, &*self.responder, &mut self.out, budget, cx);
            progress |= step.moved;
            stream.moved |= step.moved;
            if step.done {
                done.push(i);
            }
        }
        // Highest first, so that each swap_remove moves a stream already kept.
        done.sort_unstable_by(|a, b| b.cmp(a));
        for &i in &done {
            let stream = self.streams.swap_remove(i);
            // Answered whole while its body still comes: no more of it is wanted
            // (RFC 9113 section 8.1, what hyper and nginx do). A tunnel is done only
            // once both sides ended.
            let tunnel = matches!(stream.phase, Phase::Tunnel { .. });
            let unread = !tunnel && stream.inbound.as_ref().is_some_and(|b| !b.borrow().ended());
            let codec = &mut self.codec;
            if unread {
                codec.cancel(stream.id, ErrorCode::NoError, &mut self.out);
            }
            abort(&stream);
            progress = true;
        }
        done.clear();
        self.done = done;
        progress
    }

    /// Sends what is left and closes the TLS session, within a second; then reads and
    /// drops what the client still sends, for another second at most (nginx's lingering
    /// close), so that closing on its unread bytes does not reset the connection and
    /// destroy the GOAWAY before the client reads why.
    async fn finish(mut self) {
        for stream in self.streams.drain(..) {
            abort(&stream);
        }
        self.input = None;
        let flush = std::future::poll_fn(|cx| loop {
            match self.poll_write(cx) {
                Poll::Ready(Ok(true)) => continue,
                Poll::Ready(Ok(false)) => return Pin::new(&mut self.io).poll_shutdown(cx),
                Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                Poll::Pending => return Poll::Pending,
            }
        });
        if !matches!(
            tokio::time::timeout(Duration::from_secs(1), flush).await,
            Ok(Ok(()))
        ) || self.eof
        {
            return;
        }
        let linger = async {
            let mut sink = Lent::of(READ_SIZE);
            let mut left: usize = 1 << 20;
            while left > 0 {
                match tokio::io::AsyncReadExt::read(&mut self.io, &mut sink).await {
                    Ok(0) | Err(_) => break,
                    Ok(n) => left = left.saturating_sub(n),
                }
            }
        };
        let _ = tokio::time::timeout(Duration::from_secs(1), linger).await;
    }
}

/// What one poll of a stream did.
struct Step {
    moved: bool,
    done: bool,
}

/// Moves one stream on: its handler polled, its head written, its body sent as far as
/// its window, `budget` and the output backlog allow.
fn step<R: Responder>(
    stream: &mut Stream,
    codec: &mut Connection,
    responder: &R,
    out: &mut Vec<u8>,
    budget: usize,
    cx: &mut Context<'_>,
) -> Step {
    let mut moved = false;
    if let Phase::Responding(handler) = &mut stream.phase {
        let Poll::Ready(resp) = handler.as_mut().poll(cx) else {
            return Step { moved, done: false };
        };
        moved = true;
        let path = stream.uri.path_and_query().map_or("/", |p| p.as_str());
        responder.record(&stream.method, path, Version::HTTP_2, &resp);
        let (parts, body) = resp.into_parts();
        let upgrade = match stream.tunnel.take() {
            Some(body) if parts.status.is_success() => parts
                .extensions
                .get::<crate::Upgrade>()
                .cloned()
                .map(|u| (u, body)),
            _ => None,
        };
        let bodiless = stream.method == Method::HEAD
            || parts.status == StatusCode::NO_CONTENT
            || parts.status == StatusCode::NOT_MODIFIED
            || (upgrade.is_none() && body.is_end_stream());
        let no_length = stream.method == Method::HEAD || upgrade.is_some();
        let sent = codec.send_head(stream.id, bodiless, out, |b| {
            response::encode_head(&parts, &body, no_length, b)
        });
        if !sent || bodiless {
            return Step { moved, done: true };
        }
        stream.phase = match upgrade {
            Some((upgrade, body)) => {
                let outbound = Rc::new(RefCell::new(Outbound::default()));
                let io = TunnelIo {
                    inbound: body,
                    outbound: outbound.clone(),
                    unread: Bytes::new(),
                };
                tokio::task::spawn_local(tunnel(upgrade, io));
                Phase::Tunnel {
                    outbound,
                    end_sent: false,
                }
            }
            None => Phase::Sending {
                body,
                chunk: Bytes::new(),
            },
        };
    }
    // What this step may add to the output.
    let mut allowed = budget.min(HIGH_WATER.saturating_sub(out.len()));
    match &mut stream.phase {
        Phase::Responding(_) => Step { moved, done: false },
        Phase::Sending { body, chunk } => {
            // Bodies that keep yielding empty frames get a bounded share of the pass.
            for _ in 0..64 {
                if !chunk.is_empty() {
                    let take = chunk.len().min(allowed);
                    let last = take == chunk.len() && body.is_end_stream();
                    let n = codec.send_data(stream.id, &chunk[..take], last, out);
                    chunk.advance(n);
                    allowed -= n;
                    moved |= n > 0;
                    if last && chunk.is_empty() {
                        return Step { moved, done: true };
                    }
                    if !chunk.is_empty() {
                        // Waiting for the client's window or for the next pass.
                        return Step { moved, done: false };
                    }
                }
                if allowed == 0 || codec.send_window(stream.id) == 0 {
                    return Step { moved, done: false };
                }
                if let Body::File {
                    file,
                    offset,
                    remaining,
                } = body
                {
                    // Read straight into the frames it is sent in.
                    return send_file(
                        stream.id, file, offset, remaining, codec, out, allowed, moved,
                    );
                }
                match Pin::new(&mut *body).poll_frame(cx) {
                    Poll::Pending => return Step { moved, done: false },
                    Poll::Ready(None) => {
                        codec.send_data(stream.id, &[], true, out);
                        return Step {
                            moved: true,
                            done: true,
                        };
                    }
                    Poll::Ready(Some(Err(e))) => {
                        // A body that fails mid-way is never passed off as whole.
                        tracing::debug!("h2: stream {} body failed: {e}", stream.id);
                        codec.cancel(stream.id, ErrorCode::InternalError, out);
                        return Step {
                            moved: true,
                            done: true,
                        };
                    }
                    Poll::Ready(Some(Ok(frame))) => {
                        moved = true;
                        match frame.into_data() {
                            Ok(data) => *chunk = data,
                            Err(frame) => {
                                if let Ok(trailers) = frame.into_trailers() {
                                    codec.send_head(stream.id, true, out, |b| {
                                        response::encode_trailers(&trailers, b)
                                    });
                                } else {
                                    // A frame of neither kind ends the body.
                                    codec.send_data(stream.id, &[], true, out);
                                }
                                return Step { moved, done: true };
                            }
                        }
                    }
                }
            }
            Step { moved, done: false }
        }
        Phase::Tunnel { outbound, end_sent } => {
            if !*end_sent {
                let mut outbound = outbound.borrow_mut();
                let (bytes, ended) = outbound.pending(cx.waker());
                let take = bytes.len().min(allowed);
                let last = ended && take == bytes.len();
                if take > 0 || last {
                    let n = codec.send_data(stream.id, &bytes[..take], last, out);
                    outbound.sent(n);
                    moved |= n > 0;
                    *end_sent = last && n == take;
                    moved |= *end_sent;
                }
            }
            // Done once the upstream's side has ended and the client's has too (or the
            // tunnel stopped reading it).
            let client_done = stream.inbound.as_ref().is_none_or(|i| {
                let i = i.borrow();
                i.ended() || i.reader_gone()
            });
            Step {
                moved,
                done: *end_sent && client_done,
            }
        }
    }
}

/// Sends a file range as DATA frames read into the output where they lie, as far as the
/// window and the output backlog allow; done when the range is all sent (or the file
/// fails, and the stream is reset: a short body is never passed off as whole).
#[allow(clippy::too_many_arguments)]
fn send_file(
    id: u32,
    file: &std::fs::File,
    offset: &mut u64,
    remaining: &mut u64,
    codec: &mut Connection,
    out: &mut Vec<u8>,
    mut allowed: usize,
    mut moved: bool,
) -> Step {
    use std::os::unix::fs::FileExt;
    loop {
        let whole = usize::try_from(*remaining).unwrap_or(usize::MAX);
        let want = whole.min(allowed);
        let at = *offset;
        let sent = codec.send_data_from(id, want, want == whole, out, |buf| {
            let mut filled = 0;
            while filled < buf.len() {
                match file.read_at(&mut buf[filled..], at + filled as u64) {
                    Ok(0) => return false,
                    Ok(n) => filled += n,
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                    Err(_) => return false,
                }
            }
            true
        });
        match sent {
            None => {
                tracing::debug!("h2: stream {id}: file truncated or unreadable while sent");
                codec.cancel(id, ErrorCode::InternalError, out);
                return Step {
                    moved: true,
                    done: true,
                };
            }
            Some(n) => {
                *offset += n as u64;
                *remaining -= n as u64;
                allowed -= n;
                moved |= n > 0;
                if *remaining == 0 {
                    return Step { moved, done: true };
                }
                if n == 0 || allowed == 0 {
                    return Step { moved, done: false };
                }
            }
        }
    }
}

/// A stream gone: its body's reader and its tunnel told.
fn abort(stream: &Stream) {
    if let Some(inbound) = &stream.inbound {
        inbound.borrow_mut().abort();
    }
    if let Phase::Tunnel { outbound, .. } = &stream.phase {
        outbound.borrow_mut().abort();
    }
}

/// Carries a WebSocket stream the proxy accepted upstream, to and from the upstream.
async fn tunnel(upgrade: crate::Upgrade, mut io: TunnelIo) {
    if let Err(e) = upgrade.tunnel(&mut io, &[]).await {
        tracing::debug!("HTTP/2 WebSocket stream ended: {e}");
    }
    let _ = tokio::io::AsyncWriteExt::shutdown(&mut io).await;
}
