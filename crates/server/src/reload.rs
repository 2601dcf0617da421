//! Serving until told to stop: the signals terminus answers (SIGTERM and SIGINT drain and
//! stop, SIGHUP reloads, SIGUSR1 reopens the log files) and the ACME manager's word that it stored a certificate, which
//! rebuilds the site. A reload builds a new [`Site`] from the file and its certificates
//! and swaps it in; a broken configuration is logged and the running one kept; settings
//! only a restart changes are named in a warning.

use std::sync::Arc;
use std::time::Duration;

use terminus_config::Config;
use terminus_tls::LoadedCert;
use tokio::signal::unix::{signal, Signal, SignalKind};
use tokio::sync::mpsc;

use crate::capacity::Machine;
use crate::health_checks::HealthChecks;
use crate::notify::{Heartbeats, Notifier};
use crate::placement;
use crate::site::{Kept, Site, SiteHandle};
use crate::upgrade::control::{HandedOver, Upgrades};
use crate::ServerOptions;

/// What a reload needs: the file to read again, the configuration started with and the
/// one in force, and what a new site keeps from the old.
pub(crate) struct Reloader {
    pub(crate) options: ServerOptions,
    /// The configuration terminus started with: what only a restart changes is compared
    /// with it.
    pub(crate) started: Config,
    /// The configuration in force: the file's as last loaded without error.
    pub(crate) live: Config,
    pub(crate) self_signed: Vec<LoadedCert>,
    pub(crate) proxy_metrics: Arc<terminus_proxy::ProxyMetrics>,
    pub(crate) fleet: Arc<terminus_fleet::Fleet>,
    pub(crate) machine: Arc<Machine>,
    /// The per-client limits' counts, which a reload keeps.
    pub(crate) clients: Arc<terminus_admission::clients::Clients>,
    pub(crate) handle: SiteHandle,
    pub(crate) checks: HealthChecks,
    /// A certificate the ACME manager stored.
    pub(crate) issued: mpsc::UnboundedReceiver<()>,
    /// systemd, told of readiness, reloads, the drain, and the workers' health.
    pub(crate) notifier: Notifier,
    /// Where the workers beat, while systemd's watchdog watches.
    pub(crate) heartbeats: Option<Arc<Heartbeats>>,
}

/// The signals, listened for before any worker accepts (a flood arriving with the first
/// accept must not leave terminus without the descriptors for them).
pub(crate) struct Signals {
    runtime: tokio::runtime::Runtime,
    term: Signal,
    int: Signal,
    hup: Signal,
    usr1: Signal,
    usr2: Signal,
}

impl Signals {
    pub(crate) fn listen() -> std::io::Result<Self> {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        let (term, int, hup, usr1, usr2) = {
            let _enter = runtime.enter();
            (
                signal(SignalKind::terminate())?,
                signal(SignalKind::interrupt())?,
                signal(SignalKind::hangup())?,
                signal(SignalKind::user_defined1())?,
                signal(SignalKind::user_defined2())?,
            )
        };
        Ok(Self {
            runtime,
            term,
            int,
            hup,
            usr1,
            usr2,
        })
    }
}

/// SIGTERM and SIGINT while a handover's drain runs (`upgrade.drain`, minutes): they cut
/// it short, as they would a shutdown's.
pub(crate) struct LateSignals {
    runtime: tokio::runtime::Runtime,
    term: Signal,
    int: Signal,
}

impl LateSignals {
    /// Waits until `done`, cutting `drain` short at SIGTERM or SIGINT.
    pub(crate) fn watch(
        mut self,
        drain: &crate::worker::Drain,
        done: &std::sync::atomic::AtomicBool,
    ) {
        use std::sync::atomic::Ordering;
        self.runtime.block_on(async {
            let mut tick = tokio::time::interval(Duration::from_millis(50));
            while !done.load(Ordering::Relaxed) {
                tokio::select! {
                    _ = self.term.recv() => {}
                    _ = self.int.recv() => {}
                    _ = tick.tick() => continue,
                }
                tracing::info!("stopping as told: what is still open gets shutdown_grace, not the rest of upgrade.drain");
                drain.hurry();
                return;
            }
        });
    }
}

impl Reloader {
    /// Answers SIGHUP and new certificates until SIGTERM or SIGINT, or until the
    /// control thread has handed over to a new process (`upgrades`; SIGUSR2 asks it
    /// to): then systemd is told the new main PID, `drain` is set to `upgrade.drain`,
    /// and what was handed over is returned, to be kept until this process exits.
    pub(crate) fn serve(
        mut self,
        signals: Signals,
        upgrades: Option<Upgrades>,
        drain: &crate::worker::Drain,
    ) -> Option<(HandedOver, LateSignals)> {
        let Signals {
            runtime,
            mut term,
            mut int,
            mut hup,
            mut usr1,
            mut usr2,
        } = signals;
        let (mut handed_over, signal) = match upgrades {
            Some(u) => (Some(u.handed_over), Some(u.signal)),
            None => (None, None),
        };
        let mut handed = None;
        // Pinged at half the watchdog's timeout; a worker is wedged when its last beat is
        // older than that (it beats every `notify::BEAT`).
        let period = self.notifier.watchdog_period();
        let mut wedged: Vec<usize> = Vec::new();
        runtime.block_on(async {
            let mut watchdog = tokio::time::interval(period.unwrap_or(Duration::from_secs(3600)));
            loop {
                tokio::select! {
                    _ = term.recv() => break,
                    _ = int.recv() => break,
                    _ = hup.recv() => {
                        self.notifier.reloading();
                        let outcome = self.reload();
                        self.notifier.ready(outcome);
                    }
                    // logrotate has renamed the files (nginx's USR1, HAProxy's
                    // convention for its own logs).
                    _ = usr1.recv() => {
                        tracing::info!("SIGUSR1: reopening the log files");
                        crate::logs::reopen();
                    }
                    // nginx's signal for a binary upgrade.
                    _ = usr2.recv() => match &signal {
                        Some(signal) => {
                            tracing::info!("SIGUSR2: handing over to a new process");
                            let _ = signal.send(());
                        }
                        None => tracing::warn!("SIGUSR2: no upgrade.socket, so no upgrade: a successor could not reach this process"),
                    },
                    Some(over) = async { handed_over.as_mut()?.recv().await }, if handed_over.is_some() => {
                        handed = Some(over);
                        break;
                    }
                    _ = watchdog.tick(), if period.is_some() => {
                        let stale = self
                            .heartbeats
                            .as_ref()
                            .map(|h| h.stale(period.unwrap_or_default().max(crate::notify::BEAT * 3)))
                            .unwrap_or_default();
                        if stale.is_empty() {
                            self.notifier.watchdog();
                        } else if stale != wedged {
                            tracing::error!(
                                "workers {stale:?} have not run for {:?}: systemd's watchdog is not pinged",
                                period.unwrap_or_default()
                            );
                        }
                        wedged = stale;
                    }
                    Some(()) = self.issued.recv() => {
                        // Several certificates stored at once: one rebuild takes them all.
                        while self.issued.try_recv().is_ok() {}
                        if self.rebuild(&self.live) {
                            tracing::info!("acme: new certificates in force");
                        }
                    }
                }
            }
        });
        // A SIGTERM that came as the successor took over: it serves, and systemd is to
        // follow it (the drain is then cut short below).
        let stopped = handed.is_none();
        if let Some(late) = handed_over.as_mut().and_then(|h| h.try_recv().ok()) {
            handed.get_or_insert(late);
        }
        if let Some(over) = handed {
            drain.hand_over(self.live.upgrade_drain);
            terminus_http::h1::server::drain_gently();
            self.notifier.handed_over(over.pid, over.generation);
            tracing::info!(
                "handed over: no new connections here; what is open gets up to {:?} (upgrade.drain)",
                self.live.upgrade_drain
            );
            if stopped {
                tracing::info!(
                    "stopping as told: the drain gets {:?} (shutdown_grace)",
                    self.started.shutdown_grace
                );
                drain.hurry();
            }
            let late = LateSignals { runtime, term, int };
            return Some((over, late));
        }
        self.notifier.stopping();
        tracing::info!(
            "shutting down: no new connections; in-flight requests get {:?}",
            self.started.shutdown_grace
        );
        None
    }

    /// SIGHUP: the file read again and its site swapped in, then made the live
    /// configuration. Says what came of it (systemd's `STATUS=`).
    fn reload(&mut self) -> &'static str {
        let config = match self.options.load_config() {
            Ok(c) => c,
            Err(e) => {
                tracing::error!("reload failed, keeping the running configuration: {e}");
                return "reload failed; the running configuration kept";
            }
        };
        if !self.rebuild(&config) {
            return "reload failed; the running configuration kept";
        }
        for what in needs_restart(&self.started, &config) {
            tracing::warn!("reload: {what} changed; it takes effect in a new process: `terminus upgrade` (or a restart)");
        }
        tracing::info!("configuration reloaded from {}", config.source);
        self.live = config;
        "configuration reloaded"
    }

    /// Builds the [`Site`] of `config` again (certificates and files re-read) and swaps
    /// it in: a reload's second half, and all of what a new ACME certificate needs (the
    /// file is not read again for it: an edit half made is not put live by a renewal).
    fn rebuild(&self, config: &Config) -> bool {
        let kept = Kept {
            self_signed: &self.self_signed,
            proxy_metrics: &self.proxy_metrics,
            tenants: &self.machine.tenants,
            tickets: self.fleet.ticketer(),
            clients: &self.clients,
            checking: false,
        };
        // The upstream servers' series and health are those of the site in force: a
        // server the new site dropped is forgotten, and so is one that a site which
        // failed to build had added.
        match Site::build(config, &kept) {
            Ok(site) => {
                self.machine.measure(&site);
                self.checks.watch(&site);
                self.proxy_metrics.retain(&site.upstreams);
                self.handle.replace(site);
                true
            }
            Err(e) => {
                tracing::error!("reload failed, keeping the running configuration: {e}");
                self.proxy_metrics.retain(&self.handle.current().upstreams);
                false
            }
        }
    }
}

/// The settings `config` changes from `started` that only a restart puts in force.
fn needs_restart(started: &Config, config: &Config) -> Vec<&'static str> {
    let acme_servers = |c: &Config| -> Vec<Vec<String>> {
        c.servers
            .iter()
            .filter(|s| s.acme)
            .map(|s| s.names.clone())
            .collect()
    };
    [
        ("listen", config.listen != started.listen),
        // As placed: `workers` left out and set to the CPUs' count are the same.
        (
            "workers",
            placement::workers(config) != placement::workers(started),
        ),
        (
            "crypto.backend",
            config.crypto.backend != started.crypto.backend,
        ),
        (
            "crypto.simd or crypto.simd_cores",
            config.crypto.simd != started.crypto.simd
                || placement::simd_cores(config) != placement::simd_cores(started),
        ),
        ("admin", config.admin != started.admin),
        ("log.error", config.error_log != started.error_log),
        (
            "limits.max_connections",
            config.max_connections != started.max_connections,
        ),
        ("limits.rate_keys", config.rate_keys != started.rate_keys),
        (
            "limits.handshake_queue",
            config.handshake_queue != started.handshake_queue,
        ),
        ("tls.ticket_keys", config.ticket_keys != started.ticket_keys),
        ("[fleet]", config.fleet != started.fleet),
        ("[signer]", config.signer != started.signer),
        (
            "[acme] or the servers with certificates = \"acme\"",
            config.acme != started.acme || acme_servers(config) != acme_servers(started),
        ),
    ]
    .into_iter()
    .filter_map(|(what, changed)| changed.then_some(what))
    .collect()
}
