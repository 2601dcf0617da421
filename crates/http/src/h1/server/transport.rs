//! What a connection's record layer must offer HTTP/1.1: a byte stream that can also send
//! a range of a file (sendfile(2) on kernel TLS, read-and-encrypt on rustls).

use std::fs::File;
use std::future::Future;
use std::io;
use std::os::unix::fs::FileExt;
use std::task::{Context, Poll};

use terminus_tls::{KtlsStream, SecureStream};
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt};

use super::FILE_CHUNK;
use crate::buffers::Lent;

/// A connection's byte stream, as responses are written to it, that can also send a range
/// of a file. Reading is the connection's (`AsyncRead` besides): while a request body is
/// still coming in, a response may be written to the write half alone.
pub trait Transport: AsyncWrite + Unpin {
    /// Sends `head` (the response head, or nothing) and then `len` (> 0) bytes of `file`
    /// from `offset`, in as few TLS records as they fit.
    fn send_file(
        &mut self,
        head: &[u8],
        file: &File,
        offset: u64,
        len: u64,
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
    ) -> io::Result<()> {
        KtlsStream::send_file(self, head, file, offset, len).await
    }
}

/// Waiting for a connection's next bytes without a buffer to read them into, so that a
/// connection between requests holds none: Ready once a read would not wait.
pub trait ReadReady: AsyncRead + Unpin {
    /// Ready once bytes can be read (or the stream ended or failed), without reading.
    fn poll_read_ready(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>>;
}

impl ReadReady for Box<SecureStream> {
    fn poll_read_ready(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        SecureStream::poll_read_ready(self, cx)
    }
}

impl ReadReady for KtlsStream {
    fn poll_read_ready(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        KtlsStream::poll_read_ready(self, cx)
    }
}

impl ReadReady for tokio::net::TcpStream {
    fn poll_read_ready(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        tokio::net::TcpStream::poll_read_ready(self, cx)
    }
}

/// Tests' pipes have no readiness of their own: a read is tried at once.
#[cfg(test)]
impl ReadReady for tokio::io::DuplexStream {
    fn poll_read_ready(&mut self, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}

/// A record layer that sends a file by reading it into a buffer the worker lends for the
/// response ([`Lent`]) and writing the bytes: terminus's record layer in userspace, which
/// packs head and body into full records
/// (and, in tests, a plain pipe).
pub trait CopiesFiles: AsyncWrite + Unpin {}

impl CopiesFiles for Box<SecureStream> {}

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
    ) -> io::Result<()> {
        self.write_all(head).await?;
        let mut chunk = Lent::of(FILE_CHUNK);
        let end = offset + len;
        while offset < end {
            let want = ((end - offset) as usize).min(FILE_CHUNK);
            let n = file.read_at(&mut chunk[..want], offset)?;
            if n == 0 {
                return Err(truncated());
            }
            self.write_all(&chunk[..n]).await?;
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
