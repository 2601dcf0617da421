//! SO_REUSEPORT listening sockets: one per worker per address, so the kernel spreads
//! connections across workers without a shared accept lock; [`accept`] takes
//! connections off them. A listener with `http3` has a UDP socket per worker on the same
//! address too, for QUIC.

pub(crate) mod accept;

use std::io;
use std::net::{SocketAddr, TcpListener, UdpSocket};

use socket2::{Domain, Protocol, Socket, Type};

const BACKLOG: i32 = 4096;

/// SO_REUSEPORT would let us share a port with another running server (a second
/// terminus, an nginx) without a word. A plain bind first fails with EADDRINUSE if anyone
/// listens there, which is the error an operator needs to see.
fn ensure_free(addr: SocketAddr, kind: Type) -> io::Result<()> {
    if addr.port() == 0 {
        return Ok(());
    }
    let protocol = if kind == Type::DGRAM {
        Protocol::UDP
    } else {
        Protocol::TCP
    };
    let probe = Socket::new(Domain::for_address(addr), kind, Some(protocol))?;
    // TCP's TIME_WAIT leftovers do not make a port busy; for UDP, SO_REUSEADDR would let
    // the probe share a port another server holds.
    probe.set_reuse_address(kind == Type::STREAM)?;
    if addr.is_ipv6() {
        probe.set_only_v6(true)?;
    }
    probe.bind(&addr.into())
}

fn bind(addr: SocketAddr) -> io::Result<TcpListener> {
    let socket = Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP))?;
    socket.set_reuse_address(true)?;
    socket.set_reuse_port(true)?;
    if addr.is_ipv6() {
        socket.set_only_v6(true)?;
    }
    socket.set_nonblocking(true)?;
    socket.bind(&addr.into())?;
    socket.listen(BACKLOG)?;
    Ok(socket.into())
}

/// The sockets of every worker, and the addresses actually bound.
pub struct Bound {
    /// Each worker's listeners, each with the index of its address in `addrs` (a
    /// worker has one per address, or more where a handover brought more sockets than
    /// there are workers).
    pub per_worker: Vec<Vec<(TcpListener, usize)>>,
    pub addrs: Vec<SocketAddr>,
}

/// Sockets a previous process handed over for an address as configured, in its
/// workers' order (none without a handover).
pub type Inherit<'a> = &'a mut dyn FnMut(SocketAddr) -> Vec<std::os::fd::OwnedFd>;

/// Binds every address once per worker. Port 0 is resolved by the first bind and reused
/// by the others, so all workers share one port. Where a previous process handed
/// sockets over for an address (`inherit`), they are used first, one per worker, and
/// any beyond the workers' count shared among them: every socket already in the
/// address's SO_REUSEPORT group keeps being accepted from, so nothing queued in one is
/// lost. An error names the address.
pub fn bind_all(
    addrs: &[SocketAddr],
    workers: usize,
    inherit: Inherit<'_>,
) -> Result<Bound, (SocketAddr, io::Error)> {
    let mut per_worker: Vec<Vec<(TcpListener, usize)>> = (0..workers).map(|_| Vec::new()).collect();
    let mut bound = Vec::new();
    for (index, &addr) in addrs.iter().enumerate() {
        let mut sockets: Vec<TcpListener> =
            inherit(addr).into_iter().map(TcpListener::from).collect();
        if sockets.is_empty() {
            ensure_free(addr, Type::STREAM).map_err(|e| (addr, e))?;
            sockets.push(bind(addr).map_err(|e| (addr, e))?);
        }
        let actual = sockets[0].local_addr().map_err(|e| (addr, e))?;
        while sockets.len() < workers {
            sockets.push(bind(actual).map_err(|e| (actual, e))?);
        }
        for (i, socket) in sockets.into_iter().enumerate() {
            socket.set_nonblocking(true).map_err(|e| (actual, e))?;
            per_worker[i % workers].push((socket, index));
        }
        bound.push(actual);
    }
    Ok(Bound {
        per_worker,
        addrs: bound,
    })
}

fn bind_udp(addr: SocketAddr) -> io::Result<UdpSocket> {
    let socket = Socket::new(Domain::for_address(addr), Type::DGRAM, Some(Protocol::UDP))?;
    socket.set_reuse_port(true)?;
    if addr.is_ipv6() {
        socket.set_only_v6(true)?;
    }
    socket.set_nonblocking(true)?;
    socket.bind(&addr.into())?;
    // A worker busy with a batch of handshakes reads its socket a few milliseconds
    // late; the default 208 KiB holds fewer than a hundred full-size datagrams, and a
    // dropped Initial costs its client a second (QUIC's first retransmission timeout).
    // quic-go asks for the same.
    match terminus_sys::set_socket_buffers(&socket, UDP_BUFFER) {
        Ok(granted) if granted < UDP_BUFFER => tracing::warn!(
            "QUIC socket {addr}: receive buffer {} KiB, not the {} KiB asked for; raise net.core.rmem_max and wmem_max (or run with CAP_NET_ADMIN) so bursts of datagrams are not dropped",
            granted / 1024,
            UDP_BUFFER / 1024
        ),
        Ok(_) => {}
        Err(e) => tracing::warn!("QUIC socket {addr}: cannot size its buffers: {e}"),
    }
    Ok(socket.into())
}

/// Receive and send buffer of each QUIC socket.
const UDP_BUFFER: usize = 7 << 20;

/// Each worker's UDP sockets, each with the index of its address.
pub type UdpPerWorker = Vec<Vec<(UdpSocket, usize)>>;

/// Binds a UDP socket per worker at each of `addrs` (the TCP listeners' bound
/// addresses, so the port is the same), using first the sockets a previous process
/// handed over for it (`inherit`, by bound address). Each worker's sockets come with
/// the index in `addrs` of their address. Inherited sockets beyond the workers' count
/// are kept, spread over the workers (a worker then reads two sockets of one address),
/// as TCP's are: closed, one would stay in the kernel's group as long as the old
/// process holds its copy (it sends its draining connections' datagrams on it), and the
/// datagrams the kernel steered to it would go unread. An error names the address.
pub fn bind_udp_all(
    addrs: &[SocketAddr],
    workers: usize,
    inherit: Inherit<'_>,
) -> Result<UdpPerWorker, (SocketAddr, io::Error)> {
    let mut per_worker: UdpPerWorker = (0..workers).map(|_| Vec::new()).collect();
    for (index, &addr) in addrs.iter().enumerate() {
        let mut inherited = inherit(addr).into_iter().map(UdpSocket::from);
        if inherited.len() == 0 {
            ensure_free(addr, Type::DGRAM).map_err(|e| (addr, e))?;
        }
        for sockets in per_worker.iter_mut() {
            let socket = match inherited.next() {
                Some(socket) => socket,
                None => bind_udp(addr).map_err(|e| (addr, e))?,
            };
            sockets.push((socket, index));
        }
        for (surplus, socket) in inherited.enumerate() {
            per_worker[surplus % workers].push((socket, index));
        }
    }
    Ok(per_worker)
}
