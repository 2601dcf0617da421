//! Kernel TLS: after the handshake the kernel's record layer takes over the socket, so
//! files leave with sendfile(2) and proxied bytes with splice(2) without a copy into
//! user space.
//!
//! The hand-off ([`offload`]): the handshake driver stops rustls at the record that ends
//! the handshake, so what the client sent after it (a request with its Finished, the head
//! of a record) is in terminus's hands. The records are completed and opened by
//! terminus's record layer ([`crate::record`]), their plaintext kept for the HTTP layer,
//! and then the traffic secrets and sequence numbers go to the kernel with
//! `TLS_TX`/`TLS_RX`. The TLS 1.3 NewSessionTickets were already sent by the driver.
//!
//! Whether the kernel can take a connection is decided before anything is changed:
//! [`KernelSupport`] probes each version and cipher once on a loopback connection, and the
//! `tls` ULP is attached before any record is opened. So every "kTLS cannot be used
//! here" is an [`Unavailable`] that hands the handshake back for userspace TLS; only a
//! failure after that loses the connection.
//!
//! KeyUpdate: kernels before 6.14 cannot replace the keys of a TLS 1.3 socket. A client
//! KeyUpdate therefore ends the connection cleanly (close_notify, then FIN) rather than
//! letting the kernel fail on records under keys it does not have. See [`KtlsStream`].

mod splice;
mod stream;
// The kernel's TLS socket options and sendfile/splice: the kTLS system-call boundary.
#[allow(unsafe_code)]
pub(crate) mod sys;

use std::io;
use std::os::fd::AsRawFd;
use std::sync::Arc;

use rustls::server::ServerConnectionData;
use rustls::{CipherSuite, ConnectionTrafficSecrets, ProtocolVersion, SupportedCipherSuite};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

pub use splice::{splice_bidirectional, splice_plain};
pub use stream::KtlsStream;

use crate::handshake::Handshake;
use crate::record::{
    plausible_header, whole_records, KernelKeys, Opened, RecordError, RecordLayer, HEADER_LEN,
};
use crate::stream::TrafficCounters;
use sys::CryptoInfo;

/// Why a connection stays on userspace TLS. Nothing was changed on the socket or the
/// rustls connection, so userspace TLS carries on.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Unavailable {
    #[error("the kernel has no TLS support (no `tls` module: {0})")]
    /// The kernel has no TLS ULP (the `tls` module is not loaded or built).
    NoKernelTls(String),
    #[error("the kernel cannot do {0} with kernel TLS ({1})")]
    /// The kernel does not offer the negotiated cipher (its name, and the kernel's error).
    UnsupportedCipher(&'static str, String),
    #[error("the negotiated cipher suite {0} has no kernel TLS equivalent")]
    /// The negotiated cipher has no kernel equivalent.
    UnknownCipher(&'static str),
}

impl Unavailable {
    /// The metrics label this falls under.
    pub fn cause(&self) -> FallbackCause {
        match self {
            Self::NoKernelTls(_) => FallbackCause::NoKernelTls,
            Self::UnsupportedCipher(..) | Self::UnknownCipher(_) => {
                FallbackCause::UnsupportedCipher
            }
        }
    }
}

/// Why a connection did not get kernel TLS, as a metric label.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FallbackCause {
    /// No kernel TLS.
    NoKernelTls,
    /// A cipher the kernel does not do.
    UnsupportedCipher,
    /// A record could not be completed before the hand-off.
    PendingRecord,
    /// The traffic secrets could not be extracted.
    Secrets,
    /// The kernel refused the keys.
    Setsockopt,
}

impl FallbackCause {
    /// Every cause, in metrics order.
    pub const ALL: [FallbackCause; 5] = [
        Self::NoKernelTls,
        Self::UnsupportedCipher,
        Self::PendingRecord,
        Self::Secrets,
        Self::Setsockopt,
    ];

    /// The cause's name in the `cause` label.
    pub fn name(self) -> &'static str {
        match self {
            Self::NoKernelTls => "no_kernel_tls",
            Self::UnsupportedCipher => "unsupported_cipher",
            Self::PendingRecord => "pending_record",
            Self::Secrets => "secrets",
            Self::Setsockopt => "setsockopt",
        }
    }
}

/// A hand-off that failed after the point of no return.
#[derive(Debug, thiserror::Error)]
pub enum OffloadError {
    #[error("reading the rest of a TLS record before the hand-off: {0}")]
    /// The socket failed.
    Io(#[from] io::Error),
    #[error("TLS error before the hand-off: {0}")]
    /// A record that came with the client's Finished was refused (its alert sent).
    Record(RecordError),
    #[error("taking the traffic keys: {0}")]
    /// The record layer could not be built from the traffic secrets.
    Secrets(RecordError),
    /// The kernel refused the keys.
    #[error("installing the {direction} keys (setsockopt SOL_TLS): {source}")]
    Install {
        /// `TX` or `RX`.
        direction: &'static str,
        /// What setsockopt said.
        source: io::Error,
    },
}

impl OffloadError {
    /// The metrics label this falls under.
    pub fn cause(&self) -> FallbackCause {
        match self {
            Self::Io(_) | Self::Record(_) => FallbackCause::PendingRecord,
            Self::Secrets(_) => FallbackCause::Secrets,
            Self::Install { .. } => FallbackCause::Setsockopt,
        }
    }
}

/// What became of a connection offered to the kernel.
pub enum Offload {
    /// The kernel does the record layer now.
    Kernel(KtlsStream),
    /// The kernel could not take it; the socket and the handshake's keys and unread
    /// bytes are returned intact for userspace TLS.
    Userspace {
        /// Why the kernel could not take it.
        why: Unavailable,
        /// The connection's socket.
        socket: TcpStream,
        /// The handshake, untouched.
        done: Box<Handshake>,
    },
    /// Past the point of no return: the connection is lost.
    Failed(OffloadError),
}

/// The kernel ciphers terminus can hand connections to.
const KERNEL_CIPHERS: [(u16, &str); 3] = [
    (sys::TLS_CIPHER_AES_GCM_128, "AES-128-GCM"),
    (sys::TLS_CIPHER_AES_GCM_256, "AES-256-GCM"),
    (sys::TLS_CIPHER_CHACHA20_POLY1305, "CHACHA20-POLY1305"),
];

/// What this kernel's TLS can do, probed once per process.
#[derive(Debug, Clone)]
pub struct KernelSupport {
    /// Per (TLS 1.2, TLS 1.3) x [`KERNEL_CIPHERS`]: Ok or why not.
    results: [[Result<(), Unavailable>; 3]; 2],
}

impl KernelSupport {
    /// Installs zero keys for every version and cipher on a loopback connection. Takes a
    /// fraction of a millisecond; on a kernel without `tls` the first setsockopt says so.
    pub fn probe() -> Self {
        let probe_one =
            |version: u16, cipher: u16, name: &'static str| -> Result<(), Unavailable> {
                let pair = loopback_pair()
                    .map_err(|e| Unavailable::NoKernelTls(format!("loopback probe: {e}")))?;
                sys::attach_tls_ulp(pair.0.as_raw_fd())
                    .map_err(|e| Unavailable::NoKernelTls(format!("setsockopt TCP_ULP: {e}")))?;
                let (iv, key, salt) = match cipher {
                    sys::TLS_CIPHER_AES_GCM_128 => (8, 16, 4),
                    sys::TLS_CIPHER_AES_GCM_256 => (8, 32, 4),
                    _ => (12, 32, 0),
                };
                let info = CryptoInfo::new(
                    version,
                    cipher,
                    &[0; 12][..iv],
                    &[0; 32][..key],
                    &[0; 4][..salt],
                    0,
                );
                for (direction, label) in [(sys::TLS_TX, "TLS_TX"), (sys::TLS_RX, "TLS_RX")] {
                    sys::set_crypto_info(pair.0.as_raw_fd(), direction, &info).map_err(|e| {
                        Unavailable::UnsupportedCipher(name, format!("setsockopt {label}: {e}"))
                    })?;
                }
                Ok(())
            };
        let results = [sys::TLS_1_2_VERSION, sys::TLS_1_3_VERSION]
            .map(|version| KERNEL_CIPHERS.map(|(cipher, name)| probe_one(version, cipher, name)));
        Self { results }
    }

    /// Support that is known to be absent (for tests and `ktls = "off"`).
    pub fn none(why: &str) -> Self {
        let no = Err(Unavailable::NoKernelTls(why.to_owned()));
        Self {
            results: [
                [no.clone(), no.clone(), no.clone()],
                [no.clone(), no.clone(), no],
            ],
        }
    }

    /// True when at least one version and cipher can be offloaded.
    pub fn any(&self) -> bool {
        self.results.iter().flatten().any(Result::is_ok)
    }

    /// One line for the start-up log.
    pub fn summary(&self) -> String {
        if !self.any() {
            return match &self.results[0][0] {
                Err(e) => format!("unavailable: {e}"),
                Ok(()) => unreachable!(),
            };
        }
        let mut parts = Vec::new();
        for (v, label) in [(0, "TLS1.2"), (1, "TLS1.3")] {
            for (c, (_, name)) in KERNEL_CIPHERS.iter().enumerate() {
                parts.push(match &self.results[v][c] {
                    Ok(()) => format!("{label} {name}"),
                    Err(_) => format!("{label} {name} (no)"),
                });
            }
        }
        format!("available for {}", parts.join(", "))
    }

    /// Whether a connection with `version` and `suite` can be offloaded.
    pub fn check(
        &self,
        version: ProtocolVersion,
        suite: SupportedCipherSuite,
    ) -> Result<(), Unavailable> {
        let name = suite.suite().as_str().unwrap_or("unknown");
        let v = match version {
            ProtocolVersion::TLSv1_2 => 0,
            ProtocolVersion::TLSv1_3 => 1,
            _ => return Err(Unavailable::UnknownCipher(name)),
        };
        let c = kernel_cipher_index(suite.suite()).ok_or(Unavailable::UnknownCipher(name))?;
        self.results[v][c].clone()
    }
}

fn kernel_cipher_index(suite: CipherSuite) -> Option<usize> {
    use CipherSuite::*;
    match suite {
        TLS13_AES_128_GCM_SHA256
        | TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256
        | TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256 => Some(0),
        TLS13_AES_256_GCM_SHA384
        | TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384
        | TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384 => Some(1),
        TLS13_CHACHA20_POLY1305_SHA256
        | TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256
        | TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256 => Some(2),
        _ => None,
    }
}

/// A connected loopback pair; the ULP needs an established connection, so both ends live
/// as long as the probe.
fn loopback_pair() -> io::Result<(std::net::TcpStream, std::net::TcpStream)> {
    let listener = std::net::TcpListener::bind(("127.0.0.1", 0))?;
    let client = std::net::TcpStream::connect(listener.local_addr()?)?;
    let (server, _) = listener.accept()?;
    Ok((client, server))
}

/// Hands a finished handshake to the kernel, or returns it untouched when the kernel
/// cannot take it. `done.pending` may hold records the client sent with its Finished:
/// they are opened here, in userspace (the kernel takes a connection only at a record
/// boundary, and only what it reads itself), the plaintext kept for the application.
pub async fn offload(
    support: &KernelSupport,
    socket: TcpStream,
    done: Handshake,
    counters: Arc<TrafficCounters>,
) -> Offload {
    let (version, suite) = (done.session.version, done.session.suite);
    // The ULP goes on first: it fails where the module is missing (or was unloaded since
    // the probe) and leaves the socket a plain TCP socket until keys are installed.
    let usable = support.check(version, suite).and_then(|()| {
        sys::attach_tls_ulp(socket.as_raw_fd())
            .map_err(|e| Unavailable::NoKernelTls(format!("setsockopt TCP_ULP: {e}")))
    });
    if let Err(why) = usable {
        return Offload::Userspace {
            why,
            socket,
            done: Box::new(done),
        };
    }
    let Handshake {
        secrets,
        kernel,
        pending,
        ..
    } = done;
    let mut socket = socket;
    let result = async {
        let mut layer = RecordLayer::for_kernel(secrets, kernel).map_err(OffloadError::Secrets)?;
        let before = open_pending(&mut socket, &mut layer, pending, &counters).await?;
        let keys = layer
            .into_kernel()
            .expect("a layer built for the kernel keeps its secrets");
        let records_left = confidentiality_limit(suite).saturating_sub(keys.tx.0);
        install(&socket, &keys, version)?;
        Ok::<_, OffloadError>((before, records_left))
    }
    .await;
    match result {
        Ok((before, records_left)) => Offload::Kernel(KtlsStream::new(
            socket,
            before.plaintext,
            before.peer_closed,
            records_left,
            counters,
        )),
        Err(e) => Offload::Failed(e),
    }
}

/// What the records read before the hand-off held.
#[derive(Default)]
struct BeforeHandOff {
    plaintext: Vec<u8>,
    /// They ended with close_notify.
    peer_closed: bool,
}

/// Opens the records read before the hand-off (reading the rest of the last one first:
/// the kernel can only take whole records), sending what the layer answers (a KeyUpdate,
/// an alert) in the clear TCP stream that still carries TLS records: no key is installed
/// yet.
async fn open_pending(
    socket: &mut TcpStream,
    layer: &mut RecordLayer<ServerConnectionData>,
    mut pending: Vec<u8>,
    counters: &TrafficCounters,
) -> Result<BeforeHandOff, OffloadError> {
    let mut before = BeforeHandOff::default();
    if pending.is_empty() {
        return Ok(before);
    }
    // The last record is completed from the socket (those before it came whole). A
    // header no record has is not waited on: the layer refuses it below. (Waiting on it
    // would never end: `whole_records` does not count it, so the loop would go round
    // without reading, the worker spinning.)
    loop {
        let at = whole_records(&pending);
        let want = match pending.get(at..at + HEADER_LEN) {
            _ if at == pending.len() => break,
            None => HEADER_LEN,
            Some(header) if !plausible_header(header) => break,
            Some(header) => HEADER_LEN + u16::from_be_bytes([header[3], header[4]]) as usize,
        };
        let start = pending.len();
        pending.resize(at + want, 0);
        socket.read_exact(&mut pending[start..]).await?;
    }
    counters.add_in(pending.len());
    let mut rest = &mut pending[..];
    while !rest.is_empty() && !before.peer_closed {
        let opened = layer.open_next(rest);
        if let Some(answer) = layer.take_queued() {
            counters.add_out(answer.len());
            socket.write_all(&answer).await?;
        }
        // Every record is whole (completed above) or refused by its header.
        let Some((len, opened)) = opened.map_err(OffloadError::Record)? else {
            return Err(OffloadError::Io(io::ErrorKind::UnexpectedEof.into()));
        };
        match opened {
            Opened::Data(range) => before.plaintext.extend_from_slice(&rest[range]),
            Opened::Control => {}
            Opened::Closed => before.peer_closed = true,
        }
        rest = &mut rest[len..];
    }
    Ok(before)
}

/// Installs `keys` in the kernel, both directions.
fn install(
    socket: &TcpStream,
    keys: &KernelKeys<ServerConnectionData>,
    version: ProtocolVersion,
) -> Result<(), OffloadError> {
    let kernel_version = if version == ProtocolVersion::TLSv1_2 {
        sys::TLS_1_2_VERSION
    } else {
        sys::TLS_1_3_VERSION
    };
    let (tx_seq, tx) = &keys.tx;
    let (rx_seq, rx) = &keys.rx;
    let fd = socket.as_raw_fd();
    for (direction, label, seq, secret) in [
        (sys::TLS_TX, "TLS_TX", *tx_seq, tx),
        (sys::TLS_RX, "TLS_RX", *rx_seq, rx),
    ] {
        let info = crypto_info(kernel_version, direction == sys::TLS_TX, seq, secret);
        sys::set_crypto_info(fd, direction, &info).map_err(|source| OffloadError::Install {
            direction: label,
            source,
        })?;
    }
    Ok(())
}

/// Records one key may protect (rustls refreshes or stops before it; the kernel does not,
/// so [`KtlsStream`] counts).
fn confidentiality_limit(suite: SupportedCipherSuite) -> u64 {
    match suite {
        SupportedCipherSuite::Tls12(s) => s.common.confidentiality_limit,
        SupportedCipherSuite::Tls13(s) => s.common.confidentiality_limit,
    }
}

/// The kernel's `crypto_info` for one direction's secrets.
///
/// TLS 1.2 AES-GCM needs care on transmit: the kernel sends the explicit nonce as a
/// counter it starts at the `iv` we give and increments per record, while rustls used
/// `fixed_iv[4..] XOR seq` for the records it sent (the Finished). Starting the counter
/// at the rustls value for the current sequence number could meet one rustls already
/// used (one record sent with an odd E: the kernel's second nonce would be (E^1)+1 = E),
/// and a GCM nonce used twice under one key is fatal. So the kernel's counter starts just past the whole aligned block of values
/// rustls can have used (see [`kernel_tls12_gcm_nonce_start`]). On receive the nonce is
/// read from each record and only the salt matters.
fn crypto_info(
    version: u16,
    transmit: bool,
    seq: u64,
    secret: &ConnectionTrafficSecrets,
) -> CryptoInfo {
    let (cipher, key, iv) = match secret {
        ConnectionTrafficSecrets::Aes128Gcm { key, iv } => {
            (sys::TLS_CIPHER_AES_GCM_128, key.as_ref(), iv.as_ref())
        }
        ConnectionTrafficSecrets::Aes256Gcm { key, iv } => {
            (sys::TLS_CIPHER_AES_GCM_256, key.as_ref(), iv.as_ref())
        }
        ConnectionTrafficSecrets::Chacha20Poly1305 { key, iv } => {
            return CryptoInfo::new(
                version,
                sys::TLS_CIPHER_CHACHA20_POLY1305,
                iv.as_ref(),
                key.as_ref(),
                &[],
                seq,
            );
        }
        _ => unreachable!("KernelSupport::check admits only kernel ciphers"),
    };
    let (salt, explicit) = iv.split_at(4);
    if version == sys::TLS_1_2_VERSION && transmit {
        let used = u64::from_be_bytes(explicit.try_into().expect("GCM iv is 12 bytes"));
        let start = kernel_tls12_gcm_nonce_start(used, seq);
        return CryptoInfo::new(version, cipher, &start.to_be_bytes(), key, salt, seq);
    }
    CryptoInfo::new(version, cipher, explicit, key, salt, seq)
}

/// The first explicit nonce the kernel may use after rustls sent `sent` records with
/// nonces `base ^ s` (s < sent). Those all lie in the block of `base` aligned to the next
/// power of two >= sent; the kernel counts up from just past it and would only come back
/// after 2^64 records.
fn kernel_tls12_gcm_nonce_start(base: u64, sent: u64) -> u64 {
    let mask = sent.checked_next_power_of_two().map_or(u64::MAX, |p| p - 1);
    (base | mask).wrapping_add(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kernel_gcm_nonces_never_meet_the_ones_rustls_used() {
        for base in [
            0u64,
            1,
            2,
            3,
            0xfe,
            0xff,
            0x1234_5678_9abc_def0,
            u64::MAX - 3,
            u64::MAX,
        ] {
            for sent in 0..40u64 {
                let used: Vec<u64> = (0..sent).map(|s| base ^ s).collect();
                let start = kernel_tls12_gcm_nonce_start(base, sent);
                // The kernel's next 1,000 nonces (and, by the block argument, all of them
                // until the counter wraps around 2^64).
                for k in 0..1000u64 {
                    let n = start.wrapping_add(k);
                    assert!(
                        !used.contains(&n),
                        "base {base:#x} sent {sent}: kernel nonce {n:#x} reused"
                    );
                }
            }
        }
    }

    /// The records that came with the client's Finished are completed from the socket
    /// before the hand-off; a header no record has, after a whole record, is refused at
    /// once rather than waited on. The completing loop once went round for ever on such
    /// a header whose announced body had come (never reading, its worker spinning) and
    /// waited for the rest of one whose body had not.
    #[test]
    fn a_bad_header_after_a_whole_record_is_refused_not_waited_on() {
        use rustls::AlertDescription as A;
        for (header, alert) in [
            // An unknown type, its two announced bytes there: the old spin.
            (&[0x99, 3, 3, 0, 2, 1, 2][..], A::UnexpectedMessage),
            // An unknown type announcing more than came.
            (&[0x99, 3, 3, 0, 10, 1, 2][..], A::UnexpectedMessage),
            // Longer than any record.
            (&[23, 3, 3, 0xff, 0xff, 1, 2][..], A::RecordOverflow),
            // Not TLS.
            (&[23, 0xfe, 0xff, 0, 2, 1, 2][..], A::DecodeError),
        ] {
            assert_eq!(open_pending_with(header), alert, "{header:?}");
        }
    }

    /// What `open_pending` refuses, given a whole application-data record from a real
    /// client followed by `tail`.
    fn open_pending_with(tail: &[u8]) -> rustls::AlertDescription {
        use std::io::Write;

        use crate::record::testing::{all_suites, handshake};

        let (suite, version) = all_suites()[0];
        let mut h = handshake(suite, version);
        h.client.writer().write_all(b"GET / HTTP/1.1\r\n").unwrap();
        let mut pending = Vec::new();
        h.client.write_tls(&mut pending).unwrap();
        pending.extend_from_slice(tail);
        let mut layer = RecordLayer::for_kernel(h.secrets, h.kernel).unwrap();
        let (done, result) = std::sync::mpsc::channel();
        // Its own thread: a spinning future would never let a timeout fire.
        std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async {
                let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
                let _client = TcpStream::connect(listener.local_addr().unwrap())
                    .await
                    .unwrap();
                let (mut socket, _) = listener.accept().await.unwrap();
                let counters = TrafficCounters::default();
                let opened = open_pending(&mut socket, &mut layer, pending, &counters).await;
                let _ = done.send(opened.map(|b| b.plaintext));
            });
        });
        let outcome = result
            .recv_timeout(std::time::Duration::from_secs(10))
            .expect("open_pending returned (it did not spin or wait)");
        match outcome {
            Err(OffloadError::Record(RecordError::Refused { alert, .. })) => alert,
            other => panic!("expected a refusal, got {:?}", other.map(|_| ())),
        }
    }
}
