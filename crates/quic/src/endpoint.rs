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

use std::io::IoSliceMut;

use bytes::BytesMut;

use crate::succession::Succession;
use quinn_proto::{
    ConnectionEvent, ConnectionHandle, DatagramEvent, EcnCodepoint, Endpoint, EndpointConfig,
    ServerConfig, Transmit,
};
use terminus_engine::{Engine, HandshakeGuard};
use tokio::io::Interest;
use tokio::net::UdpSocket;
use tokio::sync::mpsc;

use crate::admission::{self, Decision, Limits};
use crate::connection;
use crate::metrics::QuicMetrics;
use crate::routing::{Handover, Member, Owner};
use crate::Hooks;

/// Datagrams per GSO send at most (see [`Shared::max_datagrams`]).
const MAX_GSO_SEGMENTS: usize = 10;

/// Room for one read: a datagram, or several of one flow coalesced by the kernel (GRO),
/// up to what one UDP read returns.
const READ_SLOT: usize = 64 * 1024;
/// Reads at most this many datagrams (or coalesced runs of them) per system call
/// (`recvmmsg`): a burst of a handshake storm's Initials is read in a few calls.
const READS: usize = 8;

/// What a worker's connections share with its endpoint task.
pub(crate) struct Shared {
    pub(crate) socket: UdpSocket,
    /// The socket's GSO, GRO, ECN and destination-address state (quinn-udp).
    udp: quinn_udp::UdpSocketState,
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
    /// Sends `transmit`: one datagram, or several of one size in one system call (GSO)
    /// where quinn-proto made them so, with its ECN mark and source address. A datagram
    /// the kernel refuses is dropped, as the network could have: QUIC retransmits.
    pub(crate) async fn send(&self, transmit: &Transmit, bytes: &[u8]) {
        let transmit = quinn_udp::Transmit {
            destination: transmit.destination,
            ecn: transmit
                .ecn
                .and_then(|ecn| quinn_udp::EcnCodepoint::from_bits(ecn as u8)),
            contents: &bytes[..transmit.size],
            segment_size: transmit.segment_size,
            src_ip: transmit.src_ip,
        };
        loop {
            let sent = self.socket.try_io(Interest::WRITABLE, || {
                self.udp.send((&self.socket).into(), &transmit)
            });
            match sent {
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    if self.socket.writable().await.is_err() {
                        return;
                    }
                }
                _ => return,
            }
        }
    }

    /// How many datagrams one send may carry: GSO's segments (1 without GSO), at most
    /// ten as quinn's own driver, so that one send stays under UDP's 64 KiB (the kernel
    /// refuses a larger one, and quinn-udp drops it without a word).
    pub(crate) fn max_datagrams(&self) -> usize {
        self.udp.max_gso_segments().min(MAX_GSO_SEGMENTS)
    }
}

/// Serves QUIC on `socket` with `config` until the task is dropped, new connections
/// admitted as `limits` say: handshakes computed by `engine`, counted in [`crate::QUIC_METRICS`]; each connection whose handshake
/// completed is given to `hooks.on_established`, which serves its requests; each
/// handshake is admitted at its ClientHello by `hooks.admit`. Once `succession` says
/// this process has handed over, the socket is left to the successor to read, and the
/// datagrams it passes back for this endpoint's connections are served instead.
pub async fn serve(
    socket: std::net::UdpSocket,
    mut member: Member,
    config: Arc<ServerConfig>,
    limits: Limits,
    engine: Engine,
    hooks: Hooks,
    succession: Succession,
) -> io::Result<()> {
    let Succession {
        inbox,
        mut handed_over,
        predecessor,
    } = succession;
    member.succeed(predecessor);
    let inbox = match inbox {
        Some(inbox) => {
            inbox.set_nonblocking(true)?;
            Some(tokio::net::UnixDatagram::from_std(inbox)?)
        }
        None => None,
    };
    let mut passed = vec![0u8; crate::succession::HEADER + READ_SLOT];
    // The socket is ours to read until this process hands over.
    let mut reading = true;
    socket.set_nonblocking(true)?;
    let udp = quinn_udp::UdpSocketState::new((&socket).into())?;
    let socket = UdpSocket::from_std(socket)?;
    let local = socket.local_addr()?;
    // A wildcard socket does not know which of the host's addresses a datagram reached.
    let local_ip = (!local.ip().is_unspecified()).then_some(local.ip());
    let mut endpoint_config = EndpointConfig::default();
    endpoint_config.cid_generator(member.cid_generators());
    let endpoint = Endpoint::new(Arc::new(endpoint_config), Some(config), true, None);
    let shared = Rc::new(Shared {
        socket,
        udp,
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
    let mut slots = vec![0u8; READ_SLOT * READS];
    let mut metas = [quinn_udp::RecvMeta::default(); READS];
    let mut out = Vec::with_capacity(1500);
    loop {
        let read = tokio::select! {
            read = read_batch(&shared, &mut slots, &mut metas), if reading => read,
            Some(handover) = member.inbox.recv() => {
                handle(&shared, handover, &mut out).await;
                continue;
            }
            _ = handed_over.wait_for(|&h| h), if reading => {
                reading = false;
                continue;
            }
            // From the successor, for a connection of this process's.
            // Read at all times: the successor may pass datagrams from its `go`, before
            // this process has heard it serves.
            Some(n) = passed_back(inbox.as_ref(), &mut passed) => {
                if let Some(datagram) = crate::succession::decode(&passed[..n]) {
                    route_read(&shared, &member, datagram, &mut out).await;
                }
                continue;
            }
            // Handed over, and nothing can come any more: the connections' own tasks
            // end them.
            else => std::future::pending().await,
        };
        let count = match read {
            Ok(count) => count,
            // An ICMP error from an earlier send to a peer gone: nothing to do for the
            // others.
            Err(e) if e.kind() == io::ErrorKind::ConnectionRefused => continue,
            Err(e) => return Err(e),
        };
        for (meta, slot) in metas[..count].iter().zip(slots.chunks(READ_SLOT)) {
            // A run of datagrams of one flow coalesced by the kernel (GRO), `stride`
            // bytes each but the last.
            for datagram in slot[..meta.len].chunks(meta.stride.max(1)) {
                let datagram = Handover {
                    remote: meta.addr,
                    local_ip: meta.dst_ip.or(local_ip),
                    ecn: meta.ecn.and_then(|e| EcnCodepoint::from_bits(e as u8)),
                    data: BytesMut::from(datagram),
                };
                route_read(&shared, &member, datagram, &mut out).await;
            }
        }
    }
}

/// The next message the successor passed back, its length (`None`: no inbox, or it
/// failed; the successor gone, nothing more comes).
async fn passed_back(inbox: Option<&tokio::net::UnixDatagram>, buf: &mut [u8]) -> Option<usize> {
    inbox?.recv(buf).await.ok()
}

/// A datagram read (or passed back by the successor): handled here, or handed to the
/// worker or process whose connection it is.
async fn route_read(shared: &Rc<Shared>, member: &Member, datagram: Handover, out: &mut Vec<u8>) {
    match member.route(datagram) {
        Owner::Here(datagram) => handle(shared, datagram, out).await,
        Owner::Handed => shared.metrics.handed_over(),
        Owner::Dropped => shared.metrics.handover_dropped(),
        Owner::Passed => shared.metrics.passed_to_predecessor(),
    }
}

/// Reads what the socket has, up to [`READS`] datagrams (or coalesced runs) at once,
/// into `slots`, [`READ_SLOT`] bytes each; how many were read.
async fn read_batch(
    shared: &Shared,
    slots: &mut [u8],
    metas: &mut [quinn_udp::RecvMeta],
) -> io::Result<usize> {
    loop {
        shared.socket.readable().await?;
        let mut chunks = slots.chunks_mut(READ_SLOT);
        let mut bufs: [IoSliceMut<'_>; READS] =
            std::array::from_fn(|_| IoSliceMut::new(chunks.next().unwrap_or_default()));
        let read = shared.socket.try_io(Interest::READABLE, || {
            shared.udp.recv((&shared.socket).into(), &mut bufs, metas)
        });
        match read {
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
            read => return read,
        }
    }
}

/// Hands one datagram to the endpoint: for a connection, a new one, or nobody.
async fn handle(shared: &Rc<Shared>, datagram: Handover, out: &mut Vec<u8>) {
    let Handover {
        remote,
        local_ip,
        ecn,
        data,
    } = datagram;
    out.clear();
    let event =
        shared
            .endpoint
            .borrow_mut()
            .handle(Instant::now(), remote, local_ip, ecn, data, out);
    match event {
        None => {}
        Some(DatagramEvent::Response(transmit)) => shared.send(&transmit, out).await,
        Some(DatagramEvent::ConnectionEvent(ch, event)) => route(shared, ch, event),
        Some(DatagramEvent::NewConnection(incoming)) => accept(shared, incoming, remote, out).await,
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
