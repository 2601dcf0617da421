//! The handshake driver: socket I/O around rustls, with crypto suspended to the engine.

use std::io;
use std::sync::Arc;
use std::time::Instant;

use rustls::kernel::KernelConnection;
use rustls::pki_types::CertificateDer;
use rustls::server::{AcceptedAlert, ServerConnectionData, UnbufferedServerConnection};
use rustls::unbuffered::{ConnectionState, EncodeError, EncodeTlsData};
use rustls::{
    AlertDescription, ExtractedSecrets, HandshakeKind, ProtocolVersion, ServerConfig,
    SupportedCipherSuite,
};
use terminus_engine::{Engine, HandshakeContext};
use tokio::net::TcpStream;

use super::bridge;
use super::hello::ClientHelloRead;
use super::HandshakeError;
use crate::record::whole_records_within;
use crate::stream::TrafficCounters;

/// A completed handshake, its records' keys taken from rustls: what the record layer
/// (terminus's in userspace, or the kernel's) goes on with.
pub struct Handshake {
    /// What the handshake settled.
    pub session: Session,
    /// The traffic secrets, each with its next sequence number.
    pub secrets: ExtractedSecrets,
    /// What derives the next traffic secrets at a KeyUpdate.
    pub kernel: KernelConnection<ServerConnectionData>,
    /// Bytes read after the record that completed the handshake, which rustls did not
    /// see: whole records (the client may send its request with its Finished) and the
    /// head of one more.
    pub pending: Vec<u8>,
}

/// What a handshake settled, read from rustls before its keys were taken.
#[derive(Debug, Clone)]
pub struct Session {
    /// TLS 1.2 or 1.3.
    pub version: ProtocolVersion,
    /// The cipher suite.
    pub suite: SupportedCipherSuite,
    /// Whether ALPN chose `h2`.
    pub h2: bool,
    /// Full or resumed.
    pub kind: HandshakeKind,
    /// The client's certificate chain, where it showed one (or a resumed session
    /// restored one).
    pub peer_certificates: Option<Vec<CertificateDer<'static>>>,
}

/// Completes the handshake that `hello` began, with `config`, over `stream`, on rustls's
/// unbuffered connection, ending with the traffic secrets and rustls's
/// [`KernelConnection`] instead of a rustls connection that keeps its buffers for the
/// connection's life. The ClientHello the `Acceptor` parsed is processed again
/// by the unbuffered connection (a few microseconds): rustls offers no unbuffered
/// acceptor, and the configuration can only be chosen once SNI is known.
///
/// Everything rustls computes (the ClientHello's answer, then each of the client's
/// flights) runs on a coroutine, so that the signer and key exchange can wait on `engine`
/// without blocking the worker; their requests are charged to `ctx`, whose timeline also
/// gets each flight and the end. On a TLS error the alert rustls queued is sent before
/// returning. rustls is offered
/// one whole record at a time and nothing after the handshake's last (see
/// `Flight::advance`).
pub async fn handshake(
    stream: &TcpStream,
    hello: ClientHelloRead,
    config: Arc<ServerConfig>,
    engine: &Engine,
    ctx: &HandshakeContext,
    counters: &TrafficCounters,
) -> Result<Handshake, HandshakeError> {
    let ClientHelloRead {
        inbox, _in_flight, ..
    } = hello;
    let conn = UnbufferedServerConnection::new(config).map_err(HandshakeError::Tls)?;
    let mut flight = Box::new(Flight {
        conn,
        incoming: inbox.into_all(),
        consumed: 0,
        offered: 0,
        out: Vec::new(),
    });
    loop {
        // Boxed across the coroutine: corosensei copies what crosses it through the new
        // stack, which takes only small values.
        let (returned, progress) = bridge::run(
            move || {
                let progress = flight.advance();
                (flight, progress)
            },
            |op| engine.submit(op, ctx),
        )
        .await;
        flight = returned;
        if !flight.out.is_empty() {
            counters.add_out(flight.out.len());
            ctx.flight(flight.out.len());
            let sent = write_all(stream, &flight.out).await;
            flight.out.clear();
            sent?;
        }
        match progress {
            Progress::Done => break,
            Progress::NeedsBytes => {
                let waiting = Instant::now();
                flight.read_more(stream, counters).await?;
                ctx.waited_for_client(waiting);
            }
            Progress::Failed(e, alerted) => {
                if alerted {
                    linger(stream).await;
                } else {
                    // rustls refused without queueing an alert (see `fallback_alert`).
                    // Once the handshake is encrypted the alert is owed sealed, under keys
                    // rustls keeps when it fails; it goes in the clear, which clients
                    // read (tlslite, OpenSSL, rustls take a plaintext alert), rather
                    // than none.
                    refuse_with(stream, fallback_alert(&e), counters).await;
                }
                return Err(e.into());
            }
        }
    }
    ctx.finished();
    flight.into_completed()
}

/// The handshake between flights: rustls's connection, the bytes read, what to send.
struct Flight {
    conn: UnbufferedServerConnection,
    /// Bytes read; rustls has done with `incoming[..consumed]`.
    incoming: Vec<u8>,
    consumed: usize,
    /// Whole records past `consumed` that rustls has been offered.
    offered: usize,
    /// Records to send before waiting on the client again.
    out: Vec<u8>,
}

/// Where [`Flight::advance`] stopped.
enum Progress {
    /// rustls waits for the client's next records.
    NeedsBytes,
    /// The handshake is complete and everything rustls had to send is in `out`.
    Done,
    /// rustls refused the handshake; `true` when its alert is in `out`.
    Failed(rustls::Error, bool),
}

impl Flight {
    /// Lets rustls process the records read, one whole record more at a time, and queue
    /// what it answers, until it needs the client's next records or the handshake is
    /// complete. rustls sees no record after the one that completes the handshake: the
    /// record layer after it is not rustls's, and application data the client sent with
    /// its Finished (a TLS 1.2 resumption, or a client that does not wait) stays in
    /// `incoming` for it.
    fn advance(&mut self) -> Progress {
        loop {
            let end = self.consumed + self.offered;
            let status = self
                .conn
                .process_tls_records(&mut self.incoming[self.consumed..end]);
            self.consumed += status.discard;
            self.offered -= status.discard.min(self.offered);
            let blocked = match status.state {
                Ok(ConnectionState::EncodeTlsData(mut data)) => {
                    encode(&mut data, &mut self.out);
                    false
                }
                // The records queued so far leave when `advance` returns.
                Ok(ConnectionState::TransmitTlsData(data)) => {
                    data.done();
                    false
                }
                // The end of what was offered (nothing, at first), or a handshake
                // message that continues in the next record.
                Ok(ConnectionState::BlockedHandshake) => true,
                // Also said before the end of a TLS 1.3 handshake that sends half-RTT
                // data: only the handshake's end is the end.
                Ok(ConnectionState::WriteTraffic(_)) => true,
                Ok(other) => {
                    let e = rustls::Error::General(format!("unexpected state {other:?}"));
                    return self.failed(e);
                }
                Err(e) => return self.failed(e),
            };
            if blocked {
                if !self.conn.is_handshaking() {
                    return Progress::Done;
                }
                if !self.offer_next() {
                    return Progress::NeedsBytes;
                }
            }
        }
    }

    /// Offers rustls the next whole record read, if there is one.
    fn offer_next(&mut self) -> bool {
        let from = self.consumed + self.offered;
        let next = whole_records_within(&self.incoming[from..], 1);
        self.offered += next;
        next > 0
    }

    /// rustls failed with `e`: the alert it queued, if any, goes to `out`.
    fn failed(&mut self, e: rustls::Error) -> Progress {
        let before = self.out.len();
        // The same bytes again: rustls's deframer keeps its progress through them.
        let end = self.consumed + self.offered;
        loop {
            let status = self
                .conn
                .process_tls_records(&mut self.incoming[self.consumed..end]);
            match status.state {
                Ok(ConnectionState::EncodeTlsData(mut data)) => encode(&mut data, &mut self.out),
                Ok(ConnectionState::TransmitTlsData(data)) => data.done(),
                _ => break,
            }
        }
        let alerted = self.out.len() > before;
        Progress::Failed(e, alerted)
    }

    /// Reads what the client sent next, dropping what rustls has done with first.
    async fn read_more(
        &mut self,
        stream: &TcpStream,
        counters: &TrafficCounters,
    ) -> Result<(), HandshakeError> {
        self.incoming.drain(..self.consumed);
        self.consumed = 0;
        self.incoming.reserve(4096);
        loop {
            stream.readable().await?;
            match stream.try_read_buf(&mut self.incoming) {
                Ok(0) => return Err(HandshakeError::Eof),
                Ok(n) => {
                    counters.add_in(n);
                    return Ok(());
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                Err(e) => return Err(e.into()),
            }
        }
    }

    fn into_completed(self) -> Result<Handshake, HandshakeError> {
        let Flight {
            conn,
            mut incoming,
            consumed,
            ..
        } = self;
        let incomplete = || rustls::Error::HandshakeNotComplete;
        let session = Session {
            version: conn.protocol_version().ok_or_else(incomplete)?,
            suite: conn.negotiated_cipher_suite().ok_or_else(incomplete)?,
            h2: conn.alpn_protocol() == Some(b"h2"),
            kind: conn.handshake_kind().ok_or_else(incomplete)?,
            peer_certificates: conn.peer_certificates().map(<[_]>::to_vec),
        };
        let (secrets, kernel) = conn
            .dangerous_into_kernel_connection()
            .map_err(HandshakeError::Tls)?;
        incoming.drain(..consumed);
        Ok(Handshake {
            session,
            secrets,
            kernel,
            pending: incoming,
        })
    }
}

/// Appends the record rustls encoded to `out`.
fn encode(data: &mut EncodeTlsData<'_, ServerConnectionData>, out: &mut Vec<u8>) {
    let at = out.len();
    let needed = match data.encode(&mut []) {
        Err(EncodeError::InsufficientSize(size)) => size.required_size,
        _ => return,
    };
    out.resize(at + needed, 0);
    let written = data.encode(&mut out[at..]).unwrap_or(0);
    out.truncate(at + written);
}

/// Sends the alert rustls chose when it refused a ClientHello; the connection is closing,
/// so a failure to send is not reported.
pub(super) async fn send_alert(
    stream: &TcpStream,
    mut alert: AcceptedAlert,
    error: &rustls::Error,
    counters: &TrafficCounters,
) {
    let mut out = Vec::new();
    let _ = alert.write_all(&mut out);
    if out.is_empty() {
        // rustls queues no alert for a message its record layer refuses before parsing
        // (a handshake message over its 64 KiB bound): the client still gets one.
        return refuse_with(stream, fallback_alert(error), counters).await;
    }
    send_and_linger(stream, &out, counters).await;
}

/// Refuses the connection before the ServerHello with a fatal `description` alert (in
/// the clear: nothing is negotiated yet), then [`linger`]s.
pub(super) async fn refuse_with(
    stream: &TcpStream,
    description: AlertDescription,
    counters: &TrafficCounters,
) {
    const ALERT: u8 = 21;
    const FATAL: u8 = 2;
    let record = [ALERT, 3, 3, 0, 2, FATAL, u8::from(description)];
    send_and_linger(stream, &record, counters).await;
}

async fn send_and_linger(stream: &TcpStream, alert: &[u8], counters: &TrafficCounters) {
    counters.add_out(alert.len());
    let _ = write_all(stream, alert).await;
    linger(stream).await;
}

/// The alert RFC 8446 names for a refusal rustls sent none for.
fn fallback_alert(error: &rustls::Error) -> AlertDescription {
    use rustls::PeerMisbehaved;
    match error {
        rustls::Error::InvalidMessage(_) => AlertDescription::DecodeError,
        rustls::Error::InappropriateMessage { .. }
        | rustls::Error::InappropriateHandshakeMessage { .. }
        // Sections 5.1 and 5.
        | rustls::Error::PeerMisbehaved(
            PeerMisbehaved::MessageInterleavedWithHandshakeMessage
            | PeerMisbehaved::IllegalMiddleboxChangeCipherSpec
            // Section 5.4.
            | PeerMisbehaved::IllegalTlsInnerPlaintext,
        ) => AlertDescription::UnexpectedMessage,
        rustls::Error::PeerMisbehaved(_) => AlertDescription::IllegalParameter,
        _ => AlertDescription::HandshakeFailure,
    }
}

/// Ends a connection refused with a fatal alert: stops sending, then reads and drops what
/// the client still sends until it closes, for a second and 256 KiB at most (nginx's
/// lingering close, bounded). Closing a socket with unread input sends a reset, which can
/// reach the client before it has read the alert, and the alert is then lost: a
/// ClientHello larger than rustls takes is refused before the client has sent all of it.
async fn linger(stream: &TcpStream) {
    const FOR: std::time::Duration = std::time::Duration::from_secs(1);
    const AT_MOST: usize = 256 * 1024;
    let _ = socket2::SockRef::from(stream).shutdown(std::net::Shutdown::Write);
    let drain = async {
        let mut scratch = vec![0u8; 16 * 1024];
        let mut drained = 0;
        while drained < AT_MOST {
            if stream.readable().await.is_err() {
                return;
            }
            match stream.try_read(&mut scratch) {
                Ok(0) => return,
                Ok(n) => drained += n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                Err(_) => return,
            }
        }
    };
    let _ = tokio::time::timeout(FOR, drain).await;
}

async fn write_all(stream: &TcpStream, mut rest: &[u8]) -> io::Result<()> {
    while !rest.is_empty() {
        match stream.try_write(rest) {
            Ok(n) => rest = &rest[n..],
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => stream.writable().await?,
            Err(e) => return Err(e),
        }
    }
    Ok(())
}
