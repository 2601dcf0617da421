//! terminus's own TLS record layer, for the connection after its handshake.
//!
//! rustls drives the handshake (unbuffered) and hands over the traffic secrets with their
//! sequence numbers and a `KernelConnection` that derives the next secrets for a TLS 1.3
//! KeyUpdate. From there this module seals and opens the records itself, in buffers the
//! caller owns: rustls's buffered connection would keep a receive buffer and queues of
//! its own for every idle connection, and copy each record through them; here a record
//! is sealed and opened where it lies, and an idle connection holds keys and sequence
//! numbers only ([`crate::secure`] is the stream built on it).
//!
//! - [`framing`]: where whole records end, before anything is decrypted;
//! - [`cipher`]: one record sealed or opened in place, for AES-GCM and ChaCha20-Poly1305
//!   in TLS 1.2 and 1.3;
//! - [`layer`]: the connection's two directions, their sequence numbers and key limits,
//!   the peer's control records (KeyUpdate, alerts) and what it must be refused.

pub mod cipher;
pub mod framing;
mod handshake;
pub mod layer;
#[cfg(test)]
pub(crate) mod testing;
#[cfg(test)]
mod tests;

use std::io;

use rustls::AlertDescription;

pub use cipher::{RecordCipher, Version, HEADER_LEN, MAX_PLAINTEXT, MAX_RECORD_LEN, TAG_LEN};
pub use framing::{plausible_header, whole_records, whole_records_within};
pub use layer::{KernelKeys, Opened, RecordLayer, Side};

/// Why the record layer stopped, or would not do what it was asked.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RecordError {
    /// The peer broke the protocol; `alert` was queued for it (fatal), and the connection
    /// is over.
    #[error("refused the peer's record: {reason} (alert {alert:?})")]
    Refused {
        /// The alert the RFCs name for it.
        alert: AlertDescription,
        /// What was wrong, for the log.
        reason: &'static str,
    },
    /// The peer ended the connection with this alert (anything but close_notify, and but a
    /// tolerated warning).
    #[error("the peer sent the alert {0:?}")]
    PeerAlert(AlertDescription),
    /// A record came after the peer's close_notify: it is not read.
    #[error("a record came after the peer's close_notify")]
    AfterClose,
    /// The write keys may seal no more records: TLS 1.2 at its confidentiality limit,
    /// where no KeyUpdate exists. The caller closes the connection.
    #[error("the write keys are spent")]
    KeysExhausted,
    /// Nothing more is sealed: close_notify was sent, or the connection failed.
    #[error("the connection is closed for writing")]
    Closed,
    /// What rustls handed over, or asked, is not something this layer can do.
    #[error("unusable: {0}")]
    Unsupported(&'static str),
}

impl RecordError {
    /// The fatal alert this error sends the peer, if any.
    pub fn alert(&self) -> Option<AlertDescription> {
        match self {
            Self::Refused { alert, .. } => Some(*alert),
            _ => None,
        }
    }
}

impl From<RecordError> for io::Error {
    fn from(e: RecordError) -> Self {
        let kind = match e {
            RecordError::Refused { .. } | RecordError::PeerAlert(_) | RecordError::AfterClose => {
                io::ErrorKind::InvalidData
            }
            RecordError::KeysExhausted | RecordError::Closed => io::ErrorKind::BrokenPipe,
            RecordError::Unsupported(_) => io::ErrorKind::Other,
        };
        io::Error::new(kind, e)
    }
}
