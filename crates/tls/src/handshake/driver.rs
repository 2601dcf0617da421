//! The handshake driver: socket I/O around rustls, with crypto suspended to the engine.

use std::io;

use rustls::ServerConnection;
use terminus_engine::Engine;
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

/// Completes the handshake of `conn` over `stream`. Every `process_new_packets()` runs on
/// a coroutine so that the signer and key exchange can wait on `engine` without blocking
/// the worker. On a TLS error the alert rustls queued is sent before returning.
pub async fn handshake(
    stream: &TcpStream,
    mut conn: ServerConnection,
    engine: &Engine,
    counters: &TrafficCounters,
) -> Result<ServerConnection, HandshakeError> {
    let _in_flight = engine.handshake_started();
    let mut out = Vec::with_capacity(4096);
    loop {
        send_pending(&mut conn, stream, &mut out, counters).await?;
        if !conn.is_handshaking() {
            return Ok(conn);
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
            |op| engine.submit(op),
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
