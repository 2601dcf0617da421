//! The server's userspace TLS stream: terminus's own [`RecordLayer`] over a TCP socket,
//! as a tokio stream, where the kernel does not take the record layer over.
//!
//! It replaces rustls's buffered connection on the server's data path so that an idle
//! connection holds no buffer: between requests a `SecureStream` holds its keys,
//! sequence numbers and socket, nothing on the heap. A read takes a buffer from the
//! thread's [`crate::pool`] once the socket is readable and gives it back when a read ends
//! at a record boundary with all plaintext read (see `read.rs`); a response is copied once
//! into a pool buffer laid out for sealing in place and given back once sent (see
//! `write.rs`).
//!
//! Writes are coalesced into full records, as [`crate::TlsStream`] does (nginx's
//! `ssl_buffer_size 16k`): plaintext waits until a full 16 KiB record can be sealed or
//! the caller flushes, and a flush seals what is left as one record, so that a response
//! head written before its body leaves in one record with it.
//!
//! A KeyUpdate from the client asking for ours is answered as soon as it is read, even
//! while the application only reads: a client may wait for the answer before it sends
//! the rest of a request. A record the layer refuses has its alert sent (best effort)
//! and the read fails with `InvalidData`.

mod read;
#[cfg(test)]
mod tests;
mod write;

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};

use rustls::server::ServerConnectionData;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;

use crate::record::{Opened, RecordError, RecordLayer};
use crate::stream::{SendMethod, TrafficCounters};
use read::Inbound;
use write::Outbound;

/// A TLS connection after its handshake, its records sealed and opened by terminus.
pub struct SecureStream {
    io: TcpStream,
    layer: RecordLayer<ServerConnectionData>,
    inbound: Inbound,
    outbound: Outbound,
    counters: Arc<TrafficCounters>,
    /// The socket returned end-of-file.
    io_eof: bool,
    /// The peer closed: close_notify, or the socket's end at a record boundary.
    read_closed: bool,
    /// Why reading failed, said again at every read.
    failed: Option<RecordError>,
}

impl SecureStream {
    /// Takes over after the handshake: `layer` is built from what rustls handed over, and
    /// `pending` is what the handshake read past its end (whole records, maybe the head
    /// of one), opened before the socket is read.
    pub fn new(
        io: TcpStream,
        layer: RecordLayer<ServerConnectionData>,
        pending: Vec<u8>,
        counters: Arc<TrafficCounters>,
    ) -> io::Result<Self> {
        Ok(Self {
            io,
            layer,
            inbound: Inbound::new(pending),
            outbound: Outbound::default(),
            counters,
            io_eof: false,
            read_closed: false,
            failed: None,
        })
    }

    /// Takes over from a completed handshake, in userspace.
    pub fn after(
        io: TcpStream,
        done: crate::Handshake,
        counters: Arc<TrafficCounters>,
    ) -> io::Result<Self> {
        let layer = RecordLayer::new(done.secrets, done.kernel)?;
        Self::new(io, layer, done.pending, counters)
    }

    /// The record layer (version, suite, sequence numbers).
    pub fn record_layer(&self) -> &RecordLayer<ServerConnectionData> {
        &self.layer
    }

    /// The socket.
    pub fn get_ref(&self) -> &TcpStream {
        &self.io
    }

    /// Whether the stream holds a buffer: none while idle, between requests.
    pub fn holds_buffers(&self) -> bool {
        self.inbound.holds_buffer() || self.outbound.holds_buffer()
    }

    /// Ready once a read would not wait: plaintext is decrypted and unread, or the stream
    /// has ended (or failed). Records are opened meanwhile, so a caller can wait for the
    /// next request without a buffer of its own to read it into.
    pub fn poll_read_ready(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        loop {
            if let Some(e) = &self.failed {
                return Poll::Ready(Err(e.clone().into()));
            }
            if !self.inbound.plaintext().is_empty() || self.read_closed {
                return Poll::Ready(Ok(()));
            }
            if self.outbound.has_unsent() {
                ready_or_pending(self.outbound.poll_send(&mut self.io, cx, &self.counters))?;
            }
            match self.inbound.open_next(&mut self.layer) {
                Ok(Some(Opened::Data(_))) => {}
                Ok(Some(Opened::Control)) => ready_or_pending(self.send_control(cx))?,
                Ok(Some(Opened::Closed)) => self.read_closed = true,
                Ok(None) => ready!(self.poll_fill(cx))?,
                Err(e) => return Poll::Ready(Err(self.refused(cx, e))),
            }
        }
    }

    /// Reads from the socket into the inbound buffer (taken only once bytes are there).
    fn poll_fill(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        if self.io_eof {
            // A record cut short is a truncation, said at every read (not an end).
            if self.inbound.has_partial() {
                return Poll::Ready(Err(io::ErrorKind::UnexpectedEof.into()));
            }
            self.read_closed = true;
            return Poll::Ready(Ok(()));
        }
        if self.io.poll_read_ready(cx).is_pending() {
            // Waiting: a buffer with nothing in it goes back meanwhile.
            self.inbound.release_if_done();
            return Poll::Pending;
        }
        // Through tokio's poll_read rather than try_read: a read that leaves room in the
        // buffer drained the socket (edge-triggered epoll), so tokio forgets the
        // readiness and the next wait goes to epoll instead of a read that would only
        // say EAGAIN: one system call fewer per request.
        let mut room = ReadBuf::new(self.inbound.room());
        let polled = Pin::new(&mut self.io).poll_read(cx, &mut room);
        let n = room.filled().len();
        match polled {
            Poll::Ready(Ok(())) if n == 0 => self.io_eof = true,
            Poll::Ready(Ok(())) => {
                self.counters.add_in(n);
                self.inbound.filled(n);
            }
            Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
            Poll::Pending => {
                self.inbound.release_if_done();
                return Poll::Pending;
            }
        }
        self.inbound.release_if_done();
        Poll::Ready(Ok(()))
    }

    /// Sends the control records the layer queued (a KeyUpdate's answer) now; what the
    /// socket does not take leaves with the next write or read.
    fn send_control(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.outbound.take_control(&mut self.layer);
        self.outbound.poll_send(&mut self.io, cx, &self.counters)
    }

    /// A refusal: its alert sent (best effort), the error kept for later reads.
    fn refused(&mut self, cx: &mut Context<'_>, e: RecordError) -> io::Error {
        let _ = self.send_control(cx);
        self.failed = Some(e.clone());
        e.into()
    }

    /// Seals what was written since the last flush and sends everything queued.
    fn poll_send_all(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.outbound.seal(&mut self.layer)?;
        self.outbound.poll_send(&mut self.io, cx, &self.counters)
    }

    fn poll_write_coalesced(
        &mut self,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        // Taken now, such bytes would be dropped at the next seal without a word.
        if let Some(e) = &self.failed {
            return Poll::Ready(Err(e.clone().into()));
        }
        if self.layer.close_notify_sent() {
            return Poll::Ready(Err(RecordError::Closed.into()));
        }
        self.outbound.take_control(&mut self.layer);
        if self.outbound.is_full() {
            ready!(self.outbound.poll_send(&mut self.io, cx, &self.counters))?;
        }
        let taken = self.outbound.write(&mut self.layer, bufs)?;
        self.counters.sent(SendMethod::Userspace, taken);
        if self.outbound.is_full() {
            // Start sending; what the socket does not take now goes at the next call.
            if let Poll::Ready(Err(e)) = self.outbound.poll_send(&mut self.io, cx, &self.counters) {
                return Poll::Ready(Err(e));
            }
        }
        Poll::Ready(Ok(taken))
    }
}

/// Control records go out when the socket takes them: waiting for it must not hold up
/// the read (the next write or read sends the rest).
fn ready_or_pending(poll: Poll<io::Result<()>>) -> io::Result<()> {
    match poll {
        Poll::Ready(r) => r,
        Poll::Pending => Ok(()),
    }
}

impl AsyncRead for SecureStream {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = &mut *self;
        if buf.remaining() == 0 {
            return Poll::Ready(Ok(()));
        }
        ready!(this.poll_read_ready(cx))?;
        let plaintext = this.inbound.plaintext();
        let n = plaintext.len().min(buf.remaining());
        buf.put_slice(&plaintext[..n]);
        this.inbound.consume(n);
        Poll::Ready(Ok(()))
    }
}

impl AsyncWrite for SecureStream {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        self.poll_write_coalesced(cx, &[io::IoSlice::new(buf)])
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        self.poll_write_coalesced(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        true
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = &mut *self;
        ready!(this.poll_send_all(cx))?;
        Pin::new(&mut this.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = &mut *self;
        if !this.layer.close_notify_sent() && this.failed.is_none() {
            this.outbound.seal(&mut this.layer)?;
            this.layer.seal_close_notify()?;
            this.outbound.take_control(&mut this.layer);
        }
        ready!(this.outbound.poll_send(&mut this.io, cx, &this.counters))?;
        Pin::new(&mut this.io).poll_shutdown(cx)
    }
}
