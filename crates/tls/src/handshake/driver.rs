//! The handshake driver: socket I/O around rustls, with crypto suspended to the engine.

use std::io;

use rustls::ServerConnection;
use terminus_engine::{CryptoOp, Engine, KeyAlgorithm};
use tokio::net::TcpStream;

use super::bridge;
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
}

/// Completes the handshake of `conn` over `stream`. Every `process_new_packets()` runs on
/// a coroutine so that the signer and key exchange can wait on `engine` without blocking
/// the worker. On a TLS error the alert rustls queued is sent before returning.
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
    loop {
        send_pending(&mut conn, stream, &mut out, counters).await?;
        if !conn.is_handshaking() {
            return Ok(Handshake {
                conn: *conn,
                signed_with,
            });
        }
        let received = receive(&mut conn, stream).await?;
        if received == 0 {
            return Err(HandshakeError::Eof);
        }
        counters.add_in(received);
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

struct TryRead<'a>(&'a TcpStream);

impl io::Read for TryRead<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.0.try_read(buf)
    }
}

async fn receive(conn: &mut ServerConnection, stream: &TcpStream) -> io::Result<usize> {
    loop {
        stream.readable().await?;
        match conn.read_tls(&mut TryRead(stream)) {
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
