//! The read side: bytes from the socket, whole records opened in place, plaintext until
//! the application has read it.
//!
//! A buffer is held only while there is something in it: a record still arriving, or
//! plaintext not yet read. At a record boundary with everything read it goes back to the
//! pool. A record still arriving keeps the pool buffer it started in, rather than moving
//! its bytes into a Vec of their size: a large upload arrives a segment at a time, and
//! moving the record out and back at every segment would copy it many times over; a
//! connection in the middle of a record is busy, not idle.

use std::ops::{Deref, DerefMut, Range};

use rustls::server::ServerConnectionData;

use crate::pool::Buffer;
use crate::record::{Opened, RecordError, RecordLayer};

/// Where received bytes are: a pool buffer, or the bytes the handshake read past its end
/// (opened where they lie, then dropped).
enum Bytes {
    Pooled(Buffer),
    Pending(Vec<u8>),
}

impl Deref for Bytes {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        match self {
            Self::Pooled(b) => b,
            Self::Pending(v) => v,
        }
    }
}

impl DerefMut for Bytes {
    fn deref_mut(&mut self) -> &mut [u8] {
        match self {
            Self::Pooled(b) => b,
            Self::Pending(v) => v,
        }
    }
}

/// Received bytes: `bytes[start..end]` not yet opened, `plain` opened and unread.
#[derive(Default)]
pub(super) struct Inbound {
    bytes: Option<Bytes>,
    start: usize,
    end: usize,
    plain: Range<usize>,
}

impl Inbound {
    /// Starts with what the handshake read past its end: whole records, maybe the head
    /// of one.
    pub(super) fn new(pending: Vec<u8>) -> Self {
        let end = pending.len();
        Self {
            bytes: (end > 0).then_some(Bytes::Pending(pending)),
            start: 0,
            end,
            plain: 0..0,
        }
    }

    /// Plaintext opened and not yet read.
    pub(super) fn plaintext(&self) -> &[u8] {
        match &self.bytes {
            Some(bytes) => &bytes[self.plain.clone()],
            None => &[],
        }
    }

    /// The application read `n` bytes of the plaintext.
    pub(super) fn consume(&mut self, n: usize) {
        self.plain.start += n;
        self.release_if_done();
    }

    /// Whether bytes of a record are held, waiting for the rest.
    pub(super) fn has_partial(&self) -> bool {
        self.start < self.end
    }

    /// Whether a buffer is held.
    pub(super) fn holds_buffer(&self) -> bool {
        self.bytes.is_some()
    }

    /// Opens the next whole record, if one is here; `Ok(None)` when more bytes are needed.
    /// A refusal is found from the header alone when it can be, before waiting for a body.
    pub(super) fn open_next(
        &mut self,
        layer: &mut RecordLayer<ServerConnectionData>,
    ) -> Result<Option<Opened>, RecordError> {
        let Some(bytes) = &mut self.bytes else {
            return Ok(None);
        };
        let at = self.start;
        let Some((len, opened)) = layer.open_next(&mut bytes[at..self.end])? else {
            return Ok(None);
        };
        self.start += len;
        Ok(Some(match opened {
            Opened::Data(range) => {
                self.plain = at + range.start..at + range.end;
                self.release_if_done();
                Opened::Data(self.plain.clone())
            }
            other => {
                self.release_if_done();
                other
            }
        }))
    }

    /// Room to read socket bytes into, in a pool buffer, after the record arriving.
    pub(super) fn room(&mut self) -> &mut [u8] {
        debug_assert!(
            self.plain.is_empty(),
            "read only once the plaintext is taken"
        );
        let partial = self.start..self.end;
        match &mut self.bytes {
            Some(Bytes::Pooled(buffer)) if partial.start > 0 => {
                buffer.copy_within(partial.clone(), 0);
            }
            Some(Bytes::Pooled(_)) => {}
            other => {
                let mut buffer = Buffer::take();
                if let Some(pending) = other {
                    buffer[..partial.len()].copy_from_slice(&pending[partial.clone()]);
                }
                *other = Some(Bytes::Pooled(buffer));
            }
        }
        self.end = partial.len();
        self.start = 0;
        self.plain = 0..0;
        let bytes = self.bytes.as_mut().expect("a buffer");
        &mut bytes[self.end..]
    }

    /// `n` bytes were read into [`Inbound::room`].
    pub(super) fn filled(&mut self, n: usize) {
        self.end += n;
        self.release_if_done();
    }

    /// Gives the buffer back once nothing in it is left: no plaintext, no record part.
    pub(super) fn release_if_done(&mut self) {
        if self.plain.is_empty() && self.start == self.end {
            // Dropped, the buffer goes back zeroed (see `Drop`).
            *self = Self::default();
        }
    }
}

impl Drop for Inbound {
    /// A client's decrypted request (its cookies, its Authorization) does not stay in the
    /// pool's free buffers for whoever comes next: the buffer goes back zeroed, also
    /// from a connection that ends mid-record or with plaintext unread.
    fn drop(&mut self) {
        if let Some(Bytes::Pooled(buffer)) = &mut self.bytes {
            buffer[..self.end].fill(0);
        }
    }
}
