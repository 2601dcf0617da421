//! One QUIC connection's task: its handshake on the crypto bridge, then its timers,
//! datagrams and the endpoint's events.
//!
//! Every quinn-proto call that may reach rustls's handshake code runs on a coroutine
//! (`terminus_tls::handshake::bridge`) while the connection is handshaking: the first
//! packet (the ClientHello: the server's key exchange and signature), and every datagram
//! until the handshake is done (a ClientHello spread over two Initial packets, as
//! post-quantum key shares make it, is answered when the second arrives). A step that
//! waits for the engine suspends this task only; its datagrams queue meanwhile. After
//! the handshake no call computes asymmetric crypto and the connection is driven
//! directly.

use std::rc::Rc;
use std::time::Instant;

use quinn_proto::{
    Connection, ConnectionEvent, ConnectionHandle, Event, FailedAccept, FirstPacket,
};
use terminus_engine::HandshakeContext;
use terminus_tls::handshake::bridge;
use tokio::sync::mpsc;

use crate::endpoint::Shared;

/// Drives connection `ch` until it is drained, starting with its `first` packet.
pub(crate) async fn run(
    shared: Rc<Shared>,
    ch: ConnectionHandle,
    conn: Box<Connection>,
    first: FirstPacket,
    failed: FailedAccept,
    mut events: mpsc::UnboundedReceiver<ConnectionEvent>,
) {
    let ctx = HandshakeContext::new(Instant::now());
    let engine = shared.engine.clone();
    // Everything crossing the coroutine is boxed: corosensei moves the closure and the
    // result through the coroutine's stack.
    let first = Box::new(first);
    let (mut conn, answered) = bridge::run(
        move || {
            let mut conn = conn;
            let answered = conn.process_first_packet(*first);
            (conn, answered)
        },
        |op| engine.submit(op, &ctx),
    )
    .await;
    let mut out = Vec::with_capacity(1500);
    if let Err(e) = answered {
        shared.metrics.failed();
        let response = shared
            .endpoint
            .borrow_mut()
            .accept_failed(ch, failed, &e, &mut out);
        if let Some(transmit) = response {
            shared.send(&transmit, &out).await;
        }
        shared.routes.borrow_mut().remove(&ch);
        return;
    }
    drop(failed);
    let mut handshaking = true;
    loop {
        flush(&shared, ch, &mut conn, &mut out).await;
        while let Some(event) = conn.poll() {
            match event {
                Event::Connected => {
                    handshaking = false;
                    ctx.finished();
                    shared.metrics.handshaken();
                }
                Event::ConnectionLost { reason } => {
                    if handshaking {
                        shared.metrics.failed();
                    }
                    tracing::debug!("quic: connection lost: {reason}");
                }
                _ => {}
            }
        }
        if conn.is_drained() {
            break;
        }
        let deadline = conn.poll_timeout();
        tokio::select! {
            event = events.recv() => {
                let Some(event) = event else { break };
                conn = step(conn, event, &shared, &ctx).await;
            }
            () = sleep_until(deadline) => conn.handle_timeout(Instant::now()),
        }
    }
    shared.routes.borrow_mut().remove(&ch);
}

/// Hands `event` to `conn`: on the bridge while it is handshaking (a datagram may carry
/// the rest of the ClientHello, or the client's Finished), directly after.
async fn step(
    mut conn: Box<Connection>,
    event: ConnectionEvent,
    shared: &Shared,
    ctx: &HandshakeContext,
) -> Box<Connection> {
    if !conn.is_handshaking() {
        conn.handle_event(event);
        return conn;
    }
    let engine = shared.engine.clone();
    let event = Box::new(event);
    bridge::run(
        move || {
            conn.handle_event(*event);
            conn
        },
        |op| engine.submit(op, ctx),
    )
    .await
}

/// Sends what `conn` has to send, and passes its events to the endpoint (and the
/// endpoint's answers back).
async fn flush(shared: &Shared, ch: ConnectionHandle, conn: &mut Connection, out: &mut Vec<u8>) {
    while let Some(event) = conn.poll_endpoint_events() {
        let answer = shared.endpoint.borrow_mut().handle_event(ch, event);
        if let Some(answer) = answer {
            // New connection IDs and the like: no handshake crypto.
            conn.handle_event(answer);
        }
    }
    loop {
        out.clear();
        let Some(transmit) = conn.poll_transmit(Instant::now(), 1, out) else {
            break;
        };
        shared.send(&transmit, out).await;
    }
}

async fn sleep_until(deadline: Option<Instant>) {
    match deadline {
        Some(at) => tokio::time::sleep_until(at.into()).await,
        None => std::future::pending().await,
    }
}
