//! SO_REUSEPORT listening sockets: one per worker per address, so the kernel spreads
//! connections across workers without a shared accept lock; [`accept`] takes
//! connections off them.

pub(crate) mod accept;

use std::io;
use std::net::{SocketAddr, TcpListener};

use socket2::{Domain, Protocol, Socket, Type};

const BACKLOG: i32 = 4096;

/// SO_REUSEPORT would let us share a port with another running server (a second
/// terminus, an nginx) without a word. A plain bind first fails with EADDRINUSE if anyone
/// listens there, which is the error an operator needs to see.
fn ensure_free(addr: SocketAddr) -> io::Result<()> {
    if addr.port() == 0 {
        return Ok(());
    }
    let probe = Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP))?;
    probe.set_reuse_address(true)?;
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
        ensure_free(addr).map_err(|e| (addr, e))?;
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
