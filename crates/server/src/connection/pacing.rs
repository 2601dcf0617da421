//! SCU pacing: the writes of a tenant with a bulk quota (`capacity = { scu = MBPS }`)
//! go out no faster than it, over all its connections, whichever layer encrypts them.
//!
//! What costs symmetric crypto is what is sent, so pacing the writes paces the
//! encryption on either record layer: rustls seals what it is given, the kernel what
//! `write` and `sendfile` hand it. A write waits for the tenant's meter (a timer, never a
//! blocked worker) and is charged the bytes it wrote; a file is sent in slices the same
//! way, so a large sendfile cannot take a burst beyond the quota. Connections of tenants
//! without an SCU quota are not wrapped at all.

use std::fs::File;
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};
use std::time::Instant;

use terminus_admission::tenant::TenantAccount;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::time::Sleep;

use terminus_http::{ReadReady, Transport};

/// The most one write or file slice takes at once: small enough that the meter's burst
/// (a tenth of a second at the quota) is not overrun by much at low rates.
const SLICE: usize = 16 * 1024;

/// A record layer whose writes are paced to its tenant's SCU quota.
pub(crate) struct Paced<S> {
    inner: S,
    tenant: Arc<TenantAccount>,
    sleep: Option<Pin<Box<Sleep>>>,
}

impl<S> Paced<S> {
    pub(crate) fn new(inner: S, tenant: Arc<TenantAccount>) -> Self {
        Self {
            inner,
            tenant,
            sleep: None,
        }
    }

    /// Ready once the tenant's meter lets a write go.
    fn poll_quota(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        loop {
            if let Some(sleep) = &mut self.sleep {
                ready!(sleep.as_mut().poll(cx));
                self.sleep = None;
            }
            let wait = self.tenant.scu_wait(Instant::now());
            if wait.is_zero() {
                return Poll::Ready(());
            }
            self.sleep = Some(Box::pin(tokio::time::sleep(wait)));
        }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Paced<S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_read(cx, buf)
    }
}

impl<S: ReadReady> ReadReady for Paced<S> {
    fn poll_read_ready(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.inner.poll_read_ready(cx)
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Paced<S> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        ready!(this.poll_quota(cx));
        let want = buf.len().min(SLICE);
        let n = ready!(Pin::new(&mut this.inner).poll_write(cx, &buf[..want]))?;
        this.tenant.scu_sent(Instant::now(), n);
        Poll::Ready(Ok(n))
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }
}

impl<S: Transport> Transport for Paced<S> {
    async fn send_file(
        &mut self,
        head: &[u8],
        file: &File,
        mut offset: u64,
        len: u64,
    ) -> io::Result<()> {
        self.write_all(head).await?;
        let end = offset + len;
        while offset < end {
            std::future::poll_fn(|cx| self.poll_quota(cx)).await;
            let slice = (end - offset).min(SLICE as u64);
            self.inner.send_file(&[], file, offset, slice).await?;
            self.tenant.scu_sent(Instant::now(), slice as usize);
            offset += slice;
        }
        Ok(())
    }
}
