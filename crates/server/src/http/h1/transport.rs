//! What a connection's record layer must offer HTTP/1.1: a byte stream that can also send
//! a range of a file (sendfile(2) on kernel TLS, read-and-encrypt on rustls).

use std::fs::File;
use std::future::Future;
use std::io;
use std::os::unix::fs::FileExt;

use terminus_tls::{KtlsStream, TlsStream};
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt};

use super::FILE_CHUNK;

/// A connection's byte stream, as responses are written to it, that can also send a range
/// of a file. Reading is the connection's (`AsyncRead` besides): while a request body is
/// still coming in, a response may be written to the write half alone.
pub(crate) trait Transport: AsyncWrite + Unpin {
    /// Sends `head` (the response head, or nothing) and then `len` (> 0) bytes of `file`
    /// from `offset`, in as few TLS records as they fit; `scratch` is the connection's
    /// buffer.
    fn send_file(
        &mut self,
        head: &[u8],
        file: &File,
        offset: u64,
        len: u64,
        scratch: &mut Vec<u8>,
    ) -> impl Future<Output = io::Result<()>>;
}

impl Transport for KtlsStream {
    /// sendfile(2): the kernel reads the page cache and encrypts; no user-space copy.
    async fn send_file(
        &mut self,
        head: &[u8],
        file: &File,
        offset: u64,
        len: u64,
        _scratch: &mut Vec<u8>,
    ) -> io::Result<()> {
        KtlsStream::send_file(self, head, file, offset, len).await
    }
}

/// A record layer that sends a file by reading it into the connection's buffer and
/// writing the bytes: rustls in userspace, which packs head and body into full records
/// (and, in tests, a plain pipe).
pub(crate) trait CopiesFiles: AsyncWrite + Unpin {}

impl CopiesFiles for TlsStream {}

/// A plain-HTTP listener's connection: no record layer.
impl CopiesFiles for tokio::net::TcpStream {}

/// The write half of a connection still reading a request body (full duplex).
impl<T: AsyncRead + AsyncWrite> CopiesFiles for tokio::io::WriteHalf<T> {}

#[cfg(test)]
impl CopiesFiles for tokio::io::DuplexStream {}

impl<T: CopiesFiles> Transport for T {
    async fn send_file(
        &mut self,
        head: &[u8],
        file: &File,
        mut offset: u64,
        len: u64,
        scratch: &mut Vec<u8>,
    ) -> io::Result<()> {
        self.write_all(head).await?;
        scratch.resize(FILE_CHUNK, 0);
        let end = offset + len;
        while offset < end {
            let want = ((end - offset) as usize).min(FILE_CHUNK);
            let n = file.read_at(&mut scratch[..want], offset)?;
            if n == 0 {
                return Err(truncated());
            }
            self.write_all(&scratch[..n]).await?;
            offset += n as u64;
        }
        Ok(())
    }
}

fn truncated() -> io::Error {
    io::Error::new(
        io::ErrorKind::UnexpectedEof,
        "file truncated while being sent",
    )
}
