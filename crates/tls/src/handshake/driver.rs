//! The handshake driver: socket I/O around rustls, with crypto suspended to the engine.

use std::io;

use rustls::ServerConnection;
use terminus_engine::{CryptoOp, Engine, KeyAlgorithm};
use tokio::net::TcpStream;

use super::bridge;
use crate::ktls::whole_records;
use crate::stream::TrafficCounters;

/// Why a handshake did not complete.
#[derive(Debug, thiserror::Error)]
pub enum HandshakeError {
    #[error("i/o error during handshake: {0}")]
    Io(#[from] io::Error),
    #[error("client closed the connection during the handshake")]
    Eof,
    #[error("TLS handshake failed: {0}")]
    Tls(#[from] rustls::Error),
}

/// A completed handshake.
pub struct Handshake {
    pub conn: ServerConnection,
    /// The key type that signed, or None when nothing was signed (resumption).
    pub signed_with: Option<KeyAlgorithm>,
    /// Bytes received after the handshake that rustls has not seen: the head of one
    /// record, never a whole one (see [`crate::ktls`]: the kernel takes whole records).
    pub pending: Vec<u8>,
}

/// Completes the handshake of `conn` over `stream`. Every `process_new_packets()` runs on
/// a coroutine so that the signer and key exchange can wait on `engine` without blocking
/// the worker. On a TLS error the alert rustls queued is sent before returning.
///
/// rustls is given whole records only, so that when the handshake ends no record is
/// half inside rustls: the kernel could not take over a connection mid-record.
pub async fn handshake(
    stream: &TcpStream,
    conn: ServerConnection,
    engine: &Engine,
    counters: &TrafficCounters,
) -> Result<Handshake, HandshakeError> {
    let _in_flight = engine.handshake_started();
    let mut signed_with = None;
    // Boxed: the coroutine's closure must stay small (corosensei copies it onto the new
    // stack), and moving a pointer in and out per flight is cheaper than the struct.
    let mut conn = Box::new(conn);
    let mut out = Vec::with_capacity(4096);
    let mut received = Vec::with_capacity(4096);
    loop {
        send_pending(&mut conn, stream, &mut out, counters).await?;
        if !conn.is_handshaking() {
            return Ok(Handshake {
                conn: *conn,
                signed_with,
                pending: received,
            });
        }
        if whole_records(&received) == 0 {
            let n = receive(&mut received, stream).await?;
            if n == 0 {
                return Err(HandshakeError::Eof);
            }
            counters.add_in(n);
            continue;
        }
        let whole = whole_records(&received);
        let mut rest = &received[..whole];
        while !rest.is_empty() {
            // rustls takes less when its buffer is full; the rest waits for the next pass.
            if conn.read_tls(&mut rest)? == 0 {
                break;
            }
        }
        let fed = whole - rest.len();
        received.drain(..fed);
        let (returned, result) = bridge::run(
            move || {
                let result = conn.process_new_packets().map(|_| ());
                (conn, result)
            },
            |op| {
                if let CryptoOp::Sign { key, .. } = &op {
                    signed_with = Some(key.algorithm());
                }
                engine.submit(op)
            },
        )
        .await;
        conn = returned;
        if let Err(e) = result {
            let _ = send_pending(&mut conn, stream, &mut out, counters).await;
            return Err(e.into());
        }
    }
}

/// Appends what the socket has to `buf`; 0 is end of file.
async fn receive(buf: &mut Vec<u8>, stream: &TcpStream) -> io::Result<usize> {
    buf.reserve(4096);
    loop {
        stream.readable().await?;
        match stream.try_read_buf(buf) {
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
            other => return other,
        }
    }
}

async fn send_pending(
    conn: &mut ServerConnection,
    stream: &TcpStream,
    out: &mut Vec<u8>,
    counters: &TrafficCounters,
) -> io::Result<()> {
    while conn.wants_write() {
        out.clear();
        conn.write_tls(out)?;
        counters.add_out(out.len());
        let mut rest = &out[..];
        while !rest.is_empty() {
            match stream.try_write(rest) {
                Ok(n) => rest = &rest[n..],
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => stream.writable().await?,
                Err(e) => return Err(e),
            }
        }
    }
    Ok(())
}
