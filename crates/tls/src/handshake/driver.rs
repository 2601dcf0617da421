//! The handshake driver: socket I/O around rustls, with crypto suspended to the engine.

use std::io;
use std::sync::Arc;

use rustls::{ServerConfig, ServerConnection};
use terminus_engine::{Engine, HandshakeContext};
use tokio::net::TcpStream;

use super::bridge;
use super::hello::ClientHelloRead;
use super::HandshakeError;
use crate::record::whole_records;
use crate::stream::TrafficCounters;

/// A completed handshake.
pub struct Handshake {
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
        mut received,
        _in_flight,
    } = hello;
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
            let (e, mut alert) = *failed;
            alert.write_all(&mut out)?;
            counters.add_out(out.len());
            let _ = write_all(stream, &out).await;
            return Err(e.into());
        }
    };
    loop {
        send_pending(&mut conn, stream, &mut out, ctx, counters).await?;
        if !conn.is_handshaking() {
            ctx.finished();
            return Ok(Handshake {
                conn: *conn,
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
            |op| engine.submit(op, ctx),
        )
        .await;
        conn = returned;
        if let Err(e) = result {
            let _ = send_pending(&mut conn, stream, &mut out, ctx, counters).await;
            return Err(e.into());
        }
    }
}

/// Appends what the socket has to `buf`; 0 is end of file.
pub(super) async fn receive(buf: &mut Vec<u8>, stream: &TcpStream) -> io::Result<usize> {
    buf.reserve(4096);
    loop {
        stream.readable().await?;
        match stream.try_read_buf(buf) {
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
            other => return other,
        }
    }
}

pub(super) async fn write_all(stream: &TcpStream, mut rest: &[u8]) -> io::Result<()> {
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
