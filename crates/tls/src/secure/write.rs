//! The write side: plaintext copied once into a pool buffer laid out for sealing in
//! place (header room, plaintext, tag room), sealed when it holds a full record or at a
//! flush, and sent with as few `writev` calls as the socket allows.

use std::io::{self, IoSlice};
use std::pin::Pin;
use std::task::{Context, Poll};

use rustls::server::ServerConnectionData;
use tokio::io::AsyncWrite;
use tokio::net::TcpStream;

use crate::pool::Buffer;
use crate::record::{RecordError, RecordLayer, MAX_PLAINTEXT};
use crate::stream::TrafficCounters;

/// Full records sealed ahead of the socket before a write waits for it.
pub(super) const SEAL_AHEAD: usize = 4;
/// Records given to one `writev`.
const WRITEV_MAX: usize = 16;

/// Sealed bytes waiting for the socket: a record in its pool buffer, or control records.
enum Sealed {
    Record(Buffer),
    Control(Vec<u8>),
}

struct Chunk {
    bytes: Sealed,
    at: usize,
    end: usize,
}

impl Chunk {
    fn unsent(&self) -> &[u8] {
        let bytes: &[u8] = match &self.bytes {
            Sealed::Record(b) => b,
            Sealed::Control(v) => v,
        };
        &bytes[self.at..self.end]
    }
}

/// Plaintext being gathered into a record, and sealed records waiting to leave.
#[derive(Default)]
pub(super) struct Outbound {
    /// The record being filled: plaintext at `prefix..prefix + filled`.
    filling: Option<Buffer>,
    filled: usize,
    /// In the order they were sealed; emptied (and its storage freed) once all is sent.
    queue: Vec<Chunk>,
}

impl Outbound {
    /// Whether a buffer (or the queue's storage) is held.
    pub(super) fn holds_buffer(&self) -> bool {
        self.filling.is_some() || self.queue.capacity() > 0
    }

    /// Whether sealed records wait for the socket.
    pub(super) fn has_unsent(&self) -> bool {
        !self.queue.is_empty()
    }

    fn records_queued(&self) -> usize {
        self.queue
            .iter()
            .filter(|c| matches!(c.bytes, Sealed::Record(_)))
            .count()
    }

    /// Whether a write must wait for the socket before it takes more.
    pub(super) fn is_full(&self) -> bool {
        self.records_queued() >= SEAL_AHEAD
    }

    /// Copies what fits of `bufs` into records, sealing each that fills; stops once
    /// [`SEAL_AHEAD`] records wait. The plaintext bytes taken.
    pub(super) fn write(
        &mut self,
        layer: &mut RecordLayer<ServerConnectionData>,
        bufs: &[IoSlice<'_>],
    ) -> Result<usize, RecordError> {
        let mut taken = 0;
        for buf in bufs {
            let mut rest: &[u8] = buf;
            while !rest.is_empty() {
                if self.is_full() {
                    return Ok(taken);
                }
                let prefix = layer.prefix_len();
                let record = self.filling.get_or_insert_with(Buffer::take);
                let n = rest.len().min(MAX_PLAINTEXT - self.filled);
                let at = prefix + self.filled;
                record[at..at + n].copy_from_slice(&rest[..n]);
                self.filled += n;
                taken += n;
                rest = &rest[n..];
                if self.filled == MAX_PLAINTEXT {
                    self.seal(layer)?;
                }
            }
        }
        Ok(taken)
    }

    /// Seals the record being filled, if it holds anything.
    pub(super) fn seal(
        &mut self,
        layer: &mut RecordLayer<ServerConnectionData>,
    ) -> Result<(), RecordError> {
        self.take_control(layer);
        let Some(mut record) = self.filling.take() else {
            return Ok(());
        };
        let end = layer.prefix_len() + std::mem::take(&mut self.filled) + layer.suffix_len();
        layer.seal_in_place(&mut record[..end])?;
        self.queue.push(Chunk {
            bytes: Sealed::Record(record),
            at: 0,
            end,
        });
        // A KeyUpdate the key's limit forced follows this record.
        self.take_control(layer);
        Ok(())
    }

    /// Queues the control records the layer sealed (KeyUpdate, alerts).
    pub(super) fn take_control(&mut self, layer: &mut RecordLayer<ServerConnectionData>) {
        if let Some(control) = layer.take_queued() {
            let end = control.len();
            self.queue.push(Chunk {
                bytes: Sealed::Control(control),
                at: 0,
                end,
            });
        }
    }

    /// Sends what is queued; Ready(Ok) once nothing is left.
    pub(super) fn poll_send(
        &mut self,
        io: &mut TcpStream,
        cx: &mut Context<'_>,
        counters: &TrafficCounters,
    ) -> Poll<io::Result<()>> {
        while !self.queue.is_empty() {
            let mut slices = [IoSlice::new(&[]); WRITEV_MAX];
            for (slice, chunk) in slices.iter_mut().zip(&self.queue) {
                *slice = IoSlice::new(chunk.unsent());
            }
            let count = self.queue.len().min(WRITEV_MAX);
            let n = match Pin::new(&mut *io).poll_write_vectored(cx, &slices[..count]) {
                Poll::Ready(Ok(0)) => return Poll::Ready(Err(io::ErrorKind::WriteZero.into())),
                Poll::Ready(Ok(n)) => n,
                Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                Poll::Pending => return Poll::Pending,
            };
            counters.add_out(n);
            self.advance(n);
        }
        // Sent: the queue's storage goes too, so that an idle connection holds none.
        self.queue = Vec::new();
        Poll::Ready(Ok(()))
    }

    /// `n` bytes left: finished chunks go (their buffers back to the pool).
    fn advance(&mut self, mut n: usize) {
        let mut done = 0;
        for chunk in &mut self.queue {
            let step = n.min(chunk.end - chunk.at);
            chunk.at += step;
            n -= step;
            if chunk.at < chunk.end {
                break;
            }
            done += 1;
        }
        self.queue.drain(..done);
    }
}
