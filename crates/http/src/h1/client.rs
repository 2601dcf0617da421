//! HTTP/1.1's client side: one response read from a byte stream with the codec the
//! server reads requests with ([`super::head`], [`super::framing`]), its body decoded to
//! the end and counted. The load generator reads its responses here. The proxy's upstream
//! exchange, which also streams a request body, passes response heads on as bytes and
//! pools connections, is `terminus-proxy`'s `http1`, on the same codec.

use std::fmt;
use std::io;

use http::{Method, StatusCode};
use tokio::io::{AsyncRead, AsyncReadExt};

use super::{keeps_alive, parse_response_head, response_framing, Decoder, Framing, Malformed};

/// The largest response head read: more than a server's request heads get
/// ([`super::MAX_HEAD`]), as a client takes what servers send (nginx's proxy buffers and
/// curl allow as much).
pub const MAX_RESPONSE_HEAD: usize = 64 * 1024;

/// A response read to its end.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Received {
    /// Its status (informational responses before it skipped).
    pub status: StatusCode,
    /// The connection can carry another request: both the version and `Connection` say
    /// so, and the body did not end with the connection.
    pub reusable: bool,
    /// The body's length, decoded.
    pub body: u64,
}

/// Why no whole response came.
#[derive(Debug)]
pub enum ReadError {
    /// Reading failed.
    Io(io::Error),
    /// The connection ended before the response did.
    Closed,
    /// The response is not HTTP/1.x as the codec reads it.
    Malformed(&'static str),
    /// The head did not end within [`MAX_RESPONSE_HEAD`] bytes.
    HeadTooLarge,
}

impl fmt::Display for ReadError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Io(e) => write!(f, "{e}"),
            Self::Closed => f.write_str("the connection closed before the end of the response"),
            Self::Malformed(why) => write!(f, "malformed response: {why}"),
            Self::HeadTooLarge => write!(f, "response head over {} KiB", MAX_RESPONSE_HEAD / 1024),
        }
    }
}

impl std::error::Error for ReadError {}

impl From<Malformed> for ReadError {
    fn from(Malformed(why): Malformed) -> Self {
        ReadError::Malformed(why)
    }
}

/// Reads the response to a `method` request from `stream`. `buf` is the connection's
/// read buffer: bytes already in it are read first, and what follows the response (none
/// when nothing is pipelined) is left in it.
pub async fn read_response<S: AsyncRead + Unpin>(
    stream: &mut S,
    buf: &mut Vec<u8>,
    method: &Method,
) -> Result<Received, ReadError> {
    let head = loop {
        match parse_response_head(buf)? {
            // 100 Continue and friends: the real response follows.
            Some(head) if head.status.is_informational() => continue,
            Some(head) => break head,
            None => {
                // Checked before each read, which brings at most the room left.
                let room = MAX_RESPONSE_HEAD.saturating_sub(buf.len());
                if room == 0 {
                    return Err(ReadError::HeadTooLarge);
                }
                if fill(stream, buf, room).await? == 0 {
                    return Err(ReadError::Closed);
                }
            }
        }
    };
    let framing = response_framing(method, head.status, &head.fields, head.version)?;
    let mut decoder = Decoder::new(framing);
    let mut body = 0u64;
    // The body is counted where it lies and dropped, never copied.
    while !decoder.is_done() {
        match decoder.skip(buf)? {
            Some(n) => body += n as u64,
            None => {
                if fill(stream, buf, READ_SIZE).await? == 0 {
                    decoder.at_eof().map_err(|_| ReadError::Closed)?;
                }
            }
        }
    }
    Ok(Received {
        status: head.status,
        reusable: framing != Framing::Close && keeps_alive(head.version, &head.fields),
        body,
    })
}

/// What a read of the body asks for at most.
const READ_SIZE: usize = 16 * 1024;

/// Reads at most `most` more bytes into `buf`; 0 at the end of the stream, which a TLS
/// peer that closes without close_notify also means (how servers end a body framed by
/// the close).
async fn fill<S: AsyncRead + Unpin>(
    stream: &mut S,
    buf: &mut Vec<u8>,
    most: usize,
) -> Result<usize, ReadError> {
    if buf.capacity() - buf.len() < 4096 {
        buf.reserve(READ_SIZE);
    }
    let mut limited = (&mut *stream).take(most as u64);
    match limited.read_buf(buf).await {
        Ok(n) => Ok(n),
        Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => Ok(0),
        Err(e) => Err(ReadError::Io(e)),
    }
}

#[cfg(test)]
mod tests {
    use tokio::io::AsyncWriteExt;

    use super::*;

    /// Reads `response`, sent a few bytes at a time, as the answer to `method`.
    async fn read(method: Method, response: &[u8]) -> Result<Received, ReadError> {
        let (mut client, mut server) = tokio::io::duplex(1 << 16);
        let response = response.to_vec();
        let sending = tokio::spawn(async move {
            for part in response.chunks(7) {
                server.write_all(part).await.unwrap();
            }
        });
        let mut buf = Vec::new();
        let r = read_response(&mut client, &mut buf, &method).await;
        sending.await.unwrap();
        r
    }

    fn received(status: u16, reusable: bool, body: u64) -> Received {
        let status = StatusCode::from_u16(status).unwrap();
        Received {
            status,
            reusable,
            body,
        }
    }

    #[tokio::test]
    async fn each_framing_is_read_to_its_end() {
        let r = read(
            Method::GET,
            b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello",
        )
        .await;
        assert_eq!(r.unwrap(), received(200, true, 5));
        let chunked = b"HTTP/1.1 404 Not Found\r\nTransfer-Encoding: chunked\r\n\r\n3;x=y\r\nabc\r\n10\r\n0123456789abcdef\r\n0\r\nT: v\r\n\r\n";
        assert_eq!(
            read(Method::GET, chunked).await.unwrap(),
            received(404, true, 19)
        );
        let close = b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\nuntil the end";
        assert_eq!(
            read(Method::GET, close).await.unwrap(),
            received(200, false, 13)
        );
        // No length on a keep-alive connection: the body ends with it all the same.
        let unframed = b"HTTP/1.1 200 OK\r\n\r\nuntil the end";
        assert_eq!(
            read(Method::GET, unframed).await.unwrap(),
            received(200, false, 13)
        );
        let continued = b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.0 304 Not Modified\r\n\r\n";
        assert_eq!(
            read(Method::GET, continued).await.unwrap(),
            received(304, false, 0)
        );
        let head = b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\n";
        assert_eq!(
            read(Method::HEAD, head).await.unwrap(),
            received(200, true, 0)
        );
    }

    /// A response whose head has a field of `len` bytes.
    fn with_field(len: usize) -> Vec<u8> {
        let mut response = b"HTTP/1.1 204 No Content\r\nX-Big: ".to_vec();
        response.resize(response.len() + len, b'a');
        response.extend_from_slice(b"\r\n\r\n");
        response
    }

    #[tokio::test]
    async fn a_head_is_taken_up_to_64_kib_and_no_further() {
        let big = with_field(40 * 1024);
        assert_eq!(
            read(Method::GET, &big).await.unwrap(),
            received(204, true, 0)
        );
        let too_big = with_field(MAX_RESPONSE_HEAD);
        assert!(matches!(
            read(Method::GET, &too_big).await,
            Err(ReadError::HeadTooLarge)
        ));
    }

    #[tokio::test]
    async fn short_and_malformed_responses_fail() {
        let short = b"HTTP/1.1 200 OK\r\nContent-Length: 50\r\n\r\nshort";
        assert!(matches!(
            read(Method::GET, short).await,
            Err(ReadError::Closed)
        ));
        let not_http = b"NOT HTTP\r\n\r\n";
        assert!(matches!(
            read(Method::GET, not_http).await,
            Err(ReadError::Malformed(_))
        ));
        let bad_length = b"HTTP/1.1 200 OK\r\nContent-Length: x\r\n\r\n";
        assert!(matches!(
            read(Method::GET, bad_length).await,
            Err(ReadError::Malformed(_))
        ));
        let headless = b"HTTP/1.1 200 OK\r\nContent-Le";
        assert!(matches!(
            read(Method::GET, headless).await,
            Err(ReadError::Closed)
        ));
    }
}
