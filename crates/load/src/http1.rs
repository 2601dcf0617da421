//! A minimal HTTP/1.1 client exchange: one GET written in one go, the response read with
//! httparse and its body (Content-Length, chunked, or up to close) read and dropped.

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

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

const MAX_HEADER: usize = 64 * 1024;

/// Writes `request` and reads one response. `buf` is the connection's read buffer; bytes
/// past the response (none, as nothing is pipelined) are discarded.
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
    let mut need_more = true;
    let (status, framing, keep_alive, header_len) = loop {
        if need_more {
            fill_more(stream, buf).await?;
        }
        need_more = true;
        let mut headers = [httparse::EMPTY_HEADER; 64];
        let mut parsed = httparse::Response::new(&mut headers);
        match parsed.parse(buf) {
            Ok(httparse::Status::Complete(len)) => {
                let status = parsed.code.unwrap_or(0);
                if (100..200).contains(&status) {
                    // 100 Continue and friends: skip and read the real response,
                    // which may be in the buffer already.
                    buf.drain(..len);
                    need_more = buf.is_empty();
                    continue;
                }
                let (framing, keep_alive) = framing(&parsed)?;
                break (status, framing, keep_alive, len);
            }
            Ok(httparse::Status::Partial) if buf.len() < MAX_HEADER => continue,
            Ok(httparse::Status::Partial) => {
                return Err(Failure::Protocol("response header over 64 KiB".into()))
            }
            Err(e) => return Err(Failure::Protocol(format!("bad response header: {e}"))),
        }
    };
    buf.drain(..header_len);
    match framing {
        Framing::Length(n) => {
            let mut left = n.saturating_sub(buf.len() as u64);
            buf.clear();
            while left > 0 {
                let got = fill_more(stream, buf).await?;
                left = left.saturating_sub(got as u64);
                buf.clear();
            }
        }
        Framing::Chunked => read_chunked(stream, buf).await?,
        Framing::UntilClose => {
            // Read to EOF; a missing close_notify is how such servers end, not an error.
            loop {
                buf.clear();
                match fill(stream, buf).await {
                    Ok(0) => break,
                    Ok(_) => {}
                    Err(Failure::Io(e)) if e.kind() == std::io::ErrorKind::UnexpectedEof => break,
                    Err(e) => return Err(e),
                }
            }
        }
    }
    buf.clear();
    Ok(Response {
        status,
        reusable: keep_alive && framing != Framing::UntilClose,
    })
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Framing {
    Length(u64),
    Chunked,
    UntilClose,
}

fn framing(resp: &httparse::Response<'_, '_>) -> Result<(Framing, bool), Failure> {
    let mut framing = Framing::UntilClose;
    let mut keep_alive = resp.version == Some(1);
    for h in resp.headers.iter() {
        if h.name.eq_ignore_ascii_case("content-length") {
            let n = std::str::from_utf8(h.value)
                .ok()
                .and_then(|v| v.trim().parse().ok())
                .ok_or_else(|| Failure::Protocol("bad Content-Length".into()))?;
            if framing != Framing::Chunked {
                framing = Framing::Length(n);
            }
        } else if h.name.eq_ignore_ascii_case("transfer-encoding") {
            if h.value.to_ascii_lowercase().ends_with(b"chunked") {
                framing = Framing::Chunked;
            }
        } else if h.name.eq_ignore_ascii_case("connection") {
            let v = h.value.to_ascii_lowercase();
            if v.windows(5).any(|w| w == b"close") {
                keep_alive = false;
            } else if v.windows(10).any(|w| w == b"keep-alive") {
                keep_alive = true;
            }
        }
    }
    let status = resp.code.unwrap_or(0);
    if status == 204 || status == 304 {
        framing = Framing::Length(0);
    }
    Ok((framing, keep_alive))
}

/// Reads more bytes into `buf`; 0 at EOF.
async fn fill<S: AsyncRead + Unpin>(stream: &mut S, buf: &mut Vec<u8>) -> Result<usize, Failure> {
    if buf.capacity() - buf.len() < 4096 {
        buf.reserve(16 * 1024);
    }
    stream.read_buf(buf).await.map_err(Failure::Io)
}

/// Like [`fill`], where the response is not complete yet: end-of-file is an error.
async fn fill_more<S: AsyncRead + Unpin>(
    stream: &mut S,
    buf: &mut Vec<u8>,
) -> Result<usize, Failure> {
    match fill(stream, buf).await? {
        0 => Err(Failure::Io(std::io::ErrorKind::UnexpectedEof.into())),
        n => Ok(n),
    }
}

async fn read_chunked<S: AsyncRead + Unpin>(
    stream: &mut S,
    buf: &mut Vec<u8>,
) -> Result<(), Failure> {
    loop {
        // Chunk-size line.
        let line_end = loop {
            if let Some(i) = buf.windows(2).position(|w| w == b"\r\n") {
                break i;
            }
            if buf.len() > 1024 {
                return Err(Failure::Protocol("chunk size line too long".into()));
            }
            fill_more(stream, buf).await?;
        };
        let size_text = std::str::from_utf8(&buf[..line_end])
            .ok()
            .map(|l| l.split(';').next().unwrap_or("").trim().to_owned())
            .ok_or_else(|| Failure::Protocol("bad chunk size".into()))?;
        let size = u64::from_str_radix(&size_text, 16)
            .map_err(|_| Failure::Protocol(format!("bad chunk size {size_text:?}")))?;
        buf.drain(..line_end + 2);
        if size == 0 {
            // Trailers until an empty line.
            loop {
                if let Some(i) = buf.windows(2).position(|w| w == b"\r\n") {
                    let empty = i == 0;
                    buf.drain(..i + 2);
                    if empty {
                        return Ok(());
                    }
                    continue;
                }
                fill_more(stream, buf).await?;
            }
        }
        // Chunk data and its CRLF.
        let mut left = size + 2;
        loop {
            let take = left.min(buf.len() as u64) as usize;
            buf.drain(..take);
            left -= take as u64;
            if left == 0 {
                break;
            }
            fill_more(stream, buf).await?;
        }
    }
}

#[cfg(test)]
mod tests {
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
