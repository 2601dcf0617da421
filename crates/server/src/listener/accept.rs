//! Taking connections off a worker's listeners, with admission decided at accept.
//!
//! Each listener has an accept loop task. Under a flood that is not enough on its own: a
//! task woken by the network runs after every task already runnable, and a saturated
//! worker always has a line of them, so a connection admission would reset at once
//! waits in the listen queue for the whole line (13.6 ms at p99 in bench/overload at 2x,
//! where the bound was 25 ms). So while admission control is on, the worker also
//! [`drain`](Acceptor::drain)s its listen queues before a crypto batch (its longest
//! stretches of CPU; see `Engine::before_dispatch`), at most every 250 µs: connections beyond the bound are
//! reset there and then, and the ones taken on wait in [`Acceptor`] for the accept loop
//! to start them, counted as admitted work from that moment as if accepted by it.

use std::cell::{Cell, RefCell};
use std::collections::VecDeque;
use std::io;
use std::net::SocketAddr;
use std::rc::Rc;
use std::time::{Duration, Instant};

use socket2::SockRef;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Notify;

use crate::admission::{Refusal, Ticket};
use crate::connection;
use crate::logs::throttled::Throttled;
use crate::worker::{OpenConnection, Worker};
use terminus_config::Listen;

/// How many connections one drain takes off a listen queue at most, so that a drain
/// stays a short detour from the batch it runs before.
const DRAIN_MAX: usize = 64;

/// How often the listen queues are drained before a crypto batch at most: a refusal
/// waits little longer, and the empty accept() a drain mostly is stays a few thousand
/// calls a second at most.
const DRAIN_EVERY: Duration = Duration::from_micros(250);

/// Has `worker` drain `acceptors` before its crypto batches (see the module docs).
pub(crate) fn drain_before_batches(acceptors: &[Rc<Acceptor>], worker: &Rc<Worker>) {
    let (acceptors, weak) = (acceptors.to_vec(), Rc::downgrade(worker));
    let last = Cell::new(Instant::now());
    worker.engine.before_dispatch(move || {
        if last.get().elapsed() < DRAIN_EVERY {
            return;
        }
        last.set(Instant::now());
        if let Some(worker) = weak.upgrade() {
            for acceptor in &acceptors {
                acceptor.drain(&worker);
            }
        }
    });
}

/// One listener of a worker.
pub(crate) struct Acceptor {
    listener: TcpListener,
    /// The same socket, for accepting outside the accept loop's turn ([`Acceptor::drain`]).
    direct: std::net::TcpListener,
    listen: Rc<Listen>,
    /// Connections a drain took on, for the accept loop to start.
    taken: RefCell<VecDeque<(std::net::TcpStream, SocketAddr, Ticket)>>,
    taken_ready: Notify,
}

impl Acceptor {
    pub(crate) fn new(listener: std::net::TcpListener, listen: Listen) -> io::Result<Rc<Self>> {
        let direct = listener.try_clone()?;
        Ok(Rc::new(Self {
            listener: TcpListener::from_std(listener)?,
            direct,
            listen: Rc::new(listen),
            taken: RefCell::default(),
            taken_ready: Notify::new(),
        }))
    }

    /// Decides every connection waiting in the listen queue now (a bounded number):
    /// resets those beyond the admission bound, keeps the others for the accept loop.
    /// Never blocks: the socket is non-blocking, and the accept loop's readiness is not
    /// disturbed (it accepts until the kernel says the queue is empty, as before).
    pub(crate) fn drain(&self, worker: &Worker) {
        // Stopping (or handed over): what waits in the socket is no longer this
        // worker's to take; the successor's, after a handover.
        if *worker.shared.shutdown.borrow() {
            return;
        }
        for _ in 0..DRAIN_MAX {
            let Ok((socket, peer)) = self.direct.accept() else {
                return;
            };
            if let Some(ticket) = admit(worker, &socket) {
                self.taken.borrow_mut().push_back((socket, peer, ticket));
                self.taken_ready.notify_one();
            }
        }
    }

    /// The next connection taken on, from a drain or the listener.
    async fn next(&self, worker: &Worker) -> io::Result<(TcpStream, SocketAddr, Ticket)> {
        loop {
            let taken = self.taken.borrow_mut().pop_front();
            if let Some((socket, peer, ticket)) = taken {
                socket.set_nonblocking(true)?;
                return Ok((TcpStream::from_std(socket)?, peer, ticket));
            }
            tokio::select! {
                accepted = self.listener.accept() => {
                    let (socket, peer) = accepted?;
                    if let Some(ticket) = admit(worker, &socket) {
                        return Ok((socket, peer, ticket));
                    }
                }
                () = self.taken_ready.notified() => {}
            }
        }
    }
}

/// Takes on a connection just accepted, or turns it away unread with a reset (no FIN
/// exchange, no TIME_WAIT) when the worker is overloaded.
fn admit(worker: &Worker, socket: &impl std::os::fd::AsFd) -> Option<Ticket> {
    let waited = || terminus_sys::tcp_quiet_for(socket).unwrap_or_default();
    let resumable = || worker.shared.site.current().resumption;
    let quotas = || worker.shared.site.current().quotas;
    let ticket = worker.admission.at_accept(waited, resumable, quotas);
    if ticket.is_none() {
        let _ = SockRef::from(socket).set_linger(Some(Duration::ZERO));
        worker.shared.metrics.handshake_refused(Refusal::AtAccept);
    }
    ticket
}

/// A task for connection `conn`, taken on by `acceptor`.
fn start(
    acceptor: &Acceptor,
    worker: &Rc<Worker>,
    (socket, peer, ticket): (TcpStream, SocketAddr, Ticket),
    permit: tokio::sync::OwnedSemaphorePermit,
) {
    let open = OpenConnection::new(worker.clone(), permit);
    let (listen, task_worker) = (acceptor.listen.clone(), worker.clone());
    // Boxed: tokio moves a spawned future by value three times on its way into the
    // task; a box is moved instead, after one copy.
    tokio::task::spawn_local(Box::pin(async move {
        connection::run(socket, peer, open, ticket, &listen, task_worker).await
    }));
}

/// At shutdown, the connections a drain took on and the accept loop had not started
/// yet are served all the same (while permits last): accepted, their clients are
/// waiting on this process, not on a successor.
fn serve_taken(acceptor: &Acceptor, worker: &Rc<Worker>) {
    loop {
        let taken = acceptor.taken.borrow_mut().pop_front();
        let Some((socket, peer, ticket)) = taken else {
            return;
        };
        let Ok(permit) = worker.shared.connection_limit.clone().try_acquire_owned() else {
            return;
        };
        let conn = socket
            .set_nonblocking(true)
            .and_then(|()| TcpStream::from_std(socket));
        if let Ok(socket) = conn {
            start(acceptor, worker, (socket, peer, ticket), permit);
        }
    }
}

/// accept() failures that mean "out of resources": back off instead of spinning.
fn is_resource_exhaustion(e: &io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::EMFILE | libc::ENFILE | libc::ENOBUFS | libc::ENOMEM)
    )
}

/// Starts a task for every connection `acceptor` takes on, until shutdown.
pub(crate) async fn accept_loop(acceptor: Rc<Acceptor>, worker: Rc<Worker>) {
    let mut shutdown = worker.shared.shutdown.clone();
    // EMFILE and the like come back at every accept while they last: said once per 5 s
    // (terminus_accept_errors_total counts them all).
    let mut exhausted = Throttled::new(Duration::from_secs(5));
    loop {
        let next = std::pin::pin!(acceptor.next(&worker));
        let accepted = tokio::select! {
            r = worker.admission.metered(next) => r,
            _ = shutdown.wait_for(|&stop| stop) => {
                serve_taken(&acceptor, &worker);
                return;
            }
        };
        // The permit is taken after accept, so a worker whose backlog is empty holds none
        // of max_connections hostage. At the limit the accepted connection waits here for
        // one to close and this worker accepts nothing more: no spin, and at most one
        // waiting connection per worker beyond the limit.
        let accepted = match accepted {
            Ok(conn) => tokio::select! {
                p = worker.shared.connection_limit.clone().acquire_owned() => match p {
                    Ok(permit) => Ok((conn, permit)),
                    Err(_) => return,
                },
                _ = shutdown.wait_for(|&stop| stop) => return,
            },
            Err(e) => Err(e),
        };
        match accepted {
            Ok((conn, permit)) => {
                start(&acceptor, &worker, conn, permit);
                // Without admission control, one accept per scheduler pass, like nginx
                // without multi_accept: connections in progress finish before the backlog
                // is drained. With it, the whole backlog is decided at once (what is
                // taken on is bounded anyway): a refusal comes within one pass.
                if !worker.admission.bounded() {
                    tokio::task::yield_now().await;
                }
            }
            Err(e) => {
                worker.shared.metrics.accept_failed();
                if is_resource_exhaustion(&e) {
                    if let Some(more) = exhausted.now_with_held() {
                        tracing::warn!("accept failed: {e}; backing off (raise the open-file limit or lower limits.max_connections){more}");
                    }
                    tokio::time::sleep(Duration::from_millis(100)).await;
                } else {
                    tracing::debug!("accept failed: {e}");
                }
            }
        }
    }
}
