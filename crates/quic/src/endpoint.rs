//! A worker's QUIC endpoint: one UDP socket (`SO_REUSEPORT`, as the worker's TCP
//! listeners), one quinn-proto `Endpoint`, and a task per connection.
//!
//! The endpoint task reads datagrams and routes them: a new connection is accepted with
//! its first packet left unprocessed (`Endpoint::accept_deferred`, terminus's patch to
//! quinn-proto) and handed to a task of its own ([`crate::connection`]); a datagram for a
//! known connection goes to that task's queue. A connection whose handshake is waiting
//! for the crypto engine is suspended inside its own task, its datagrams queued, while
//! the endpoint goes on routing everyone else's: that is what lets QUIC handshakes be
//! batched like TCP ones.

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::io;
use std::net::SocketAddr;
use std::rc::Rc;
use std::sync::Arc;
use std::time::Instant;

use bytes::BytesMut;
use quinn_proto::{
    ConnectionEvent, ConnectionHandle, DatagramEvent, Endpoint, EndpointConfig, ServerConfig,
    Transmit,
};
use terminus_engine::{Engine, HandshakeGuard};
use tokio::net::UdpSocket;
use tokio::sync::mpsc;

use crate::admission::{self, Decision, Limits};
use crate::connection;
use crate::metrics::QuicMetrics;
use crate::routing::{Handover, Member, Owner};
use crate::Hooks;

/// The largest UDP payload read (QUIC's datagrams are at most this, RFC 9000 section 14
/// allows up to 65527, and an endpoint advertises what it takes).
const MAX_DATAGRAM: usize = 65_527;

/// What a worker's connections share with its endpoint task.
pub(crate) struct Shared {
    pub(crate) socket: UdpSocket,
    pub(crate) endpoint: RefCell<Endpoint>,
    /// Each connection's queue of events from the endpoint, with the number of the
    /// connection that holds the handle now (quinn-proto reuses a handle once its
    /// connection is drained).
    pub(crate) routes: RefCell<HashMap<ConnectionHandle, (u64, mpsc::Sender<ConnectionEvent>)>>,
    /// Numbers connections, for [`Shared::routes`].
    next_route: Cell<u64>,
    pub(crate) engine: Engine,
    pub(crate) metrics: &'static QuicMetrics,
    /// The socket's address.
    pub(crate) local: SocketAddr,
    /// Given each connection whose handshake completed; asked about each handshake.
    pub(crate) hooks: Hooks,
    /// Which new connections are taken.
    pub(crate) limits: Limits,
    /// Handshakes in flight on this worker.
    handshaking: Cell<usize>,
}

impl Shared {
    /// Sends one datagram (quinn-proto is asked for one at a time: no GSO yet).
    pub(crate) async fn send(&self, transmit: &Transmit, bytes: &[u8]) {
        let bytes = &bytes[..transmit.size];
        match transmit.segment_size {
            Some(segment) if segment < bytes.len() => {
                for chunk in bytes.chunks(segment) {
                    let _ = self.socket.send_to(chunk, transmit.destination).await;
                }
            }
            _ => {
                let _ = self.socket.send_to(bytes, transmit.destination).await;
            }
        }
    }
}

/// Serves QUIC on `socket` with `config` until the task is dropped, new connections
/// admitted as `limits` say: handshakes computed by `engine`, counted in [`crate::QUIC_METRICS`]; each connection whose handshake
/// completed is given to `hooks.on_established`, which serves its requests; each
/// handshake is admitted at its ClientHello by `hooks.admit`.
pub async fn serve(
    socket: std::net::UdpSocket,
    mut member: Member,
    config: Arc<ServerConfig>,
    limits: Limits,
    engine: Engine,
    hooks: Hooks,
) -> io::Result<()> {
    socket.set_nonblocking(true)?;
    let socket = UdpSocket::from_std(socket)?;
    let local = socket.local_addr()?;
    // A wildcard socket does not know which of the host's addresses a datagram reached.
    let local_ip = (!local.ip().is_unspecified()).then_some(local.ip());
    let mut endpoint_config = EndpointConfig::default();
    endpoint_config.cid_generator(member.cid_generators());
    let endpoint = Endpoint::new(Arc::new(endpoint_config), Some(config), true, None);
    let shared = Rc::new(Shared {
        socket,
        endpoint: RefCell::new(endpoint),
        routes: RefCell::default(),
        next_route: Cell::new(0),
        engine,
        metrics: &crate::QUIC_METRICS,
        local,
        hooks,
        limits,
        handshaking: Cell::new(0),
    });
    let mut datagram = vec![0u8; MAX_DATAGRAM];
    let mut out = Vec::with_capacity(1500);
    loop {
        let (remote, data) = tokio::select! {
            received = shared.socket.recv_from(&mut datagram) => match received {
                Ok((len, remote)) => match member.route(remote, &datagram[..len]) {
                    Owner::Here => (remote, BytesMut::from(&datagram[..len])),
                    Owner::Handed => {
                        shared.metrics.handed_over();
                        continue;
                    }
                    Owner::Dropped => continue,
                },
                // An ICMP error from an earlier send to a peer gone: nothing to do
                // for the others.
                Err(e) if e.kind() == io::ErrorKind::ConnectionRefused => continue,
                Err(e) => return Err(e),
            },
            Some(Handover { remote, data }) = member.inbox.recv() => (remote, data),
        };
        out.clear();
        let event = shared.endpoint.borrow_mut().handle(
            Instant::now(),
            remote,
            local_ip,
            None,
            data,
            &mut out,
        );
        match event {
            None => {}
            Some(DatagramEvent::Response(transmit)) => shared.send(&transmit, &out).await,
            Some(DatagramEvent::ConnectionEvent(ch, event)) => route(&shared, ch, event),
            Some(DatagramEvent::NewConnection(incoming)) => {
                accept(&shared, incoming, remote, &mut out).await
            }
        }
    }
}

/// A handshake in flight on this worker, until dropped: counted for admission
/// ([`Shared::handshaking`]) and for the engine, which holds a partial batch while
/// handshakes in flight may still add to it (as a TCP one from its ClientHello).
pub(crate) struct InFlight {
    shared: Rc<Shared>,
    _engine: HandshakeGuard,
}

impl InFlight {
    fn new(shared: &Rc<Shared>) -> Self {
        shared.handshaking.set(shared.handshaking.get() + 1);
        Self {
            shared: shared.clone(),
            _engine: shared.engine.handshake_started(),
        }
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.shared
            .handshaking
            .set(self.shared.handshaking.get() - 1);
    }
}

/// Datagrams queued for one connection at most: beyond, while its task is busy (a
/// handshake waiting for the engine), they are dropped, as a full socket buffer would.
const QUEUE: usize = 64;

/// Hands `event` to connection `ch`'s task (dropped if the connection has gone, or its
/// queue is full: QUIC recovers from a lost datagram).
pub(crate) fn route(shared: &Shared, ch: ConnectionHandle, event: ConnectionEvent) {
    if let Some((_, queue)) = shared.routes.borrow().get(&ch) {
        let _ = queue.try_send(event);
    }
}

impl Shared {
    /// Forgets connection `ch`'s queue if it is still connection `id`'s.
    pub(crate) fn unroute(&self, ch: ConnectionHandle, id: u64) {
        let mut routes = self.routes.borrow_mut();
        if routes.get(&ch).is_some_and(|(held, _)| *held == id) {
            routes.remove(&ch);
        }
    }
}

/// Accepts `incoming` and starts its connection's task; the first packet (the
/// ClientHello) is processed there, on the crypto bridge.
async fn accept(
    shared: &Rc<Shared>,
    incoming: quinn_proto::Incoming,
    remote: SocketAddr,
    out: &mut Vec<u8>,
) {
    let decision = admission::decide(
        &shared.limits,
        shared.handshaking.get(),
        incoming.remote_address_validated(),
        incoming.may_retry(),
    );
    match decision {
        Decision::Accept => {}
        Decision::Retry => {
            let retry = shared.endpoint.borrow_mut().retry(incoming, out);
            if let Ok(transmit) = retry {
                shared.metrics.retried();
                shared.send(&transmit, out).await;
            }
            return;
        }
        Decision::Refuse => {
            let transmit = shared.endpoint.borrow_mut().refuse(incoming, out);
            shared.metrics.refused();
            shared.send(&transmit, out).await;
            return;
        }
    }
    let accepted =
        shared
            .endpoint
            .borrow_mut()
            .accept_deferred(incoming, Instant::now(), out, None);
    match accepted {
        Ok((ch, conn, first, failed)) => {
            let in_flight = InFlight::new(shared);
            let (queue, events) = mpsc::channel(QUEUE);
            let id = shared.next_route.get();
            shared.next_route.set(id + 1);
            shared.routes.borrow_mut().insert(ch, (id, queue));
            shared.metrics.accepted();
            tokio::task::spawn_local(connection::run(
                shared.clone(),
                (ch, id),
                Box::new(conn),
                first,
                failed,
                events,
                in_flight,
            ));
        }
        Err(e) => {
            tracing::debug!("quic: connection from {remote} not accepted: {}", e.cause);
            if let Some(transmit) = e.response {
                shared.send(&transmit, out).await;
            }
        }
    }
}
