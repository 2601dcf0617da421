//! Start-up, step by step: the crypto backend and its placement, the fleet, the site, the
//! crypto threads, the listeners, the workers, and the services beside them. Every step
//! that starts a thread adds it to the [`Services`], so that a start-up failing half-way
//! stops what it had started, and shutdown stops everything in reverse.

use std::net::{SocketAddr, TcpListener};
use std::os::unix::net::UnixDatagram;
use std::sync::{mpsc, Arc, Condvar, Mutex};
use std::thread::JoinHandle;

use terminus_config::{BackendChoice, Config, KtlsMode};
use terminus_engine::{BackendKind, EngineMetrics, EngineSpec, FlushPolicy, ThreadPool};
use terminus_fleet::Fleet;
use terminus_tls::{selfsigned, KernelSupport, LoadedCert};
use tokio::sync::{mpsc as async_mpsc, watch, Semaphore};

use crate::capacity::{self, Machine};
use crate::health_checks::HealthChecks;
use crate::metrics::Metrics;
use crate::notify::{Heartbeats, Notifier};
use crate::placement::{self, Placed};
use crate::reload::Reloader;
use crate::service::{CryptoThreads, Service, Services, Thread};
use crate::site::{self, Kept, Site, SiteHandle};
use crate::upgrade::{self, Entry, Handover, Inherited, Kind};
use crate::{admin, listener, memory, worker, ServerOptions, StartError};

/// What start-up built before anything is bound: the crypto engine's setting, the
/// machine's measure, the fleet, the first site and the metrics.
pub(crate) struct Core {
    pub(crate) backend: BackendKind,
    pub(crate) placed: Placed,
    pub(crate) machine: Arc<Machine>,
    pub(crate) fleet: Arc<Fleet>,
    pub(crate) self_signed: Vec<LoadedCert>,
    pub(crate) proxy_metrics: Arc<terminus_proxy::ProxyMetrics>,
    pub(crate) pool: Option<Arc<ThreadPool>>,
    pub(crate) metrics: Arc<Metrics>,
    /// The per-client limits' counts, shared by the workers and kept across reloads.
    pub(crate) clients: Arc<terminus_admission::clients::Clients>,
    pub(crate) challenges: Arc<terminus_acme::Challenges>,
    pub(crate) acme: Option<terminus_acme::Acme>,
    pub(crate) issued: async_mpsc::UnboundedReceiver<()>,
}

impl Core {
    /// Builds the core of `config` and its first site, starting the fleet's store rounds
    /// and the crypto threads (the ACME manager waits for the listeners:
    /// [`Core::start_acme`]).
    pub(crate) fn build(
        config: &Config,
        services: &mut Services,
    ) -> Result<(Self, Site), StartError> {
        let self_signed = self_signed_for(config)?;
        let proxy_metrics = Arc::new(terminus_proxy::ProxyMetrics::default());
        let backend = resolve_backend(config.crypto.backend)?;
        let placed = placement::place(
            config,
            backend,
            (backend == BackendKind::Multibuffer).then(capacity::unit),
        )?;
        let machine = Arc::new(Machine::new(backend, placed.clone()));
        let fleet = Arc::new(Fleet::start(
            config.ticket_keys,
            config.fleet.as_ref(),
            Some(Arc::new(capacity::FleetQuotas(machine.tenants.clone()))),
        )?);
        if let Some(sync) = fleet.store_sync() {
            services.add(Thread::spawn("fleet-store", move |stop| sync.run(stop))?);
        }
        let clients = Arc::new(terminus_admission::clients::Clients::new(config.rate_keys));
        let kept = Kept {
            self_signed: &self_signed,
            proxy_metrics: &proxy_metrics,
            tenants: &machine.tenants,
            tickets: fleet.ticketer(),
            clients: &clients,
            checking: false,
        };
        let site = Site::build(config, &kept)?;
        machine.measure(&site);
        let engine_metrics = Arc::new(EngineMetrics::new(backend));
        let pool = match backend {
            BackendKind::Threads => Some(ThreadPool::start(
                placement::crypto_threads(config),
                config.crypto.queue_capacity,
            )?),
            BackendKind::Scalar | BackendKind::Multibuffer => placed.start_pool(
                config.crypto.queue_capacity,
                engine_metrics.clone(),
                machine.crossovers.clone(),
            )?,
        };
        if let Some(pool) = &pool {
            services.add(CryptoThreads(pool.clone()));
        }
        let challenges = Arc::new(terminus_acme::Challenges::default());
        let (issued_tx, issued) = async_mpsc::unbounded_channel::<()>();
        let acme = acme(config, &challenges, issued_tx)?;
        let metrics = Arc::new(Metrics::new(
            engine_metrics,
            pool.clone(),
            machine.clone(),
            proxy_metrics.clone(),
            fleet.clone(),
            acme.as_ref().map(terminus_acme::Acme::metrics),
            clients.clone(),
        ));
        let core = Self {
            backend,
            placed,
            machine,
            fleet,
            self_signed,
            proxy_metrics,
            pool,
            metrics,
            clients,
            challenges,
            acme,
            issued,
        };
        Ok((core, site))
    }

    /// `site`'s certificates, on standard output (the self-signed ones' fingerprints are
    /// what a client pins).
    pub(crate) fn print_certificates(&self, site: &Site) {
        let origin = if self.self_signed.is_empty() {
            ""
        } else {
            " (self-signed)"
        };
        for (names, key, fp) in &site.certificates {
            println!("certificate {names} {key}{origin} SHA256 Fingerprint={fp}");
        }
    }

    /// What the workers share, for `config`'s `bound` listeners serving `handle`'s site.
    pub(crate) fn shared(
        &self,
        config: &Config,
        bound: &Bound,
        handle: &SiteHandle,
        shutdown: watch::Receiver<bool>,
    ) -> Result<worker::Shared, StartError> {
        let quic = match bound.http3.is_empty() {
            true => None,
            false => Some(quic_config(config, handle)?),
        };
        Ok(worker::Shared {
            site: handle.clone(),
            metrics: self.metrics.clone(),
            connection_limit: Arc::new(Semaphore::new(config.max_connections)),
            shutdown,
            shutdown_grace: config.shutdown_grace,
            drain: Arc::default(),
            handshake_queue: config.handshake_queue,
            engine: EngineSpec {
                backend: self.backend,
                policy: FlushPolicy {
                    max_batch_delay: config.crypto.max_batch_delay,
                },
                crossovers: self.machine.crossovers.clone(),
                pool: self.pool.clone(),
            },
            kernel_tls: Arc::new(probe_kernel_tls(config)),
            challenges: self.challenges.clone(),
            quic,
            https_port: bound
                .addrs
                .iter()
                .zip(&config.listen)
                .find(|(_, l)| l.plain.is_none())
                .map(|(addr, _)| addr.port())
                .filter(|&port| port != 443),
            heartbeats: None,
            signer: match &config.signer {
                None => None,
                Some(signer) => Some(Arc::new(
                    crate::signer::SignerService::load(signer, config.handshake_timeout)
                        .map_err(StartError::Signer)?,
                )),
            },
        })
    }

    /// Starts the ACME manager, if a server takes its certificates from `[acme]`: once the
    /// listeners accept, so that its challenges can be answered.
    pub(crate) fn start_acme(&mut self, services: &mut Services) -> std::io::Result<()> {
        if let Some(acme) = self.acme.take() {
            services.add(Thread::spawn("acme", move |stop| acme.run(stop))?);
        }
        Ok(())
    }

    /// What a reload needs, once the workers serve `handle`'s site.
    pub(crate) fn reloader(
        self,
        options: &ServerOptions,
        config: Config,
        handle: SiteHandle,
        checks: HealthChecks,
        (notifier, heartbeats): (Notifier, Option<Arc<Heartbeats>>),
    ) -> Reloader {
        Reloader {
            options: options.clone(),
            live: config.clone(),
            started: config,
            self_signed: self.self_signed,
            proxy_metrics: self.proxy_metrics,
            fleet: self.fleet,
            machine: self.machine,
            clients: self.clients,
            handle,
            checks,
            issued: self.issued,
            notifier,
            heartbeats,
        }
    }
}

/// The sockets of `config`'s listeners, bound before any worker starts (or taken
/// from the process this one replaces).
pub(crate) struct Bound {
    /// Each worker's TCP listeners (SO_REUSEPORT), each with its index in
    /// `config.listen`.
    pub(crate) per_worker: Vec<Vec<(TcpListener, usize)>>,
    /// Each listener's address (the port chosen, for port 0).
    pub(crate) addrs: Vec<SocketAddr>,
    /// The listeners with `http3`.
    pub(crate) http3: Vec<SocketAddr>,
    /// Each worker's QUIC sockets with their places among their listener's endpoints.
    pub(crate) quic_per_worker: Vec<Vec<worker::QuicSocket>>,
    /// The admin listener.
    pub(crate) admin: Option<TcpListener>,
    /// Each worker's `[signer]` listeners (SO_REUSEPORT), each with its index in
    /// `signer.listen`.
    pub(crate) signer_per_worker: Vec<Vec<(TcpListener, usize)>>,
    /// Their addresses.
    pub(crate) signer_addrs: Vec<SocketAddr>,
    /// The control socket (`upgrade.socket`) and its path.
    pub(crate) control: Option<(std::os::unix::net::UnixListener, std::path::PathBuf)>,
    /// A copy of every socket above, for a successor.
    pub(crate) handover: Handover,
}

impl Bound {
    /// Binds `config`'s sockets for `workers` workers, taking first those `inherited`
    /// from the process this one replaces.
    pub(crate) fn bind(
        config: &Config,
        workers: usize,
        inherited: &mut Inherited,
    ) -> Result<Self, StartError> {
        let listen = |(addr, source)| StartError::Listen { addr, source };
        let configured: Vec<SocketAddr> = config.listen.iter().map(|l| l.addr).collect();
        let listener::Bound { per_worker, addrs } =
            listener::bind_all(&configured, workers, &mut |addr| {
                inherited.take(Kind::Tcp, Some(addr))
            })
            .map_err(listen)?;
        let http3: Vec<SocketAddr> = addrs
            .iter()
            .zip(&config.listen)
            .filter(|(_, l)| l.http3)
            .map(|(addr, _)| *addr)
            .collect();
        let configured_of = |bound: SocketAddr| {
            let at = addrs.iter().position(|a| *a == bound);
            at.map(|i| configured[i])
        };
        let udp = listener::bind_udp_all(&http3, workers, &mut |bound| {
            inherited.take(Kind::Udp, configured_of(bound))
        })
        .map_err(listen)?;
        // The predecessor's QUIC inboxes, for each http3 listener: its connections'
        // datagrams go there while it drains.
        let predecessors = (http3.iter())
            .map(|bound| {
                let inboxes = inherited.take(Kind::QuicInbox, configured_of(*bound));
                terminus_quic::Predecessor::new(
                    inboxes.into_iter().map(UnixDatagram::from).collect(),
                )
            })
            .collect::<std::io::Result<Vec<_>>>()?;
        let admin = match config.admin {
            None => None,
            Some(addr) => Some(match inherited.take(Kind::Admin, Some(addr)).pop() {
                Some(socket) => TcpListener::from(socket),
                None => TcpListener::bind(addr).map_err(|source| listen((addr, source)))?,
            }),
        };
        let signer = config.signer.as_ref().map_or(&[][..], |s| &s.listen[..]);
        let signer = listener::bind_all(signer, workers, &mut |addr| {
            inherited.take(Kind::Signer, Some(addr))
        })
        .map_err(listen)?;
        let control = control_socket(config, inherited)?;
        let mut bound = Self {
            per_worker,
            addrs,
            http3,
            quic_per_worker: Vec::new(),
            admin,
            signer_per_worker: signer.per_worker,
            signer_addrs: signer.addrs,
            control,
            handover: Handover::default(),
        };
        if inherited.left() > 0 {
            tracing::info!(
                "upgrade: {} sockets handed over are not in this configuration: closed",
                inherited.left()
            );
        }
        let listens: Vec<_> = (config.listen.iter())
            .filter(|l| l.http3)
            .cloned()
            .collect();
        let (quic, inboxes) = quic_endpoints(udp, &listens, &predecessors)?;
        bound.keep_copies(config, &quic, &inboxes)?;
        bound.quic_per_worker = quic;
        Ok(bound)
    }

    /// Copies of every socket, for a successor: taken now, while they are all here.
    fn keep_copies(
        &mut self,
        config: &Config,
        quic: &[Vec<worker::QuicSocket>],
        inboxes: &[(usize, usize, UnixDatagram)],
    ) -> std::io::Result<()> {
        let entry = |kind, configured, bound, worker| Entry {
            kind,
            configured,
            bound,
            worker,
        };
        let handover = &mut self.handover;
        for (worker, sockets) in self.per_worker.iter().enumerate() {
            for (socket, index) in sockets {
                let (configured, bound) = (config.listen[*index].addr, self.addrs[*index]);
                let e = entry(Kind::Tcp, Some(configured), Some(bound), worker);
                handover.keep(e, socket)?;
            }
        }
        let http3: Vec<SocketAddr> = (config.listen.iter())
            .filter(|l| l.http3)
            .map(|l| l.addr)
            .collect();
        for q in quic.iter().flatten() {
            let (configured, bound) = (http3[q.listener], self.http3[q.listener]);
            let e = entry(Kind::Udp, Some(configured), Some(bound), q.slot);
            handover.keep(e, &q.socket)?;
        }
        for (listener, slot, inbox) in inboxes {
            let (configured, bound) = (http3[*listener], self.http3[*listener]);
            let e = entry(Kind::QuicInbox, Some(configured), Some(bound), *slot);
            handover.keep(e, inbox)?;
        }
        if let (Some(socket), Some(addr)) = (&self.admin, config.admin) {
            handover.keep(entry(Kind::Admin, Some(addr), None, 0), socket)?;
        }
        let signer = config.signer.as_ref().map_or(&[][..], |s| &s.listen[..]);
        for (worker, sockets) in self.signer_per_worker.iter().enumerate() {
            for (socket, index) in sockets {
                let e = entry(Kind::Signer, Some(signer[*index]), None, worker);
                handover.keep(e, socket)?;
            }
        }
        Ok(())
    }

    /// The listening addresses on standard output, and what started in the log.
    pub(crate) fn announce(&self, config: &Config, core: &Core) {
        // Before the HTTPS listeners: what reads the first `listening on https://` line
        // (tests, scripts) has seen these by then.
        for addr in &self.signer_addrs {
            println!("keyless signer on {addr} (mutual TLS)");
        }
        for (addr, l) in self.addrs.iter().zip(&config.listen) {
            if l.plain.is_some() {
                println!(
                    "listening on http://{addr}/ (plain: ACME challenges, redirects to https)"
                );
                continue;
            }
            println!("listening on https://{addr}/");
            tracing::info!("listener {addr}: ktls {}", l.ktls.name());
        }

        tracing::info!(
            "terminus started: {} workers{}, crypto backend {}{}, config {}",
            core.placed.workers,
            if config.pin { " pinned" } else { "" },
            core.backend.name(),
            if core.backend == BackendKind::Multibuffer {
                format!(" ({})", core.placed.describe())
            } else {
                String::new()
            },
            config.source
        );
    }
}

/// The control socket's thread, for `terminus upgrade` and SIGUSR2.
pub(crate) fn start_control(
    settings: upgrade::control::Settings,
    services: &mut Services,
) -> Result<upgrade::control::Upgrades, StartError> {
    let (thread, upgrades) = upgrade::control::start(settings)?;
    services.add(thread);
    Ok(upgrades)
}

/// The control socket `terminus upgrade` reaches: `upgrade.socket`, where a failure
/// to bind it stops the start; else [`upgrade::DEFAULT_SOCKET`] where its folder exists
/// (systemd's `RuntimeDirectory=`), a failure only warned of. The one a predecessor
/// answered on is taken over when it is the same path.
fn control_socket(
    config: &Config,
    inherited: &mut Inherited,
) -> Result<Option<(std::os::unix::net::UnixListener, std::path::PathBuf)>, StartError> {
    let handed = inherited.take(Kind::Control, None).pop();
    let (path, explicit) = match &config.upgrade_socket {
        Some(path) => (path.clone(), true),
        None => (std::path::PathBuf::from(upgrade::DEFAULT_SOCKET), false),
    };
    if let (Some(socket), Some(theirs)) = (handed, &inherited.control_path) {
        if *theirs == path {
            return Ok(Some((socket.into(), path)));
        }
    }
    if !explicit && !path.parent().is_some_and(|p| p.is_dir()) {
        tracing::debug!("no upgrade.socket: `terminus upgrade` cannot reach this process");
        return Ok(None);
    }
    match upgrade::control::bind(&path) {
        Ok(listener) => Ok(Some((listener, path))),
        Err(why) if explicit => Err(StartError::Upgrade(why)),
        Err(why) => {
            tracing::warn!("{why}: `terminus upgrade` cannot reach this process");
            Ok(None)
        }
    }
}

/// The workers: one thread each, all told to drain by one signal.
pub(crate) struct Workers {
    shutdown: watch::Sender<bool>,
    threads: Vec<JoinHandle<std::io::Result<()>>>,
}

/// Where the workers wait, once their event loops are built, until start-up lets them
/// accept: opened once, by the main thread, when everything start-up needs is held, or
/// when start-up failed (after the shutdown signal, so they return at once).
pub(crate) struct Gate {
    open: Mutex<bool>,
    opened: Condvar,
}

impl Gate {
    fn new() -> Arc<Self> {
        Arc::new(Self {
            open: Mutex::new(false),
            opened: Condvar::new(),
        })
    }

    /// Waits until the gate is open.
    pub(crate) fn wait(&self) {
        let mut open = self.open.lock().unwrap_or_else(|p| p.into_inner());
        while !*open {
            open = self.opened.wait(open).unwrap_or_else(|p| p.into_inner());
        }
    }

    /// Lets every worker waiting, and every one to come, through.
    pub(crate) fn open(&self) {
        *self.open.lock().unwrap_or_else(|p| p.into_inner()) = true;
        self.opened.notify_all();
    }
}

impl Workers {
    /// Starts a worker per `bound.per_worker` entry. Each reports whether its event loop
    /// could be built; only when all could does any accept (they wait at the [`Gate`]
    /// returned, which the caller opens). Where one could not be built, or a thread not
    /// started, those started are stopped and joined.
    pub(crate) fn start(
        config: &Config,
        placed: &Placed,
        bound: &mut Bound,
        shared: worker::Shared,
        shutdown: watch::Sender<bool>,
    ) -> Result<(Self, Arc<Gate>), StartError> {
        let per_worker = std::mem::take(&mut bound.per_worker);
        let mut quic = std::mem::take(&mut bound.quic_per_worker).into_iter();
        let mut signer = std::mem::take(&mut bound.signer_per_worker).into_iter();
        let gate = Gate::new();
        let (ready_tx, ready_rx) = mpsc::channel();
        let mut workers = Workers {
            shutdown,
            threads: Vec::new(),
        };
        let mut failed = None;
        for (id, listeners) in per_worker.into_iter().enumerate() {
            let listeners = (listeners.into_iter())
                .map(|(socket, index)| (socket, config.listen[index].clone()))
                .collect();
            let quic_sockets = quic.next().unwrap_or_default();
            let signer_sockets = (signer.next().unwrap_or_default().into_iter())
                .map(|(socket, _)| socket)
                .collect();
            let (shared, cpus) = (shared.clone(), placed.cpus_of_worker(id, config.pin));
            let (gate, ready) = (gate.clone(), ready_tx.clone());
            let spawned = std::thread::Builder::new()
                .name(format!("worker-{id}"))
                .spawn(move || {
                    let sockets = worker::Sockets {
                        listeners,
                        quic: quic_sockets,
                        signer: signer_sockets,
                    };
                    worker::run(id, sockets, cpus, shared, ready, gate)
                });
            match spawned {
                Ok(thread) => workers.threads.push(thread),
                Err(e) => {
                    failed = Some(e);
                    break;
                }
            }
        }
        drop(ready_tx);
        let not_ready = (0..workers.threads.len())
            .filter_map(|_| ready_rx.recv().ok().and_then(Result::err))
            .next();
        if let Some(e) = failed.or(not_ready) {
            workers.stop();
            gate.open();
            Box::new(workers).join();
            return Err(StartError::Io(e));
        }
        Ok((workers, gate))
    }
}

impl Service for Workers {
    fn name(&self) -> &str {
        "workers"
    }

    fn stop(&mut self) {
        let _ = self.shutdown.send(true);
    }

    fn join(self: Box<Self>) {
        for t in self.threads {
            match t.join() {
                Ok(Err(e)) => tracing::error!("worker failed: {e}"),
                Err(_) => tracing::error!("worker panicked"),
                Ok(Ok(())) => {}
            }
        }
    }
}

/// The admin listener's thread, serving the status page, `/metrics` and `/capacity`;
/// the page describes `listeners`.
pub(crate) fn start_admin(
    listener: TcpListener,
    metrics: Arc<Metrics>,
    listeners: Vec<admin::Listener>,
    timeouts: terminus_http::Timeouts,
    services: &mut Services,
) -> Result<(), StartError> {
    let addr = listener.local_addr()?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    services.add(Thread::spawn("admin", move |stop| {
        if let Err(e) = admin::run(runtime, listener, metrics, listeners, timeouts, stop) {
            tracing::error!("admin listener failed: {e}");
        }
    })?);
    println!("admin on http://{addr}/metrics");
    println!("status page on http://{addr}/");
    Ok(())
}

/// The health checks' and memory housekeeping's threads.
pub(crate) fn start_background(services: &mut Services) -> Result<HealthChecks, StartError> {
    let (checks, thread) = HealthChecks::start()?;
    services.add(thread);
    services.add(Thread::spawn("housekeeping", memory::housekeeping)?);
    Ok(checks)
}

/// Self-signed certificates for the hosts that name none (the embedded default).
pub(crate) fn self_signed_for(config: &Config) -> Result<Vec<LoadedCert>, StartError> {
    let mut names: Vec<String> = config
        .servers
        .iter()
        .filter(|s| s.certificates.is_empty())
        .flat_map(|s| s.names.iter().cloned())
        .collect();
    if names.is_empty() {
        return Ok(Vec::new());
    }
    names.dedup();
    Ok(selfsigned::generate(&names)?)
}

/// QUIC's TLS configuration, built once for the endpoints' life: its certificates follow
/// the current site (reloads, ACME renewals).
fn quic_config(
    config: &Config,
    handle: &SiteHandle,
) -> Result<(Arc<terminus_quic::ServerConfig>, terminus_quic::Limits), StartError> {
    let mut tls = (*handle.current().tls).clone();
    tls.cert_resolver = Arc::new(site::LiveCertificates(handle.clone()));
    Ok((
        terminus_quic::server_config(
            &Arc::new(tls),
            config.http3_early_data.then_some(config.tls.session_cache),
        )?,
        terminus_quic::Limits {
            handshake_timeout: config.handshake_timeout,
            ..config.http3
        },
    ))
}

/// The ACME manager, if a server takes its certificates from `[acme]`: it tells the
/// server through `issued` when it stored one, and the server rebuilds its site.
fn acme(
    config: &Config,
    challenges: &Arc<terminus_acme::Challenges>,
    issued: async_mpsc::UnboundedSender<()>,
) -> Result<Option<terminus_acme::Acme>, StartError> {
    let Some(settings) = &config.acme else {
        return Ok(None);
    };
    let targets: Vec<terminus_acme::Target> = config
        .servers
        .iter()
        .filter(|s| s.acme)
        .map(|s| terminus_acme::Target {
            names: s.names.clone(),
        })
        .collect();
    if targets.is_empty() {
        tracing::warn!("[acme] is configured but no server has certificates = \"acme\"");
        return Ok(None);
    }
    let acme = terminus_acme::Acme::new(
        settings.clone(),
        targets,
        config.fleet.as_ref(),
        challenges.clone(),
        Arc::new(move || {
            let _ = issued.send(());
        }),
    )?;
    tracing::info!(
        "acme: certificates from {} ({}), kept in {}{}",
        settings.directory,
        settings.challenge.name(),
        settings.state_dir.display(),
        if config.fleet.is_some() {
            " and in the fleet's store"
        } else {
            ""
        }
    );
    Ok(Some(acme))
}

/// Probes what the kernel's TLS can take, unless no listener wants it, and says so once.
fn probe_kernel_tls(config: &Config) -> KernelSupport {
    if config.listen.iter().all(|l| l.ktls == KtlsMode::Off) {
        return KernelSupport::none("ktls = \"off\" on every listener");
    }
    let support = KernelSupport::probe();
    tracing::info!("kernel TLS {}", support.summary());
    if !support.any() {
        for l in config
            .listen
            .iter()
            .filter(|l| l.ktls == KtlsMode::Required)
        {
            tracing::warn!("listener {} has ktls = \"required\" but this kernel has no usable kernel TLS: its connections will be refused after the handshake", l.addr);
        }
    }
    support
}

/// The backend `crypto.backend` chose, with `auto` decided by the CPU's features.
pub(crate) fn resolve_backend(choice: BackendChoice) -> Result<BackendKind, StartError> {
    match choice {
        BackendChoice::Auto => {
            let kind = BackendKind::auto();
            if kind == BackendKind::Scalar {
                tracing::info!("crypto backend auto: crypto_mb cannot run on this CPU (no AVX-512 IFMA), computing handshake crypto scalar");
            }
            Ok(kind)
        }
        BackendChoice::Use(BackendKind::Multibuffer)
            if BackendKind::auto() != BackendKind::Multibuffer =>
        {
            Err(StartError::MultibufferUnavailable)
        }
        BackendChoice::Use(kind) => Ok(kind),
    }
}

/// Each worker's QUIC endpoints (one per http3 listener, and any surplus socket a
/// predecessor with more workers handed over) with their places among their listener's
/// endpoints, which hand each other datagrams for their connections; and the other end
/// of each endpoint's inbox (listener, slot), for a successor.
#[allow(clippy::type_complexity)]
fn quic_endpoints(
    per_worker: listener::UdpPerWorker,
    listens: &[terminus_config::Listen],
    predecessors: &[Option<Arc<terminus_quic::Predecessor>>],
) -> std::io::Result<(
    Vec<Vec<worker::QuicSocket>>,
    Vec<(usize, usize, UnixDatagram)>,
)> {
    let mut counts = vec![0usize; predecessors.len()];
    for (_, listener) in per_worker.iter().flatten() {
        counts[*listener] += 1;
    }
    let mut members: Vec<_> = counts
        .iter()
        .map(|&n| terminus_quic::members(n).into_iter().enumerate())
        .collect();
    let mut inboxes = Vec::new();
    let mut quic = Vec::with_capacity(per_worker.len());
    for sockets in per_worker {
        let mut endpoints = Vec::with_capacity(sockets.len());
        for (socket, listener) in sockets {
            let Some((slot, member)) = members[listener].next() else {
                continue;
            };
            let (inbox, successors_end) = terminus_quic::succession::inbox_pair()?;
            inboxes.push((listener, slot, successors_end));
            endpoints.push(worker::QuicSocket {
                socket,
                listener,
                listen: listens[listener].clone(),
                slot,
                member,
                inbox,
                predecessor: predecessors[listener].clone(),
            });
        }
        quic.push(endpoints);
    }
    Ok((quic, inboxes))
}

/// Every client connection takes a descriptor: as HAProxy does, the soft limit is raised
/// toward `max_connections` and some room besides (upstreams, files, listeners), up to
/// the hard limit, which only privilege raises. Below that, accept fails and backs off
/// (with a warning then).
pub(crate) fn raise_open_file_limit(max_connections: usize) {
    let wanted = max_connections as u64 + 1024;
    match terminus_sys::raise_open_file_limit(wanted) {
        Ok(limit) if limit < wanted => tracing::warn!(
            "open-file limit {limit} is below the {wanted} limits.max_connections = {max_connections} may need (raise the hard limit: ulimit -Hn, LimitNOFILE=)"
        ),
        Ok(_) => {}
        Err(e) => tracing::warn!("cannot raise the open-file limit: {e}"),
    }
}
