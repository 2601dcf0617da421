//! Handshake messages after the handshake: KeyUpdate, and what must be refused.
//!
//! Choices where the RFCs leave one, or where we follow a particular reading:
//! - TLS 1.3 takes KeyUpdate only (a client also takes NewSessionTicket); any other type,
//!   such as a client's NewSessionTicket or a Certificate we never asked for, is refused
//!   with unexpected_message as soon as its type byte is read;
//! - a KeyUpdate must end its record (RFC 8446 5.1: no message spans a key change), or
//!   unexpected_message; its body is one byte (else decode_error), 0 or 1 (else
//!   illegal_parameter), as tlsfuzzer's tls13-keyupdate expects;
//! - a message split across records is reassembled, up to [`Side::MAX_MESSAGE`] bytes (a
//!   server's: one KeyUpdate, 5 bytes); no other record may come between its pieces
//!   (unexpected_message), nor may a handshake record be empty (RFC 8446 5.1);
//! - TLS 1.2 renegotiation (a ClientHello at a server) is answered with a warning
//!   no_renegotiation and skipped, as rustls does and tlsfuzzer's
//!   test-renegotiation-disabled expects, so a client that tries goes on with the
//!   session it has; a second try is refused (unexpected_message): nothing is gained by
//!   answering it again. Any other TLS 1.2 handshake message is unexpected_message.

use rustls::{AlertDescription, HandshakeType};

use super::cipher::Version;
use super::layer::{RecordLayer, Side};
use super::RecordError;

/// Bytes of a handshake message header: type and 24-bit length.
const HEADER: usize = 4;

/// A handshake message arriving across records.
#[derive(Debug, Default)]
pub(crate) struct Reassembly {
    /// The start of a message, while the rest comes.
    held: Vec<u8>,
    /// Bytes of a refused renegotiation's message still to skip.
    skip: usize,
}

impl Reassembly {
    /// Whether a message is half received: nothing else may come until it ends.
    pub(crate) fn is_partial(&self) -> bool {
        !self.held.is_empty() || self.skip > 0
    }
}

impl<Data: Side> RecordLayer<Data> {
    /// A handshake record's plaintext: whole messages handled, the start of one held.
    pub(super) fn handshake(&mut self, body: &[u8]) -> Result<(), RecordError> {
        if body.is_empty() {
            return Err(self.refuse(
                AlertDescription::UnexpectedMessage,
                "a zero-length handshake record",
            ));
        }
        let skipped = body.len().min(self.reassembly.skip);
        self.reassembly.skip -= skipped;
        let body = &body[skipped..];
        let mut held = std::mem::take(&mut self.reassembly.held);
        let mut rest: &[u8] = if held.is_empty() {
            body
        } else {
            held.extend_from_slice(body);
            &held
        };
        while !rest.is_empty() {
            match self.message(rest)? {
                Some(n) => rest = &rest[n..],
                None => break,
            }
        }
        if !rest.is_empty() {
            self.reassembly.held = rest.to_vec();
        }
        Ok(())
    }

    /// The message at the front of `bytes` (which end where the record ends): the bytes it
    /// took once whole (or skipped), `None` while it is incomplete.
    fn message(&mut self, bytes: &[u8]) -> Result<Option<usize>, RecordError> {
        let typ = HandshakeType::from(bytes[0]);
        self.check_type(typ)?;
        let Some(header) = bytes.get(..HEADER) else {
            return Ok(None);
        };
        let len = u32::from_be_bytes([0, header[1], header[2], header[3]]) as usize;
        if self.version() == Version::Tls12 {
            return self.renegotiation(bytes, len).map(Some);
        }
        if typ == HandshakeType::KeyUpdate && len != 1 {
            return Err(self.refuse(AlertDescription::DecodeError, "a KeyUpdate not 1 byte long"));
        }
        if HEADER + len > Data::MAX_MESSAGE {
            return Err(self.refuse(
                AlertDescription::DecodeError,
                "a handshake message too long to hold",
            ));
        }
        let Some(body) = bytes.get(HEADER..HEADER + len) else {
            return Ok(None);
        };
        if typ != HandshakeType::KeyUpdate {
            self.other_message(typ, body)?;
        } else if bytes.len() > HEADER + len {
            return Err(self.refuse(
                AlertDescription::UnexpectedMessage,
                "a KeyUpdate not at the end of its record",
            ));
        } else {
            self.key_update(body[0])?;
        }
        Ok(Some(HEADER + len))
    }

    fn check_type(&mut self, typ: HandshakeType) -> Result<(), RecordError> {
        let taken = match self.version() {
            Version::Tls13 => Data::accepts(typ),
            Version::Tls12 => typ == Data::RENEGOTIATION,
        };
        if taken {
            return Ok(());
        }
        Err(self.refuse(
            AlertDescription::UnexpectedMessage,
            "an unexpected handshake message after the handshake",
        ))
    }

    /// A TLS 1.2 renegotiation of `len` bytes of body: answered with a warning the first
    /// time, its bytes skipped; the bytes of `bytes` it took.
    fn renegotiation(&mut self, bytes: &[u8], len: usize) -> Result<usize, RecordError> {
        self.renegotiations += 1;
        if self.renegotiations > 1 {
            return Err(self.refuse(
                AlertDescription::UnexpectedMessage,
                "a second renegotiation",
            ));
        }
        self.seal_warning(AlertDescription::NoRenegotiation)?;
        let have = bytes.len() - HEADER;
        if have >= len {
            return Ok(HEADER + len);
        }
        self.reassembly.skip = len - have;
        Ok(bytes.len())
    }
}
