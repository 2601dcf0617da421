//! Idle upstream connections, per worker (thread-per-core: no lock, no sharing). A
//! response read to its end on a connection both sides will keep puts it back; the next
//! request to the same server takes the most recently used one, which is the likeliest
//! to still be open. Connections idle longer than their keepalive timeout, or that the
//! server closed meanwhile, are dropped instead of used.

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::net::TcpStream;

use crate::metrics::ServerMetrics;
use crate::spec::Keepalive;

/// How often the whole pool is swept for connections past their timeout (taking and
/// putting sweep only their own server's list).
const SWEEP_EVERY: Duration = Duration::from_secs(1);

/// One worker's idle upstream connections.
#[derive(Debug)]
pub struct Pool {
    idle: RefCell<HashMap<SocketAddr, Vec<Idle>>>,
    last_sweep: Cell<Instant>,
}

impl Default for Pool {
    fn default() -> Self {
        Pool {
            idle: RefCell::default(),
            last_sweep: Cell::new(Instant::now()),
        }
    }
}

#[derive(Debug)]
struct Idle {
    /// Always `Some` until taken.
    stream: Option<TcpStream>,
    until: Instant,
    metrics: Arc<ServerMetrics>,
}

impl Drop for Idle {
    fn drop(&mut self) {
        self.metrics.idle(-1);
    }
}

impl Pool {
    /// An idle connection to `address` that is still open, if there is one.
    pub(crate) fn take(&self, address: SocketAddr) -> Option<TcpStream> {
        self.sweep();
        let mut idle = self.idle.borrow_mut();
        let list = idle.get_mut(&address)?;
        let now = Instant::now();
        while let Some(mut conn) = list.pop() {
            let stream = conn.stream.take()?;
            if conn.until > now && still_open(&stream) {
                return Some(stream);
            }
        }
        None
    }

    /// Keeps `stream` for the next request to `address`, unless `keepalive` keeps no
    /// more of them.
    pub(crate) fn put(
        &self,
        address: SocketAddr,
        stream: TcpStream,
        keepalive: Keepalive,
        metrics: &Arc<ServerMetrics>,
    ) {
        self.sweep();
        let mut idle = self.idle.borrow_mut();
        let list = idle.entry(address).or_default();
        if list.len() >= keepalive.idle {
            return;
        }
        metrics.idle(1);
        list.push(Idle {
            stream: Some(stream),
            until: Instant::now() + keepalive.timeout,
            metrics: metrics.clone(),
        });
    }

    /// How many idle connections the pool holds.
    pub fn len(&self) -> usize {
        self.idle.borrow().values().map(Vec::len).sum()
    }

    /// Whether the pool holds no connection.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn sweep(&self) {
        let now = Instant::now();
        if now.duration_since(self.last_sweep.get()) < SWEEP_EVERY {
            return;
        }
        self.last_sweep.set(now);
        let mut idle = self.idle.borrow_mut();
        for list in idle.values_mut() {
            list.retain(|c| c.until > now);
        }
        idle.retain(|_, list| !list.is_empty());
    }
}

/// An idle connection has nothing to read: a FIN (0) or unsolicited bytes mean the
/// server is done with it.
fn still_open(stream: &TcpStream) -> bool {
    let mut probe = [0u8; 1];
    matches!(stream.try_read(&mut probe), Err(e) if e.kind() == io::ErrorKind::WouldBlock)
}
