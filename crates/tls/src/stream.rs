//! A rustls connection over a TCP socket as a tokio stream: `terminus load`'s client
//! connections (the server's own userspace TLS is [`crate::SecureStream`], on terminus's
//! record layer). Generic over the rustls side, so tests can run a server end too.
//!
//! Writes are coalesced into full records, as nginx's `ssl_buffer_size 16k` does: rustls
//! seals every `write` call as records of its own, so a response head written before its
//! body would leave as two records (two seals, two record headers, often two segments),
//! and a strict client expecting one record per small response would stumble. Plaintext
//! waits here until a full 16 KiB record can be sealed or the caller flushes; a flush
//! seals what is left as one record. Full records are sealed straight from the caller's
//! buffers (rustls fragments a vectored write across its slices), so only the tail of a
//! write shorter than a record is copied.

use std::io::{self, BufRead, Read, Write};
use std::ops::DerefMut;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};

use rustls::{ConnectionCommon, ServerConnection, SideData};
use terminus_metrics::{label_values, Counter, Exposition, Labelled, Labels, Render};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;

/// How response bytes left the process.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SendMethod {
    /// Encrypted by rustls, written by us.
    Userspace,
    /// Written in plaintext to a kernel TLS socket.
    KernelTls,
    /// sendfile(2) to a kernel TLS socket.
    Sendfile,
    /// splice(2) to a kernel TLS socket.
    Splice,
}

impl SendMethod {
    /// Every method, in metrics order.
    pub const ALL: [SendMethod; 4] = [
        Self::Userspace,
        Self::KernelTls,
        Self::Sendfile,
        Self::Splice,
    ];

    /// The method's name in the `method` label.
    pub fn name(self) -> &'static str {
        match self {
            Self::Userspace => "userspace",
            Self::KernelTls => "ktls_write",
            Self::Sendfile => "sendfile",
            Self::Splice => "splice",
        }
    }
}

/// Bytes moved, shared by all connections of the process.
#[derive(Debug)]
pub struct TrafficCounters {
    /// TLS bytes read from client sockets by rustls (kernel TLS reads are not counted:
    /// the kernel hides the record overhead).
    bytes_in: Counter,
    /// TLS bytes written to client sockets by rustls.
    bytes_out: Counter,
    /// Application bytes sent, by [`SendMethod`].
    plaintext_sent: Labelled<4>,
    /// Kernel TLS connections closed because the client sent a KeyUpdate.
    key_update_closes: Counter,
}

impl Default for TrafficCounters {
    fn default() -> Self {
        Self {
            bytes_in: Counter::new(
                "terminus_bytes_received_total",
                "Bytes read from client sockets.",
            ),
            bytes_out: Counter::new(
                "terminus_bytes_sent_total",
                "Bytes written to client sockets.",
            ),
            plaintext_sent: Labelled::counter(
                "terminus_response_bytes_total",
                "Application bytes sent to clients, by how: rustls (userspace), write/sendfile/splice to a kernel TLS socket.",
                label_values("method", SendMethod::ALL.map(SendMethod::name), &Labels::NONE),
            ),
            key_update_closes: Counter::new(
                "terminus_ktls_key_update_closes_total",
                "Kernel TLS connections closed cleanly after a client KeyUpdate the kernel cannot follow.",
            ),
        }
    }
}

impl TrafficCounters {
    /// Counts `n` bytes sent by `method`.
    pub fn sent(&self, method: SendMethod, n: usize) {
        self.plaintext_sent.add(method as usize, n as i64);
    }

    /// Bytes sent by `method` so far.
    pub fn sent_by(&self, method: SendMethod) -> u64 {
        self.plaintext_sent.get(method as usize) as u64
    }

    /// Counts `n` bytes received.
    pub fn add_in(&self, n: usize) {
        self.bytes_in.add(n as u64);
    }

    /// Counts `n` bytes sent.
    pub fn add_out(&self, n: usize) {
        self.bytes_out.add(n as u64);
    }

    /// Counts a connection closed because its keys would wrap (KeyUpdate limit).
    pub fn key_update_closed(&self) {
        self.key_update_closes.inc();
    }
}

impl Render for TrafficCounters {
    fn render(&self, out: &mut Exposition) {
        self.bytes_in.render(out);
        self.bytes_out.render(out);
        self.key_update_closes.render(out);
        self.plaintext_sent.render(out);
    }
}

/// Largest TLS plaintext record (rustls's default fragment size).
const RECORD: usize = 16 * 1024;
/// Records sealed at once, and then only when the earlier ones have left: what rustls
/// holds for a connection stays below this many records.
const SEAL_AHEAD: usize = 4;

/// A TLS connection after its handshake: a [`ServerConnection`] by default, or a rustls
/// client connection.
pub struct TlsStream<C = ServerConnection> {
    io: TcpStream,
    conn: C,
    /// Plaintext accepted but not yet sealed: always less than one record.
    unsealed: Vec<u8>,
    counters: Arc<TrafficCounters>,
    /// The socket returned end-of-file.
    io_eof: bool,
    close_notify_sent: bool,
}

impl<C, D> TlsStream<C>
where
    C: DerefMut<Target = ConnectionCommon<D>> + Unpin,
    D: SideData,
{
    /// `pending`: the head of a record received with the handshake that rustls has not
    /// seen yet ([`crate::Handshake::pending`]).
    pub fn new(
        io: TcpStream,
        mut conn: C,
        pending: &[u8],
        counters: Arc<TrafficCounters>,
    ) -> io::Result<Self> {
        // Bounded by SEAL_AHEAD instead: rustls's own limit could accept part of a record.
        conn.set_buffer_limit(None);
        let mut rest = pending;
        while !rest.is_empty() {
            if conn.read_tls(&mut rest)? == 0 {
                return Err(io::Error::other("rustls refused the rest of a record"));
            }
        }
        Ok(Self {
            io,
            conn,
            unsealed: Vec::new(),
            counters,
            io_eof: false,
            close_notify_sent: false,
        })
    }

    /// Reads TLS records from the socket into rustls and processes them.
    fn poll_fill(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let mut reader = PollIo {
            io: &mut self.io,
            cx,
        };
        let n = match self.conn.read_tls(&mut reader) {
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Poll::Pending,
            Err(e) => return Poll::Ready(Err(e)),
        };
        if n == 0 {
            self.io_eof = true;
        }
        self.counters.add_in(n);
        if let Err(e) = self.conn.process_new_packets() {
            // Tell the peer why before giving up; errors writing that alert do not matter.
            let _ = self.poll_flush_tls(cx);
            return Poll::Ready(Err(io::Error::new(io::ErrorKind::InvalidData, e)));
        }
        Poll::Ready(Ok(()))
    }

    /// Writes queued TLS records; Ready(Ok) once nothing is left.
    fn poll_flush_tls(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        while self.conn.wants_write() {
            let mut writer = PollIo {
                io: &mut self.io,
                cx,
            };
            match self.conn.write_tls(&mut writer) {
                Ok(0) => return Poll::Ready(Err(io::ErrorKind::WriteZero.into())),
                Ok(n) => self.counters.add_out(n),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Poll::Pending,
                Err(e) => return Poll::Ready(Err(e)),
            }
        }
        Poll::Ready(Ok(()))
    }
}

impl<C, D> TlsStream<C>
where
    C: DerefMut<Target = ConnectionCommon<D>> + Unpin,
    D: SideData,
{
    /// Takes `bufs` into whole records: below one record they only join `unsealed`; from
    /// one record on, once rustls has sent what it held, up to [`SEAL_AHEAD`] full
    /// records are sealed and the tail (less than a record) joins `unsealed`.
    fn poll_write_coalesced(
        &mut self,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let total: usize = bufs.iter().map(|b| b.len()).sum();
        if self.unsealed.len() + total < RECORD {
            bufs.iter().for_each(|b| self.unsealed.extend_from_slice(b));
            self.counters.sent(SendMethod::Userspace, total);
            return Poll::Ready(Ok(total));
        }
        ready!(self.poll_flush_tls(cx))?;
        let held = self.unsealed.len();
        let seal = ((held + total) / RECORD).min(SEAL_AHEAD) * RECORD;
        let mut slices = Vec::with_capacity(bufs.len() + 1);
        slices.push(io::IoSlice::new(&self.unsealed));
        let mut left = seal - held;
        for b in bufs {
            if left == 0 {
                break;
            }
            let n = b.len().min(left);
            slices.push(io::IoSlice::new(&b[..n]));
            left -= n;
        }
        let sealed = self.conn.writer().write_vectored(&slices)?;
        if sealed < seal {
            return Poll::Ready(Err(keys_exhausted()));
        }
        self.unsealed.clear();
        let mut taken = seal - held;
        if total - taken < RECORD {
            let mut skip = taken;
            for b in bufs {
                let from = skip.min(b.len());
                self.unsealed.extend_from_slice(&b[from..]);
                skip -= from;
            }
            taken = total;
        }
        self.counters.sent(SendMethod::Userspace, taken);
        // Start sending; what the socket does not take now goes at the next call.
        if let Poll::Ready(Err(e)) = self.poll_flush_tls(cx) {
            return Poll::Ready(Err(e));
        }
        Poll::Ready(Ok(taken))
    }

    /// Seals what waits in `unsealed` as one record.
    fn seal_unsealed(&mut self) -> io::Result<()> {
        if self.unsealed.is_empty() {
            return Ok(());
        }
        let sealed = self.conn.writer().write(&self.unsealed)?;
        if sealed < self.unsealed.len() {
            return Err(keys_exhausted());
        }
        // Flushed: a response is done, and the connection may idle. It keeps no buffer
        // meanwhile; the next response's tail takes one again.
        self.unsealed = Vec::new();
        Ok(())
    }
}

/// rustls takes less than it was given only when the traffic keys are spent and it has
/// closed the connection.
fn keys_exhausted() -> io::Error {
    io::Error::new(io::ErrorKind::BrokenPipe, "TLS write keys exhausted")
}

/// Adapts the socket's poll functions to the `Read`/`Write` rustls expects.
struct PollIo<'a, 'b> {
    io: &'a mut TcpStream,
    cx: &'a mut Context<'b>,
}

impl Read for PollIo<'_, '_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let mut buf = ReadBuf::new(buf);
        match Pin::new(&mut *self.io).poll_read(self.cx, &mut buf) {
            Poll::Ready(Ok(())) => Ok(buf.filled().len()),
            Poll::Ready(Err(e)) => Err(e),
            Poll::Pending => Err(io::ErrorKind::WouldBlock.into()),
        }
    }
}

impl Write for PollIo<'_, '_> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match Pin::new(&mut *self.io).poll_write(self.cx, buf) {
            Poll::Ready(r) => r,
            Poll::Pending => Err(io::ErrorKind::WouldBlock.into()),
        }
    }

    fn write_vectored(&mut self, bufs: &[io::IoSlice<'_>]) -> io::Result<usize> {
        match Pin::new(&mut *self.io).poll_write_vectored(self.cx, bufs) {
            Poll::Ready(r) => r,
            Poll::Pending => Err(io::ErrorKind::WouldBlock.into()),
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl<C, D> AsyncRead for TlsStream<C>
where
    C: DerefMut<Target = ConnectionCommon<D>> + Unpin,
    D: SideData,
{
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
        // Copied from rustls's own buffer: `Read::read` would need the caller's unfilled
        // bytes zeroed first, on every call.
        let mut reader = this.conn.reader();
        match reader.fill_buf() {
            Ok(plaintext) => {
                // Empty: the peer sent close_notify.
                let n = plaintext.len().min(buf.remaining());
                buf.put_slice(&plaintext[..n]);
                reader.consume(n);
                Poll::Ready(Ok(()))
            }
            // Ready without plaintext: the socket closed, with close_notify or without.
            Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => Poll::Ready(Ok(())),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => Poll::Ready(Ok(())),
            Err(e) => Poll::Ready(Err(e)),
        }
    }
}

impl<C, D> TlsStream<C>
where
    C: DerefMut<Target = ConnectionCommon<D>> + Unpin,
    D: SideData,
{
    /// Ready once a read would not wait: plaintext is in, or the stream has ended (or
    /// failed). (The server's equivalent, which waits for the next request without a
    /// buffer, is `SecureStream::poll_read_ready`, tested there.)
    fn poll_read_ready(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        loop {
            match self.conn.reader().fill_buf() {
                Ok(_) => return Poll::Ready(Ok(())),
                // The socket closed without close_notify: end of stream all the same.
                Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Poll::Ready(Ok(())),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                Err(e) => return Poll::Ready(Err(e)),
            }
            if self.io_eof {
                return Poll::Ready(Ok(()));
            }
            match self.poll_fill(cx) {
                Poll::Ready(Ok(())) => {
                    // A KeyUpdate asking for ours is answered now. rustls holds the answer
                    // until our next application data (RFC 8446 section 4.6.3 allows
                    // that), and a client may wait for it before it sends the rest of its
                    // request; an empty write releases it.
                    let _ = self.conn.writer().write(&[]);
                    if let Poll::Ready(Err(e)) = self.poll_flush_tls(cx) {
                        return Poll::Ready(Err(e));
                    }
                }
                Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                Poll::Pending => return Poll::Pending,
            }
        }
    }
}

impl<C, D> AsyncWrite for TlsStream<C>
where
    C: DerefMut<Target = ConnectionCommon<D>> + Unpin,
    D: SideData,
{
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
        this.seal_unsealed()?;
        match this.poll_flush_tls(cx) {
            Poll::Ready(Ok(())) => Pin::new(&mut this.io).poll_flush(cx),
            other => other,
        }
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = &mut *self;
        if !this.close_notify_sent {
            this.seal_unsealed()?;
            this.conn.send_close_notify();
            this.close_notify_sent = true;
        }
        match this.poll_flush_tls(cx) {
            Poll::Ready(Ok(())) => Pin::new(&mut this.io).poll_shutdown(cx),
            other => other,
        }
    }
}
