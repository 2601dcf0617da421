//! Bytes both ways between a client and an upstream through terminus's memory: what an
//! upgraded connection (WebSocket) and a stream over userspace TLS both are. It runs until
//! both directions have ended (each end passed on as a shutdown) or nothing has moved
//! either way for the idle timeout, and counts what moved even when it ends badly.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use terminus_tls::Activity;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt, ReadBuf};

/// Relays between `client` and `upstream`. Returns the bytes moved (to the upstream, to
/// the client) and how the relay ended.
pub async fn relay<C, U>(client: C, upstream: U, idle: Duration) -> (u64, u64, io::Result<()>)
where
    C: AsyncRead + AsyncWrite + Unpin,
    U: AsyncRead + AsyncWrite + Unpin,
{
    let moved = Activity::default();
    let (cr, mut cw) = tokio::io::split(client);
    let (ur, mut uw) = tokio::io::split(upstream);
    let mut cr = Watched {
        inner: cr,
        moved: &|n| moved.up(n),
    };
    let mut ur = Watched {
        inner: ur,
        moved: &|n| moved.down(n),
    };
    let up = async {
        tokio::io::copy(&mut cr, &mut uw).await?;
        uw.shutdown().await
    };
    let down = async {
        tokio::io::copy(&mut ur, &mut cw).await?;
        cw.shutdown().await
    };
    let ended = moved
        .until_quiet(async { tokio::try_join!(up, down) }, idle)
        .await;
    let (up, down) = moved.moved();
    (up, down, ended.map(|_| ()))
}

/// A reader that tells `moved` what it read.
struct Watched<'a, R> {
    inner: R,
    moved: &'a dyn Fn(usize),
}

impl<R: AsyncRead + Unpin> AsyncRead for Watched<'_, R> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let polled = Pin::new(&mut self.inner).poll_read(cx, buf);
        let read = buf.filled().len() - before;
        if read > 0 {
            (self.moved)(read);
        }
        polled
    }
}
