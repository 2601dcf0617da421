//! Idle upstream connections, per worker (thread-per-core: no lock, no sharing). A
//! response read to its end on a connection both sides will keep puts it back; the next
//! request to the same server takes the most recently used one, which is the likeliest
//! to still be open. Connections idle longer than their keepalive timeout, or that the
//! server closed meanwhile, are dropped instead of used, and a sweep every second closes
//! them even when no request comes ([`Pool::keep_swept`]): their descriptors are not held
//! until the next request to the same server. A worker keeps at most [`MAX_IDLE`] idle
//! connections in all, the one nearest its timeout closed to make room: with
//! `proxy_protocol` each client has its own, and clients are many. A connection leaves
//! the pool closed as the protocol wants: over TLS with a close_notify alert, so that
//! the server can tell our close from a connection cut off ([`Conn::close`]).

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::Context;
use std::time::{Duration, Instant};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use crate::connect::{ReadHalf, Stream, WriteHalf};
use crate::metrics::ServerMetrics;
use crate::spec::Keepalive;

/// How often the whole pool is swept for connections past their timeout or closed.
const SWEEP_EVERY: Duration = Duration::from_secs(1);

/// The most idle connections one worker keeps, over every upstream, server and client.
pub const MAX_IDLE: usize = 1024;

/// Which requests an idle connection may carry: its upstream's to its server, or, where
/// the connection began with a PROXY protocol header naming a client, only that
/// client's.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct Key {
    /// [`crate::Upstream`]'s id.
    pub(crate) upstream: u64,
    pub(crate) server: SocketAddr,
    pub(crate) client: Option<SocketAddr>,
}

/// One worker's idle upstream connections.
#[derive(Debug)]
pub struct Pool {
    idle: RefCell<HashMap<Key, Vec<Idle>>>,
    /// How many connections `idle` holds.
    count: Cell<usize>,
    /// HTTP/2 connections, one per server, shared by the requests in progress.
    pub(crate) h2: crate::h2::Connections,
}

impl Default for Pool {
    fn default() -> Self {
        Pool {
            idle: RefCell::default(),
            count: Cell::new(0),
            h2: Default::default(),
        }
    }
}

/// An upstream connection as an exchange uses it: its halves (the request body goes out
/// while the response comes in) and its read buffer, kept across requests so that a
/// reused connection costs no allocation.
#[derive(Debug)]
pub(crate) struct Conn {
    pub(crate) read: ReadHalf,
    pub(crate) write: WriteHalf,
    /// Empty between exchanges.
    pub(crate) buf: Vec<u8>,
}

impl Conn {
    pub(crate) fn new(stream: Stream) -> Self {
        let (read, write) = tokio::io::split(stream);
        Conn {
            read,
            write,
            buf: Vec::with_capacity(16 * 1024),
        }
    }

    /// Closes an idle connection: over TLS a close_notify alert, then the TCP FIN. One
    /// attempt that does not wait: an idle connection's send buffer is empty, so the
    /// alert's few bytes go at once, and a connection that cannot take them is dropped
    /// as it is (no task lives on to finish a close nobody waits for).
    pub(crate) fn close(mut self) {
        let mut cx = Context::from_waker(futures_util::task::noop_waker_ref());
        let _ = Pin::new(&mut self.write).poll_shutdown(&mut cx);
    }
}

#[derive(Debug)]
struct Idle {
    /// Always `Some` until taken.
    conn: Option<Conn>,
    until: Instant,
    metrics: Arc<ServerMetrics>,
}

impl Drop for Idle {
    fn drop(&mut self) {
        self.metrics.idle(-1);
        if let Some(conn) = self.conn.take() {
            conn.close();
        }
    }
}

impl Pool {
    /// An idle connection for `key` that is still open, if there is one.
    pub(crate) fn take(&self, key: Key) -> Option<Conn> {
        let mut idle = self.idle.borrow_mut();
        let list = idle.get_mut(&key)?;
        let now = Instant::now();
        while let Some(mut idle) = list.pop() {
            self.count.set(self.count.get() - 1);
            let conn = idle.conn.as_mut()?;
            if idle.until > now && still_open(&mut conn.read) {
                return idle.conn.take();
            }
            // Dropped, so closed.
        }
        None
    }

    /// How many idle connections the pool holds.
    pub fn idle(&self) -> usize {
        self.count.get()
    }

    /// Keeps `conn` for the next request for `key`, unless `keepalive` keeps no
    /// more of them.
    pub(crate) fn put(
        &self,
        key: Key,
        conn: Conn,
        keepalive: Keepalive,
        metrics: &Arc<ServerMetrics>,
    ) {
        let mut idle = self.idle.borrow_mut();
        if idle.get(&key).map_or(0, Vec::len) >= keepalive.idle {
            conn.close();
            return;
        }
        if self.count.get() >= MAX_IDLE {
            // The one nearest its timeout goes (the least recently used where the
            // upstreams' keepalive timeouts are the same).
            let oldest = idle
                .iter()
                .filter_map(|(k, list)| list.first().map(|c| (c.until, *k)))
                .min_by_key(|(until, _)| *until)
                .map(|(_, k)| k);
            if let Some(list) = oldest.and_then(|k| idle.get_mut(&k)) {
                list.remove(0);
                self.count.set(self.count.get() - 1);
            }
        }
        metrics.idle(1);
        self.count.set(self.count.get() + 1);
        idle.entry(key).or_default().push(Idle {
            conn: Some(conn),
            until: Instant::now() + keepalive.timeout,
            metrics: metrics.clone(),
        });
    }

    /// Closes the connections past their timeout or closed by their server.
    fn sweep(&self) {
        let now = Instant::now();
        let mut idle = self.idle.borrow_mut();
        for list in idle.values_mut() {
            list.retain_mut(|c| {
                c.until > now && c.conn.as_mut().is_some_and(|c| still_open(&mut c.read))
            });
        }
        idle.retain(|_, list| !list.is_empty());
        self.count.set(idle.values().map(Vec::len).sum());
    }

    /// Sweeps the pool every second for as long as it is in use (a worker's task).
    pub async fn keep_swept(pool: std::rc::Weak<Pool>) {
        let mut every = tokio::time::interval(SWEEP_EVERY);
        every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            every.tick().await;
            match pool.upgrade() {
                Some(pool) => pool.sweep(),
                None => return,
            }
        }
    }
}

/// An idle connection has nothing to read: a FIN or close_notify (0), an error, or
/// unsolicited bytes mean the server is done with it. One read attempt that must not
/// wait: over TLS it also takes in what the server may send unasked and that is not
/// data (session tickets), which leaves the connection usable.
fn still_open(read: &mut ReadHalf) -> bool {
    let mut probe = [0u8; 1];
    let mut buf = ReadBuf::new(&mut probe);
    let mut cx = Context::from_waker(futures_util::task::noop_waker_ref());
    Pin::new(read).poll_read(&mut cx, &mut buf).is_pending()
}
