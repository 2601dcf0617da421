//! Body framing, both ways: how a message says where its body ends (content-length,
//! chunked, or the connection's close), decoding a body from the bytes read so far, and
//! chunked encoding.
//!
//! Decoding is strict where leniency lets two parsers disagree about where a body ends
//! (request smuggling): both framings at once, disagreeing or signed lengths, transfer
//! codings other than `chunked`, and chunk lines that are not hex digits, optional
//! extensions and CRLF are all refused.

use bytes::Bytes;
use http::header::{self, HeaderMap};

use crate::h1::raw::Fields;
use http::{StatusCode, Version};

/// Longest chunk-size line (size and extensions), and trailer section, accepted.
const MAX_LINE: usize = 4096;
const MAX_TRAILERS: usize = 16 * 1024;

/// How a message says where its body ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Framing {
    /// No body.
    None,
    /// Exactly this many bytes.
    Length(u64),
    /// Chunks, ended by a zero-size chunk and optional trailers.
    Chunked,
    /// Whatever comes until the connection closes (responses only: a request without a
    /// length has no body).
    Close,
}

/// Why a message's framing cannot be trusted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Refusal {
    /// Both framings, disagreeing or malformed lengths, codings on HTTP/1.0.
    Ambiguous,
    /// A transfer coding other than a single `chunked`.
    UnknownCoding,
}

impl Refusal {
    fn reason(self) -> &'static str {
        match self {
            Refusal::Ambiguous => "ambiguous or malformed content-length/transfer-encoding",
            Refusal::UnknownCoding => "a transfer coding other than chunked",
        }
    }
}

/// The framing the headers declare, `None` when they declare none. Strict the same way
/// for both directions: a message two parsers could split differently is refused.
fn declared_framing(headers: &impl Fields, version: Version) -> Result<Option<Framing>, Refusal> {
    let mut codings = headers.values_of(header::TRANSFER_ENCODING);
    if let Some(coding) = codings.next() {
        // Both framings at once is how requests are smuggled past a proxy, and HTTP/1.0
        // has no transfer codings: refuse.
        let lengths = headers.values_of(header::CONTENT_LENGTH).next().is_some();
        if lengths || version == Version::HTTP_10 {
            return Err(Refusal::Ambiguous);
        }
        // Only `chunked`, once, as nginx: anything else is a coding we cannot undo.
        return match codings.next() {
            None if coding.eq_ignore_ascii_case(b"chunked") => Ok(Some(Framing::Chunked)),
            _ => Err(Refusal::UnknownCoding),
        };
    }
    let mut length = None;
    for v in headers.values_of(header::CONTENT_LENGTH) {
        let n: u64 = std::str::from_utf8(v)
            .ok()
            .filter(|s| !s.is_empty() && s.len() <= 19 && s.bytes().all(|b| b.is_ascii_digit()))
            .and_then(|s| s.parse().ok())
            .ok_or(Refusal::Ambiguous)?;
        if length.is_some_and(|l| l != n) {
            return Err(Refusal::Ambiguous);
        }
        length = Some(n);
    }
    Ok(length.map(|n| match n {
        0 => Framing::None,
        n => Framing::Length(n),
    }))
}

/// Reads a request's framing from its headers. Errors are the status to refuse it with.
pub fn request_framing(headers: &impl Fields, version: Version) -> Result<Framing, StatusCode> {
    match declared_framing(headers, version) {
        Ok(framing) => Ok(framing.unwrap_or(Framing::None)),
        Err(Refusal::Ambiguous) => Err(StatusCode::BAD_REQUEST),
        Err(Refusal::UnknownCoding) => Err(StatusCode::NOT_IMPLEMENTED),
    }
}

/// Reads the framing of a response to a `method` request from its status and headers
/// (RFC 9112 section 6.3): none after HEAD and for 1xx, 204 and 304 whatever the headers
/// say; a length or chunks as declared; otherwise until the connection closes.
pub fn response_framing(
    method: &http::Method,
    status: StatusCode,
    headers: &impl Fields,
    version: Version,
) -> Result<Framing, Malformed> {
    if method == http::Method::HEAD
        || status.is_informational()
        || status == StatusCode::NO_CONTENT
        || status == StatusCode::NOT_MODIFIED
    {
        return Ok(Framing::None);
    }
    declared_framing(headers, version)
        .map(|f| f.unwrap_or(Framing::Close))
        .map_err(|r| Malformed(r.reason()))
}

/// What decoding gave.
#[derive(Debug, PartialEq)]
pub enum Decoded {
    /// Body bytes.
    Data(Bytes),
    /// The trailer section of a chunked body (the last piece before the end).
    Trailers(HeaderMap),
    /// The body is complete; what follows in the buffer is the next message.
    End,
}

/// What a decoding step gave: [`Decoded`], with the data as the caller keeps it.
enum Step<T> {
    Data(T),
    Trailers(HeaderMap),
    End,
}

/// A body being decoded from the front of a connection's read buffer.
#[derive(Debug)]
pub struct Decoder(State);

#[derive(Debug, Clone, Copy, PartialEq)]
enum State {
    Length(u64),
    UntilClose,
    /// Expecting a chunk-size line.
    ChunkSize,
    ChunkData(u64),
    /// Expecting the CRLF after a chunk's data.
    ChunkEnd,
    Trailers,
    Done,
}

/// A body that cannot be decoded: the connection cannot continue after it.
#[derive(Debug, PartialEq)]
pub struct Malformed(
    /// What was wrong.
    pub &'static str,
);

impl Decoder {
    /// A decoder for a body framed by `framing`.
    pub fn new(framing: Framing) -> Self {
        Decoder(match framing {
            Framing::None | Framing::Length(0) => State::Done,
            Framing::Length(n) => State::Length(n),
            Framing::Chunked => State::ChunkSize,
            Framing::Close => State::UntilClose,
        })
    }

    /// What the connection closing means here: the end of a body framed by the close, a
    /// truncated body for any other framing.
    pub fn at_eof(&mut self) -> Result<(), Malformed> {
        match self.0 {
            State::Done => Ok(()),
            State::UntilClose => {
                self.0 = State::Done;
                Ok(())
            }
            _ => Err(Malformed(
                "the connection closed before the end of the body",
            )),
        }
    }

    /// Whether the whole body has been decoded.
    pub fn is_done(&self) -> bool {
        self.0 == State::Done
    }

    /// Takes the next piece of the body from the front of `buf`; `Ok(None)` wants more bytes.
    pub fn decode(&mut self, buf: &mut Vec<u8>) -> Result<Option<Decoded>, Malformed> {
        Ok(self
            .step(buf, Bytes::copy_from_slice)?
            .map(|step| match step {
                Step::Data(data) => Decoded::Data(data),
                Step::Trailers(trailers) => Decoded::Trailers(trailers),
                Step::End => Decoded::End,
            }))
    }

    /// Like [`Decoder::decode`] for a reader that only counts the body: body bytes are
    /// dropped where they lie (no copy), trailers parsed and dropped. `Ok(Some(n))`: `n`
    /// bytes of body went (0 for trailers or the end: see [`Decoder::is_done`]);
    /// `Ok(None)` wants more bytes.
    pub fn skip(&mut self, buf: &mut Vec<u8>) -> Result<Option<usize>, Malformed> {
        Ok(self.step(buf, <[u8]>::len)?.map(|step| match step {
            Step::Data(n) => n,
            Step::Trailers(_) | Step::End => 0,
        }))
    }

    /// The next piece of the body, its bytes handed to `data` (which makes what the
    /// caller keeps of them) before they leave `buf`.
    fn step<T>(
        &mut self,
        buf: &mut Vec<u8>,
        data: impl FnOnce(&[u8]) -> T,
    ) -> Result<Option<Step<T>>, Malformed> {
        loop {
            match self.0 {
                State::Done => return Ok(Some(Step::End)),
                State::UntilClose if buf.is_empty() => return Ok(None),
                State::UntilClose => {
                    let data = data(buf);
                    buf.clear();
                    return Ok(Some(Step::Data(data)));
                }
                State::Length(n) | State::ChunkData(n) => {
                    if buf.is_empty() {
                        return Ok(None);
                    }
                    let take = (n as usize).min(buf.len());
                    let data = data(&buf[..take]);
                    buf.drain(..take);
                    let left = n - take as u64;
                    self.0 = match self.0 {
                        State::Length(_) if left == 0 => State::Done,
                        State::Length(_) => State::Length(left),
                        _ if left == 0 => State::ChunkEnd,
                        _ => State::ChunkData(left),
                    };
                    return Ok(Some(Step::Data(data)));
                }
                State::ChunkSize => {
                    let Some(line) = take_line(buf, MAX_LINE)? else {
                        return Ok(None);
                    };
                    let size = chunk_size(&line)?;
                    self.0 = if size == 0 {
                        State::Trailers
                    } else {
                        State::ChunkData(size)
                    };
                }
                State::ChunkEnd => {
                    if buf.len() < 2 {
                        return Ok(None);
                    }
                    if &buf[..2] != b"\r\n" {
                        return Err(Malformed("chunk data longer than its size"));
                    }
                    buf.drain(..2);
                    self.0 = State::ChunkSize;
                }
                State::Trailers => {
                    if buf.starts_with(b"\r\n") {
                        buf.drain(..2);
                        self.0 = State::Done;
                        return Ok(Some(Step::End));
                    }
                    let Some(end) = find(buf, b"\r\n\r\n") else {
                        if buf.len() > MAX_TRAILERS {
                            return Err(Malformed("trailer section too long"));
                        }
                        return Ok(None);
                    };
                    let section = &buf[..end + 4];
                    let mut fields = [httparse::EMPTY_HEADER; 64];
                    let trailers = match httparse::parse_headers(section, &mut fields) {
                        Ok(httparse::Status::Complete((_, fields))) => {
                            crate::h1::raw::RawHead::new(fields, section)
                                .and_then(|raw| raw.to_header_map())
                                .ok_or(Malformed("bad trailer field"))?
                        }
                        _ => return Err(Malformed("bad trailer section")),
                    };
                    buf.drain(..end + 4);
                    self.0 = State::Done;
                    return Ok(Some(Step::Trailers(trailers)));
                }
            }
        }
    }
}

/// Removes and returns the line (without CRLF) at the front of `buf`.
fn take_line(buf: &mut Vec<u8>, max: usize) -> Result<Option<Vec<u8>>, Malformed> {
    match find(buf, b"\r\n") {
        Some(end) => {
            let line = buf[..end].to_vec();
            buf.drain(..end + 2);
            Ok(Some(line))
        }
        None if buf.len() > max => Err(Malformed("chunk-size line too long")),
        None => Ok(None),
    }
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

/// A chunk-size line: hex digits, then optional `;extensions` (ignored), nothing else.
fn chunk_size(line: &[u8]) -> Result<u64, Malformed> {
    let digits = line.split(|&b| b == b';').next().unwrap_or_default();
    if digits.is_empty() || digits.len() > 15 || !digits.iter().all(u8::is_ascii_hexdigit) {
        return Err(Malformed("bad chunk size"));
    }
    if line[digits.len()..]
        .iter()
        .any(|&b| b == b'\r' || b == b'\n')
    {
        return Err(Malformed("bare CR or LF in a chunk-size line"));
    }
    let text = std::str::from_utf8(digits).map_err(|_| Malformed("bad chunk size"))?;
    u64::from_str_radix(text, 16).map_err(|_| Malformed("bad chunk size"))
}

/// How a response says where its body ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ResponseFraming {
    /// No body follows (HEAD, 1xx, 204, 304); a content-length the responder set stays.
    Bodiless,
    /// Exactly this many bytes, announced by `content-length`.
    Length(u64),
    /// `transfer-encoding: chunked`.
    Chunked,
    /// The body ends when the connection closes (an HTTP/1.0 client and a body of
    /// unknown length).
    Close,
}

/// The head of one chunk of `len` (> 0) bytes; the data and a CRLF follow.
pub fn chunk_head(out: &mut Vec<u8>, len: usize) {
    out.extend_from_slice(format!("{len:x}\r\n").as_bytes());
}

/// The last chunk and the trailer section that end a chunked body.
pub fn chunked_end(out: &mut Vec<u8>, trailers: Option<&HeaderMap>) {
    out.extend_from_slice(b"0\r\n");
    for (name, value) in trailers.into_iter().flatten() {
        out.extend_from_slice(name.as_str().as_bytes());
        out.extend_from_slice(b": ");
        out.extend_from_slice(value.as_bytes());
        out.extend_from_slice(b"\r\n");
    }
    out.extend_from_slice(b"\r\n");
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::header::{HeaderName, HeaderValue};

    fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut m = HeaderMap::new();
        for (k, v) in pairs {
            m.append(
                HeaderName::from_bytes(k.as_bytes()).unwrap(),
                HeaderValue::from_str(v).unwrap(),
            );
        }
        m
    }

    #[test]
    fn request_framing_is_strict() {
        let f = |pairs: &[(&str, &str)]| request_framing(&headers(pairs), Version::HTTP_11);
        assert_eq!(f(&[]), Ok(Framing::None));
        assert_eq!(f(&[("content-length", "0")]), Ok(Framing::None));
        assert_eq!(f(&[("content-length", "10")]), Ok(Framing::Length(10)));
        assert_eq!(
            f(&[("content-length", "10"), ("content-length", "10")]),
            Ok(Framing::Length(10))
        );
        assert_eq!(f(&[("transfer-encoding", "Chunked")]), Ok(Framing::Chunked));
        for bad in [
            &[("transfer-encoding", "chunked"), ("content-length", "3")][..],
            &[("content-length", "3"), ("content-length", "4")],
            &[("content-length", "-1")],
            &[("content-length", "+3")],
            &[("content-length", "3, 3")],
            &[("content-length", "99999999999999999999")],
        ] {
            assert_eq!(f(bad), Err(StatusCode::BAD_REQUEST), "{bad:?}");
        }
        for unknown in [
            &[("transfer-encoding", "gzip, chunked")][..],
            &[
                ("transfer-encoding", "chunked"),
                ("transfer-encoding", "chunked"),
            ],
            &[("transfer-encoding", "identity")],
        ] {
            assert_eq!(f(unknown), Err(StatusCode::NOT_IMPLEMENTED), "{unknown:?}");
        }
        let http10 = request_framing(
            &headers(&[("transfer-encoding", "chunked")]),
            Version::HTTP_10,
        );
        assert_eq!(http10, Err(StatusCode::BAD_REQUEST));
    }

    #[test]
    fn response_framing_follows_rfc_9112() {
        use http::Method;
        let f = |method: &Method, status: u16, pairs: &[(&str, &str)]| {
            let status = StatusCode::from_u16(status).unwrap();
            response_framing(method, status, &headers(pairs), Version::HTTP_11)
        };
        let cl = [("content-length", "5")];
        assert_eq!(f(&Method::GET, 200, &cl), Ok(Framing::Length(5)));
        assert_eq!(f(&Method::HEAD, 200, &cl), Ok(Framing::None));
        for bodiless in [101, 103, 204, 304] {
            assert_eq!(f(&Method::GET, bodiless, &cl), Ok(Framing::None));
        }
        assert_eq!(f(&Method::GET, 200, &[]), Ok(Framing::Close));
        assert_eq!(
            f(&Method::GET, 200, &[("transfer-encoding", "chunked")]),
            Ok(Framing::Chunked)
        );
        for ambiguous in [
            &[("transfer-encoding", "chunked"), ("content-length", "5")][..],
            &[("content-length", "5"), ("content-length", "6")],
            &[("content-length", "0x5")],
            &[("transfer-encoding", "gzip")],
        ] {
            assert!(f(&Method::GET, 200, ambiguous).is_err(), "{ambiguous:?}");
        }
    }

    #[test]
    fn a_close_delimited_body_ends_only_at_eof() {
        let mut d = Decoder::new(Framing::Close);
        let mut buf = b"abc".to_vec();
        assert_eq!(
            d.decode(&mut buf),
            Ok(Some(Decoded::Data(Bytes::from_static(b"abc"))))
        );
        assert_eq!(d.decode(&mut buf), Ok(None));
        assert_eq!(d.at_eof(), Ok(()));
        assert!(d.is_done());
        let mut d = Decoder::new(Framing::Length(4));
        let mut buf = b"abc".to_vec();
        d.decode(&mut buf).unwrap();
        assert!(d.at_eof().is_err(), "a short body is not a whole one");
    }

    /// Data, trailers, and the bytes after the body.
    type Whole = (Vec<u8>, Option<HeaderMap>, Vec<u8>);

    /// Decodes all of `input` at once.
    fn decode_all(framing: Framing, input: &[u8]) -> Result<Whole, Malformed> {
        let mut d = Decoder::new(framing);
        let mut buf = input.to_vec();
        let (mut data, mut trailers) = (Vec::new(), None);
        loop {
            match d.decode(&mut buf)? {
                Some(Decoded::Data(b)) => data.extend_from_slice(&b),
                Some(Decoded::Trailers(t)) => trailers = Some(t),
                Some(Decoded::End) => return Ok((data, trailers, buf)),
                None => return Err(Malformed("incomplete")),
            }
        }
    }

    #[test]
    fn chunked_bodies_decode_and_leave_the_next_message() {
        let (data, trailers, rest) = decode_all(
            Framing::Chunked,
            b"5;ext=1\r\nhello\r\nA\r\n0123456789\r\n0\r\nGrpc-Status: 0\r\nX-B: 2\r\n\r\nGET /next",
        )
        .unwrap();
        assert_eq!(data, b"hello0123456789");
        let trailers = trailers.unwrap();
        assert_eq!(trailers["grpc-status"], "0");
        assert_eq!(trailers["x-b"], "2");
        assert_eq!(rest, b"GET /next");

        let (data, trailers, rest) = decode_all(Framing::Chunked, b"0\r\n\r\nX").unwrap();
        assert!(data.is_empty() && trailers.is_none());
        assert_eq!(rest, b"X");
        let (data, _, rest) = decode_all(Framing::Length(3), b"abcdef").unwrap();
        assert_eq!(
            (data.as_slice(), rest.as_slice()),
            (&b"abc"[..], &b"def"[..])
        );
    }

    #[test]
    fn malformed_chunks_are_refused() {
        for bad in [
            &b"5\r\nhelloX\r\n0\r\n\r\n"[..],
            b"-5\r\nhello\r\n0\r\n\r\n",
            b" 5\r\nhello\r\n0\r\n\r\n",
            b"5 \r\nhello\r\n0\r\n\r\n",
            b"0x5\r\nhello\r\n0\r\n\r\n",
            b"\r\nhello\r\n0\r\n\r\n",
            b"fffffffffffffffff\r\n",
            b"5\nhello\r\n0\r\n\r\n",
            b"0\r\nbad trailer\r\n\r\n",
        ] {
            assert!(
                decode_all(Framing::Chunked, bad).is_err(),
                "{:?}",
                String::from_utf8_lossy(bad)
            );
        }
    }

    #[test]
    fn chunked_encoding_round_trips() {
        let mut out = Vec::new();
        for part in [&b"hello "[..], &[b'x'; 300]] {
            chunk_head(&mut out, part.len());
            out.extend_from_slice(part);
            out.extend_from_slice(b"\r\n");
        }
        chunked_end(&mut out, Some(&headers(&[("grpc-status", "0")])));
        let (data, trailers, rest) = decode_all(Framing::Chunked, &out).unwrap();
        assert_eq!(data.len(), 306);
        assert_eq!(trailers.unwrap()["grpc-status"], "0");
        assert!(rest.is_empty());
    }

    mod properties {
        use super::super::*;
        use proptest::prelude::*;

        proptest! {
            #![proptest_config(ProptestConfig::with_cases(256))]

            /// A chunked body split into reads at any points decodes to the same data,
            /// and the bytes after it are left untouched.
            #[test]
            fn a_chunked_body_decodes_the_same_however_it_arrives(
                chunks in prop::collection::vec(prop::collection::vec(any::<u8>(), 1..40), 0..6),
                cuts in prop::collection::vec(0usize..400, 0..8),
            ) {
                let mut wire = Vec::new();
                for c in &chunks {
                    chunk_head(&mut wire, c.len());
                    wire.extend_from_slice(c);
                    wire.extend_from_slice(b"\r\n");
                }
                chunked_end(&mut wire, None);
                wire.extend_from_slice(b"NEXT");
                let mut cuts: Vec<usize> = cuts.into_iter().map(|c| c % (wire.len() + 1)).collect();
                cuts.push(wire.len());
                cuts.sort_unstable();
                let mut d = Decoder::new(Framing::Chunked);
                let (mut buf, mut data, mut fed) = (Vec::new(), Vec::new(), 0);
                let mut ended = false;
                for cut in cuts {
                    buf.extend_from_slice(&wire[fed..cut.max(fed)]);
                    fed = cut.max(fed);
                    while let Some(piece) = d.decode(&mut buf).unwrap() {
                        match piece {
                            Decoded::Data(b) => data.extend_from_slice(&b),
                            Decoded::Trailers(_) => {}
                            Decoded::End => { ended = true; break; }
                        }
                    }
                    if ended { break; }
                }
                prop_assert!(ended);
                prop_assert_eq!(data, chunks.concat());
                buf.extend_from_slice(&wire[fed..]);
                prop_assert_eq!(buf, b"NEXT".to_vec());
            }
        }
    }
}
