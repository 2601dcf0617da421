//! What a connection's record layer must offer HTTP/1.1: a byte stream that can also send
//! a range of a file (sendfile(2) on kernel TLS, read-and-encrypt on rustls).

use std::fs::File;
use std::future::Future;
use std::io;
use std::os::unix::fs::FileExt;

use terminus_tls::{KtlsStream, TlsStream};
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt};

use super::FILE_CHUNK;

/// A connection's byte stream that can also send a range of a file.
pub(crate) trait Transport: AsyncRead + AsyncWrite + Unpin {
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

impl Transport for TlsStream {
    /// Reads into the connection's one buffer and lets rustls encrypt from it; the
    /// stream packs head and body into full records.
    async fn send_file(
        &mut self,
        head: &[u8],
        file: &File,
        offset: u64,
        len: u64,
        scratch: &mut Vec<u8>,
    ) -> io::Result<()> {
        copy_file(self, head, file, offset, len, scratch).await
    }
}

/// A plain byte stream, for testing the connection code without TLS.
#[cfg(test)]
impl Transport for tokio::io::DuplexStream {
    async fn send_file(
        &mut self,
        head: &[u8],
        file: &File,
        offset: u64,
        len: u64,
        scratch: &mut Vec<u8>,
    ) -> io::Result<()> {
        copy_file(self, head, file, offset, len, scratch).await
    }
}

/// Writes `head`, then `len` bytes of `file` from `offset` read through `scratch`.
async fn copy_file<W: AsyncWrite + Unpin>(
    io: &mut W,
    head: &[u8],
    file: &File,
    mut offset: u64,
    len: u64,
    scratch: &mut Vec<u8>,
) -> io::Result<()> {
    io.write_all(head).await?;
    scratch.resize(FILE_CHUNK, 0);
    let end = offset + len;
    while offset < end {
        let want = ((end - offset) as usize).min(FILE_CHUNK);
        let n = file.read_at(&mut scratch[..want], offset)?;
        if n == 0 {
            return Err(truncated());
        }
        io.write_all(&scratch[..n]).await?;
        offset += n as u64;
    }
    Ok(())
}

fn truncated() -> io::Error {
    io::Error::new(
        io::ErrorKind::UnexpectedEof,
        "file truncated while being sent",
    )
}
