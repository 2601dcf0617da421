//! A connection's record layer after the handshake: both directions' keys and sequence
//! numbers, the suite's key limits, and the peer's control records.
//!
//! The caller owns every buffer and the socket; this type only seals and opens where the
//! caller points, and keeps the few small control records it must send of its own accord
//! (a KeyUpdate, an alert) until the caller takes them with
//! [`RecordLayer::take_queued`]. Records are sent in the order they were sealed, so the
//! caller takes the queue after every open and every seal and sends it before anything
//! it seals later: a KeyUpdate is sealed under the old key and every later record under
//! the new one.
//!
//! Choices where the RFCs leave one (the module [`super::handshake`] has those about
//! handshake messages):
//! - a KeyUpdate asking for ours is answered at once, sealed under the old key, unless
//!   our write key is already fresh (we sent a KeyUpdate and no application data since):
//!   RFC 8446 4.6.3 has a peer that sends several while we are silent get one answer;
//! - more than 32 KeyUpdates without application data between them are refused
//!   (unexpected_message), as BoringSSL and rustls do: each costs a key derivation;
//! - TLS 1.2 warning alerts, and TLS 1.3's user_canceled, are tolerated, 4 at most (as
//!   rustls); every other alert but close_notify ends the connection, without an alert
//!   back (RFC 8446 6.2);
//! - a record after close_notify is not read ([`RecordError::AfterClose`]) and answered
//!   with nothing (RFC 8446 6.1: "MUST be ignored");
//! - TLS 1.3 sends its own KeyUpdate when the write key has one record left under its
//!   limit (the suite's confidentiality limit, 2^24.5 records for AES-GCM, or 2^64 - 1);
//!   TLS 1.2 has no KeyUpdate, so it refuses application data once one record is left,
//!   and keeps that one for close_notify.

use std::io::IoSlice;
use std::ops::Range;

use rustls::client::ClientConnectionData;
use rustls::kernel::KernelConnection;
use rustls::server::ServerConnectionData;
use rustls::{
    AlertDescription, ConnectionTrafficSecrets, ContentType, ExtractedSecrets, HandshakeType,
    ProtocolVersion, SupportedCipherSuite,
};

use super::cipher::{RecordCipher, Version, HEADER_LEN, MAX_PLAINTEXT};
use super::handshake::Reassembly;
use super::RecordError;

/// KeyUpdates in a row (no application data between them) before the peer is refused.
const MAX_KEY_UPDATES_IN_A_ROW: u8 = 32;
/// Warning alerts tolerated over the connection's life.
const MAX_WARNINGS: u8 = 4;
/// TLS 1.3's limit on a ciphertext (RFC 8446 5.2).
const TLS13_MAX_CIPHERTEXT: usize = MAX_PLAINTEXT + 256;
/// TLS 1.2's limit on a ciphertext (RFC 5246 6.2.3).
const TLS12_MAX_CIPHERTEXT: usize = MAX_PLAINTEXT + 2048;

/// What opening one record gave.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Opened {
    /// Application data, at this range of the record's buffer (it may be empty).
    Data(Range<usize>),
    /// A control record, handled: a KeyUpdate (or part of one), a tolerated warning.
    /// [`RecordLayer::take_queued`] may hold an answer.
    Control,
    /// The peer's close_notify: no more data comes.
    Closed,
}

/// The side of the connection this layer is: what post-handshake handshake messages it
/// takes from its peer. Implemented for rustls's server and client data only.
pub trait Side: private::Sealed + Sized {
    /// The handshake message a TLS 1.2 peer renegotiates with: a ClientHello at a server,
    /// a HelloRequest at a client. Answered with a warning no_renegotiation, once.
    const RENEGOTIATION: HandshakeType;
    /// Longest post-handshake handshake message (header included) held while it arrives.
    const MAX_MESSAGE: usize;
    /// Whether a TLS 1.3 post-handshake message of this type is taken (KeyUpdate always).
    fn accepts(typ: HandshakeType) -> bool;
    /// Handles a TLS 1.3 post-handshake message other than KeyUpdate that
    /// [`Side::accepts`].
    fn handle(
        kernel: &mut KernelConnection<Self>,
        typ: HandshakeType,
        body: &[u8],
    ) -> Result<(), RecordError>;
}

mod private {
    pub trait Sealed {}
    impl Sealed for rustls::server::ServerConnectionData {}
    impl Sealed for rustls::client::ClientConnectionData {}
}

/// A server takes nothing but KeyUpdate after the handshake: it asks for no
/// post-handshake authentication, and a client has no tickets to give.
impl Side for ServerConnectionData {
    const RENEGOTIATION: HandshakeType = HandshakeType::ClientHello;
    const MAX_MESSAGE: usize = 4 + 1;

    fn accepts(typ: HandshakeType) -> bool {
        typ == HandshakeType::KeyUpdate
    }

    fn handle(
        _: &mut KernelConnection<Self>,
        _: HandshakeType,
        _: &[u8],
    ) -> Result<(), RecordError> {
        Err(RecordError::Unsupported("a server takes no other message"))
    }
}

/// A client (terminus's tests) takes the server's session tickets too.
impl Side for ClientConnectionData {
    const RENEGOTIATION: HandshakeType = HandshakeType::HelloRequest;
    const MAX_MESSAGE: usize = 64 * 1024;

    fn accepts(typ: HandshakeType) -> bool {
        matches!(
            typ,
            HandshakeType::KeyUpdate | HandshakeType::NewSessionTicket
        )
    }

    fn handle(
        kernel: &mut KernelConnection<Self>,
        _: HandshakeType,
        body: &[u8],
    ) -> Result<(), RecordError> {
        kernel
            .handle_new_session_ticket(body)
            .map_err(|_| RecordError::Refused {
                alert: AlertDescription::DecodeError,
                reason: "a NewSessionTicket rustls could not take",
            })
    }
}

/// One direction: its key and the sequence number of its next record.
struct Direction {
    cipher: RecordCipher,
    seq: u64,
    /// The secret the key came from, kept only by a layer that hands over to the kernel
    /// ([`RecordLayer::for_kernel`]).
    secret: Option<ConnectionTrafficSecrets>,
}

/// Shows the sequence number, never the secret.
impl std::fmt::Debug for Direction {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Direction")
            .field("cipher", &self.cipher)
            .field("seq", &self.seq)
            .field("secret_kept", &self.secret.is_some())
            .finish()
    }
}

impl Direction {
    fn new(
        (seq, secret): (u64, ConnectionTrafficSecrets),
        v: Version,
        keep: bool,
    ) -> Result<Self, RecordError> {
        Ok(Self {
            cipher: RecordCipher::new(&secret, v)?,
            seq,
            secret: keep.then_some(secret),
        })
    }
}

/// What the kernel's record layer takes over from a [`RecordLayer::for_kernel`]: each
/// direction's secret with the sequence number of its next record, and rustls's
/// [`KernelConnection`] for the traffic secrets after a KeyUpdate.
pub struct KernelKeys<Data> {
    /// rustls's side of the connection, for KeyUpdate.
    pub kernel: KernelConnection<Data>,
    /// The write direction: next sequence number and secret.
    pub tx: (u64, ConnectionTrafficSecrets),
    /// The read direction: next sequence number and secret.
    pub rx: (u64, ConnectionTrafficSecrets),
}

/// The record layer of one connection after its handshake; `Data` is rustls's
/// [`ServerConnectionData`] (terminus's server) or [`ClientConnectionData`] (tests).
pub struct RecordLayer<Data> {
    kernel: KernelConnection<Data>,
    version: Version,
    suite: SupportedCipherSuite,
    tx: Direction,
    rx: Direction,
    /// Whether each direction keeps its secret (see [`RecordLayer::for_kernel`]).
    keep_secrets: bool,
    /// Records one key may seal or open: the suite's confidentiality limit, or less.
    key_limit: u64,
    /// No application data sealed since our last KeyUpdate: a request needs no new one.
    tx_fresh: bool,
    close_notify_sent: bool,
    close_notify_received: bool,
    /// Why the connection failed: every later call says it again.
    failed: Option<RecordError>,
    /// Control records sealed of our own accord, waiting for the caller.
    queued: Vec<u8>,
    /// A handshake message arriving across records.
    pub(super) reassembly: Reassembly,
    key_updates_in_a_row: u8,
    warnings: u8,
    pub(super) renegotiations: u8,
}

impl<Data> std::fmt::Debug for RecordLayer<Data> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RecordLayer")
            .field("version", &self.version)
            .field("suite", &self.suite.suite())
            .field("tx_seq", &self.tx.seq)
            .field("rx_seq", &self.rx.seq)
            .field("close_notify_sent", &self.close_notify_sent)
            .field("close_notify_received", &self.close_notify_received)
            .finish_non_exhaustive()
    }
}

impl<Data: Side> RecordLayer<Data> {
    /// Takes over from rustls: `secrets` and `kernel` are what
    /// `dangerous_into_kernel_connection` returned.
    pub fn new(
        secrets: ExtractedSecrets,
        kernel: KernelConnection<Data>,
    ) -> Result<Self, RecordError> {
        Self::build(secrets, kernel, false)
    }

    /// [`RecordLayer::new`], for a connection about to be handed to the kernel: the
    /// layer opens what came before the hand-off (the records that came with the
    /// client's Finished, KeyUpdates among them), keeping each direction's secret until
    /// [`RecordLayer::into_kernel`] gives them up. A layer that stays in userspace keeps
    /// only the keys.
    pub fn for_kernel(
        secrets: ExtractedSecrets,
        kernel: KernelConnection<Data>,
    ) -> Result<Self, RecordError> {
        Self::build(secrets, kernel, true)
    }

    /// The secrets and sequence numbers, for the kernel to go on from; `None` for a
    /// layer built by [`RecordLayer::new`], which kept no secret.
    pub fn into_kernel(self) -> Option<KernelKeys<Data>> {
        let tx = (self.tx.seq, self.tx.secret?);
        let rx = (self.rx.seq, self.rx.secret?);
        Some(KernelKeys {
            kernel: self.kernel,
            tx,
            rx,
        })
    }

    fn build(
        secrets: ExtractedSecrets,
        kernel: KernelConnection<Data>,
        keep_secrets: bool,
    ) -> Result<Self, RecordError> {
        let version = match kernel.protocol_version() {
            ProtocolVersion::TLSv1_3 => Version::Tls13,
            ProtocolVersion::TLSv1_2 => Version::Tls12,
            _ => {
                return Err(RecordError::Unsupported(
                    "a version other than TLS 1.2 or 1.3",
                ))
            }
        };
        let suite = kernel.negotiated_cipher_suite();
        let key_limit = match suite {
            SupportedCipherSuite::Tls13(s) => s.common.confidentiality_limit,
            SupportedCipherSuite::Tls12(s) => s.common.confidentiality_limit,
        };
        Ok(Self {
            tx: Direction::new(secrets.tx, version, keep_secrets)?,
            rx: Direction::new(secrets.rx, version, keep_secrets)?,
            keep_secrets,
            kernel,
            version,
            suite,
            key_limit,
            tx_fresh: false,
            close_notify_sent: false,
            close_notify_received: false,
            failed: None,
            queued: Vec::new(),
            reassembly: Reassembly::default(),
            key_updates_in_a_row: 0,
            warnings: 0,
            renegotiations: 0,
        })
    }

    /// Moves both directions' next sequence numbers, as if that many records had gone
    /// under the current keys: the tests of the sequence space's end, which no
    /// connection reaches in a test's time.
    #[cfg(test)]
    pub(crate) fn jump_sequences_for_tests(&mut self, tx: u64, rx: u64) {
        self.tx.seq = tx;
        self.rx.seq = rx;
    }

    /// Lowers the records one key may seal to `records` (never above the suite's
    /// confidentiality limit, nor below what the current key has sealed plus two): keys
    /// change sooner in TLS 1.3, and a TLS 1.2 connection must close sooner. Tests use it
    /// to reach the limit.
    pub fn with_key_limit(mut self, records: u64) -> Self {
        let floor = self.tx.seq.saturating_add(2);
        self.key_limit = self.key_limit.min(records.max(floor));
        self
    }

    /// The protocol version.
    pub fn version(&self) -> Version {
        self.version
    }

    /// The negotiated cipher suite.
    pub fn suite(&self) -> SupportedCipherSuite {
        self.suite
    }

    /// Sequence number of the next record sealed.
    pub fn tx_seq(&self) -> u64 {
        self.tx.seq
    }

    /// Sequence number of the next record opened.
    pub fn rx_seq(&self) -> u64 {
        self.rx.seq
    }

    /// Whether close_notify was sealed.
    pub fn close_notify_sent(&self) -> bool {
        self.close_notify_sent
    }

    /// Whether the peer's close_notify was opened.
    pub fn close_notify_received(&self) -> bool {
        self.close_notify_received
    }

    /// Bytes before the plaintext of a record [`RecordLayer::seal_in_place`] seals.
    pub fn prefix_len(&self) -> usize {
        self.tx.cipher.prefix_len()
    }

    /// Bytes after the plaintext of a record [`RecordLayer::seal_in_place`] seals.
    pub fn suffix_len(&self) -> usize {
        self.tx.cipher.suffix_len()
    }

    /// Whether control records wait for [`RecordLayer::take_queued`].
    pub fn has_queued(&self) -> bool {
        !self.queued.is_empty()
    }

    /// The control records sealed of our own accord (KeyUpdate, alerts), in order: send
    /// them before any record sealed after this call.
    pub fn take_queued(&mut self) -> Option<Vec<u8>> {
        (!self.queued.is_empty()).then(|| std::mem::take(&mut self.queued))
    }
}

/// Opening.
impl<Data: Side> RecordLayer<Data> {
    /// Opens the record at the start of `bytes` once it is whole: its length, header
    /// included, and what it held (a data range within `bytes`); `None` while its header
    /// or body is still arriving. A header is judged as soon as it has come.
    pub fn open_next(&mut self, bytes: &mut [u8]) -> Result<Option<(usize, Opened)>, RecordError> {
        let Some(header) = bytes.get(..HEADER_LEN) else {
            return Ok(None);
        };
        let len = HEADER_LEN + self.check_header(header.try_into().expect("a header"))?;
        let Some(record) = bytes.get_mut(..len) else {
            return Ok(None);
        };
        Ok(Some((len, self.open_in_place(record)?)))
    }

    /// Checks a record's header before its body is read: the length of its body, or a
    /// refusal (an unexpected content type, not TLS, longer than the protocol allows).
    pub fn check_header(&mut self, header: &[u8; HEADER_LEN]) -> Result<usize, RecordError> {
        self.usable_for_open()?;
        let len = u16::from_be_bytes([header[3], header[4]]) as usize;
        let typ = ContentType::from(header[0]);
        let overhead = self.rx.cipher.prefix_len() - HEADER_LEN + self.rx.cipher.suffix_len();
        let refusal = if header[1] != 3 {
            Some((AlertDescription::DecodeError, "not a TLS record"))
        } else if !self.expected_outer_type(typ) {
            Some((
                AlertDescription::UnexpectedMessage,
                "an unexpected record type after the handshake",
            ))
        } else if len > self.max_ciphertext() {
            Some((
                AlertDescription::RecordOverflow,
                "a record longer than the protocol allows",
            ))
        } else if self.version == Version::Tls12 && len > MAX_PLAINTEXT + overhead {
            Some((
                AlertDescription::RecordOverflow,
                "more than 2^14 bytes of plaintext in a record",
            ))
        } else {
            None
        };
        match refusal {
            Some((alert, reason)) => Err(self.refuse(alert, reason)),
            None => Ok(len),
        }
    }

    /// Opens one whole record (`record`: header and body) in place.
    pub fn open_in_place(&mut self, record: &mut [u8]) -> Result<Opened, RecordError> {
        let header: [u8; HEADER_LEN] = match record.get(..HEADER_LEN) {
            Some(h) => h.try_into().expect("five bytes"),
            None => return Err(RecordError::Unsupported("less than a record header")),
        };
        let len = self.check_header(&header)?;
        if record.len() != HEADER_LEN + len {
            return Err(RecordError::Unsupported("not exactly one record"));
        }
        // Stricter than RFC 8446 5.3 by one record: 2^64 - 1 is refused too (after it the
        // count would wrap), which no peer reaches: they change keys or close long before.
        if self.rx.seq == u64::MAX {
            return Err(self.refuse(
                AlertDescription::InternalError,
                "the read sequence would wrap",
            ));
        }
        let opened = self.rx.cipher.open(self.rx.seq, record);
        let (typ, range) = opened.map_err(|e| self.fail(e))?;
        self.rx.seq += 1;
        let result = self.dispatch(typ, &record[range.clone()]);
        result.map(|handled| handled.unwrap_or(Opened::Data(range)))
    }

    /// What a record of this type carries; `None` for application data (the caller's).
    fn dispatch(&mut self, typ: ContentType, body: &[u8]) -> Result<Option<Opened>, RecordError> {
        if typ != ContentType::Handshake && self.reassembly.is_partial() {
            return Err(self.refuse(
                AlertDescription::UnexpectedMessage,
                "a record inside a handshake message",
            ));
        }
        match typ {
            ContentType::ApplicationData => {
                self.key_updates_in_a_row = 0;
                Ok(None)
            }
            ContentType::Alert => self.alert(body).map(Some),
            ContentType::Handshake => self.handshake(body).map(|()| Some(Opened::Control)),
            _ => Err(self.refuse(
                AlertDescription::UnexpectedMessage,
                "an unexpected content type after the handshake",
            )),
        }
    }

    /// The peer's alert: close_notify, a tolerated warning, or the end.
    fn alert(&mut self, body: &[u8]) -> Result<Opened, RecordError> {
        let &[level, description] = body else {
            return Err(self.refuse(
                AlertDescription::DecodeError,
                "an alert record not 2 bytes long",
            ));
        };
        let description = AlertDescription::from(description);
        if level != 1 && level != 2 {
            return Err(self.refuse(
                AlertDescription::IllegalParameter,
                "an alert of unknown level",
            ));
        }
        if description == AlertDescription::CloseNotify {
            self.close_notify_received = true;
            return Ok(Opened::Closed);
        }
        let tolerated = level == 1
            && (self.version == Version::Tls12 || description == AlertDescription::UserCanceled);
        if !tolerated {
            return Err(self.fail(RecordError::PeerAlert(description)));
        }
        self.warnings += 1;
        if self.warnings > MAX_WARNINGS {
            return Err(self.refuse(
                AlertDescription::UnexpectedMessage,
                "too many warning alerts",
            ));
        }
        Ok(Opened::Control)
    }

    /// The peer's KeyUpdate (RFC 8446 4.6.3): our answer first if it asks for one, then
    /// its new key.
    pub(super) fn key_update(&mut self, request: u8) -> Result<(), RecordError> {
        self.key_updates_in_a_row += 1;
        if self.key_updates_in_a_row > MAX_KEY_UPDATES_IN_A_ROW {
            return Err(self.refuse(
                AlertDescription::UnexpectedMessage,
                "too many KeyUpdates without application data",
            ));
        }
        match request {
            0 => {}
            1 if self.tx_fresh || self.close_notify_sent => {}
            1 => self.send_key_update()?,
            _ => {
                return Err(self.refuse(
                    AlertDescription::IllegalParameter,
                    "a KeyUpdate of unknown value",
                ))
            }
        }
        let next = self.kernel.update_rx_secret().map_err(|_| {
            self.refuse(
                AlertDescription::InternalError,
                "rustls refused the next read key",
            )
        })?;
        self.rx =
            Direction::new(next, self.version, self.keep_secrets).map_err(|e| self.fail(e))?;
        Ok(())
    }

    /// A TLS 1.3 post-handshake message other than KeyUpdate, that the side accepts.
    pub(super) fn other_message(
        &mut self,
        typ: HandshakeType,
        body: &[u8],
    ) -> Result<(), RecordError> {
        Data::handle(&mut self.kernel, typ, body).map_err(|e| self.fail(e))
    }

    fn expected_outer_type(&self, typ: ContentType) -> bool {
        match self.version {
            Version::Tls13 => typ == ContentType::ApplicationData,
            Version::Tls12 => matches!(
                typ,
                ContentType::ApplicationData | ContentType::Alert | ContentType::Handshake
            ),
        }
    }

    fn max_ciphertext(&self) -> usize {
        match self.version {
            Version::Tls13 => TLS13_MAX_CIPHERTEXT,
            Version::Tls12 => TLS12_MAX_CIPHERTEXT,
        }
    }

    fn usable_for_open(&self) -> Result<(), RecordError> {
        match &self.failed {
            Some(e) => Err(e.clone()),
            None if self.close_notify_received => Err(RecordError::AfterClose),
            None => Ok(()),
        }
    }

    /// Refuses the peer with a fatal `alert`, queued for it (best effort).
    pub(super) fn refuse(&mut self, alert: AlertDescription, reason: &'static str) -> RecordError {
        self.fail(RecordError::Refused { alert, reason })
    }

    /// Ends the connection with `e`; a refusal's alert is queued first.
    fn fail(&mut self, e: RecordError) -> RecordError {
        if self.failed.is_none() {
            if let (Some(alert), false) = (e.alert(), self.close_notify_sent) {
                // Best effort: spent or closed keys only mean the peer is not told why.
                let _ = self.seal_control(ContentType::Alert, &[2, alert.into()]);
            }
            self.failed = Some(e.clone());
        }
        self.failed.clone().unwrap_or(e)
    }
}

/// Sealing.
impl<Data: Side> RecordLayer<Data> {
    /// Seals one application-data record in place: its plaintext is
    /// `record[prefix_len()..record.len() - suffix_len()]`, at most 2^14 bytes; the rest
    /// is room for the header, explicit nonce, inner type and tag. Take
    /// [`RecordLayer::take_queued`] before (it goes first) and after (a KeyUpdate the
    /// limit forced follows this record).
    pub fn seal_in_place(&mut self, record: &mut [u8]) -> Result<(), RecordError> {
        debug_assert!(
            self.queued.is_empty(),
            "queued control records must leave first"
        );
        self.usable_for_seal()?;
        if self.version == Version::Tls12 && self.tx.seq.saturating_add(1) >= self.key_limit {
            return Err(RecordError::KeysExhausted);
        }
        self.seal_with_key(ContentType::ApplicationData, record)?;
        self.tx_fresh = false;
        // The last record under the limit is the KeyUpdate's. Alerts need no such care:
        // TLS 1.3 sends none but close_notify and fatal ones, after which nothing follows.
        if self.version == Version::Tls13 && self.tx.seq.saturating_add(1) >= self.key_limit {
            self.send_key_update()?;
        }
        Ok(())
    }

    /// Seals `bufs` (all of it) as application-data records of at most 2^14 bytes,
    /// appended to `out` after any queued control records, and followed by any
    /// KeyUpdate a key's limit forced. Returns the plaintext bytes sealed.
    pub fn seal_vectored(
        &mut self,
        bufs: &[IoSlice<'_>],
        out: &mut Vec<u8>,
    ) -> Result<usize, RecordError> {
        self.drain_queued(out);
        let total: usize = bufs.iter().map(|b| b.len()).sum();
        let (prefix, suffix) = (self.prefix_len(), self.suffix_len());
        let mut chunks = bufs.iter().flat_map(|b| b.chunks(MAX_PLAINTEXT)).peekable();
        while chunks.peek().is_some() {
            let start = out.len();
            out.resize(start + prefix, 0);
            while let Some(chunk) = chunks.peek() {
                let room = MAX_PLAINTEXT - (out.len() - start - prefix);
                if room == 0 {
                    break;
                }
                let n = chunk.len().min(room);
                out.extend_from_slice(&chunk[..n]);
                if n == chunk.len() {
                    chunks.next();
                } else {
                    let rest = &chunk[n..];
                    *chunks.peek_mut().expect("peeked") = rest;
                }
            }
            out.resize(out.len() + suffix, 0);
            if let Err(e) = self.seal_in_place(&mut out[start..]) {
                // No plaintext is left behind in what the caller would send.
                out.truncate(start);
                return Err(e);
            }
            self.drain_queued(out);
        }
        Ok(total)
    }

    /// Queues close_notify: nothing is sealed after it.
    pub fn seal_close_notify(&mut self) -> Result<(), RecordError> {
        self.usable_for_seal()?;
        self.seal_control(
            ContentType::Alert,
            &[1, AlertDescription::CloseNotify.into()],
        )?;
        self.close_notify_sent = true;
        Ok(())
    }

    /// Queues a fatal `alert` (the connection fails): for the caller's own reasons to end
    /// a connection, such as a timeout.
    pub fn seal_fatal_alert(&mut self, alert: AlertDescription) -> Result<(), RecordError> {
        self.usable_for_seal()?;
        let _ = self.refuse(alert, "ended by terminus");
        Ok(())
    }

    /// Queues a warning `alert` (the connection goes on).
    pub(super) fn seal_warning(&mut self, alert: AlertDescription) -> Result<(), RecordError> {
        self.seal_control(ContentType::Alert, &[1, alert.into()])
    }

    /// Queues a KeyUpdate(update_not_requested) under the current key, then moves to the
    /// next one.
    fn send_key_update(&mut self) -> Result<(), RecordError> {
        self.seal_control(
            ContentType::Handshake,
            &[HandshakeType::KeyUpdate.into(), 0, 0, 1, 0],
        )?;
        let next = self.kernel.update_tx_secret().map_err(|_| {
            self.fail(RecordError::Unsupported(
                "rustls refused the next write key",
            ))
        })?;
        self.tx =
            Direction::new(next, self.version, self.keep_secrets).map_err(|e| self.fail(e))?;
        self.tx_fresh = true;
        Ok(())
    }

    /// Seals a small control record into the queue.
    fn seal_control(&mut self, typ: ContentType, body: &[u8]) -> Result<(), RecordError> {
        let (prefix, suffix) = (self.prefix_len(), self.suffix_len());
        let mut record = vec![0; prefix + body.len() + suffix];
        record[prefix..prefix + body.len()].copy_from_slice(body);
        self.seal_with_key(typ, &mut record)?;
        self.queued.extend_from_slice(&record);
        Ok(())
    }

    /// Seals record `tx.seq` under the current key, if the key's limit allows it.
    fn seal_with_key(&mut self, typ: ContentType, record: &mut [u8]) -> Result<(), RecordError> {
        if self.tx.seq >= self.key_limit {
            return Err(RecordError::KeysExhausted);
        }
        self.tx.cipher.seal(self.tx.seq, typ, record)?;
        self.tx.seq += 1;
        Ok(())
    }

    fn drain_queued(&mut self, out: &mut Vec<u8>) {
        out.append(&mut self.queued);
    }

    fn usable_for_seal(&self) -> Result<(), RecordError> {
        if self.failed.is_some() || self.close_notify_sent {
            return Err(RecordError::Closed);
        }
        Ok(())
    }
}
