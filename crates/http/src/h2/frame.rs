//! HTTP/2 frames (RFC 9113 sections 4 and 6), parsed in place and encoded.
//!
//! A frame is a 9-byte [`Head`] and a payload of `Head::len` bytes. [`parse`] reads a
//! payload where it lies and returns a [`Frame`] that borrows it (a DATA frame's data, a
//! header block fragment, GOAWAY's debug data are slices of the caller's buffer), after
//! every check the RFC puts on a frame by itself. What it refuses is a [`FrameError`]:
//! a connection error (the connection ends with GOAWAY and that code) or a stream error
//! (that stream ends with RST_STREAM), as section 5.4 tells which.
//!
//! The codec is the server's: a PUSH_PROMISE, which only servers send, is refused as
//! RFC 9113 section 8.4 says.

/// Bytes of a frame header.
pub const HEADER_LEN: usize = 9;
/// The largest payload either side may send before SETTINGS_MAX_FRAME_SIZE raises it.
pub const DEFAULT_MAX_FRAME_SIZE: u32 = 1 << 14;
/// The largest SETTINGS_MAX_FRAME_SIZE a peer may announce (2^24 - 1).
pub const MAX_FRAME_SIZE_LIMIT: u32 = (1 << 24) - 1;
/// The largest flow-control window (2^31 - 1).
pub const MAX_WINDOW: u32 = (1 << 31) - 1;

/// The frame types of RFC 9113 section 6.
pub mod kind {
    /// DATA.
    pub const DATA: u8 = 0x0;
    /// HEADERS.
    pub const HEADERS: u8 = 0x1;
    /// PRIORITY (deprecated, still parsed: RFC 9113 section 6.3).
    pub const PRIORITY: u8 = 0x2;
    /// RST_STREAM.
    pub const RST_STREAM: u8 = 0x3;
    /// SETTINGS.
    pub const SETTINGS: u8 = 0x4;
    /// PUSH_PROMISE.
    pub const PUSH_PROMISE: u8 = 0x5;
    /// PING.
    pub const PING: u8 = 0x6;
    /// GOAWAY.
    pub const GOAWAY: u8 = 0x7;
    /// WINDOW_UPDATE.
    pub const WINDOW_UPDATE: u8 = 0x8;
    /// CONTINUATION.
    pub const CONTINUATION: u8 = 0x9;
}

/// Frame flags (each meaningful only on the types that define it).
pub mod flags {
    /// DATA, HEADERS: the stream's last frame from this side.
    pub const END_STREAM: u8 = 0x1;
    /// SETTINGS, PING: an acknowledgement.
    pub const ACK: u8 = 0x1;
    /// HEADERS, CONTINUATION: the field block ends in this frame.
    pub const END_HEADERS: u8 = 0x4;
    /// DATA, HEADERS: a pad length byte leads, padding trails.
    pub const PADDED: u8 = 0x8;
    /// HEADERS: a stream dependency and weight lead.
    pub const PRIORITY: u8 = 0x20;
}

/// The SETTINGS parameters terminus reads (RFC 9113 section 6.5.2, RFC 8441).
pub mod setting {
    /// SETTINGS_HEADER_TABLE_SIZE.
    pub const HEADER_TABLE_SIZE: u16 = 0x1;
    /// SETTINGS_ENABLE_PUSH.
    pub const ENABLE_PUSH: u16 = 0x2;
    /// SETTINGS_MAX_CONCURRENT_STREAMS.
    pub const MAX_CONCURRENT_STREAMS: u16 = 0x3;
    /// SETTINGS_INITIAL_WINDOW_SIZE.
    pub const INITIAL_WINDOW_SIZE: u16 = 0x4;
    /// SETTINGS_MAX_FRAME_SIZE.
    pub const MAX_FRAME_SIZE: u16 = 0x5;
    /// SETTINGS_MAX_HEADER_LIST_SIZE.
    pub const MAX_HEADER_LIST_SIZE: u16 = 0x6;
    /// SETTINGS_ENABLE_CONNECT_PROTOCOL (RFC 8441).
    pub const ENABLE_CONNECT_PROTOCOL: u16 = 0x8;
}

/// HTTP/2 error codes (RFC 9113 section 7).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ErrorCode {
    /// NO_ERROR: a graceful end.
    NoError,
    /// PROTOCOL_ERROR.
    ProtocolError,
    /// INTERNAL_ERROR.
    InternalError,
    /// FLOW_CONTROL_ERROR.
    FlowControlError,
    /// SETTINGS_TIMEOUT.
    SettingsTimeout,
    /// STREAM_CLOSED.
    StreamClosed,
    /// FRAME_SIZE_ERROR.
    FrameSizeError,
    /// REFUSED_STREAM: not processed, safe to retry.
    RefusedStream,
    /// CANCEL.
    Cancel,
    /// COMPRESSION_ERROR: the field compression context is lost.
    CompressionError,
    /// CONNECT_ERROR.
    ConnectError,
    /// ENHANCE_YOUR_CALM: the peer is generating excessive load.
    EnhanceYourCalm,
    /// INADEQUATE_SECURITY.
    InadequateSecurity,
    /// HTTP_1_1_REQUIRED.
    Http11Required,
    /// A code this codec does not know (RFC 9113 section 7: not an error in itself).
    Other(u32),
}

impl From<u32> for ErrorCode {
    fn from(code: u32) -> Self {
        match code {
            0x0 => Self::NoError,
            0x1 => Self::ProtocolError,
            0x2 => Self::InternalError,
            0x3 => Self::FlowControlError,
            0x4 => Self::SettingsTimeout,
            0x5 => Self::StreamClosed,
            0x6 => Self::FrameSizeError,
            0x7 => Self::RefusedStream,
            0x8 => Self::Cancel,
            0x9 => Self::CompressionError,
            0xa => Self::ConnectError,
            0xb => Self::EnhanceYourCalm,
            0xc => Self::InadequateSecurity,
            0xd => Self::Http11Required,
            other => Self::Other(other),
        }
    }
}

impl From<ErrorCode> for u32 {
    fn from(code: ErrorCode) -> u32 {
        match code {
            ErrorCode::NoError => 0x0,
            ErrorCode::ProtocolError => 0x1,
            ErrorCode::InternalError => 0x2,
            ErrorCode::FlowControlError => 0x3,
            ErrorCode::SettingsTimeout => 0x4,
            ErrorCode::StreamClosed => 0x5,
            ErrorCode::FrameSizeError => 0x6,
            ErrorCode::RefusedStream => 0x7,
            ErrorCode::Cancel => 0x8,
            ErrorCode::CompressionError => 0x9,
            ErrorCode::ConnectError => 0xa,
            ErrorCode::EnhanceYourCalm => 0xb,
            ErrorCode::InadequateSecurity => 0xc,
            ErrorCode::Http11Required => 0xd,
            ErrorCode::Other(other) => other,
        }
    }
}

/// A frame refused by itself, and what it costs (RFC 9113 section 5.4).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FrameError {
    /// The connection ends: GOAWAY with `code`.
    Connection(ErrorCode, &'static str),
    /// Only `stream` ends: RST_STREAM with `code`.
    Stream(u32, ErrorCode, &'static str),
}

impl FrameError {
    /// The error code sent.
    pub fn code(&self) -> ErrorCode {
        match self {
            Self::Connection(code, _) | Self::Stream(_, code, _) => *code,
        }
    }
}

impl std::fmt::Display for FrameError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Connection(code, why) => write!(f, "connection error {code:?}: {why}"),
            Self::Stream(id, code, why) => write!(f, "stream {id} error {code:?}: {why}"),
        }
    }
}

impl std::error::Error for FrameError {}

fn connection(code: ErrorCode, why: &'static str) -> FrameError {
    FrameError::Connection(code, why)
}

/// A frame header (RFC 9113 section 4.1).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Head {
    /// Payload length (24 bits).
    pub len: u32,
    /// Frame type ([`kind`]).
    pub kind: u8,
    /// Flags ([`flags`]).
    pub flags: u8,
    /// Stream identifier (31 bits; the reserved bit is dropped on receipt, as the RFC
    /// says it MUST be ignored).
    pub stream: u32,
}

impl Head {
    /// Reads a header.
    pub fn parse(bytes: &[u8; HEADER_LEN]) -> Self {
        Self {
            len: u32::from_be_bytes([0, bytes[0], bytes[1], bytes[2]]),
            kind: bytes[3],
            flags: bytes[4],
            stream: u32::from_be_bytes([bytes[5], bytes[6], bytes[7], bytes[8]]) & MAX_WINDOW,
        }
    }

    /// Writes this header (`len` below 2^24 and `stream` below 2^31: the caller's
    /// frames are never larger).
    pub fn encode(&self) -> [u8; HEADER_LEN] {
        debug_assert!(self.len <= MAX_FRAME_SIZE_LIMIT && self.stream <= MAX_WINDOW);
        let len = self.len.to_be_bytes();
        let stream = (self.stream & MAX_WINDOW).to_be_bytes();
        [
            len[1], len[2], len[3], self.kind, self.flags, stream[0], stream[1], stream[2],
            stream[3],
        ]
    }

    /// Whether `flag` is set.
    pub fn has(&self, flag: u8) -> bool {
        self.flags & flag != 0
    }

    /// Checks the payload length against the SETTINGS_MAX_FRAME_SIZE this side
    /// announced, before the payload is read: too long is a connection error
    /// (section 4.2: a frame that long cannot be skipped safely on any stream).
    pub fn check_len(&self, max_frame_size: u32) -> Result<(), FrameError> {
        if self.len > max_frame_size {
            return Err(connection(
                ErrorCode::FrameSizeError,
                "a frame longer than SETTINGS_MAX_FRAME_SIZE",
            ));
        }
        Ok(())
    }
}

/// A stream dependency (RFC 9113 section 5.3.2, deprecated): parsed so that it is checked
/// and skipped, and otherwise ignored (RFC 9218 priority signals are too).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Priority {
    /// The stream depended on.
    pub depends_on: u32,
    /// The exclusive bit.
    pub exclusive: bool,
    /// Weight minus one, as sent.
    pub weight: u8,
}

impl Priority {
    fn parse(bytes: &[u8]) -> Self {
        let word = u32::from_be_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]);
        Self {
            depends_on: word & MAX_WINDOW,
            exclusive: word & !MAX_WINDOW != 0,
            weight: bytes[4],
        }
    }
}

/// One SETTINGS parameter, as sent.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Setting {
    /// Its identifier ([`setting`]; unknown ones are passed on, to be ignored).
    pub id: u16,
    /// Its value.
    pub value: u32,
}

/// A SETTINGS frame's parameters, in order, each already checked.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Settings<'a>(&'a [u8]);

impl<'a> Iterator for Settings<'a> {
    type Item = Setting;

    fn next(&mut self) -> Option<Setting> {
        let (one, rest) = self.0.split_first_chunk::<6>()?;
        self.0 = rest;
        Some(Setting {
            id: u16::from_be_bytes([one[0], one[1]]),
            value: u32::from_be_bytes([one[2], one[3], one[4], one[5]]),
        })
    }
}

/// A frame, its payload borrowed from the buffer it was parsed in.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Frame<'a> {
    /// DATA. `flow_len` is what the frame counts against flow control: its whole
    /// payload, padding included (section 6.1).
    Data {
        /// The stream.
        stream: u32,
        /// END_STREAM.
        end_stream: bool,
        /// The data, padding removed.
        data: &'a [u8],
        /// The payload length, padding included.
        flow_len: u32,
    },
    /// HEADERS: the start of a field block.
    Headers {
        /// The stream.
        stream: u32,
        /// END_STREAM.
        end_stream: bool,
        /// END_HEADERS: no CONTINUATION follows.
        end_headers: bool,
        /// The deprecated priority fields, when present (checked, else unused).
        priority: Option<Priority>,
        /// The field block fragment, padding removed.
        fragment: &'a [u8],
    },
    /// PRIORITY (deprecated; ignored once checked).
    Priority {
        /// The stream.
        stream: u32,
        /// Its dependency.
        priority: Priority,
    },
    /// RST_STREAM.
    RstStream {
        /// The stream.
        stream: u32,
        /// Why.
        code: ErrorCode,
    },
    /// SETTINGS.
    Settings {
        /// An acknowledgement of ours (no parameters).
        ack: bool,
        /// The parameters.
        settings: Settings<'a>,
    },
    /// PING.
    Ping {
        /// An answer to ours.
        ack: bool,
        /// The 8 opaque bytes, echoed in the answer.
        data: [u8; 8],
    },
    /// GOAWAY.
    GoAway {
        /// The last stream the peer processed or may process.
        last_stream: u32,
        /// Why.
        code: ErrorCode,
        /// Opaque debug data.
        debug: &'a [u8],
    },
    /// WINDOW_UPDATE (a non-zero increment).
    WindowUpdate {
        /// The stream, or 0 for the connection.
        stream: u32,
        /// The increment, 1 to 2^31 - 1.
        increment: u32,
    },
    /// CONTINUATION: more of a field block.
    Continuation {
        /// The stream.
        stream: u32,
        /// END_HEADERS.
        end_headers: bool,
        /// The field block fragment.
        fragment: &'a [u8],
    },
    /// A type this codec does not know: ignored (section 4.1), unless it arrives inside a
    /// field block, which the connection checks.
    Unknown {
        /// Its type.
        kind: u8,
        /// Its stream.
        stream: u32,
    },
}

/// Parses the payload of a frame with header `head` (its length already checked with
/// [`Head::check_len`]); `payload` is exactly `head.len` bytes.
pub fn parse(head: Head, payload: &[u8]) -> Result<Frame<'_>, FrameError> {
    debug_assert_eq!(payload.len(), head.len as usize);
    let stream = head.stream;
    match head.kind {
        kind::DATA => {
            need_stream(stream, "DATA on stream 0")?;
            let (_, data) = unpad(head, payload, 0)?;
            Ok(Frame::Data {
                stream,
                end_stream: head.has(flags::END_STREAM),
                data,
                flow_len: head.len,
            })
        }
        kind::HEADERS => {
            need_stream(stream, "HEADERS on stream 0")?;
            let fixed = if head.has(flags::PRIORITY) { 5 } else { 0 };
            let (fields, fragment) = unpad(head, payload, fixed)?;
            let priority = match fields.first_chunk::<5>() {
                Some(fields) => {
                    let priority = Priority::parse(fields);
                    not_self_dependent(stream, priority)?;
                    Some(priority)
                }
                None => None,
            };
            Ok(Frame::Headers {
                stream,
                end_stream: head.has(flags::END_STREAM),
                end_headers: head.has(flags::END_HEADERS),
                priority,
                fragment,
            })
        }
        kind::PRIORITY => {
            need_stream(stream, "PRIORITY on stream 0")?;
            if payload.len() != 5 {
                return Err(FrameError::Stream(
                    stream,
                    ErrorCode::FrameSizeError,
                    "PRIORITY not 5 bytes long",
                ));
            }
            let priority = Priority::parse(payload);
            not_self_dependent(stream, priority)?;
            Ok(Frame::Priority { stream, priority })
        }
        kind::RST_STREAM => {
            need_stream(stream, "RST_STREAM on stream 0")?;
            let code = exactly::<4>(payload, "RST_STREAM not 4 bytes long")?;
            Ok(Frame::RstStream {
                stream,
                code: u32::from_be_bytes(code).into(),
            })
        }
        kind::SETTINGS => {
            no_stream(stream, "SETTINGS on a stream")?;
            let ack = head.has(flags::ACK);
            if ack && !payload.is_empty() {
                return Err(connection(
                    ErrorCode::FrameSizeError,
                    "a SETTINGS acknowledgement with parameters",
                ));
            }
            if !payload.len().is_multiple_of(6) {
                return Err(connection(
                    ErrorCode::FrameSizeError,
                    "SETTINGS not a multiple of 6 bytes long",
                ));
            }
            for s in Settings(payload) {
                check_setting(s)?;
            }
            Ok(Frame::Settings {
                ack,
                settings: Settings(payload),
            })
        }
        kind::PUSH_PROMISE => Err(connection(
            ErrorCode::ProtocolError,
            "PUSH_PROMISE sent to a server",
        )),
        kind::PING => {
            no_stream(stream, "PING on a stream")?;
            let data = exactly::<8>(payload, "PING not 8 bytes long")?;
            Ok(Frame::Ping {
                ack: head.has(flags::ACK),
                data,
            })
        }
        kind::GOAWAY => {
            no_stream(stream, "GOAWAY on a stream")?;
            let Some((fixed, debug)) = payload.split_first_chunk::<8>() else {
                return Err(connection(
                    ErrorCode::FrameSizeError,
                    "GOAWAY shorter than 8 bytes",
                ));
            };
            Ok(Frame::GoAway {
                last_stream: u32::from_be_bytes([fixed[0], fixed[1], fixed[2], fixed[3]])
                    & MAX_WINDOW,
                code: u32::from_be_bytes([fixed[4], fixed[5], fixed[6], fixed[7]]).into(),
                debug,
            })
        }
        kind::WINDOW_UPDATE => {
            let bytes = exactly::<4>(payload, "WINDOW_UPDATE not 4 bytes long")?;
            let increment = u32::from_be_bytes(bytes) & MAX_WINDOW;
            if increment == 0 {
                let why = "a WINDOW_UPDATE of 0";
                return Err(if stream == 0 {
                    connection(ErrorCode::ProtocolError, why)
                } else {
                    FrameError::Stream(stream, ErrorCode::ProtocolError, why)
                });
            }
            Ok(Frame::WindowUpdate { stream, increment })
        }
        kind::CONTINUATION => {
            need_stream(stream, "CONTINUATION on stream 0")?;
            Ok(Frame::Continuation {
                stream,
                end_headers: head.has(flags::END_HEADERS),
                fragment: payload,
            })
        }
        other => Ok(Frame::Unknown {
            kind: other,
            stream,
        }),
    }
}

/// A frame that belongs to a stream must name one (sections 6.1-6.4, 6.10).
fn need_stream(stream: u32, why: &'static str) -> Result<(), FrameError> {
    if stream == 0 {
        return Err(connection(ErrorCode::ProtocolError, why));
    }
    Ok(())
}

/// A frame that belongs to the connection must name no stream (sections 6.5, 6.7, 6.8).
fn no_stream(stream: u32, why: &'static str) -> Result<(), FrameError> {
    if stream != 0 {
        return Err(connection(ErrorCode::ProtocolError, why));
    }
    Ok(())
}

/// A fixed-size payload; another size is a connection error (section 4.2: these frames
/// either alter the connection's state or have no stream to reset).
fn exactly<const N: usize>(payload: &[u8], why: &'static str) -> Result<[u8; N], FrameError> {
    payload
        .try_into()
        .map_err(|_| connection(ErrorCode::FrameSizeError, why))
}

/// A stream cannot depend on itself (section 5.3.1): a stream error.
fn not_self_dependent(stream: u32, priority: Priority) -> Result<(), FrameError> {
    if priority.depends_on == stream {
        return Err(FrameError::Stream(
            stream,
            ErrorCode::ProtocolError,
            "a stream that depends on itself",
        ));
    }
    Ok(())
}

/// A padded payload's `fixed` leading bytes (HEADERS's priority fields) and the rest
/// without its padding (sections 6.1 and 6.2). Too short for the pad length or the fixed
/// fields is a frame size error; padding longer than what remains after them, a protocol
/// error. Both end the connection (DATA's could end only its stream; section 5.4.1 lets
/// an endpoint treat any stream error as a connection error).
fn unpad(head: Head, payload: &[u8], fixed: usize) -> Result<(&[u8], &[u8]), FrameError> {
    let (pad, body) = if head.has(flags::PADDED) {
        match payload.split_first() {
            Some((&pad, body)) => (pad as usize, body),
            None => {
                return Err(connection(
                    ErrorCode::FrameSizeError,
                    "a padded frame without its pad length",
                ))
            }
        }
    } else {
        (0, payload)
    };
    let Some((fields, rest)) = body.split_at_checked(fixed) else {
        return Err(connection(
            ErrorCode::FrameSizeError,
            "HEADERS too short for its priority fields",
        ));
    };
    match rest.len().checked_sub(pad) {
        Some(len) => Ok((fields, &rest[..len])),
        None => Err(connection(
            ErrorCode::ProtocolError,
            "padding longer than the payload it pads",
        )),
    }
}

/// The checks section 6.5.2 (and RFC 8441 section 3) put on a parameter's value.
fn check_setting(s: Setting) -> Result<(), FrameError> {
    match s.id {
        setting::ENABLE_PUSH | setting::ENABLE_CONNECT_PROTOCOL if s.value > 1 => Err(connection(
            ErrorCode::ProtocolError,
            "a boolean setting neither 0 nor 1",
        )),
        setting::INITIAL_WINDOW_SIZE if s.value > MAX_WINDOW => Err(connection(
            ErrorCode::FlowControlError,
            "SETTINGS_INITIAL_WINDOW_SIZE above 2^31 - 1",
        )),
        setting::MAX_FRAME_SIZE
            if !(DEFAULT_MAX_FRAME_SIZE..=MAX_FRAME_SIZE_LIMIT).contains(&s.value) =>
        {
            Err(connection(
                ErrorCode::ProtocolError,
                "SETTINGS_MAX_FRAME_SIZE outside 2^14 to 2^24 - 1",
            ))
        }
        _ => Ok(()),
    }
}

/// Writers of the frames a server sends: each appends one whole frame to `out`.
pub mod write {
    use super::{flags, kind, ErrorCode, Head, Setting};

    fn head(out: &mut Vec<u8>, len: usize, kind: u8, flags: u8, stream: u32) {
        let len = u32::try_from(len).expect("a frame shorter than 2^24");
        out.extend_from_slice(
            &Head {
                len,
                kind,
                flags,
                stream,
            }
            .encode(),
        );
    }

    /// SETTINGS with `settings`.
    pub fn settings(out: &mut Vec<u8>, settings: &[Setting]) {
        head(out, settings.len() * 6, kind::SETTINGS, 0, 0);
        for s in settings {
            out.extend_from_slice(&s.id.to_be_bytes());
            out.extend_from_slice(&s.value.to_be_bytes());
        }
    }

    /// The acknowledgement of the peer's SETTINGS.
    pub fn settings_ack(out: &mut Vec<u8>) {
        head(out, 0, kind::SETTINGS, flags::ACK, 0);
    }

    /// The answer to a PING.
    pub fn ping_ack(out: &mut Vec<u8>, data: [u8; 8]) {
        head(out, 8, kind::PING, flags::ACK, 0);
        out.extend_from_slice(&data);
    }

    /// GOAWAY naming the last stream processed.
    pub fn goaway(out: &mut Vec<u8>, last_stream: u32, code: ErrorCode, debug: &[u8]) {
        head(out, 8 + debug.len(), kind::GOAWAY, 0, 0);
        out.extend_from_slice(&last_stream.to_be_bytes());
        out.extend_from_slice(&u32::from(code).to_be_bytes());
        out.extend_from_slice(debug);
    }

    /// RST_STREAM.
    pub fn rst_stream(out: &mut Vec<u8>, stream: u32, code: ErrorCode) {
        head(out, 4, kind::RST_STREAM, 0, stream);
        out.extend_from_slice(&u32::from(code).to_be_bytes());
    }

    /// WINDOW_UPDATE (`increment` 1 to 2^31 - 1).
    pub fn window_update(out: &mut Vec<u8>, stream: u32, increment: u32) {
        debug_assert!(increment > 0);
        head(out, 4, kind::WINDOW_UPDATE, 0, stream);
        out.extend_from_slice(&increment.to_be_bytes());
    }

    /// DATA holding `data`.
    pub fn data(out: &mut Vec<u8>, stream: u32, data: &[u8], end_stream: bool) {
        let flags = if end_stream { flags::END_STREAM } else { 0 };
        head(out, data.len(), kind::DATA, flags, stream);
        out.extend_from_slice(data);
    }

    /// HEADERS (and END_HEADERS) with a whole field block.
    pub fn headers(out: &mut Vec<u8>, stream: u32, block: &[u8], end_stream: bool) {
        let end = if end_stream { flags::END_STREAM } else { 0 };
        head(
            out,
            block.len(),
            kind::HEADERS,
            flags::END_HEADERS | end,
            stream,
        );
        out.extend_from_slice(block);
    }
}

#[cfg(test)]
mod tests;
