//! A minimal HTTP/1.1 client exchange: one GET written in one go, the response read by
//! `terminus-http`'s client side and its body (Content-Length, chunked, or up to close)
//! read and dropped.

use hyper::Method;
use terminus_http::h1::client::{self, ReadError};
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt};

use crate::failure::Failure;

/// The request bytes, built once per run.
pub fn request(authority: &str, path: &str, close: bool) -> Vec<u8> {
    let connection = if close { "close" } else { "keep-alive" };
    format!(
        "GET {path} HTTP/1.1\r\nHost: {authority}\r\nUser-Agent: terminus-load\r\nAccept: */*\r\nConnection: {connection}\r\n\r\n"
    )
    .into_bytes()
}

/// A response read to its end.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Response {
    pub status: u16,
    /// The connection can carry another request.
    pub reusable: bool,
}

/// Writes `request` and reads one response with terminus's own HTTP/1.1 client side
/// (`terminus_http::h1::client`, on the codec the server reads requests with). `buf` is
/// the connection's read buffer; bytes past the response (none, as nothing is pipelined)
/// are discarded.
pub async fn exchange<S>(
    stream: &mut S,
    request: &[u8],
    buf: &mut Vec<u8>,
) -> Result<Response, Failure>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    stream.write_all(request).await.map_err(Failure::Io)?;
    stream.flush().await.map_err(Failure::Io)?;
    buf.clear();
    let received = client::read_response(stream, buf, &Method::GET)
        .await
        .map_err(|e| match e {
            ReadError::Io(e) => Failure::Io(e),
            ReadError::Closed => Failure::Io(std::io::ErrorKind::UnexpectedEof.into()),
            e @ (ReadError::Malformed(_) | ReadError::HeadTooLarge) => {
                Failure::Protocol(e.to_string())
            }
        })?;
    buf.clear();
    Ok(Response {
        status: received.status.as_u16(),
        reusable: received.reusable,
    })
}

#[cfg(test)]
mod tests {
    use tokio::io::AsyncReadExt;

    use super::*;

    async fn run(response: &[u8]) -> Result<Response, Failure> {
        let (mut client, mut server) = tokio::io::duplex(1 << 16);
        let response = response.to_vec();
        let server = tokio::spawn(async move {
            let mut req = vec![0u8; 4096];
            let n = server.read(&mut req).await.unwrap();
            assert!(req[..n].starts_with(b"GET /x HTTP/1.1\r\nHost: h:1\r\n"));
            // Dribble the response a few bytes at a time.
            for part in response.chunks(7) {
                server.write_all(part).await.unwrap();
            }
        });
        let mut buf = Vec::new();
        let r = exchange(&mut client, &request("h:1", "/x", false), &mut buf).await;
        server.await.unwrap();
        r
    }

    #[tokio::test]
    async fn reads_each_framing() {
        let r = run(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello")
            .await
            .unwrap();
        assert_eq!(
            r,
            Response {
                status: 200,
                reusable: true
            }
        );
        let r = run(b"HTTP/1.1 404 Not Found\r\nTransfer-Encoding: chunked\r\n\r\n3;x=y\r\nabc\r\n10\r\n0123456789abcdef\r\n0\r\nT: v\r\n\r\n")
            .await
            .unwrap();
        assert_eq!(
            r,
            Response {
                status: 404,
                reusable: true
            }
        );
        let r = run(b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\nuntil the end")
            .await
            .unwrap();
        assert_eq!(
            r,
            Response {
                status: 200,
                reusable: false
            }
        );
        let r = run(b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.0 304 Not Modified\r\n\r\n")
            .await
            .unwrap();
        assert_eq!(
            r,
            Response {
                status: 304,
                reusable: false
            }
        );
    }

    #[tokio::test]
    async fn short_and_bad_responses_fail() {
        let e = run(b"HTTP/1.1 200 OK\r\nContent-Length: 50\r\n\r\nshort")
            .await
            .unwrap_err();
        assert_eq!(e.kind(), "closed");
        let e = run(b"NOT HTTP\r\n\r\n").await.unwrap_err();
        assert_eq!(e.kind(), "http_protocol");
        let e = run(b"HTTP/1.1 200 OK\r\nContent-Length: x\r\n\r\n")
            .await
            .unwrap_err();
        assert_eq!(e.kind(), "http_protocol");
    }
}
