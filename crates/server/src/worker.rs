//! A worker: one thread, one current-thread tokio runtime, its own listeners and its own
//! crypto engine. Connections never move between workers, so nothing here is `Send`.

use std::cell::Cell;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::rc::Rc;
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use terminus_engine::{Engine, EngineSpec};
use terminus_tls::{FallbackCause, KernelSupport};
use tokio::sync::{watch, Notify, OwnedSemaphorePermit, Semaphore};

use crate::admission::Admission;
use crate::listener::accept::{accept_loop, drain_before_batches, Acceptor};
use crate::metrics::{Metrics, WorkerSeries};
use crate::site::{Site, SiteHandle};
use crate::start::Gate;
use terminus_admission::clients::ClientConnection;
use terminus_config::Listen;
use terminus_http as http;

/// What every worker shares with the others and with the main thread.
/// How long the workers drain once told to stop: `shutdown_grace` at a shutdown;
/// `upgrade.drain` after a handover, unless SIGTERM or SIGINT comes meanwhile (systemd
/// stopping the service, an operator who will not wait), which cuts it to
/// `shutdown_grace` from then, as nginx's TERM after its QUIT.
pub struct Drain {
    handed_over: std::sync::OnceLock<Duration>,
    hurry: watch::Sender<bool>,
}

impl Default for Drain {
    fn default() -> Self {
        Self {
            handed_over: std::sync::OnceLock::new(),
            hurry: watch::channel(false).0,
        }
    }
}

impl Drain {
    /// The process has handed over: its drain lasts `upgrade_drain`.
    pub fn hand_over(&self, upgrade_drain: Duration) {
        let _ = self.handed_over.set(upgrade_drain);
    }

    /// Whether the process has handed over.
    pub fn handed_over(&self) -> bool {
        self.handed_over.get().is_some()
    }

    /// SIGTERM or SIGINT during the drain: it ends a shutdown's grace from now.
    pub fn hurry(&self) {
        self.hurry.send_replace(true);
    }

    fn grace(&self, shutdown_grace: Duration) -> Duration {
        self.handed_over.get().copied().unwrap_or(shutdown_grace)
    }
}

#[derive(Clone)]
pub struct Shared {
    pub site: SiteHandle,
    pub metrics: Arc<Metrics>,
    pub connection_limit: Arc<Semaphore>,
    pub shutdown: watch::Receiver<bool>,
    pub shutdown_grace: Duration,
    /// How long the drain lasts after a handover, and SIGTERM's cut of it.
    pub drain: Arc<Drain>,
    /// `limits.handshake_queue`: each worker's admission bound.
    pub handshake_queue: Duration,
    /// Each worker's crypto engine.
    pub engine: EngineSpec,
    /// What the kernel's TLS can take, probed at start-up.
    pub kernel_tls: Arc<KernelSupport>,
    /// The ACME challenges being answered (none without `[acme]`).
    pub challenges: Arc<terminus_acme::Challenges>,
    /// QUIC's configuration, where a listener has `http3`, and its admission.
    pub quic: Option<(Arc<terminus_quic::ServerConfig>, terminus_quic::Limits)>,
    /// Where plain-HTTP listeners redirect to: the first TLS listener's port, `None`
    /// for 443 (or without a TLS listener).
    pub https_port: Option<u16>,
    /// Where each worker beats while systemd's watchdog watches.
    pub heartbeats: Option<Arc<crate::notify::Heartbeats>>,
    /// `[signer]`: the keys and TLS its listeners serve terminators with.
    pub(crate) signer: Option<Arc<crate::signer::SignerService>>,
}

/// One QUIC endpoint's socket, with what it serves and its part in a handover.
pub(crate) struct QuicSocket {
    pub socket: std::net::UdpSocket,
    /// Its listener: the index among the `http3` ones, and its settings.
    pub listener: usize,
    pub listen: Listen,
    /// Its place among that listener's endpoints.
    pub slot: usize,
    pub member: terminus_quic::Member,
    /// Where a successor passes back this endpoint's connections' datagrams.
    pub inbox: std::os::unix::net::UnixDatagram,
    /// Where this endpoint passes those of the process this one replaced, while it
    /// drains.
    pub predecessor: Option<Arc<terminus_quic::Predecessor>>,
}

/// A worker's sockets, bound at start-up.
pub(crate) struct Sockets {
    /// Its TLS (and plain) listeners, each with its settings.
    pub listeners: Vec<(std::net::TcpListener, Listen)>,
    /// Its QUIC sockets.
    pub quic: Vec<QuicSocket>,
    /// Its `[signer]` listeners.
    pub signer: Vec<std::net::TcpListener>,
}

pub(crate) struct Worker {
    pub(crate) shared: Shared,
    pub(crate) engine: Engine,
    pub(crate) admission: Rc<Admission>,
    /// This worker's series: its open connections (counted here, for the drain at
    /// shutdown too) and completed handshakes.
    pub(crate) series: Arc<WorkerSeries>,
    drained: Notify,
    /// Fallback causes already logged by this worker: one debug line per cause.
    ktls_causes_logged: Cell<u32>,
    /// When a `ktls = "required"` refusal was last logged, and how many since.
    ktls_refusal_log: Cell<(Option<Instant>, u64)>,
    pub(crate) files: Rc<http::files::FileCache>,
    /// What its responses' encoders may hold, all connections together.
    pub(crate) compression: Rc<http::compress::WorkerMemory>,
    pub(crate) upstream_pool: Rc<terminus_proxy::Pool>,
}

/// Runs worker `id` on the calling thread until shutdown has drained its connections.
/// It reports on `ready` whether its event loop could be built, then waits at the `start`
/// gate until the main thread opens it (every worker ready, every start-up resource
/// held), so nothing is accepted before that.
pub(crate) fn run(
    id: usize,
    sockets: Sockets,
    cpus: Option<Vec<usize>>,
    shared: Shared,
    ready: mpsc::Sender<io::Result<()>>,
    start: Arc<Gate>,
) -> io::Result<()> {
    // Fatal, not a warning (with `pin` too, for one rule): with dedicated crypto cores, a
    // worker running anywhere could share a core with AVX-512 batches.
    if let Some(cpus) = cpus {
        if let Err(e) = terminus_sys::run_current_thread_on(&cpus) {
            let e = io::Error::new(
                e.kind(),
                format!("worker {id}: cannot run on CPUs {cpus:?} only: {e}"),
            );
            let _ = ready.send(Err(e));
            start.wait();
            return Ok(());
        }
    }
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        // Partial crypto batches are computed when the loop would otherwise sleep.
        .on_thread_park(terminus_engine::worker_idle)
        // ...and how long the worker sleeps is how much capacity it has to lend.
        .on_thread_unpark(terminus_engine::worker_awake)
        .build();
    let _ = ready.send(
        runtime
            .as_ref()
            .map(|_| ())
            .map_err(|e| io::Error::new(e.kind(), e.to_string())),
    );
    start.wait();
    let runtime = runtime?;
    if *shared.shutdown.borrow() {
        // Another worker could not start: terminus is not starting.
        return Ok(());
    }
    let local = tokio::task::LocalSet::new();
    if let Some(heartbeats) = shared.heartbeats.clone() {
        local.spawn_local(async move {
            let mut beat = tokio::time::interval(crate::notify::BEAT);
            loop {
                beat.tick().await;
                heartbeats.beat(id);
            }
        });
    }
    if let Some(after) = std::env::var(crate::notify::STALL_FAULT)
        .ok()
        .and_then(|s| s.parse::<u64>().ok())
        .filter(|_| id == 0)
    {
        local.spawn_local(async move {
            tokio::time::sleep(Duration::from_secs(after)).await;
            tracing::warn!("{}: worker 0 stalls now", crate::notify::STALL_FAULT);
            loop {
                std::thread::sleep(Duration::from_secs(3600));
            }
        });
    }
    let Sockets {
        listeners,
        quic: quic_sockets,
        signer: signer_sockets,
    } = sockets;
    local.block_on(&runtime, async move {
        let engine = shared.engine.build(shared.metrics.engine.clone());
        let flush_tasks = engine.clone();
        let worker = Rc::new(Worker {
            engine,
            admission: Admission::new(shared.handshake_queue, move || {
                flush_tasks.flush_task_time()
            }),
            series: shared.metrics.worker(id),
            shared,
            drained: Notify::new(),
            ktls_causes_logged: Cell::new(0),
            ktls_refusal_log: Cell::new((None, 0)),
            files: Rc::default(),
            compression: http::compress::WorkerMemory::new(http::compress::memory::PER_WORKER),
            upstream_pool: Rc::default(),
        });
        let acceptors = listeners
            .into_iter()
            .map(|(listener, listen)| Acceptor::new(listener, listen))
            .collect::<io::Result<Vec<_>>>()?;
        if worker.admission.bounded() {
            drain_before_batches(&acceptors, &worker);
        }
        for acceptor in acceptors {
            tokio::task::spawn_local(accept_loop(acceptor, worker.clone()));
        }
        let signer_gate = crate::signer::Gate::new();
        for socket in signer_sockets {
            tokio::task::spawn_local(crate::signer::accept_loop(
                socket,
                worker.clone(),
                signer_gate.clone(),
            ));
        }
        // Turned true once this process has handed over: the endpoints leave their
        // sockets to the successor and serve what it passes back.
        let (handed_over, succession) = watch::channel(false);
        if let Some((config, limits)) = &worker.shared.quic {
            for quic in quic_sockets {
                let listen = quic.listen;
                let serving = terminus_quic::serve(
                    quic.socket,
                    quic.member,
                    config.clone(),
                    *limits,
                    worker.engine.clone(),
                    crate::connection::quic::hooks(worker.clone(), listen),
                    terminus_quic::Succession {
                        inbox: Some(quic.inbox),
                        handed_over: succession.clone(),
                        predecessor: quic.predecessor,
                    },
                );
                tokio::task::spawn_local(async move {
                    if let Err(e) = serving.await {
                        tracing::error!("worker {id}: QUIC endpoint stopped: {e}");
                    }
                });
            }
        }
        let pool = Rc::downgrade(&worker.upstream_pool);
        tokio::task::spawn_local(terminus_proxy::Pool::keep_swept(pool));
        tokio::task::spawn_local(trim_coroutine_stacks());
        let mut shutdown = worker.shared.shutdown.clone();
        let _ = shutdown.wait_for(|&stop| stop).await;
        if worker.shared.drain.handed_over() {
            // The successor reads the QUIC sockets now (a datagram read here could be a
            // new connection's, or one of its connections'); this process's own
            // connections go on with what it passes back, told to go away (HTTP/3
            // GOAWAY) as at a shutdown.
            handed_over.send_replace(true);
        }
        let drain = &worker.shared.drain;
        let shutdown_grace = worker.shared.shutdown_grace;
        let end = tokio::time::Instant::now() + drain.grace(shutdown_grace);
        let grace = tokio::time::sleep_until(end);
        tokio::pin!(grace);
        let mut hurry = drain.hurry.subscribe();
        let mut hurried = false;
        while worker.series.open() > 0 {
            tokio::select! {
                _ = worker.drained.notified() => {}
                _ = &mut grace => {
                    tracing::warn!("worker {id}: {} connections still open after the shutdown grace period; closing them", worker.series.open());
                    break;
                }
                // SIGTERM while a handover's drain runs: a shutdown's grace from now.
                _ = hurry.wait_for(|&h| h), if !hurried => {
                    hurried = true;
                    let sooner = tokio::time::Instant::now() + shutdown_grace;
                    grace.as_mut().reset(end.min(sooner));
                }
            }
        }
        Ok(())
    })
}

/// Counts a connection open on this worker and in the metrics (and for its client
/// address, where `limits.connections_per_client` counts them).
pub(crate) struct OpenConnection {
    worker: Rc<Worker>,
    _permit: OwnedSemaphorePermit,
    client: Option<ClientConnection>,
}

impl OpenConnection {
    pub(crate) fn new(worker: Rc<Worker>, permit: OwnedSemaphorePermit) -> Self {
        worker.series.connections(1);
        worker.shared.metrics.connection_opened();
        Self {
            worker,
            _permit: permit,
            client: None,
        }
    }

    /// Counts the connection for its client address `ip` (the PROXY header's, where the
    /// listener takes one) against `limits.connections_per_client`, where the site has
    /// one: false when the address already has that many open (counted in the metrics),
    /// and the connection is to be closed.
    pub(crate) fn count_client(&mut self, ip: IpAddr, site: &Site) -> bool {
        let Some(limit) = site.connections_per_client else {
            return true;
        };
        self.client = site.clients.connection(ip, limit);
        self.client.is_some()
    }
}

impl Drop for OpenConnection {
    fn drop(&mut self) {
        self.worker.series.connections(-1);
        self.worker.shared.metrics.connection_closed();
        if self.worker.series.open() == 0 {
            self.worker.drained.notify_waiters();
        }
    }
}

impl Worker {
    pub(crate) fn log_fallback(
        &self,
        cause: FallbackCause,
        peer: SocketAddr,
        why: &dyn std::fmt::Display,
    ) {
        let bit = 1 << cause as u32;
        if self.ktls_causes_logged.get() & bit == 0 {
            self.ktls_causes_logged
                .set(self.ktls_causes_logged.get() | bit);
            tracing::debug!(%peer, "kernel TLS not used, serving with userspace TLS ({}; logged once per cause): {why}", cause.name());
        }
    }

    /// `ktls = "required"` refusals are logged at once, then at most every 10 s with a
    /// count, so a misconfigured listener cannot flood the log.
    pub(crate) fn log_refusal(&self, peer: SocketAddr, why: &dyn std::fmt::Display) {
        let (last, suppressed) = self.ktls_refusal_log.get();
        if last.is_some_and(|t| t.elapsed() < Duration::from_secs(10)) {
            self.ktls_refusal_log.set((last, suppressed + 1));
            return;
        }
        let more = if suppressed > 0 {
            format!(" ({suppressed} more refused since the last line)")
        } else {
            String::new()
        };
        tracing::warn!(%peer, "ktls = \"required\": closing the connection, kernel TLS cannot take it: {why}{more}");
        self.ktls_refusal_log.set((Some(Instant::now()), 0));
    }
}

/// Every 10 s, unmaps the handshake coroutine stacks this worker did not need in the last
/// 10 s: a burst's stacks (each with the pages it touched, some 16 KiB) go back within
/// 20 s of its end. The allocator's free memory is the housekeeping thread's
/// ([`crate::memory`]).
async fn trim_coroutine_stacks() {
    let mut tick = tokio::time::interval_at(
        tokio::time::Instant::now() + crate::memory::EVERY,
        crate::memory::EVERY,
    );
    // After a stall, one trim, not a burst of them (a second one in a row would find
    // every stack unused since the first).
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    loop {
        tick.tick().await;
        terminus_tls::handshake::bridge::trim_idle_stacks();
        // And the connections to keyless signers a reload left behind.
        terminus_keyless::client::sweep();
    }
}
