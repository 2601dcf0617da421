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
//! directly; so is one that took 0-RTT data once its server flight is out (what remains
//! of its handshake, the client's Finished, is checked with symmetric keys; client
//! certificates are not asked for over QUIC).
//!
//! The worker's admission ([`crate::Admit`]) is asked the same way: the server's
//! certificate resolver, called by rustls once the ClientHello is whole, asks from the
//! coroutine (`bridge::ask`), this task awaits the decision, charges the handshake to
//! the payer it chose and keeps its hold until the handshake ends.

use std::any::Any;
use std::cell::{Cell, RefCell};
use std::net::SocketAddr;
use std::rc::Rc;
use std::time::Instant;

use bytes::Bytes;
use h3::quic::ConnectionErrorIncoming;
use quinn_proto::{
    Connection, ConnectionEvent, ConnectionHandle, Event, FailedAccept, FirstPacket, Transmit,
    VarInt,
};
use terminus_engine::HandshakeContext;
use terminus_tls::handshake::bridge;
use tokio::sync::mpsc;
use tokio::sync::Notify;

use crate::endpoint::{InFlight, Shared};
use crate::transport::{lost_reason, H3Connection, State};
use crate::{Early, Established};

/// Drives connection `ch` until it is drained, starting with its `first` packet: its
/// handshake, then its life shared with its HTTP/3 side.
pub(crate) async fn run(
    shared: Rc<Shared>,
    (ch, route): (ConnectionHandle, u64),
    conn: Box<Connection>,
    first: FirstPacket,
    failed: FailedAccept,
    mut events: mpsc::Receiver<ConnectionEvent>,
    in_flight: InFlight,
) {
    let mut ctx = HandshakeContext::new(Instant::now()).with_client(conn.remote_address().ip());
    terminus_probes::handshake_start(ctx.id());
    let deadline = tokio::time::Instant::now() + shared.limits.handshake_timeout;
    let admission = Admitting::default();
    let handshaken = handshake(
        &shared,
        (ch, route),
        conn,
        (first, failed),
        &mut events,
        (&ctx, &admission),
        deadline,
    )
    .await;
    let refused = admission.admitted.get() == Some(false);
    drop((in_flight, admission));
    match handshaken {
        Handshaken::Done(conn, early) => {
            // Its crypto is done: the tenant's estimate is settled now, not when the
            // connection closes.
            ctx.settle();
            established(&shared, ch, conn, events, (ctx, deadline, early)).await
        }
        Handshaken::TimedOut(conn) => {
            ended_unfinished(&ctx, "timeout");
            drain(&shared, ch, conn, events).await
        }
        Handshaken::Failed => ended_unfinished(&ctx, if refused { "refused" } else { "tls_error" }),
    }
    shared.unroute(ch, route);
}

/// Tells an attached tracer that `ctx`'s handshake ended unfinished, and why (TCP's
/// names where they apply). A finished one is told by the server, which labels it.
fn ended_unfinished(ctx: &HandshakeContext, why: &str) {
    terminus_probes::handshake_end(ctx.id(), false, || terminus_probes::HandshakeRecord {
        total_ns: ctx.timeline().accepted.elapsed().as_nanos() as u64,
        result: terminus_probes::HandshakeRecord::text(why),
        ..Default::default()
    });
}

/// How a handshake ended.
enum Handshaken {
    /// Its crypto done: completed, or (`true`: 0-RTT taken) waiting for the client's
    /// Finished.
    Done(Box<Connection>, bool),
    /// Closed at the handshake timeout: to drive until drained.
    TimedOut(Box<Connection>),
    /// Gone (refused, failed, or drained).
    Failed,
}

/// A handshake's admission by the worker ([`crate::Admit`]), once decided.
#[derive(Default)]
struct Admitting {
    admitted: Cell<Option<bool>>,
    /// Kept until the handshake ends.
    hold: RefCell<Option<Box<dyn Any>>>,
}

/// Runs `body`, a step of `ctx`'s handshake, on the crypto bridge: its crypto computed by
/// the engine and charged to the payer its admission chose; the question the server's
/// certificate resolver asks at the ClientHello answered by the worker's admission
/// (once: a second ClientHello is told the first's decision).
async fn on_bridge<T: 'static>(
    shared: &Shared,
    (ctx, admission): (&HandshakeContext, &Admitting),
    body: impl FnOnce() -> T + 'static,
) -> T {
    let engine = shared.engine.clone();
    bridge::run_asking(
        body,
        |op| engine.submit(op, ctx),
        |question| async move {
            let admitted = match admission.admitted.get() {
                Some(admitted) => admitted,
                None => {
                    let decided = (shared.hooks.admit)(question).await;
                    if let Some(payer) = decided.payer {
                        ctx.charge_to(payer);
                    }
                    *admission.hold.borrow_mut() = decided.hold;
                    admission.admitted.set(Some(decided.admitted));
                    decided.admitted
                }
            };
            Some(Box::new(admitted) as Box<dyn Any>)
        },
    )
    .await
}

/// Runs the handshake to its end, or to `deadline` (`timeouts.handshake`, as TCP's).
async fn handshake(
    shared: &Shared,
    (ch, route): (ConnectionHandle, u64),
    conn: Box<Connection>,
    (first, failed): (FirstPacket, FailedAccept),
    events: &mut mpsc::Receiver<ConnectionEvent>,
    admitting: (&HandshakeContext, &Admitting),
    deadline: tokio::time::Instant,
) -> Handshaken {
    let ctx = admitting.0;
    // Everything crossing the coroutine is boxed: corosensei moves the closure and the
    // result through the coroutine's stack.
    let first = Box::new(first);
    let (mut conn, answered) = on_bridge(shared, admitting, move || {
        let mut conn = conn;
        let answered = conn.process_first_packet(*first);
        (conn, answered)
    })
    .await;
    let mut out = Vec::with_capacity(1500);
    if let Err(e) = answered {
        shared.metrics.failed();
        let response = shared
            .endpoint
            .borrow_mut()
            .accept_failed(ch, failed, &e, &mut out);
        // The handle is free again from here: forgotten before anything awaits, so
        // that a connection given it meanwhile keeps its queue.
        shared.unroute(ch, route);
        if let Some(transmit) = response {
            shared.send(&transmit, &out).await;
        }
        return Handshaken::Failed;
    }
    drop(failed);
    loop {
        send_all(shared, gather(shared, ch, &mut conn)).await;
        if conn.has_0rtt() {
            // 0-RTT taken (`[http3] early_data`): the server's flight is out and its
            // crypto done, so the connection is served from here; the client's
            // Finished is awaited with its requests. What the connection reported
            // meanwhile (streams opened in 0-RTT) stays queued for that.
            ctx.finished();
            return Handshaken::Done(conn, true);
        }
        while let Some(event) = conn.poll() {
            match event {
                Event::Connected => {
                    ctx.finished();
                    shared.metrics.handshaken();
                    return Handshaken::Done(conn, false);
                }
                Event::ConnectionLost { reason } => {
                    shared.metrics.failed();
                    tracing::debug!("quic: handshake lost: {reason}");
                }
                _ => {}
            }
        }
        if conn.is_drained() {
            return Handshaken::Failed;
        }
        let timer = conn.poll_timeout();
        tokio::select! {
            event = events.recv() => {
                let Some(event) = event else { return Handshaken::Failed };
                conn = step(conn, event, shared, admitting).await;
                // What else queued meanwhile, before anything is sent.
                while let Ok(event) = events.try_recv() {
                    conn = step(conn, event, shared, admitting).await;
                }
            }
            () = sleep_until(timer) => conn.handle_timeout(Instant::now()),
            () = tokio::time::sleep_until(deadline) => {
                time_out(shared, &mut conn);
                return Handshaken::TimedOut(conn);
            }
        }
    }
}

/// Closes a connection whose handshake did not complete by `timeouts.handshake`.
fn time_out(shared: &Shared, conn: &mut Connection) {
    shared.metrics.failed();
    conn.close(
        Instant::now(),
        VarInt::from_u32(0),
        Bytes::from_static(b"handshake timeout"),
    );
}

/// Drives a closing connection until it is drained (its CONNECTION_CLOSE sent and the
/// draining period over), so that the endpoint forgets it.
async fn drain(
    shared: &Shared,
    ch: ConnectionHandle,
    mut conn: Box<Connection>,
    mut events: mpsc::Receiver<ConnectionEvent>,
) {
    loop {
        send_all(shared, gather(shared, ch, &mut conn)).await;
        while conn.poll().is_some() {}
        if conn.is_drained() {
            return;
        }
        let timer = conn.poll_timeout();
        tokio::select! {
            event = events.recv() => match event {
                Some(event) => conn.handle_event(event),
                None => return,
            },
            () = sleep_until(timer) => conn.handle_timeout(Instant::now()),
        }
    }
}

/// Drives an established connection, shared with its HTTP/3 side (handed to the
/// server's hook), until it is drained. One that took 0-RTT data (`early`) comes here
/// before its handshake completes: that is counted here, or the connection closed at the
/// handshake's `deadline`.
async fn established(
    shared: &Shared,
    ch: ConnectionHandle,
    conn: Box<Connection>,
    mut events: mpsc::Receiver<ConnectionEvent>,
    (handshake, deadline, early): (HandshakeContext, tokio::time::Instant, bool),
) {
    // Whether the handshake's end is still to be counted (and its deadline kept); the
    // Early flag the HTTP/3 side sees is cleared by the client's Finished alone.
    let mut pending = early;
    let early = Early(Rc::new(Cell::new(early)));
    let remote = conn.remote_address();
    let conn_local_ip = conn.local_ip();
    let sni = conn
        .crypto_session()
        .handshake_data()
        .and_then(|d| {
            d.downcast::<quinn_proto::crypto::rustls::HandshakeData>()
                .ok()
        })
        .and_then(|d| d.server_name);
    let kick = Rc::new(Notify::new());
    let state = State::new(conn, kick.clone());
    (shared.hooks.on_established)(Established {
        h3: H3Connection(state.clone()),
        remote,
        // On a wildcard socket, the address the client reached.
        local: SocketAddr::new(
            conn_local_ip.unwrap_or(shared.local.ip()),
            shared.local.port(),
        ),
        sni,
        handshake,
        early: early.clone(),
    });
    loop {
        let datagrams = {
            let mut state = state.borrow_mut();
            let state = &mut *state;
            let datagrams = gather(shared, ch, &mut state.conn);
            while let Some(event) = state.conn.poll() {
                match event {
                    Event::Stream(event) => state.stream_event(event),
                    Event::Connected => {
                        early.0.set(false);
                        if std::mem::take(&mut pending) {
                            shared.metrics.handshaken();
                        }
                    }
                    Event::ConnectionLost { reason } => {
                        if std::mem::take(&mut pending) {
                            shared.metrics.failed();
                        }
                        state.lost(lost_reason(&reason))
                    }
                    _ => {}
                }
            }
            if state.conn.is_drained() {
                state.lost(ConnectionErrorIncoming::InternalError("drained".into()));
                return;
            }
            datagrams
        };
        send_all(shared, datagrams).await;
        let timer = state.borrow_mut().conn.poll_timeout();
        tokio::select! {
            event = events.recv() => {
                let Some(event) = event else { return };
                let mut state = state.borrow_mut();
                state.conn.handle_event(event);
                while let Ok(event) = events.try_recv() {
                    state.conn.handle_event(event);
                }
            }
            () = sleep_until(timer) => state.borrow_mut().conn.handle_timeout(Instant::now()),
            () = kick.notified() => {}
            () = tokio::time::sleep_until(deadline), if pending => {
                pending = false;
                time_out(shared, &mut state.borrow_mut().conn);
            }
        }
    }
}

/// Hands `event` to `conn`: on the bridge while it is handshaking (a datagram may carry
/// the rest of the ClientHello, or the client's Finished), directly after.
async fn step(
    mut conn: Box<Connection>,
    event: ConnectionEvent,
    shared: &Shared,
    admitting: (&HandshakeContext, &Admitting),
) -> Box<Connection> {
    if !conn.is_handshaking() {
        conn.handle_event(event);
        return conn;
    }
    let event = Box::new(event);
    on_bridge(shared, admitting, move || {
        conn.handle_event(*event);
        conn
    })
    .await
}

/// Passes `conn`'s events to the endpoint (and the endpoint's answers back), and takes
/// the datagrams it has to send, each with its bytes: sent by [`send_all`] once no
/// borrow of the connection is held (the HTTP/3 side may want it meanwhile).
fn gather(
    shared: &Shared,
    ch: ConnectionHandle,
    conn: &mut Connection,
) -> Vec<(Transmit, Vec<u8>)> {
    while let Some(event) = conn.poll_endpoint_events() {
        let answer = shared.endpoint.borrow_mut().handle_event(ch, event);
        if let Some(answer) = answer {
            // New connection IDs and the like: no handshake crypto.
            conn.handle_event(answer);
        }
    }
    let mut datagrams = Vec::new();
    // Several datagrams of one size in one transmit where the socket can send them in
    // one call (GSO).
    let max = shared.max_datagrams();
    loop {
        let mut bytes = Vec::with_capacity(1500);
        let Some(transmit) = conn.poll_transmit(Instant::now(), max, &mut bytes) else {
            return datagrams;
        };
        datagrams.push((transmit, bytes));
    }
}

async fn send_all(shared: &Shared, datagrams: Vec<(Transmit, Vec<u8>)>) {
    for (transmit, bytes) in datagrams {
        shared.send(&transmit, &bytes).await;
    }
}

async fn sleep_until(deadline: Option<Instant>) {
    match deadline {
        Some(at) => tokio::time::sleep_until(at.into()).await,
        None => std::future::pending().await,
    }
}
