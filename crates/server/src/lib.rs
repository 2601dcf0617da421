//! The terminus server: configuration, workers and listeners, connection lifecycle,
//! HTTP and static files, admin and metrics.
//!
//! [`run`] starts everything and blocks until SIGTERM/SIGINT has drained the workers;
//! SIGHUP reloads the configuration and certificates in place.

mod access_log;
mod admin;
mod admission;
mod capacity;
mod connection;
mod health_checks;
mod http;
mod listener;
mod memory;
mod metrics;
mod placement;
mod site;
mod worker;

use std::path::PathBuf;
use std::sync::{Arc, Barrier};
use std::thread;

use terminus_engine::{BackendKind, EngineMetrics, EngineSpec, FlushPolicy, ThreadPool};
use terminus_fleet::{Fleet, StoreProblem};
use terminus_tls::selfsigned;
use terminus_tls::{KernelSupport, LoadedCert};
use tokio::signal::unix::{signal, SignalKind};
use tokio::sync::{watch, Semaphore};

use capacity::Machine;
use metrics::Metrics;
use site::{Kept, Site, SiteHandle};
pub use terminus_config::{parse_duration, Overrides};
use terminus_config::{BackendChoice, Config, ConfigError, KtlsMode};

/// How terminus was asked to run.
#[derive(Debug, Clone, Default)]
pub struct ServerOptions {
    /// The configuration file; the embedded default without one.
    pub config_path: Option<PathBuf>,
    /// Command-line flags, which win over the file.
    pub overrides: Overrides,
}

/// Why terminus could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error("{0}")]
    /// The configuration is wrong (file, line and what to fix).
    Config(#[from] ConfigError),
    #[error("cannot make the self-signed certificates: {0}")]
    /// The embedded default's certificates could not be made.
    SelfSigned(#[from] selfsigned::SelfSignedError),
    #[error("crypto backend multibuffer: crypto_mb cannot run on this CPU (it needs AVX-512 IFMA); use crypto.backend = \"auto\" or \"scalar\"")]
    /// `crypto.backend = "multibuffer"` on a CPU without AVX-512 IFMA.
    MultibufferUnavailable,
    #[error("{0}")]
    /// (`check`) The ACME issuer cannot work as configured.
    Acme(String),
    #[error("http3: {0}")]
    /// The TLS settings cannot serve QUIC.
    Http3(String),
    #[error("[fleet]: {0}")]
    /// The fleet's store settings cannot work, or (`check`) the store does not answer.
    Fleet(String),
    #[error("cannot listen on {addr}: {source}")]
    /// A listener's address cannot be bound.
    Listen {
        /// The address.
        addr: std::net::SocketAddr,
        /// What bind or listen said.
        source: std::io::Error,
    },
    #[error("{0}")]
    /// `crypto.simd = "dedicated"` cannot have a core of its own.
    Placement(String),
    #[error("cannot start: {0}")]
    /// Anything else the operating system refused at start-up.
    Io(#[from] std::io::Error),
}

impl ServerOptions {
    /// The configured log level; info when the configuration does not load (`run`
    /// reports why).
    pub fn log_level(&self) -> tracing::Level {
        self.load_config()
            .map_or(tracing::Level::INFO, |c| c.log_level)
    }

    fn load_config(&self) -> Result<Config, ConfigError> {
        match &self.config_path {
            Some(path) => Config::load(path, &self.overrides),
            None => Config::embedded(&self.overrides),
        }
    }
}

/// Self-signed certificates for the hosts that name none (the embedded default).
fn self_signed_for(config: &Config) -> Result<Vec<LoadedCert>, StartError> {
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

/// A configuration `terminus check` found usable.
pub struct Checked {
    /// The site it builds.
    pub site: Site,
    /// What works but is probably not what was meant.
    pub warnings: Vec<String>,
    /// What was found reaching the services the configuration names (the fleet's
    /// store, the ACME CA).
    pub found: Vec<String>,
}

/// Validates a configuration completely (certificates, keys, docroots), as `terminus
/// check`; with tenants, measures the machine to warn when their committed capacity is
/// more than it has.
pub fn check(options: &ServerOptions) -> Result<Checked, StartError> {
    let config = options.load_config()?;
    let self_signed = self_signed_for(&config)?;
    let backend = resolve_backend(config.crypto.backend)?;
    let machine = Machine::new(backend, placement::place(&config, backend, None)?);
    let site = Site::build(
        &config,
        &Kept {
            self_signed: &self_signed,
            proxy_metrics: &terminus_proxy::ProxyMetrics::default(),
            tenants: &machine.tenants,
            tickets: Fleet::start(config.ticket_keys, None, None)
                .map_err(StartError::Fleet)?
                .ticketer(),
        },
    )?;
    let mut warnings = Vec::new();
    let mut found = Vec::new();
    if let Some(store) = &config.fleet {
        match terminus_fleet::check_store(store, config.ticket_keys) {
            Ok(store) => found.push(format!("[fleet] {store}")),
            Err(StoreProblem::Unreachable(why)) => warnings.push(format!(
                "{}: [fleet] {why}: instances would start with keys of their own and keep trying",
                config.source
            )),
            Err(StoreProblem::Wrong(why)) => return Err(StartError::Fleet(why)),
        }
    }
    if let Some(acme) = config
        .acme
        .as_ref()
        .filter(|_| config.servers.iter().any(|s| s.acme))
    {
        match terminus_acme::check_issuer(acme) {
            Ok(issuer) => found.push(format!("[acme] {issuer}")),
            Err(terminus_acme::IssuerProblem::Unreachable(why)) => warnings.push(format!(
                "{}: [acme] directory {why}: servers would start with self-signed certificates and keep trying",
                config.source
            )),
            Err(terminus_acme::IssuerProblem::Wrong(why)) => {
                return Err(StartError::Acme(format!("{}: [acme] {why}", config.source)))
            }
        }
    }
    if !config.tenants.is_empty() {
        machine.measure(&site);
        let (committed, has) = machine.committed();
        if committed > has {
            warnings.push(format!(
                "{}: the tenants' committed capacity, {committed:.0} ACU/s, is more than this machine has: {has:.0} ACU/s ({}, {} backend); quotas cannot all be met at once",
                config.source,
                machine.crypto_cores(),
                machine.backend.name()
            ));
        }
    }
    Ok(Checked {
        site,
        warnings,
        found,
    })
}

/// Starts terminus and blocks until it has shut down.
pub fn run(options: ServerOptions) -> Result<(), StartError> {
    let config = options.load_config()?;
    raise_open_file_limit(config.max_connections);
    terminus_engine::warm_up_csprng();
    let self_signed = self_signed_for(&config)?;
    let proxy_metrics = Arc::new(terminus_proxy::ProxyMetrics::default());
    let backend = resolve_backend(config.crypto.backend)?;
    let placed = placement::place(
        &config,
        backend,
        (backend == BackendKind::Multibuffer).then(capacity::unit),
    )?;
    let workers = placed.workers;
    let machine = Arc::new(Machine::new(backend, placed.clone()));
    let fleet = Arc::new(
        Fleet::start(
            config.ticket_keys,
            config.fleet.as_ref(),
            Some(Arc::new(capacity::FleetQuotas(machine.tenants.clone()))),
        )
        .map_err(StartError::Fleet)?,
    );
    let kept = Kept {
        self_signed: &self_signed,
        proxy_metrics: &proxy_metrics,
        tenants: &machine.tenants,
        tickets: fleet.ticketer(),
    };
    let site = Site::build(&config, &kept)?;
    for (names, key, fp) in &site.certificates {
        let origin = if self_signed.is_empty() {
            ""
        } else {
            " (self-signed)"
        };
        println!("certificate {names} {key}{origin} SHA256 Fingerprint={fp}");
    }

    machine.measure(&site);
    let engine_metrics = Arc::new(EngineMetrics::new(backend));
    let pool = match backend {
        BackendKind::Threads => Some(ThreadPool::start(
            placement::crypto_threads(&config),
            config.crypto.queue_capacity,
        )?),
        BackendKind::Scalar | BackendKind::Multibuffer => placed.start_pool(
            config.crypto.queue_capacity,
            engine_metrics.clone(),
            machine.crossovers.clone(),
        )?,
    };
    let challenges = Arc::new(terminus_acme::Challenges::default());
    let (issued_tx, mut issued) = tokio::sync::mpsc::unbounded_channel::<()>();
    let acme = start_acme(&config, &challenges, issued_tx)?;
    let metrics = Arc::new(Metrics::new(
        engine_metrics,
        pool.clone(),
        machine.clone(),
        proxy_metrics.clone(),
        fleet.clone(),
        acme.as_ref().map(terminus_acme::Acme::metrics),
    ));

    let kernel_tls = Arc::new(probe_kernel_tls(&config));
    let listener::Bound {
        per_worker,
        addrs: bound,
    } = listener::bind_all(
        &config.listen.iter().map(|l| l.addr).collect::<Vec<_>>(),
        workers,
    )
    .map_err(|(addr, source)| StartError::Listen { addr, source })?;
    let http3: Vec<std::net::SocketAddr> = bound
        .iter()
        .zip(&config.listen)
        .filter(|(_, l)| l.http3)
        .map(|(addr, _)| *addr)
        .collect();
    let mut quic_per_worker = quic_endpoints(
        listener::bind_udp_all(&http3, workers)
            .map_err(|(addr, source)| StartError::Listen { addr, source })?,
    )
    .into_iter();
    let admin = config
        .admin
        .map(|addr| {
            std::net::TcpListener::bind(addr).map_err(|source| StartError::Listen { addr, source })
        })
        .transpose()?;

    let (shutdown_tx, shutdown_rx) = watch::channel(false);
    let checks = health_checks::HealthChecks::start(shutdown_rx.clone())?;
    checks.watch(&site);
    let quic_tls = (!http3.is_empty()).then(|| (*site.tls).clone());
    let handle = SiteHandle::new(site);
    let quic = match quic_tls {
        None => None,
        Some(mut tls) => {
            // Built once for the endpoints' life; its certificates follow the current
            // site (reloads, ACME renewals).
            tls.cert_resolver = Arc::new(site::LiveCertificates(handle.clone()));
            Some((
                terminus_quic::server_config(
                    &Arc::new(tls),
                    config.http3_early_data.then_some(config.tls.session_cache),
                )
                .map_err(StartError::Http3)?,
                terminus_quic::Limits {
                    handshake_timeout: config.handshake_timeout,
                    ..config.http3
                },
            ))
        }
    };
    let shared = worker::Shared {
        site: handle.clone(),
        metrics: metrics.clone(),
        connection_limit: Arc::new(Semaphore::new(config.max_connections)),
        shutdown: shutdown_rx.clone(),
        shutdown_grace: config.shutdown_grace,
        handshake_queue: config.handshake_queue,
        engine: EngineSpec {
            backend,
            policy: FlushPolicy {
                max_batch_delay: config.crypto.max_batch_delay,
            },
            crossovers: machine.crossovers.clone(),
            pool,
        },
        kernel_tls,
        challenges,
        quic,
        https_port: bound
            .iter()
            .zip(&config.listen)
            .find(|(_, l)| l.plain.is_none())
            .map(|(addr, _)| addr.port())
            .filter(|&port| port != 443),
    };
    // Everything start-up needs is acquired before any worker accepts: a connection
    // flood arriving with the first accept must not leave us without the descriptors
    // for the signal runtime or a worker's event loop.
    let signals = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let (mut term, mut int, mut hup) = {
        let _enter = signals.enter();
        (
            signal(SignalKind::terminate())?,
            signal(SignalKind::interrupt())?,
            signal(SignalKind::hangup())?,
        )
    };
    let start = Arc::new(Barrier::new(workers + 1));
    let (ready_tx, ready_rx) = std::sync::mpsc::channel();
    let mut threads = Vec::new();
    for (id, listeners) in per_worker.into_iter().enumerate() {
        let listeners = listeners
            .into_iter()
            .zip(config.listen.iter().cloned())
            .collect();
        let quic_sockets = quic_per_worker.next().unwrap_or_default();
        let shared = shared.clone();
        let cpus = placed.cpus_of_worker(id, config.pin);
        let (start, ready) = (start.clone(), ready_tx.clone());
        threads.push(
            thread::Builder::new()
                .name(format!("worker-{id}"))
                .spawn(move || {
                    worker::run(id, listeners, quic_sockets, cpus, shared, ready, start)
                })?,
        );
    }
    let not_ready: Vec<std::io::Error> = (0..workers)
        .filter_map(|_| ready_rx.recv().ok().and_then(Result::err))
        .collect();
    if let Some(e) = not_ready.into_iter().next() {
        let _ = shutdown_tx.send(true);
        start.wait();
        for t in threads {
            let _ = t.join();
        }
        return Err(StartError::Io(e));
    }
    if let Some(listener) = admin {
        let addr = listener.local_addr()?;
        let (metrics, rx) = (metrics.clone(), shutdown_rx.clone());
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        thread::Builder::new()
            .name("admin".into())
            .spawn(move || admin::run(runtime, listener, metrics, rx))?;
        println!("admin on http://{addr}/metrics");
    }
    start.wait();
    let rx = shutdown_rx.clone();
    thread::Builder::new()
        .name("housekeeping".into())
        .spawn(move || memory::housekeeping(rx))?;
    if let Some(acme) = &acme {
        acme.start()?;
    }
    for (addr, l) in bound.iter().zip(&config.listen) {
        if l.plain.is_some() {
            println!("listening on http://{addr}/ (plain: ACME challenges, redirects to https)");
            continue;
        }
        println!("listening on https://{addr}/");
        tracing::info!("listener {addr}: ktls {}", l.ktls.name());
    }
    tracing::info!(
        "terminus started: {} workers{}, crypto backend {}{}, config {}",
        workers,
        if config.pin { " pinned" } else { "" },
        backend.name(),
        if backend == BackendKind::Multibuffer {
            format!(" ({})", placed.describe())
        } else {
            String::new()
        },
        config.source
    );

    // The configuration in force: the file's as last loaded without error.
    let mut live = config.clone();
    signals.block_on(async {
        loop {
            tokio::select! {
                _ = term.recv() => break,
                _ = int.recv() => break,
                _ = hup.recv() => reload(&options, &config, &mut live, &kept, &handle, &checks, &machine),
                Some(()) = issued.recv() => {
                    // Several certificates stored at once: one rebuild takes them all.
                    while issued.try_recv().is_ok() {}
                    if rebuild(&live, &kept, &handle, &checks, &machine) {
                        tracing::info!("acme: new certificates in force");
                    }
                }
            }
        }
        tracing::info!(
            "shutting down: no new connections; in-flight requests get {:?}",
            config.shutdown_grace
        );
    });
    let _ = shutdown_tx.send(true);
    for t in threads {
        match t.join() {
            Ok(Err(e)) => tracing::error!("worker failed: {e}"),
            Err(_) => tracing::error!("worker panicked"),
            Ok(Ok(())) => {}
        }
    }
    tracing::info!("terminus stopped");
    Ok(())
}

/// Readies the ACME thread if a server takes its certificates from `[acme]` (started once
/// the listeners accept): it tells the server through `issued` when it stored one, and
/// the server reloads.
fn start_acme(
    config: &Config,
    challenges: &Arc<terminus_acme::Challenges>,
    issued: tokio::sync::mpsc::UnboundedSender<()>,
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
fn resolve_backend(choice: BackendChoice) -> Result<BackendKind, StartError> {
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

/// SIGHUP: build a new [`Site`] from the config file and certificates and swap it in,
/// and make that configuration the `live` one. A broken config is logged and the
/// running one kept. Settings only a restart changes are compared with `started`'s.
fn reload(
    options: &ServerOptions,
    started: &Config,
    live: &mut Config,
    kept: &Kept<'_>,
    handle: &SiteHandle,
    checks: &health_checks::HealthChecks,
    machine: &Machine,
) {
    let config = match options.load_config() {
        Ok(c) => c,
        Err(e) => {
            tracing::error!("reload failed, keeping the running configuration: {e}");
            return;
        }
    };
    let acme_servers = |c: &Config| -> Vec<Vec<String>> {
        c.servers
            .iter()
            .filter(|s| s.acme)
            .map(|s| s.names.clone())
            .collect()
    };
    if !rebuild(&config, kept, handle, checks, machine) {
        return;
    }
    for (what, changed) in [
        ("listen", config.listen != started.listen),
        ("workers", config.workers != started.workers),
        (
            "crypto.backend",
            config.crypto.backend != started.crypto.backend,
        ),
        (
            "crypto.simd or crypto.simd_cores",
            config.crypto.simd != started.crypto.simd
                || config.crypto.simd_cores != started.crypto.simd_cores,
        ),
        ("admin", config.admin != started.admin),
        (
            "limits.max_connections",
            config.max_connections != started.max_connections,
        ),
        (
            "limits.handshake_queue",
            config.handshake_queue != started.handshake_queue,
        ),
        ("tls.ticket_keys", config.ticket_keys != started.ticket_keys),
        ("[fleet]", config.fleet != started.fleet),
        (
            "[acme] or the servers with certificates = \"acme\"",
            config.acme != started.acme || acme_servers(&config) != acme_servers(started),
        ),
    ] {
        if changed {
            tracing::warn!("reload: {what} changed; it takes effect after a restart");
        }
    }
    tracing::info!("configuration reloaded from {}", config.source);
    *live = config;
}

/// Builds the [`Site`] of `config` again (certificates and files re-read) and swaps it
/// in: a reload's second half, and all of what a new ACME certificate needs (the file
/// is not read again for it: an edit half made is not put live by a renewal).
fn rebuild(
    config: &Config,
    kept: &Kept<'_>,
    handle: &SiteHandle,
    checks: &health_checks::HealthChecks,
    machine: &Machine,
) -> bool {
    match Site::build(config, kept) {
        Ok(site) => {
            machine.measure(&site);
            checks.watch(&site);
            handle.replace(site);
            true
        }
        Err(e) => {
            tracing::error!("reload failed, keeping the running configuration: {e}");
            false
        }
    }
}

/// Each worker's QUIC sockets (one per http3 listener) with its place among that
/// listener's workers, which hand each other datagrams for their connections.
fn quic_endpoints(
    per_worker: Vec<Vec<std::net::UdpSocket>>,
) -> Vec<Vec<(std::net::UdpSocket, terminus_quic::Member)>> {
    let listeners = per_worker.first().map_or(0, Vec::len);
    let mut members: Vec<_> = (0..listeners)
        .map(|_| terminus_quic::members(per_worker.len()).into_iter())
        .collect();
    per_worker
        .into_iter()
        .map(|sockets| {
            sockets
                .into_iter()
                .zip(members.iter_mut().map_while(Iterator::next))
                .collect()
        })
        .collect()
}

/// Every client connection takes a descriptor: as HAProxy does, the soft limit is raised
/// toward `max_connections` and some room besides (upstreams, files, listeners), up to
/// the hard limit, which only privilege raises. Below that, accept fails and backs off
/// (with a warning then).
fn raise_open_file_limit(max_connections: usize) {
    let wanted = max_connections as u64 + 1024;
    match terminus_sys::raise_open_file_limit(wanted) {
        Ok(limit) if limit < wanted => tracing::warn!(
            "open-file limit {limit} is below the {wanted} limits.max_connections = {max_connections} may need (raise the hard limit: ulimit -Hn, LimitNOFILE=)"
        ),
        Ok(_) => {}
        Err(e) => tracing::warn!("cannot raise the open-file limit: {e}"),
    }
}
