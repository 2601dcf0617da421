//! The terminus server, the wiring of a running instance: start-up and its services,
//! workers and listeners, each connection's stages, the application answering requests
//! (`app`, over `terminus-http`), admin and metrics, reload.
//!
//! [`run`] starts everything and blocks until SIGTERM/SIGINT has drained the workers;
//! SIGHUP reloads the configuration and certificates in place.

mod admin;
mod admission;
mod app;
mod capacity;
mod connection;
mod health_checks;
mod listener;
pub mod logs;
mod memory;
mod metrics;
mod notify;
mod placement;
mod reload;
mod service;
mod signer;
mod site;
mod start;
mod upgrade;
mod worker;

use std::path::PathBuf;

use terminus_fleet::{Fleet, StoreProblem};
use terminus_tls::selfsigned;
use tokio::sync::watch;

use capacity::Machine;
use reload::Signals;
use service::{Service, Services};
use site::{Kept, Site, SiteHandle};
use start::{resolve_backend, self_signed_for, Bound, Core, Workers};
pub use terminus_config::{parse_duration, Overrides};
use terminus_config::{Config, ConfigError};
pub use upgrade::client as upgrade_client;

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
    #[error(transparent)]
    /// The configuration is wrong (file, line and what to fix).
    Config(#[from] ConfigError),
    #[error("cannot make the self-signed certificates: {0}")]
    /// The embedded default's certificates could not be made.
    SelfSigned(#[from] selfsigned::SelfSignedError),
    #[error("crypto backend multibuffer: crypto_mb cannot run on this CPU (it needs AVX-512 IFMA); use crypto.backend = \"auto\" or \"scalar\"")]
    /// `crypto.backend = "multibuffer"` on a CPU without AVX-512 IFMA.
    MultibufferUnavailable,
    #[error("{config}: [acme] {source}")]
    /// (`check`) The ACME issuer cannot work as configured.
    Issuer {
        /// The configuration's file (or the embedded default).
        config: String,
        /// What is wrong with the issuer.
        source: terminus_acme::CaError,
    },
    #[error("cannot start: {0}")]
    /// The ACME manager cannot be made: its state directory, its CA's root, the fleet's
    /// store.
    Acme(#[from] terminus_acme::AcmeError),
    #[error("http3: {0}")]
    /// The TLS settings cannot serve QUIC.
    Http3(#[from] terminus_quic::ConfigError),
    #[error("[fleet]: {0}")]
    /// The fleet's store settings cannot work, or (`check`) the store does not answer.
    Fleet(#[from] terminus_fleet::StoreError),
    #[error("{0}")]
    /// `[signer]`'s files cannot be used (the message names the file).
    Signer(String),
    #[error("{0}")]
    /// The control socket cannot be bound, or a handover failed (the message says
    /// which step).
    Upgrade(String),
    #[error("cannot listen on {addr}: {source}")]
    /// A listener's address cannot be bound.
    Listen {
        /// The address.
        addr: std::net::SocketAddr,
        /// What bind or listen said.
        source: std::io::Error,
    },
    #[error(transparent)]
    /// `crypto.simd = "dedicated"` cannot have a core of its own.
    Placement(#[from] placement::PlacementError),
    #[error("cannot start: {0}")]
    /// Anything else the operating system refused at start-up.
    Io(#[from] std::io::Error),
}

impl ServerOptions {
    /// The configured log level and error log file (`log.level`, `log.error`); info to
    /// standard error when the configuration does not load (`run` reports why).
    pub fn log_settings(&self) -> (tracing::Level, Option<std::path::PathBuf>) {
        self.load_config()
            .map_or((tracing::Level::INFO, None), |c| (c.log_level, c.error_log))
    }

    fn load_config(&self) -> Result<Config, ConfigError> {
        match &self.config_path {
            Some(path) => Config::load(path, &self.overrides),
            None => Config::embedded(&self.overrides),
        }
    }
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
            tickets: Fleet::start(config.ticket_keys, None, None)?.ticketer(),
            clients: &std::sync::Arc::new(terminus_admission::clients::Clients::new(64)),
            checking: true,
        },
    )?;
    if let Some(path) = &config.error_log {
        logs::check_file(path).map_err(|e| {
            config.error_at(
                None,
                format!("error log {}: {e}", path.display()),
                Some("log.error is \"stderr\" or a writable file path"),
            )
        })?;
    }
    if let Some(signer) = &config.signer {
        signer::SignerService::load(signer, config.handshake_timeout)
            .map_err(StartError::Signer)?;
    }
    let mut warnings = Vec::new();
    let mut found = Vec::new();
    if let Some(store) = &config.fleet {
        match terminus_fleet::check_store(store, config.ticket_keys) {
            Ok(store) => found.push(format!("[fleet] {store}")),
            Err(StoreProblem::Unreachable(why)) => warnings.push(format!(
                "{}: [fleet] {why}: instances would start with keys of their own and keep trying",
                config.source
            )),
            Err(StoreProblem::Wrong(why)) => return Err(why.into()),
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
            Err(terminus_acme::IssuerProblem::Wrong(source)) => {
                return Err(StartError::Issuer {
                    config: config.source.clone(),
                    source,
                })
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

/// Starts terminus and blocks until SIGTERM or SIGINT has drained the workers and every
/// service has stopped, or until it has handed over to a new process (`terminus
/// upgrade`) and drained. Started by such a handover, it takes its sockets from the
/// process it replaces, and tells it why if it cannot start.
pub fn run(options: ServerOptions) -> Result<(), StartError> {
    // First: until the handlers are in place a signal's default action applies, and
    // SIGUSR1's (logrotate's) or SIGHUP's would end the process while it starts.
    let signals = Signals::listen()?;
    let (mut successor, inherited) = match upgrade::successor::Successor::from_env() {
        Ok(Some((successor, inherited))) => (Some(successor), inherited),
        Ok(None) => (None, upgrade::Inherited::default()),
        Err(why) => return Err(StartError::Upgrade(why)),
    };
    let ran = serve(options, signals, inherited, &mut successor);
    if let (Err(e), Some(successor)) = (&ran, &successor) {
        successor.failed(&e.to_string());
    }
    ran
}

fn serve(
    options: ServerOptions,
    signals: Signals,
    mut inherited: upgrade::Inherited,
    successor: &mut Option<upgrade::successor::Successor>,
) -> Result<(), StartError> {
    // Recorded before anything can replace the file: a successor is started from the
    // path this process was (the new binary, after a package upgrade).
    let exe = upgrade::binary()?;
    let config = options.load_config()?;
    start::raise_open_file_limit(config.max_connections);
    terminus_engine::warm_up_csprng();
    let mut services = Services::default();
    let (mut core, site) = Core::build(&config, &mut services)?;
    // The predecessor's session-ticket keys, before any handshake: its tickets resume.
    if let Some((kek, keys)) = inherited.tickets.take() {
        let taken = core.fleet.ticketer().adopt(&kek, &keys);
        tracing::info!(
            "upgrade: {taken} of the {} session-ticket keys the process replaced held are taken over",
            keys.len()
        );
    }
    core.print_certificates(&site);
    let mut bound = Bound::bind(&config, core.placed.workers, &mut inherited)?;
    drop(inherited);
    let checks = start::start_background(&mut services)?;
    checks.watch(&site);
    let handle = SiteHandle::new(site);
    let (shutdown_tx, shutdown_rx) = watch::channel(false);
    let mut shared = core.shared(&config, &bound, &handle, shutdown_rx)?;
    // systemd's notifications, and its watchdog's view of the workers.
    let notifier = notify::Notifier::from_env();
    let heartbeats = notifier
        .watchdog_period()
        .map(|_| notify::Heartbeats::new(core.placed.workers));
    shared.heartbeats = heartbeats.clone();
    let drain = shared.drain.clone();
    if let Some(listener) = bound.admin.take() {
        let listeners = admin::Listener::all(&bound.addrs, &config);
        let timeouts = terminus_http::Timeouts {
            request_header: config.request_header_timeout,
            keepalive: config.keepalive_timeout,
        };
        start::start_admin(
            listener,
            core.metrics.clone(),
            listeners,
            timeouts,
            &mut services,
        )?;
    }
    // Everything start-up needs is acquired before any worker accepts (the signals'
    // descriptors first of all): a connection flood arriving with the first accept must
    // not leave us without the descriptors for a worker's event loop.
    let (mut workers, gate) =
        Workers::start(&config, &core.placed, &mut bound, shared, shutdown_tx)?;
    // A successor accepts only once the process it replaces says go.
    if let Some(successor) = successor.as_mut() {
        if let Err(why) = successor.ready() {
            workers.stop();
            gate.open();
            Box::new(workers).join();
            return Err(StartError::Upgrade(why));
        }
    }
    services.add(workers);
    gate.open();
    let (generation, predecessor) = match successor.take() {
        Some(successor) => (successor.generation, successor.serving()),
        None => (1, upgrade::successor::Predecessor::none()),
    };
    let upgrades = bound.control.take().map(|(listener, path)| {
        start::start_control(
            upgrade::control::Settings {
                listener,
                path,
                handover: std::mem::take(&mut bound.handover),
                generation,
                predecessor,
                exe,
                args: std::env::args_os().skip(1).collect(),
                tickets: core.fleet.ticketer().clone(),
            },
            &mut services,
        )
    });
    // Serving already: a successor's predecessor has stopped accepting, so from here a
    // thread that fails to start costs what it does (the next upgrade, certificates'
    // renewal), not this process and every connection.
    let upgrades = match upgrades.transpose() {
        Ok(upgrades) => upgrades,
        Err(e) if generation > 1 => {
            tracing::error!("upgrade.socket: {e}: `terminus upgrade` cannot reach this process");
            None
        }
        Err(e) => return Err(e),
    };
    match core.start_acme(&mut services) {
        Ok(()) => {}
        Err(e) if generation > 1 => tracing::error!("acme: cannot start: {e}"),
        Err(e) => return Err(e.into()),
    }
    bound.announce(&config, &core);
    if generation == 1 {
        notifier.ready(&format!("serving on {} listeners", bound.addrs.len()));
    }
    // Copies kept for a successor are not needed without a control socket.
    drop(bound);
    let metrics = core.metrics.clone();
    let handed_over = core
        .reloader(&options, config, handle, checks, (notifier, heartbeats))
        .serve(signals, upgrades, &drain);
    let handed_over = match handed_over {
        // The successor hears how the drain goes, until it is over; SIGTERM cuts it
        // short.
        Some((mut handed, late)) => {
            let done = std::sync::atomic::AtomicBool::new(false);
            std::thread::scope(|scope| {
                scope.spawn(|| handed.report_drain(|| metrics.connections_open(), &done));
                scope.spawn(|| late.watch(&drain, &done));
                services.stop_all();
                done.store(true, std::sync::atomic::Ordering::Relaxed);
            });
            Some(handed)
        }
        None => {
            services.stop_all();
            None
        }
    };
    // The workers, which make the access log's lines, have stopped: what the logs hold
    // is written.
    logs::close_access();
    drop(handed_over);
    let (threads, sockets) = service::leftovers();
    if threads.is_empty() && sockets == 0 {
        tracing::info!("terminus stopped: every service joined, no thread or socket left");
    } else {
        tracing::warn!("terminus stopped with threads {threads:?} still running and {sockets} sockets open: a service did not stop");
    }
    Ok(())
}
