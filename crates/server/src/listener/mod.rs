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
    pub per_worker: Vec<Vec<TcpListener>>,
    pub addrs: Vec<SocketAddr>,
}

/// Binds every address once per worker. Port 0 is resolved by the first bind and reused
/// by the others, so all workers share one port. An error names the address.
pub fn bind_all(addrs: &[SocketAddr], workers: usize) -> Result<Bound, (SocketAddr, io::Error)> {
    let mut per_worker: Vec<Vec<TcpListener>> = (0..workers).map(|_| Vec::new()).collect();
    let mut bound = Vec::new();
    for &addr in addrs {
        ensure_free(addr, Type::STREAM).map_err(|e| (addr, e))?;
        let first = bind(addr).map_err(|e| (addr, e))?;
        let actual = first.local_addr().map_err(|e| (addr, e))?;
        per_worker[0].push(first);
        for sockets in per_worker.iter_mut().skip(1) {
            sockets.push(bind(actual).map_err(|e| (actual, e))?);
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

/// Binds a UDP socket per worker at each of `addrs` (the TCP listeners' bound
/// addresses, so the port is the same). An error names the address.
pub fn bind_udp_all(
    addrs: &[SocketAddr],
    workers: usize,
) -> Result<Vec<Vec<UdpSocket>>, (SocketAddr, io::Error)> {
    let mut per_worker: Vec<Vec<UdpSocket>> = (0..workers).map(|_| Vec::new()).collect();
    for &addr in addrs {
        ensure_free(addr, Type::DGRAM).map_err(|e| (addr, e))?;
        for sockets in per_worker.iter_mut() {
            sockets.push(bind_udp(addr).map_err(|e| (addr, e))?);
        }
    }
    Ok(per_worker)
}
