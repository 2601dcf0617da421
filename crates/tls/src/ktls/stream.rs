//! A socket whose record layer the kernel runs: plaintext in and out, files by sendfile.
//!
//! Reads go through recvmsg with room for the record-type control message, so a record
//! that is not application data is never handed to HTTP as if it were: close_notify is
//! end of stream, any other alert ends the connection, a TLS 1.3 KeyUpdate ends it cleanly
//! (see the module documentation of [`crate::ktls`]), and a record that fails to decrypt
//! (EBADMSG) is an error.

use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, RawFd};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, Interest, ReadBuf};
use tokio::net::TcpStream;

use super::sys;
use crate::stream::{SendMethod, TrafficCounters};

/// Largest TLS plaintext record: a write or sendfile of n bytes makes at most
/// n / MAX_RECORD + 1 records.
const MAX_RECORD: u64 = 16 * 1024;

const ALERT_CLOSE_NOTIFY: u8 = 0;
const ALERT_UNEXPECTED_MESSAGE: u8 = 10;
const HANDSHAKE_KEY_UPDATE: u8 = 24;

/// A connection whose records the kernel encrypts and decrypts: reads and writes are plain socket calls, files go by sendfile(2).
pub struct KtlsStream {
    io: TcpStream,
    /// Plaintext rustls decrypted before the hand-off, served first.
    early: Vec<u8>,
    early_at: usize,
    /// No more application data will come (close_notify, KeyUpdate, TCP FIN).
    read_done: bool,
    close_notify_sent: bool,
    /// Records the transmit key may still protect.
    records_left: u64,
    counters: Arc<TrafficCounters>,
}

/// What a non-data record means for the reader.
enum Control {
    EndOfStream,
    Fatal(io::Error),
}

/// A record the kernel handed up that is not application data.
#[derive(Debug)]
pub(super) enum ControlRecord {
    CloseNotify,
    Alert(u8),
    KeyUpdate,
    Unexpected {
        record_type: u8,
        len: usize,
    },
    /// Data after all (a splice that stopped for another reason).
    Data,
}

impl ControlRecord {
    pub(super) fn into_error(self) -> io::Error {
        match self {
            Self::CloseNotify | Self::Data => io::ErrorKind::UnexpectedEof.into(),
            Self::Alert(description) => io::Error::new(
                io::ErrorKind::ConnectionAborted,
                format!("client sent TLS alert {description}"),
            ),
            Self::KeyUpdate => io::Error::new(
                io::ErrorKind::ConnectionAborted,
                "client KeyUpdate: kernel TLS cannot rekey this connection",
            ),
            Self::Unexpected { record_type, len } => io::Error::new(
                io::ErrorKind::InvalidData,
                format!(
                    "unexpected TLS record (type {record_type}, {len} bytes) after the handshake"
                ),
            ),
        }
    }
}

pub(super) fn classify(record_type: u8, body: &[u8]) -> ControlRecord {
    match (record_type, body) {
        (sys::RECORD_APPLICATION_DATA, _) => ControlRecord::Data,
        (sys::RECORD_ALERT, [_, ALERT_CLOSE_NOTIFY]) => ControlRecord::CloseNotify,
        (sys::RECORD_ALERT, [_, description]) => ControlRecord::Alert(*description),
        (sys::RECORD_HANDSHAKE, [HANDSHAKE_KEY_UPDATE, ..]) => ControlRecord::KeyUpdate,
        (record_type, body) => ControlRecord::Unexpected {
            record_type,
            len: body.len(),
        },
    }
}

impl KtlsStream {
    pub(super) fn new(
        io: TcpStream,
        early: Vec<u8>,
        peer_closed: bool,
        records_left: u64,
        counters: Arc<TrafficCounters>,
    ) -> Self {
        Self {
            io,
            // Served before the end, which poll_read reports only once `early` is read.
            read_done: peer_closed,
            early,
            early_at: 0,
            close_notify_sent: false,
            records_left,
            counters,
        }
    }

    fn fd(&self) -> RawFd {
        self.io.as_raw_fd()
    }

    /// Refuses to send once the transmit key has protected as many records as its
    /// cipher allows (the kernel does not count; rustls would have).
    fn may_send(&self) -> io::Result<()> {
        if self.records_left == 0 {
            return Err(io::Error::other(
                "the transmit key reached its confidentiality limit; closing",
            ));
        }
        Ok(())
    }

    /// Charges `n` bytes just sent in `calls` system calls: at most n / MAX_RECORD + 1
    /// records per call.
    pub(super) fn charge(&mut self, method: SendMethod, n: u64, calls: u64) {
        self.records_left = self.records_left.saturating_sub(n / MAX_RECORD + calls);
        self.counters.sent(method, n as usize);
    }

    /// Sends one record of `record_type` through the kernel (best effort: used for the
    /// alerts that end a connection).
    fn send_control(&self, record_type: u8, data: &[u8]) {
        let _ = self.io.try_io(Interest::WRITABLE, || {
            sys::send_record(self.fd(), record_type, data)
        });
    }

    fn on_control_record(&mut self, record_type: u8, body: &[u8]) -> Control {
        match classify(record_type, body) {
            ControlRecord::CloseNotify => Control::EndOfStream,
            alert @ ControlRecord::Alert(_) => Control::Fatal(alert.into_error()),
            ControlRecord::KeyUpdate => {
                // The records after it are under keys we cannot give the kernel: answer
                // with close_notify (still under our valid key) and read no further.
                tracing::debug!("client KeyUpdate on a kernel TLS connection: closing cleanly (kernel TLS cannot rekey it)");
                self.counters.key_update_closed();
                self.send_close_notify();
                Control::EndOfStream
            }
            other => {
                self.send_control(sys::RECORD_ALERT, &[2, ALERT_UNEXPECTED_MESSAGE]);
                self.close_notify_sent = true;
                Control::Fatal(other.into_error())
            }
        }
    }

    fn send_close_notify(&mut self) {
        if !self.close_notify_sent {
            self.send_control(sys::RECORD_ALERT, &[1, ALERT_CLOSE_NOTIFY]);
            self.close_notify_sent = true;
        }
    }

    /// Sends `head` and then `len` bytes of `file` from `offset` with sendfile(2): the
    /// kernel reads the page cache and encrypts, nothing is copied through user space.
    /// `head` goes with MSG_MORE, so it shares the file's first record (a small response
    /// is one record, as from the userspace path); `len` must then not be zero, or the
    /// record would wait for data that never comes.
    pub async fn send_file(
        &mut self,
        mut head: &[u8],
        file: &File,
        offset: u64,
        len: u64,
    ) -> io::Result<()> {
        debug_assert!(len > 0 || head.is_empty());
        while !head.is_empty() {
            self.may_send()?;
            self.io.writable().await?;
            match self
                .io
                .try_io(Interest::WRITABLE, || sys::send_more(self.fd(), head))
            {
                Ok(n) => {
                    self.charge(SendMethod::KernelTls, n as u64, 1);
                    head = &head[n..];
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                Err(e) => return Err(e),
            }
        }
        let mut at = offset as i64;
        let end = offset + len;
        while (at as u64) < end {
            let want = (end - at as u64).min(1 << 30) as usize;
            self.may_send()?;
            self.io.writable().await?;
            match self.io.try_io(Interest::WRITABLE, || {
                sys::sendfile(self.fd(), file.as_raw_fd(), &mut at, want)
            }) {
                Ok(0) => {
                    return Err(io::Error::new(
                        io::ErrorKind::UnexpectedEof,
                        "file truncated while being sent",
                    ))
                }
                Ok(n) => self.charge(SendMethod::Sendfile, n as u64, 1),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    /// Takes the plaintext rustls decrypted before the hand-off that no read has returned
    /// yet, and whether the client's stream ends with it (it closed before the hand-off).
    /// A relay that splices from `socket()` must send these bytes first: they arrived
    /// before anything the kernel holds (a client's first request often rides in the
    /// same segment as its Finished).
    pub fn take_early(&mut self) -> (Vec<u8>, bool) {
        let mut early = std::mem::take(&mut self.early);
        early.drain(..self.early_at);
        self.early_at = 0;
        (early, self.read_done)
    }

    /// The socket, for splice(2) (the kernel encrypts what is spliced into it and
    /// decrypts what is spliced out of it).
    pub fn socket(&self) -> &TcpStream {
        &self.io
    }

    /// Ready once a read may not wait: plaintext from before the hand-off waits, the
    /// stream is done, or the socket has something (a record the read may find to be a
    /// control one, and handle). A caller can wait for the next request this way
    /// without a buffer of its own to read it into.
    pub fn poll_read_ready(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        if self.early_at < self.early.len() || self.read_done {
            return Poll::Ready(Ok(()));
        }
        self.io.poll_read_ready(cx)
    }
}

impl AsyncRead for KtlsStream {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = &mut *self;
        if this.early_at < this.early.len() {
            let n = buf.remaining().min(this.early.len() - this.early_at);
            buf.put_slice(&this.early[this.early_at..this.early_at + n]);
            this.early_at += n;
            if this.early_at == this.early.len() {
                // All served: nothing kept for the connection's idle time.
                (this.early, this.early_at) = (Vec::new(), 0);
            }
            return Poll::Ready(Ok(()));
        }
        if this.read_done || buf.remaining() == 0 {
            return Poll::Ready(Ok(()));
        }
        loop {
            ready!(this.io.poll_read_ready(cx))?;
            let fd = this.fd();
            let unfilled = buf.initialize_unfilled();
            match this
                .io
                .try_io(Interest::READABLE, || sys::recv_record(fd, unfilled))
            {
                Ok((n, sys::RECORD_APPLICATION_DATA)) => {
                    if n == 0 {
                        this.read_done = true;
                    }
                    buf.advance(n);
                    return Poll::Ready(Ok(()));
                }
                Ok((n, record_type)) => {
                    let body = buf.initialize_unfilled()[..n].to_vec();
                    this.read_done = true;
                    return match this.on_control_record(record_type, &body) {
                        Control::EndOfStream => Poll::Ready(Ok(())),
                        Control::Fatal(e) => Poll::Ready(Err(e)),
                    };
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
                Err(e) if e.raw_os_error() == Some(libc::EBADMSG) => {
                    this.read_done = true;
                    return Poll::Ready(Err(io::Error::new(
                        io::ErrorKind::InvalidData,
                        "a TLS record failed to decrypt (bad record MAC)",
                    )));
                }
                Err(e) => return Poll::Ready(Err(e)),
            }
        }
    }
}

impl AsyncWrite for KtlsStream {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = &mut *self;
        this.may_send()?;
        let n = ready!(Pin::new(&mut this.io).poll_write(cx, buf))?;
        this.charge(SendMethod::KernelTls, n as u64, 1);
        Poll::Ready(Ok(n))
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = &mut *self;
        this.may_send()?;
        let n = ready!(Pin::new(&mut this.io).poll_write_vectored(cx, bufs))?;
        this.charge(SendMethod::KernelTls, n as u64, 1);
        Poll::Ready(Ok(n))
    }

    fn is_write_vectored(&self) -> bool {
        true
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = &mut *self;
        while !this.close_notify_sent {
            ready!(this.io.poll_write_ready(cx))?;
            let fd = this.fd();
            match this.io.try_io(Interest::WRITABLE, || {
                sys::send_record(fd, sys::RECORD_ALERT, &[1, ALERT_CLOSE_NOTIFY])
            }) {
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
                // A peer that is gone does not need our close_notify.
                _ => this.close_notify_sent = true,
            }
        }
        Pin::new(&mut this.io).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::{classify, sys, ControlRecord, ALERT_CLOSE_NOTIFY, HANDSHAKE_KEY_UPDATE};
    use proptest::prelude::*;

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(512))]

        /// What the kernel hands up besides data: only a well-formed two-byte alert with
        /// description 0 ends the stream cleanly; any other alert is the client's alert;
        /// a handshake record is a KeyUpdate only when it starts with one; everything else
        /// (other types, malformed alerts) is unexpected, with its type and length kept.
        #[test]
        fn control_records_are_classified_by_type_and_shape(
            record_type in any::<u8>(),
            body in prop::collection::vec(any::<u8>(), 0..40),
        ) {
            let got = classify(record_type, &body);
            match (record_type, body.as_slice()) {
                (sys::RECORD_APPLICATION_DATA, _) => prop_assert!(matches!(got, ControlRecord::Data)),
                (sys::RECORD_ALERT, [_, ALERT_CLOSE_NOTIFY]) => {
                    prop_assert!(matches!(got, ControlRecord::CloseNotify))
                }
                (sys::RECORD_ALERT, [_, d]) => {
                    prop_assert!(matches!(got, ControlRecord::Alert(x) if x == *d))
                }
                (sys::RECORD_HANDSHAKE, [HANDSHAKE_KEY_UPDATE, ..]) => {
                    prop_assert!(matches!(got, ControlRecord::KeyUpdate))
                }
                _ => prop_assert!(
                    matches!(got, ControlRecord::Unexpected { record_type: t, len } if t == record_type && len == body.len()),
                    "{:?}", got
                ),
            }
        }

        /// A close_notify look-alike that is not exactly two bytes is not a clean end.
        #[test]
        fn a_malformed_alert_is_never_a_clean_close(level in any::<u8>(), extra in prop::collection::vec(any::<u8>(), 1..8)) {
            let mut body = vec![level, ALERT_CLOSE_NOTIFY];
            body.extend_from_slice(&extra);
            let got = classify(sys::RECORD_ALERT, &body);
            prop_assert!(matches!(got, ControlRecord::Unexpected { .. }), "{:?}", got);
            prop_assert!(!matches!(classify(sys::RECORD_ALERT, &body[..1]), ControlRecord::CloseNotify));
        }
    }
}
