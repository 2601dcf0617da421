//! The hello stage: the ClientHello read and parsed before any handshake state exists.
//!
//! rustls's [`Acceptor`] parses the ClientHello without choosing a configuration, so the
//! caller learns the server name (and with it the virtual host, the tenant and the route)
//! before a byte of the handshake is answered or any crypto is asked for.

use std::cell::OnceCell;
use std::io;
use std::time::Instant;

use rustls::server::{Accepted, Acceptor, ClientHello};
use rustls::{AlertDescription, ProtocolVersion};
use terminus_engine::{Engine, HandshakeGuard};
use tokio::net::TcpStream;

use super::downgrade::{self, Downgrade, Offer};
use super::driver::{refuse_with, send_alert};
use super::HandshakeError;
use crate::record::{whole_records, whole_records_within, MAX_PLAINTEXT};
use crate::stream::TrafficCounters;

/// A connection whose ClientHello has been read: the input of [`super::handshake`].
pub struct ClientHelloRead {
    pub(super) accepted: Accepted,
    /// Bytes read and not yet given to rustls.
    pub(super) inbox: Inbox,
    /// Counts the connection as a handshake in flight from its first byte: until its
    /// ClientHello is read it may still add crypto requests, so batches wait for it.
    pub(super) _in_flight: HandshakeGuard,
    /// The ClientHello's version and resumption fields, read from the bytes once, when
    /// first asked for (a passed-through connection never asks).
    offer: OnceCell<Option<Offer>>,
    /// See [`ClientHelloRead::offers_resumption`].
    resumable: OnceCell<bool>,
}

impl ClientHelloRead {
    /// The parsed ClientHello.
    pub fn client_hello(&self) -> ClientHello<'_> {
        self.accepted.client_hello()
    }

    /// Refuses a ClientHello that shares no version with `enabled` (`protocol_version`)
    /// or signals a fallback below the highest of them (`inappropriate_fallback`): checks
    /// rustls leaves to the server (see [`downgrade`]).
    pub async fn refuse_downgrade(
        &self,
        stream: &TcpStream,
        enabled: &[ProtocolVersion],
        counters: &TrafficCounters,
    ) -> Result<(), HandshakeError> {
        // Bytes that do not parse: rustls has accepted them, and judges them itself.
        match self.offer().and_then(|offer| offer.refusal(enabled)) {
            Some(refused) => Err(refuse(stream, refused, counters).await),
            None => Ok(()),
        }
    }

    /// When the ClientHello's first bytes were read.
    pub fn first_byte(&self) -> std::time::Instant {
        // A ClientHello was parsed, so bytes were read.
        self.inbox
            .first_read()
            .unwrap_or_else(std::time::Instant::now)
    }

    /// Whether the client offers a session `config` (with versions `enabled`) can resume
    /// in the version the handshake will have (a TLS 1.3 PSK or a TLS 1.2 ticket that it
    /// issued, or a session its cache holds): such a handshake costs no
    /// signature, and admission control and quotas let it in first. An offer of anything
    /// else is a full handshake and is admitted and charged as one. Decided once.
    pub fn offers_resumption(
        &self,
        config: &rustls::ServerConfig,
        enabled: &[ProtocolVersion],
    ) -> bool {
        *self.resumable.get_or_init(|| {
            self.offer()
                .is_some_and(|o| o.resumable_with(config, enabled))
        })
    }

    fn offer(&self) -> Option<&Offer> {
        self.offer
            .get_or_init(|| downgrade::parse(self.inbox.all()))
            .as_ref()
    }

    /// Refuses the connection before anything is answered, with a fatal `alert`.
    pub async fn refuse(
        &self,
        stream: &TcpStream,
        alert: AlertDescription,
        counters: &TrafficCounters,
    ) {
        refuse_with(stream, alert, counters).await;
    }

    /// Every byte the client sent so far, the ClientHello first, for passing the
    /// connection on untouched (TLS passthrough) instead of answering it.
    pub fn into_bytes(self) -> Vec<u8> {
        self.inbox.into_all()
    }
}

/// Reads records from `stream` until rustls has a whole ClientHello. A malformed one is
/// answered with the alert rustls chose before the error is returned.
pub async fn read_client_hello(
    stream: &TcpStream,
    engine: &Engine,
    counters: &TrafficCounters,
) -> Result<ClientHelloRead, HandshakeError> {
    let in_flight = engine.handshake_started();
    let mut acceptor = Acceptor::default();
    let mut inbox = Inbox::default();
    loop {
        inbox.fill(stream, counters).await?;
        // A TLS record begins with its content type (22, a handshake); a letter is an
        // HTTP method: plain HTTP sent to this port, which the caller answers as HTTP
        // (nginx's "400 The plain HTTP request was sent to HTTPS port").
        if inbox.all().first().is_some_and(u8::is_ascii_alphabetic) {
            return Err(HandshakeError::PlainText);
        }
        // Records before encryption carry at most 2^14 bytes (RFC 8446 section 5.1), and
        // the Acceptor would take a longer one whole.
        if inbox
            .next_record_len()
            .is_some_and(|len| len > MAX_PLAINTEXT)
        {
            refuse_with(stream, AlertDescription::RecordOverflow, counters).await;
            return Err(HandshakeError::Tls(rustls::Error::InvalidMessage(
                rustls::InvalidMessage::MessageTooLarge,
            )));
        }
        if let Err(e) = inbox.feed_record(|records| acceptor.read_tls(records)) {
            // rustls's buffer is full: the ClientHello is over the 64 KiB it takes, and
            // its record layer noticed before its parser could (which says decode_error).
            refuse_with(stream, rustls::AlertDescription::DecodeError, counters).await;
            return Err(e.into());
        }
        match acceptor.accept() {
            Ok(Some(accepted)) => {
                return Ok(ClientHelloRead {
                    accepted,
                    inbox,
                    _in_flight: in_flight,
                    offer: OnceCell::new(),
                    resumable: OnceCell::new(),
                })
            }
            Ok(None) => {}
            Err((e, alert)) => {
                // rustls refuses a client older than anything it implements before looking
                // at versions (TLS 1.1 and older send no signature_algorithms), and says
                // handshake_failure: RFC 8446 asks for protocol_version.
                let anything = rustls::ALL_VERSIONS.iter().map(|v| v.version);
                let anything: Vec<_> = anything.collect();
                if let Some(refused @ Downgrade::NoCommonVersion) =
                    downgrade::check(inbox.all(), &anything)
                {
                    return Err(refuse(stream, refused, counters).await);
                }
                send_alert(stream, alert, &e, counters).await;
                return Err(e.into());
            }
        }
    }
}

/// Sends `refused`'s alert and returns the error.
async fn refuse(
    stream: &TcpStream,
    refused: Downgrade,
    counters: &TrafficCounters,
) -> HandshakeError {
    refuse_with(stream, refused.alert(), counters).await;
    HandshakeError::Downgrade(refused)
}

/// Bytes read from the socket while the ClientHello is read, handed to the `Acceptor` a
/// whole record at a time and all kept: the handshake gives them again to rustls's
/// unbuffered connection, and a connection passed through untouched needs every byte.
#[derive(Default)]
pub(super) struct Inbox {
    buf: Vec<u8>,
    /// What the `Acceptor` took: `buf[..fed]`.
    fed: usize,
    /// When the first bytes were read.
    first_read: Option<Instant>,
}

impl Inbox {
    /// Returns once at least one whole record is buffered; `Eof` if the client closes
    /// first.
    pub(super) async fn fill(
        &mut self,
        stream: &TcpStream,
        counters: &TrafficCounters,
    ) -> Result<(), HandshakeError> {
        // A header announcing more than a plaintext record may hold is refused as soon as
        // it is in (see `read_client_hello`), not once its body has come.
        while whole_records(&self.buf[self.fed..]) == 0
            && self
                .next_record_len()
                .is_none_or(|len| len <= MAX_PLAINTEXT)
        {
            self.buf.reserve(4096);
            stream.readable().await?;
            match stream.try_read_buf(&mut self.buf) {
                Ok(0) => return Err(HandshakeError::Eof),
                Ok(n) => {
                    self.first_read.get_or_insert_with(Instant::now);
                    counters.add_in(n);
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                Err(e) => return Err(e.into()),
            }
        }
        Ok(())
    }

    /// Gives `read_tls` the first whole record only. The ClientHello is read this way:
    /// the `Acceptor` takes only the ClientHello from what it holds, and nothing would
    /// process records that came with it (change_cipher_spec in the same segment) until
    /// the client sent more, so they stay here for the handshake's first pass.
    pub(super) fn feed_record(
        &mut self,
        mut read_tls: impl FnMut(&mut dyn io::Read) -> io::Result<usize>,
    ) -> io::Result<()> {
        let whole = whole_records_within(&self.buf[self.fed..], 1);
        let mut rest = &self.buf[self.fed..self.fed + whole];
        while !rest.is_empty() {
            if read_tls(&mut rest)? == 0 {
                break;
            }
        }
        self.fed += whole - rest.len();
        Ok(())
    }

    /// The length of the next record the `Acceptor` has not taken, once its header is in.
    pub(super) fn next_record_len(&self) -> Option<usize> {
        let header = self.buf.get(self.fed..self.fed + 5)?;
        Some(u16::from_be_bytes([header[3], header[4]]) as usize)
    }

    /// When the first bytes were read; `None` before any were.
    pub(super) fn first_read(&self) -> Option<Instant> {
        self.first_read
    }

    /// Every byte read, rustls's or not.
    pub(super) fn into_all(self) -> Vec<u8> {
        self.buf
    }

    /// Every byte read so far.
    pub(super) fn all(&self) -> &[u8] {
        &self.buf
    }
}
