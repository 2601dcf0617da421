//! The handshake driver: socket I/O around rustls, with crypto suspended to the engine.

use std::io;
use std::sync::Arc;
use std::time::Instant;

use rustls::server::AcceptedAlert;
use rustls::{AlertDescription, ServerConfig, ServerConnection};
use terminus_engine::{Engine, HandshakeContext};
use tokio::net::TcpStream;

use super::bridge;
use super::hello::ClientHelloRead;
use super::HandshakeError;
use crate::record::{whole_records, whole_records_within};
use crate::stream::TrafficCounters;

/// A completed handshake.
pub struct Handshake {
    /// The rustls connection, its handshake complete.
    pub conn: ServerConnection,
    /// Bytes received after the handshake that rustls has not seen: the head of one
    /// record, never a whole one (see [`crate::record`]: the kernel takes whole records).
    pub pending: Vec<u8>,
}

/// Completes the handshake that `hello` began, with `config`, over `stream`. Everything
/// rustls computes (the ClientHello's answer, then every `process_new_packets()`) runs on
/// a coroutine, so that the signer and key exchange can wait on `engine` without blocking
/// the worker; their requests are charged to `ctx`, whose timeline also gets each flight
/// and the end. On a TLS error the alert rustls queued is sent before returning.
///
/// rustls is given whole records only, so that when the handshake ends no record is
/// half inside rustls: the kernel could not take over a connection mid-record.
pub async fn handshake(
    stream: &TcpStream,
    hello: ClientHelloRead,
    config: Arc<ServerConfig>,
    engine: &Engine,
    ctx: &HandshakeContext,
    counters: &TrafficCounters,
) -> Result<Handshake, HandshakeError> {
    let ClientHelloRead {
        accepted,
        mut inbox,
        _in_flight,
        ..
    } = hello;
    inbox.release();
    let mut out = Vec::with_capacity(4096);
    // Answering the ClientHello is where TLS 1.3 signs and exchanges keys: on the bridge.
    // Everything crossing the coroutine is boxed: corosensei copies the closure and the
    // result through the new stack, which takes only small values, and moving a pointer
    // in and out per flight is cheaper than the structs.
    let accepted = Box::new(accepted);
    let answered = bridge::run(
        move || {
            accepted
                .into_connection(config)
                .map(Box::new)
                .map_err(Box::new)
        },
        |op| engine.submit(op, ctx),
    )
    .await;
    let mut conn = match answered {
        Ok(conn) => conn,
        Err(failed) => {
            let (e, alert) = *failed;
            send_alert(stream, alert, &e, counters).await;
            return Err(e.into());
        }
    };
    loop {
        send_pending(&mut conn, stream, &mut out, ctx, counters).await?;
        if !conn.is_handshaking() {
            ctx.finished();
            return Ok(Handshake {
                conn: *conn,
                pending: inbox.into_rest(),
            });
        }
        let waiting = Instant::now();
        inbox.fill(stream, counters).await?;
        ctx.waited_for_client(waiting);
        inbox.feed(|records| conn.read_tls(records))?;
        let (returned, result) = bridge::run(
            move || {
                let result = conn.process_new_packets().map(|_| ());
                (conn, result)
            },
            |op| engine.submit(op, ctx),
        )
        .await;
        conn = returned;
        if let Err(e) = result {
            let _ = send_pending(&mut conn, stream, &mut out, ctx, counters).await;
            alert_if_rustls_did_not(&mut conn, &e, stream, counters).await;
            return Err(e.into());
        }
    }
}

/// Bytes read from the socket during the handshake, handed to rustls a whole record at a
/// time (see [`crate::record`]).
#[derive(Default)]
pub(super) struct Inbox {
    buf: Vec<u8>,
    /// While the ClientHello is read, what rustls took stays at the front of `buf` (up to
    /// here): a connection passed through untouched needs every byte.
    fed: usize,
    keep: bool,
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
        while whole_records(&self.buf[self.fed..]) == 0 {
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

    /// Gives `read_tls` (rustls's) the whole records buffered, one record's worth at a
    /// time: rustls buffers more than a record only once it has processed the start of a
    /// handshake message the records continue (then up to 64 KiB), so a ClientHello larger
    /// than a record must be fed and processed in turns. The rest waits for the next pass,
    /// which [`Inbox::fill`] starts at once.
    pub(super) fn feed(
        &mut self,
        read_tls: impl FnMut(&mut dyn io::Read) -> io::Result<usize>,
    ) -> io::Result<()> {
        const ONE_RECORD: usize = 5 + 16384 + 256;
        self.feed_within(ONE_RECORD, read_tls)
    }

    /// Gives `read_tls` the first whole record only. The ClientHello is read this way:
    /// the `Acceptor` takes only the ClientHello from what it holds, and nothing would
    /// process records that came with it (change_cipher_spec in the same segment) until
    /// the client sent more, so they stay here for the handshake's first pass.
    pub(super) fn feed_record(
        &mut self,
        read_tls: impl FnMut(&mut dyn io::Read) -> io::Result<usize>,
    ) -> io::Result<()> {
        self.feed_within(1, read_tls)
    }

    fn feed_within(
        &mut self,
        limit: usize,
        mut read_tls: impl FnMut(&mut dyn io::Read) -> io::Result<usize>,
    ) -> io::Result<()> {
        let whole = whole_records_within(&self.buf[self.fed..], limit);
        let mut rest = &self.buf[self.fed..self.fed + whole];
        while !rest.is_empty() {
            if read_tls(&mut rest)? == 0 {
                break;
            }
        }
        self.fed += whole - rest.len();
        if !self.keep {
            self.buf.drain(..self.fed);
            self.fed = 0;
        }
        Ok(())
    }

    /// An inbox that keeps what rustls took, until [`Inbox::release`].
    pub(super) fn keeping() -> Self {
        Inbox {
            keep: true,
            ..Default::default()
        }
    }

    /// Drops what rustls took and keeps no more.
    pub(super) fn release(&mut self) {
        self.buf.drain(..self.fed);
        self.fed = 0;
        self.keep = false;
    }

    /// What rustls was not given: the head of one record at most.
    pub(super) fn into_rest(mut self) -> Vec<u8> {
        self.release();
        self.buf
    }

    /// When the first bytes were read; `None` before any were.
    pub(super) fn first_read(&self) -> Option<Instant> {
        self.first_read
    }

    /// Every byte read, rustls's or not.
    pub(super) fn into_all(self) -> Vec<u8> {
        self.buf
    }

    /// Every byte read so far, while the inbox keeps them (see [`Inbox::keeping`]).
    pub(super) fn all(&self) -> &[u8] {
        &self.buf
    }
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

/// Ends a handshake rustls failed (its alert, if any, already sent) with an alert when
/// rustls queued none, then [`linger`]s.
///
/// rustls 0.23 fails some records without an alert, against RFC 8446's MUSTs: a record
/// whose inner content type is 0 (section 5.4), another record type inside a fragmented
/// handshake message (5.1), a third change_cipher_spec (5). Before encryption starts,
/// terminus sends the fatal alert RFC 8446 names. After it, an alert must be sealed with
/// traffic keys that rustls does not expose, and `send_close_notify` is the one alert its
/// API seals: the client gets an orderly close_notify, not an abrupt close.
/// `send_close_notify` queues nothing when rustls already sent a fatal alert, which is
/// how the two cases are told apart.
async fn alert_if_rustls_did_not(
    conn: &mut ServerConnection,
    error: &rustls::Error,
    stream: &TcpStream,
    counters: &TrafficCounters,
) {
    const ALERT: u8 = 21;
    conn.send_close_notify();
    let mut close = Vec::new();
    let _ = conn.write_tls(&mut close);
    match close.first() {
        None => linger(stream).await,
        // In the clear, so not yet encrypting.
        Some(&ALERT) => refuse_with(stream, fallback_alert(error), counters).await,
        Some(_) => send_and_linger(stream, &close, counters).await,
    }
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
            | PeerMisbehaved::IllegalMiddleboxChangeCipherSpec,
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

async fn send_pending(
    conn: &mut ServerConnection,
    stream: &TcpStream,
    out: &mut Vec<u8>,
    ctx: &HandshakeContext,
    counters: &TrafficCounters,
) -> io::Result<()> {
    while conn.wants_write() {
        out.clear();
        conn.write_tls(out)?;
        counters.add_out(out.len());
        ctx.flight(out.len());
        write_all(stream, out).await?;
    }
    Ok(())
}
