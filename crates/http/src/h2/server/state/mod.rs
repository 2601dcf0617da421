//! An HTTP/2 server connection without I/O (RFC 9113 sections 3 to 8): bytes the client
//! sent go in, events come out to the caller as they are parsed, and every frame the
//! connection owes (SETTINGS and PING answers, WINDOW_UPDATEs, RST_STREAMs, GOAWAY) and
//! every response frame the caller asks for is appended to the caller's output buffer.
//!
//! The connection keeps what the protocol needs and nothing per stream beyond it: the
//! peer's HPACK table, the settings of both ends, both ends' flow-control windows and,
//! for each open stream, its windows, which ends are closed, and its content-length
//! count. Closed streams are forgotten but for the last few ids (to tell a stream that
//! was closed from one never opened). Request bodies are the caller's to buffer: the
//! stream windows we announce bound what a client may send on one stream ahead of
//! [`Connection::release`], and the connection's window what it may send on all of them
//! ahead of [`Connection::consumed`]; the connection's window is opened only as far as
//! the caller says ([`Connection::open_connection_window`]), so that what the caller
//! holds for the client is the caller's to budget.
//!
//! What a client can do wrong is answered as section 5.4 says, a stream error where the
//! stream alone is at fault and a connection error (GOAWAY, then the caller closes)
//! where the connection's state is, and what is legal but costs us without serving the
//! client (resets before an answer, streams refused, empty frames, field blocks in
//! pieces) is counted: past [`Config::max_glitches`] the connection ends with
//! ENHANCE_YOUR_CALM, as HAProxy's `glitches` do. That is the defence against rapid
//! reset (CVE-2023-44487) and the CONTINUATION and empty-frame floods; the HPACK
//! decoder's limits are the one against header bombs.

mod request;

#[cfg(test)]
mod tests;

pub use request::{FieldList, RequestField};

use crate::h2::frame::{self, flags, kind, setting, write, ErrorCode, Frame, FrameError, Head};
use crate::h2::hpack::decoder::{Decoded, Decoder};
use crate::h2::hpack::encoder::{self, Encoder};
use crate::h2::hpack::HpackError;

/// The mark in [`Connection::recently_closed`] of a stream this end closed (stream ids
/// are 31 bits).
const OURS: u32 = 1 << 31;

/// What a client sends first (section 3.4).
pub const PREFACE: &[u8; 24] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// The window every stream and the connection start with (section 6.9.2).
const DEFAULT_WINDOW: u32 = 65_535;

/// The limits this end announces and keeps.
#[derive(Clone, Debug)]
pub struct Config {
    /// SETTINGS_MAX_CONCURRENT_STREAMS: streams a client may have open at once; more
    /// are refused with REFUSED_STREAM (nginx 128, HAProxy 100).
    pub max_concurrent_streams: u32,
    /// SETTINGS_INITIAL_WINDOW_SIZE: what a client may send on a stream ahead of the
    /// caller taking it (nginx's preread 64 KiB).
    pub initial_window_size: u32,
    /// The connection's receive window at most: the most a client may have sent ahead
    /// of the caller taking it, all streams together. The window is opened only toward
    /// what the streams still receiving a body can send (their own windows), so an
    /// idle connection wants nothing beyond the protocol's 65,535 bytes; at the default
    /// (every stream's whole window) no stream waits on bytes another stream's caller
    /// has not taken. Given back as the caller takes the bytes, and only as far as the
    /// caller opens it.
    pub connection_window: u32,
    /// SETTINGS_MAX_HEADER_LIST_SIZE: a request's fields at most, counted as section
    /// 6.5.2 does; a larger one is answered 431.
    pub max_header_list_size: u32,
    /// SETTINGS_HEADER_TABLE_SIZE: the most the client's HPACK table may hold here.
    pub header_table_size: u32,
    /// SETTINGS_ENABLE_CONNECT_PROTOCOL (RFC 8441): WebSockets over HTTP/2.
    pub connect_protocol: bool,
    /// Costly oddities tolerated on one connection before it ends (see the module).
    pub max_glitches: u32,
    /// The `Server` field of the answers the connection makes itself (a 431), as its
    /// server's other answers carry it ([`crate::ServerToken`]); None: none.
    pub server: Option<hyper::header::HeaderValue>,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            max_concurrent_streams: 128,
            initial_window_size: 65_536,
            connection_window: 128 * 65_536,
            max_header_list_size: 32 << 10,
            header_table_size: 4096,
            connect_protocol: false,
            max_glitches: 1000,
            server: None,
        }
    }
}

/// What the client's bytes meant, for the caller.
#[derive(Debug)]
pub enum Event<'a> {
    /// A request's head. Its body follows as [`Event::Data`] unless `end_stream`.
    Request {
        /// The stream, the request's id from now on.
        stream: u32,
        /// The fields, checked (see [`FieldList`]).
        head: &'a FieldList,
        /// No body follows.
        end_stream: bool,
    },
    /// Body bytes of a request; the caller gives their window back with
    /// [`Connection::release`] once it has taken them.
    Data {
        /// The stream.
        stream: u32,
        /// The bytes (padding removed).
        data: &'a [u8],
        /// The body ends here.
        end_stream: bool,
    },
    /// A request's trailers, which end its body.
    Trailers {
        /// The stream.
        stream: u32,
        /// The fields (no pseudo-fields).
        fields: &'a FieldList,
    },
    /// The stream is gone: the client reset it, or the connection did (the client broke
    /// a rule on it, after which [`Event::Refused`] is not sent). Stop answering it.
    Reset {
        /// The stream.
        stream: u32,
        /// The code sent or received.
        code: ErrorCode,
        /// The client sent the RST_STREAM (else the connection did).
        by_client: bool,
    },
    /// A request the connection answered itself, for the caller's log and metrics: a
    /// malformed one (RST_STREAM PROTOCOL_ERROR), one over the limits (431 or
    /// REFUSED_STREAM).
    Refused {
        /// The stream.
        stream: u32,
        /// Which refusal.
        reason: Refusal,
        /// Why, for the log.
        why: &'static str,
    },
    /// Send windows grew: streams waiting on flow control may send again.
    WindowOpened,
    /// The client is going away: it opens no more streams.
    GoAway {
        /// The last stream it says it processed.
        last_stream: u32,
        /// Why.
        code: ErrorCode,
    },
}

/// Why the connection answered a request itself.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refusal {
    /// Malformed (RFC 9113 section 8.1.1): RST_STREAM PROTOCOL_ERROR.
    Malformed,
    /// Past SETTINGS_MAX_CONCURRENT_STREAMS: RST_STREAM REFUSED_STREAM.
    TooManyStreams,
    /// Fields past SETTINGS_MAX_HEADER_LIST_SIZE: 431.
    TooLarge,
}

/// A connection error: the GOAWAY saying so is in the output; send it and close.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ConnectionError {
    /// The code sent.
    pub code: ErrorCode,
    /// Why, for the log.
    pub why: &'static str,
}

impl std::fmt::Display for ConnectionError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "HTTP/2 connection error {:?}: {}", self.code, self.why)
    }
}

impl std::error::Error for ConnectionError {}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum State {
    /// Waiting for the client's preface.
    Preface,
    /// Waiting for the client's first SETTINGS, which must come next.
    FirstSettings,
    Open,
    Failed(ConnectionError),
}

/// One open stream.
#[derive(Debug)]
struct Stream {
    id: u32,
    /// What we may still send (section 6.9; may go below zero when the client lowers
    /// its initial window).
    send_window: i64,
    /// What the client may still send.
    recv_window: i64,
    /// Taken by the caller, not yet given back in a WINDOW_UPDATE.
    unacked: u32,
    /// The client sent END_STREAM.
    remote_closed: bool,
    /// We sent END_STREAM.
    local_closed: bool,
    /// We sent a response head.
    head_sent: bool,
    content_length: Option<u64>,
    received: u64,
}

/// A field block whose CONTINUATIONs are still coming.
#[derive(Clone, Copy, Debug)]
struct Pending {
    stream: u32,
    end_stream: bool,
    what: BlockFor,
}

/// What a field block is for, known from its HEADERS frame.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum BlockFor {
    Request,
    Trailers,
    /// A stream the client may not send on: answered after the block is decoded.
    Closed(ErrorCode, &'static str),
    /// Over SETTINGS_MAX_CONCURRENT_STREAMS.
    Refused,
    /// A stream above the last one our GOAWAY accepted: ignored (section 6.8).
    Ignored,
}

/// An HTTP/2 server connection's state.
#[derive(Debug)]
pub struct Connection {
    config: Config,
    state: State,
    decoder: Decoder,
    encoder: Encoder,
    streams: Vec<Stream>,
    /// The highest stream id the client has used.
    last_stream: u32,
    /// The highest stream handed to the caller: what GOAWAY says was processed.
    last_accepted: u32,
    /// The last few streams closed, each marked ([`OURS`]) when this end reset, refused
    /// or ignored it: frames still in flight on those are dropped without a word
    /// (section 5.1), and a HEADERS on another one is STREAM_CLOSED rather than a
    /// stream id going backwards.
    recently_closed: [u32; 32],
    recently_closed_next: usize,
    /// Streams answered: the glitch limit grows with them (see [`Connection::glitch`]).
    answered: u32,
    send_window: i64,
    /// What the client may still send on the connection.
    recv_window: i64,
    /// Body bytes handed to the caller and not yet [`Connection::consumed`].
    held: u64,
    /// The peer's SETTINGS_INITIAL_WINDOW_SIZE and SETTINGS_MAX_FRAME_SIZE.
    peer_initial_window: u32,
    peer_max_frame_size: u32,
    settings_acked: bool,
    pending: Option<Pending>,
    /// The field block being joined from its frames (only when it came in pieces).
    block: Vec<u8>,
    fields: FieldList,
    scratch: Vec<u8>,
    glitches: u32,
    /// We sent GOAWAY: streams above this are ignored.
    going_away: Option<u32>,
    /// The client sent GOAWAY.
    peer_going_away: bool,
}

impl Connection {
    /// A connection; its SETTINGS are appended to `out`, to be sent at once (section
    /// 3.4). Its receive window is the protocol's 65,535 bytes until the caller opens it
    /// further ([`Connection::open_connection_window`]).
    pub fn new(config: Config, out: &mut Vec<u8>) -> Self {
        let mut settings = vec![
            frame::Setting {
                id: setting::MAX_CONCURRENT_STREAMS,
                value: config.max_concurrent_streams,
            },
            frame::Setting {
                id: setting::INITIAL_WINDOW_SIZE,
                value: config.initial_window_size,
            },
            frame::Setting {
                id: setting::MAX_HEADER_LIST_SIZE,
                value: config.max_header_list_size,
            },
        ];
        if config.header_table_size != 4096 {
            settings.push(frame::Setting {
                id: setting::HEADER_TABLE_SIZE,
                value: config.header_table_size,
            });
        }
        if config.connect_protocol {
            settings.push(frame::Setting {
                id: setting::ENABLE_CONNECT_PROTOCOL,
                value: 1,
            });
        }
        write::settings(out, &settings);
        Self {
            decoder: Decoder::new(config.header_table_size as usize),
            config,
            state: State::Preface,
            encoder: Encoder::default(),
            streams: Vec::new(),
            last_stream: 0,
            last_accepted: 0,
            recently_closed: [0; 32],
            recently_closed_next: 0,
            answered: 0,
            send_window: i64::from(DEFAULT_WINDOW),
            recv_window: i64::from(DEFAULT_WINDOW),
            held: 0,
            peer_initial_window: DEFAULT_WINDOW,
            peer_max_frame_size: frame::DEFAULT_MAX_FRAME_SIZE,
            settings_acked: false,
            pending: None,
            block: Vec::new(),
            fields: FieldList::default(),
            scratch: Vec::new(),
            glitches: 0,
            going_away: None,
            peer_going_away: false,
        }
    }

    /// Takes the frames at the start of `input`, calling `on` for what they mean and
    /// appending what the connection owes to `out`; returns how many bytes were taken
    /// (whole frames only: the caller keeps the rest and calls again with more). A
    /// connection error ends the connection: its GOAWAY is in `out`, and every later
    /// call returns the same error.
    pub fn receive<F>(
        &mut self,
        input: &[u8],
        out: &mut Vec<u8>,
        on: &mut F,
    ) -> Result<usize, ConnectionError>
    where
        F: FnMut(Event<'_>),
    {
        if let State::Failed(e) = self.state {
            return Err(e);
        }
        let mut pos = 0;
        if self.state == State::Preface {
            let n = input.len().min(PREFACE.len());
            if input[..n] != PREFACE[..n] {
                return Err(self.fail(ErrorCode::ProtocolError, "not the HTTP/2 preface", out));
            }
            if n < PREFACE.len() {
                return Ok(0);
            }
            pos = PREFACE.len();
            self.state = State::FirstSettings;
        }
        while let Some(head_bytes) = input.get(pos..pos + frame::HEADER_LEN) {
            let head = Head::parse(head_bytes.try_into().expect("nine bytes"));
            if let Err(FrameError::Connection(code, why)) =
                head.check_len(frame::DEFAULT_MAX_FRAME_SIZE)
            {
                return Err(self.fail(code, why, out));
            }
            let start = pos + frame::HEADER_LEN;
            let Some(payload) = input.get(start..start + head.len as usize) else {
                break;
            };
            pos = start + head.len as usize;
            let result = match self.frame(head, payload, out, on) {
                // Section 5.1: on an idle stream only HEADERS and PRIORITY may come.
                Err(FrameError::Stream(stream, _, _))
                    if stream > self.last_stream && head.kind != kind::PRIORITY =>
                {
                    Err(FrameError::Connection(
                        ErrorCode::ProtocolError,
                        "a frame on an idle stream",
                    ))
                }
                Err(FrameError::Stream(stream, code, why)) => {
                    self.reset(stream, code, out, on);
                    self.glitch()
                        .map_err(|_| FrameError::Connection(ErrorCode::EnhanceYourCalm, why))
                }
                other => other,
            };
            if let Err(FrameError::Connection(code, why)) = result {
                return Err(self.fail(code, why, out));
            }
        }
        Ok(pos)
    }

    fn frame<F>(
        &mut self,
        head: Head,
        payload: &[u8],
        out: &mut Vec<u8>,
        on: &mut F,
    ) -> Result<(), FrameError>
    where
        F: FnMut(Event<'_>),
    {
        // Section 6.10: a field block's frames come one after another.
        if let Some(pending) = self.pending {
            if head.kind != kind::CONTINUATION || head.stream != pending.stream {
                return Err(FrameError::Connection(
                    ErrorCode::ProtocolError,
                    "a frame inside another stream's field block",
                ));
            }
        }
        if self.state == State::FirstSettings
            && (head.kind != kind::SETTINGS || head.has(flags::ACK))
        {
            return Err(FrameError::Connection(
                ErrorCode::ProtocolError,
                "a first frame other than SETTINGS",
            ));
        }
        let frame = match frame::parse(head, payload) {
            Ok(frame) => frame,
            // A HEADERS refused before its block is decoded would leave the HPACK tables
            // apart: the connection cannot go on.
            Err(FrameError::Stream(_, code, why)) if head.kind == kind::HEADERS => {
                return Err(FrameError::Connection(code, why))
            }
            Err(e) => return Err(e),
        };
        match frame {
            Frame::Data {
                stream,
                end_stream,
                data,
                flow_len,
            } => self.on_data(stream, end_stream, data, flow_len, out, on),
            Frame::Headers {
                stream,
                end_stream,
                end_headers,
                fragment,
                ..
            } => self.on_headers(stream, end_stream, end_headers, fragment, out, on),
            Frame::Continuation {
                stream,
                end_headers,
                fragment,
            } => self.on_continuation(stream, end_headers, fragment, out, on),
            Frame::Priority { .. } | Frame::Unknown { .. } => Ok(()),
            Frame::RstStream { stream, code } => self.on_reset(stream, code, on),
            Frame::Settings { ack, settings } => {
                if ack {
                    self.settings_acked = true;
                    return Ok(());
                }
                self.state = State::Open;
                self.on_settings(settings, out, on)
            }
            Frame::Ping { ack, data } => {
                if !ack {
                    write::ping_ack(out, data);
                }
                Ok(())
            }
            Frame::GoAway {
                last_stream, code, ..
            } => {
                self.peer_going_away = true;
                on(Event::GoAway { last_stream, code });
                Ok(())
            }
            Frame::WindowUpdate { stream, increment } => {
                self.on_window_update(stream, increment, on)
            }
        }
    }

    fn on_data<F>(
        &mut self,
        id: u32,
        end_stream: bool,
        data: &[u8],
        flow_len: u32,
        out: &mut Vec<u8>,
        on: &mut F,
    ) -> Result<(), FrameError>
    where
        F: FnMut(Event<'_>),
    {
        // Every DATA counts against the connection's window, a closed stream's too
        // (section 6.9). What the caller is not handed (padding, a closed stream's
        // data) is consumed at once; the rest once the caller says it took it.
        self.recv_window -= i64::from(flow_len);
        if self.recv_window < 0 {
            return Err(FrameError::Connection(
                ErrorCode::FlowControlError,
                "DATA beyond the connection's window",
            ));
        }
        if data.is_empty() && !end_stream {
            // An empty DATA frame serves nothing (CVE-2019-9518).
            self.glitch()?;
        }
        let Some(i) = self.find(id) else {
            if id > self.last_stream {
                return Err(FrameError::Connection(
                    ErrorCode::ProtocolError,
                    "DATA on an idle stream",
                ));
            }
            if self.closed_by_us(id) {
                // In flight when we reset it: dropped (its window was counted above).
                return Ok(());
            }
            self.glitch()?;
            return Err(FrameError::Stream(
                id,
                ErrorCode::StreamClosed,
                "DATA on a closed stream",
            ));
        };
        let stream = &mut self.streams[i];
        if stream.remote_closed {
            return Err(FrameError::Stream(
                id,
                ErrorCode::StreamClosed,
                "DATA after END_STREAM",
            ));
        }
        stream.recv_window -= i64::from(flow_len);
        if stream.recv_window < 0 {
            return Err(FrameError::Stream(
                id,
                ErrorCode::FlowControlError,
                "DATA beyond the stream's window",
            ));
        }
        // Padding is never the caller's to take: its window comes back with the next
        // WINDOW_UPDATE.
        stream.unacked += flow_len - data.len() as u32;
        stream.received += data.len() as u64;
        if flow_len as usize > data.len() {
            self.give_window_back(i, out);
        }
        let stream = &mut self.streams[i];
        if let Some(expected) = stream.content_length {
            if stream.received > expected || (end_stream && stream.received != expected) {
                return Err(FrameError::Stream(
                    id,
                    ErrorCode::ProtocolError,
                    "DATA not adding up to the content-length",
                ));
            }
        }
        stream.remote_closed = end_stream;
        self.held += data.len() as u64;
        on(Event::Data {
            stream: id,
            data,
            end_stream,
        });
        self.forget_if_done(i);
        Ok(())
    }

    fn on_headers<F>(
        &mut self,
        id: u32,
        end_stream: bool,
        end_headers: bool,
        fragment: &[u8],
        out: &mut Vec<u8>,
        on: &mut F,
    ) -> Result<(), FrameError>
    where
        F: FnMut(Event<'_>),
    {
        if id.is_multiple_of(2) {
            return Err(FrameError::Connection(
                ErrorCode::ProtocolError,
                "a client stream with an even id",
            ));
        }
        let what = match self.find(id) {
            Some(i) if self.streams[i].remote_closed => {
                BlockFor::Closed(ErrorCode::StreamClosed, "HEADERS after END_STREAM")
            }
            Some(_) => BlockFor::Trailers,
            // Trailers in flight when we reset the stream: decoded, dropped.
            None if id <= self.last_stream && self.closed_by_us(id) => BlockFor::Ignored,
            None if id <= self.last_stream => {
                return Err(FrameError::Connection(
                    if self.recently_closed.contains(&id) {
                        ErrorCode::StreamClosed
                    } else {
                        ErrorCode::ProtocolError
                    },
                    "HEADERS on a closed stream",
                ));
            }
            None => {
                self.last_stream = id;
                if self.going_away.is_some() {
                    BlockFor::Ignored
                } else if self.streams.len() >= self.config.max_concurrent_streams as usize {
                    BlockFor::Refused
                } else {
                    BlockFor::Request
                }
            }
        };
        if !end_headers {
            self.pending = Some(Pending {
                stream: id,
                end_stream,
                what,
            });
            self.block.clear();
            return self.join(fragment);
        }
        self.on_block(id, end_stream, what, fragment, out, on)
    }

    fn on_continuation<F>(
        &mut self,
        id: u32,
        end_headers: bool,
        fragment: &[u8],
        out: &mut Vec<u8>,
        on: &mut F,
    ) -> Result<(), FrameError>
    where
        F: FnMut(Event<'_>),
    {
        let Some(pending) = self.pending else {
            return Err(FrameError::Connection(
                ErrorCode::ProtocolError,
                "CONTINUATION outside a field block",
            ));
        };
        if fragment.is_empty() && !end_headers {
            self.glitch()?;
        }
        self.join(fragment)?;
        if !end_headers {
            return Ok(());
        }
        self.pending = None;
        let block = std::mem::take(&mut self.block);
        let result = self.on_block(id, pending.end_stream, pending.what, &block, out, on);
        self.block = block;
        self.block.clear();
        if self.block.capacity() > 16 << 10 {
            self.block = Vec::new();
        }
        result
    }

    /// Adds a fragment to the block being joined, within twice the header list limit
    /// (HPACK rarely makes a block larger than its fields; a block that large is a
    /// CONTINUATION flood, CVE-2024-27316 and kin).
    fn join(&mut self, fragment: &[u8]) -> Result<(), FrameError> {
        let limit = (self.config.max_header_list_size as usize).saturating_mul(2);
        if self.block.len() + fragment.len() > limit.max(16 << 10) {
            return Err(FrameError::Connection(
                ErrorCode::EnhanceYourCalm,
                "a field block far beyond the header list limit",
            ));
        }
        self.block.extend_from_slice(fragment);
        Ok(())
    }

    /// A whole field block: decoded (always, to keep the tables in step), then acted on.
    fn on_block<F>(
        &mut self,
        id: u32,
        end_stream: bool,
        what: BlockFor,
        block: &[u8],
        out: &mut Vec<u8>,
        on: &mut F,
    ) -> Result<(), FrameError>
    where
        F: FnMut(Event<'_>),
    {
        self.fields.begin(what == BlockFor::Trailers);
        let fields = &mut self.fields;
        let decoded = self.decoder.decode(
            block,
            self.config.max_header_list_size as usize,
            &mut self.scratch,
            |f| fields.push(f),
        );
        let decoded = decoded.map_err(|e| {
            let code = match e {
                HpackError::TooLarge => ErrorCode::EnhanceYourCalm,
                _ => ErrorCode::CompressionError,
            };
            FrameError::Connection(code, "a field block that does not decode")
        })?;
        match what {
            BlockFor::Ignored => {
                if self.find(id).is_none() {
                    self.closed(id | OURS);
                }
                Ok(())
            }
            BlockFor::Closed(code, why) => Err(FrameError::Stream(id, code, why)),
            BlockFor::Refused => {
                self.glitch()?;
                write::rst_stream(out, id, ErrorCode::RefusedStream);
                self.closed(id | OURS);
                on(Event::Refused {
                    stream: id,
                    reason: Refusal::TooManyStreams,
                    why: "more streams than SETTINGS_MAX_CONCURRENT_STREAMS",
                });
                Ok(())
            }
            BlockFor::Request => self.on_request(id, end_stream, decoded, out, on),
            BlockFor::Trailers => {
                let Some(i) = self.find(id) else {
                    return Ok(());
                };
                if !end_stream {
                    return Err(FrameError::Stream(
                        id,
                        ErrorCode::ProtocolError,
                        "trailers without END_STREAM",
                    ));
                }
                let stream = &mut self.streams[i];
                let short = stream.content_length.is_some_and(|n| n != stream.received);
                let malformed = self
                    .fields
                    .finish_trailers()
                    .err()
                    .or(short.then_some("a body shorter than its content-length"));
                if let Some(why) = malformed
                    .or((decoded == Decoded::Oversized).then_some("trailers over the limit"))
                {
                    return Err(FrameError::Stream(id, ErrorCode::ProtocolError, why));
                }
                stream.remote_closed = true;
                on(Event::Trailers {
                    stream: id,
                    fields: &self.fields,
                });
                self.forget_if_done(i);
                Ok(())
            }
        }
    }

    fn on_request<F>(
        &mut self,
        id: u32,
        end_stream: bool,
        decoded: Decoded,
        out: &mut Vec<u8>,
        on: &mut F,
    ) -> Result<(), FrameError>
    where
        F: FnMut(Event<'_>),
    {
        if decoded == Decoded::Oversized {
            // Section 10.5.1: a 431 rather than a reset, so that the client learns why.
            let start = out.len();
            self.encoder.begin_block(out);
            encoder::status(431, out);
            if let Some(server) = &self.config.server {
                encoder::field(b"server", server.as_bytes(), out);
            }
            encoder::field(b"content-length", b"0", out);
            let block = out.split_off(start);
            write::headers(out, id, &block, true);
            if !end_stream {
                write::rst_stream(out, id, ErrorCode::NoError);
            }
            self.closed(id | OURS);
            on(Event::Refused {
                stream: id,
                reason: Refusal::TooLarge,
                why: "a request's fields over SETTINGS_MAX_HEADER_LIST_SIZE",
            });
            return Ok(());
        }
        let mut malformed = self
            .fields
            .finish_request(self.config.connect_protocol)
            .err();
        let content_length = self.fields.content_length();
        if end_stream && content_length.is_some_and(|n| n > 0) {
            malformed = malformed.or(Some("no body after a content-length above 0"));
        }
        if end_stream && self.fields.protocol().is_some() {
            // RFC 8441 section 4: an extended CONNECT's stream carries the tunnel, so
            // one whose stream has already ended has nothing to carry; it is malformed
            // (section 8.1.1), not a tunnel to open upstream and answer 200.
            malformed = malformed.or(Some("an extended CONNECT that ended its stream"));
        }
        if let Some(why) = malformed {
            write::rst_stream(out, id, ErrorCode::ProtocolError);
            self.closed(id | OURS);
            on(Event::Refused {
                stream: id,
                reason: Refusal::Malformed,
                why,
            });
            // Each is a stream started for nothing, as a rapid reset's are.
            return self.glitch();
        }
        let recv_window = if self.settings_acked {
            self.config.initial_window_size
        } else {
            self.config.initial_window_size.max(DEFAULT_WINDOW)
        };
        if self.streams.capacity() == 0 {
            self.streams.reserve_exact(1);
        }
        self.streams.push(Stream {
            id,
            send_window: i64::from(self.peer_initial_window),
            recv_window: i64::from(recv_window),
            unacked: 0,
            remote_closed: end_stream,
            local_closed: false,
            head_sent: false,
            content_length,
            received: 0,
        });
        self.last_accepted = id;
        on(Event::Request {
            stream: id,
            head: &self.fields,
            end_stream,
        });
        Ok(())
    }

    fn on_reset<F>(&mut self, id: u32, code: ErrorCode, on: &mut F) -> Result<(), FrameError>
    where
        F: FnMut(Event<'_>),
    {
        let Some(i) = self.find(id) else {
            if id > self.last_stream {
                return Err(FrameError::Connection(
                    ErrorCode::ProtocolError,
                    "RST_STREAM on an idle stream",
                ));
            }
            return Ok(());
        };
        let answered = self.streams[i].head_sent;
        self.streams.swap_remove(i);
        self.closed(id);
        on(Event::Reset {
            stream: id,
            code,
            by_client: true,
        });
        if !answered {
            // A request cancelled before its answer cost us its start for nothing:
            // rapid reset, CVE-2023-44487.
            self.glitch()?;
        }
        Ok(())
    }

    fn on_settings<F>(
        &mut self,
        settings: frame::Settings<'_>,
        out: &mut Vec<u8>,
        on: &mut F,
    ) -> Result<(), FrameError>
    where
        F: FnMut(Event<'_>),
    {
        let mut initial_window = None;
        for s in settings {
            match s.id {
                setting::HEADER_TABLE_SIZE => self.encoder.peer_table_size(s.value),
                setting::MAX_FRAME_SIZE => self.peer_max_frame_size = s.value,
                setting::INITIAL_WINDOW_SIZE => initial_window = Some(s.value),
                // A server never pushes, never opens streams and sends fields within
                // any sane limit; the rest is not for a server.
                _ => {}
            }
        }
        // Section 6.9.2: every open stream's window moves by the change, applied once
        // for the frame's last value (a frame of thousands costs one pass).
        let mut opened = false;
        if let Some(value) = initial_window {
            let delta = i64::from(value) - i64::from(self.peer_initial_window);
            self.peer_initial_window = value;
            for stream in &mut self.streams {
                stream.send_window += delta;
                if stream.send_window > i64::from(frame::MAX_WINDOW) {
                    return Err(FrameError::Connection(
                        ErrorCode::FlowControlError,
                        "SETTINGS_INITIAL_WINDOW_SIZE taking a window past 2^31 - 1",
                    ));
                }
            }
            opened = delta > 0;
        }
        write::settings_ack(out);
        if opened {
            on(Event::WindowOpened);
        }
        Ok(())
    }

    fn on_window_update<F>(&mut self, id: u32, increment: u32, on: &mut F) -> Result<(), FrameError>
    where
        F: FnMut(Event<'_>),
    {
        let window = if id == 0 {
            &mut self.send_window
        } else {
            match self.find(id) {
                Some(i) => &mut self.streams[i].send_window,
                None if id > self.last_stream => {
                    return Err(FrameError::Connection(
                        ErrorCode::ProtocolError,
                        "WINDOW_UPDATE on an idle stream",
                    ))
                }
                // A stream we closed while the client was opening its window.
                None => return Ok(()),
            }
        };
        *window += i64::from(increment);
        if *window > i64::from(frame::MAX_WINDOW) {
            let why = "a window past 2^31 - 1";
            return Err(if id == 0 {
                FrameError::Connection(ErrorCode::FlowControlError, why)
            } else {
                FrameError::Stream(id, ErrorCode::FlowControlError, why)
            });
        }
        on(Event::WindowOpened);
        Ok(())
    }

    /// Counts a costly oddity; past the limit, the connection ends. The limit grows by
    /// one for every two streams answered, so that a long-lived connection whose client
    /// cancels some of what it asks for (a browser navigating away, gRPC deadlines)
    /// is not ended for it, while one that is answered nothing (rapid reset) is.
    fn glitch(&mut self) -> Result<(), FrameError> {
        self.glitches += 1;
        if self.glitches > self.config.max_glitches.saturating_add(self.answered / 2) {
            return Err(FrameError::Connection(
                ErrorCode::EnhanceYourCalm,
                "too many resets, refused streams or empty frames",
            ));
        }
        Ok(())
    }

    fn find(&self, id: u32) -> Option<usize> {
        self.streams.iter().position(|s| s.id == id)
    }

    /// Remembers a closed stream (`id | OURS` when this end closed it by a reset,
    /// refusal or by ignoring it).
    fn closed(&mut self, id: u32) {
        self.recently_closed[self.recently_closed_next] = id;
        self.recently_closed_next = (self.recently_closed_next + 1) % self.recently_closed.len();
    }

    /// Whether `id` is one of the recent streams this end reset, refused or ignored.
    fn closed_by_us(&self, id: u32) -> bool {
        self.recently_closed.contains(&(id | OURS))
    }

    /// Sends the stream at `i` a WINDOW_UPDATE for what was taken of its window, once
    /// that is half of it (one update per half window, not one per frame).
    fn give_window_back(&mut self, i: usize, out: &mut Vec<u8>) {
        let half = self.config.initial_window_size / 2;
        let stream = &mut self.streams[i];
        if stream.remote_closed || stream.unacked < half.max(1) {
            return;
        }
        write::window_update(out, stream.id, stream.unacked);
        stream.recv_window += i64::from(stream.unacked);
        stream.unacked = 0;
    }

    /// Forgets the stream at `i` once both ends have closed it.
    fn forget_if_done(&mut self, i: usize) {
        let stream = &self.streams[i];
        if stream.remote_closed && stream.local_closed {
            let id = stream.id;
            self.streams.swap_remove(i);
            self.closed(id);
        }
    }

    /// A stream error: RST_STREAM, and the caller told if the stream was open.
    fn reset<F>(&mut self, id: u32, code: ErrorCode, out: &mut Vec<u8>, on: &mut F)
    where
        F: FnMut(Event<'_>),
    {
        write::rst_stream(out, id, code);
        if let Some(i) = self.find(id) {
            self.streams.swap_remove(i);
            self.closed(id | OURS);
            on(Event::Reset {
                stream: id,
                code,
                by_client: false,
            });
        }
    }

    /// A connection error: GOAWAY naming the last stream we took, and every later
    /// call refused.
    fn fail(&mut self, code: ErrorCode, why: &'static str, out: &mut Vec<u8>) -> ConnectionError {
        write::goaway(out, self.last_accepted, code, why.as_bytes());
        let e = ConnectionError { code, why };
        self.state = State::Failed(e);
        e
    }

    /// Appends a response head (or trailers) for `stream`: HEADERS, and CONTINUATIONs if
    /// the block is larger than the client's SETTINGS_MAX_FRAME_SIZE. `encode` appends
    /// the field block (see [`encoder`]). Returns false, writing nothing, if the
    /// stream is gone (reset) or has ended its side.
    pub fn send_head(
        &mut self,
        id: u32,
        end_stream: bool,
        out: &mut Vec<u8>,
        encode: impl FnOnce(&mut Vec<u8>),
    ) -> bool {
        let Some(i) = self.find(id).filter(|&i| !self.streams[i].local_closed) else {
            return false;
        };
        let start = out.len();
        out.extend_from_slice(&[0; frame::HEADER_LEN]);
        self.encoder.begin_block(out);
        encode(out);
        let len = out.len() - start - frame::HEADER_LEN;
        let max = self.peer_max_frame_size as usize;
        let end = if end_stream { flags::END_STREAM } else { 0 };
        if len <= max {
            let head = Head {
                len: len as u32,
                kind: kind::HEADERS,
                flags: flags::END_HEADERS | end,
                stream: id,
            };
            out[start..start + frame::HEADER_LEN].copy_from_slice(&head.encode());
        } else {
            // Rare (a response's fields past 16 KiB): cut the block into frames.
            let block = out.split_off(start + frame::HEADER_LEN);
            out.truncate(start);
            for (n, piece) in block.chunks(max).enumerate() {
                let last = (n + 1) * max >= block.len();
                let head = Head {
                    len: piece.len() as u32,
                    kind: if n == 0 {
                        kind::HEADERS
                    } else {
                        kind::CONTINUATION
                    },
                    flags: if n == 0 { end } else { 0 } | if last { flags::END_HEADERS } else { 0 },
                    stream: id,
                };
                out.extend_from_slice(&head.encode());
                out.extend_from_slice(piece);
            }
        }
        let stream = &mut self.streams[i];
        if !stream.head_sent {
            self.answered = self.answered.saturating_add(1);
        }
        stream.head_sent = true;
        stream.local_closed = end_stream;
        self.forget_if_done(i);
        true
    }

    /// What the client may send on `stream` now, as flow control stands (its window
    /// and the connection's; 0 if it is gone or its body ended).
    pub fn receive_window(&self, id: u32) -> usize {
        self.find(id).map_or(0, |i| {
            let stream = &self.streams[i];
            if stream.remote_closed {
                return 0;
            }
            stream.recv_window.min(self.recv_window).max(0) as usize
        })
    }

    /// What `stream` may send now, as flow control stands (0 if it is gone).
    pub fn send_window(&self, id: u32) -> usize {
        self.find(id).map_or(0, |i| {
            let stream = &self.streams[i];
            if stream.local_closed {
                return 0;
            }
            stream.send_window.min(self.send_window).max(0) as usize
        })
    }

    /// Appends as much of `data` as flow control allows to `stream`, in frames of at
    /// most the client's SETTINGS_MAX_FRAME_SIZE, and returns how much it took.
    /// END_STREAM goes on the last frame when `end_stream` and all of `data` was taken
    /// (an empty `data` with `end_stream` ends the stream with an empty frame).
    pub fn send_data(
        &mut self,
        id: u32,
        data: &[u8],
        end_stream: bool,
        out: &mut Vec<u8>,
    ) -> usize {
        let Some(i) = self.find(id).filter(|&i| !self.streams[i].local_closed) else {
            return 0;
        };
        let window = self.streams[i].send_window.min(self.send_window).max(0) as usize;
        let take = data.len().min(window);
        let max = self.peer_max_frame_size as usize;
        let ends = end_stream && take == data.len();
        let mut sent = 0;
        loop {
            let n = (take - sent).min(max);
            let last = sent + n == take;
            if n == 0 && !(last && ends) {
                break;
            }
            write::data(out, id, &data[sent..sent + n], last && ends);
            sent += n;
            if last {
                break;
            }
        }
        self.send_window -= take as i64;
        let stream = &mut self.streams[i];
        stream.send_window -= take as i64;
        if ends {
            stream.local_closed = true;
            self.forget_if_done(i);
        }
        take
    }

    /// Appends one DATA frame of as much of `len` bytes as flow control and the client's
    /// frame size allow, its payload written by `fill` straight into `out` (a file read
    /// into the buffer it is sent from, with no copy between); END_STREAM when
    /// `end_stream` and the frame takes all of `len`. Returns how much it took (0 when
    /// the windows are closed), or `None`, with nothing appended, when `fill` failed.
    pub fn send_data_from(
        &mut self,
        id: u32,
        len: usize,
        end_stream: bool,
        out: &mut Vec<u8>,
        fill: impl FnOnce(&mut [u8]) -> bool,
    ) -> Option<usize> {
        let Some(i) = self.find(id).filter(|&i| !self.streams[i].local_closed) else {
            return Some(0);
        };
        let window = self.streams[i].send_window.min(self.send_window).max(0) as usize;
        let n = len.min(window).min(self.peer_max_frame_size as usize);
        let ends = end_stream && n == len;
        if n == 0 && !ends {
            return Some(0);
        }
        let start = out.len();
        let head = Head {
            len: n as u32,
            kind: kind::DATA,
            flags: if ends { flags::END_STREAM } else { 0 },
            stream: id,
        };
        out.extend_from_slice(&head.encode());
        out.resize(start + frame::HEADER_LEN + n, 0);
        if !fill(&mut out[start + frame::HEADER_LEN..]) {
            out.truncate(start);
            return None;
        }
        self.send_window -= n as i64;
        let stream = &mut self.streams[i];
        stream.send_window -= n as i64;
        if ends {
            stream.local_closed = true;
            self.forget_if_done(i);
        }
        Some(n)
    }

    /// The caller is done with `n` bytes it was handed (took them, or dropped them):
    /// they no longer count in what the connection holds for the client, and
    /// [`Connection::connection_window_wanted`] grows by them.
    pub fn consumed(&mut self, n: usize) {
        self.held = self.held.saturating_sub(n as u64);
    }

    /// What the client may send on the connection and what the caller holds of what it
    /// sent: the most the client can make the caller hold, as things stand.
    pub fn connection_allowance(&self) -> u64 {
        self.recv_window.max(0) as u64 + self.held
    }

    /// How far the connection's window would open so that every stream still receiving
    /// its body can send its whole window beside what the caller holds (at most
    /// [`Config::connection_window`]): nothing beyond the protocol's window while no
    /// body is coming. A window opened wider would only let a client's bytes wait ahead
    /// of any stream, and hold the caller's room for nothing.
    pub fn connection_window_wanted(&self) -> u32 {
        let target = (self.connection_exposure())
            .min(u64::from(self.config.connection_window))
            .max(u64::from(DEFAULT_WINDOW));
        let room = u64::from(frame::MAX_WINDOW).saturating_sub(self.recv_window.max(0) as u64);
        (target.saturating_sub(self.connection_allowance())).min(room) as u32
    }

    /// What the caller holds and what the streams still receiving a body may send on
    /// their own windows: the most the client could make it hold, were the
    /// connection's window no limit and no new stream opened.
    pub fn connection_exposure(&self) -> u64 {
        let receiving: u64 = (self.streams.iter())
            .filter(|s| !s.remote_closed)
            .map(|s| s.recv_window.max(0) as u64)
            .sum();
        self.held + receiving
    }

    /// Whether this end has sent GOAWAY.
    pub fn is_going_away(&self) -> bool {
        self.going_away.is_some()
    }

    /// Opens the connection's window by `n` (a WINDOW_UPDATE on stream 0): the caller
    /// is willing to hold that much more for the client.
    pub fn open_connection_window(&mut self, n: u32, out: &mut Vec<u8>) {
        // Never past the largest window the protocol allows (RFC 9113 section 6.9.1):
        // a caller's miscount must not make the client end the connection.
        let room = i64::from(frame::MAX_WINDOW) - self.recv_window;
        let n = i64::from(n).min(room);
        if n <= 0 || matches!(self.state, State::Failed(_)) {
            return;
        }
        write::window_update(out, 0, n as u32);
        self.recv_window += n;
    }

    /// The caller took `n` bytes of `stream`'s body: once half its window is taken, the
    /// client may send that much more on the stream (one WINDOW_UPDATE, not one per
    /// frame). The connection's window is apart ([`Connection::consumed`]).
    pub fn release(&mut self, id: u32, n: usize, out: &mut Vec<u8>) {
        let Some(i) = self.find(id) else {
            return;
        };
        let stream = &mut self.streams[i];
        // Never more than the window the client had: a caller's miscount cannot
        // overflow it.
        stream.unacked = stream
            .unacked
            .saturating_add(u32::try_from(n).unwrap_or(u32::MAX))
            .min(frame::MAX_WINDOW);
        self.give_window_back(i, out);
    }

    /// Ends `stream` from our side (RST_STREAM with `code`): the caller gave up on it,
    /// or answered it whole and wants no more of its body (NO_ERROR, section 8.1).
    pub fn cancel(&mut self, id: u32, code: ErrorCode, out: &mut Vec<u8>) {
        if let Some(i) = self.find(id) {
            write::rst_stream(out, id, code);
            self.streams.swap_remove(i);
            self.closed(id | OURS);
        }
    }

    /// Starts a graceful close (shutdown, reload, idle): GOAWAY naming the last stream
    /// taken; streams already open finish, new ones are ignored.
    pub fn go_away(&mut self, out: &mut Vec<u8>) {
        if self.going_away.is_none() && !matches!(self.state, State::Failed(_)) {
            write::goaway(out, self.last_accepted, ErrorCode::NoError, b"");
            self.going_away = Some(self.last_accepted);
        }
    }

    /// Whether the connection has no open stream.
    pub fn is_idle(&self) -> bool {
        self.streams.is_empty() && self.pending.is_none()
    }

    /// Whether either end is going away and nothing is left open: time to close.
    pub fn is_done(&self) -> bool {
        matches!(self.state, State::Failed(_))
            || ((self.going_away.is_some() || self.peer_going_away) && self.is_idle())
    }

    /// Gives back the buffers only a request in progress needs (call when idle).
    pub fn release_buffers(&mut self) {
        self.fields.release();
        self.scratch = Vec::new();
        self.block = Vec::new();
        // One stream's room is kept: one stream at a time is the common case, and its
        // slot is not worth an allocation per request.
        if self.streams.capacity() > 1 {
            self.streams = Vec::new();
        }
    }

    /// The heap this connection holds, for memory accounting.
    pub fn heap_bytes(&self) -> usize {
        self.decoder.table().heap_bytes()
            + self.block.capacity()
            + self.scratch.capacity()
            + self.streams.capacity() * std::mem::size_of::<Stream>()
    }
}
