//! An upstream as the proxy uses it: its servers with their health, requests in progress
//! and series, and the balancer that picks among them. Built once per configuration and
//! shared by every worker (`Arc`); what is per worker (idle connections) is in
//! [`crate::pool`].

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;

use terminus_error::Classify;

use crate::balance::Balancer;
use crate::checks::CheckError;
use crate::health::{Change, Health};
use crate::metrics::{Failure, ProxyMetrics, ServerMetrics};
use crate::spec::{Check, ServerSpec, UpstreamSpec};

/// A configured upstream, ready to take requests.
#[derive(Debug)]
pub struct Upstream {
    /// Unique in the process: pooled connections belong to one upstream (its TLS
    /// settings and names), not to whichever upstream has the same address.
    pub(crate) id: u64,
    pub(crate) spec: UpstreamSpec,
    pub(crate) servers: Vec<Server>,
    pub(crate) balancer: Balancer,
}

impl Upstream {
    /// The upstream `spec` describes, its series in `metrics`.
    pub fn new(spec: UpstreamSpec, metrics: &ProxyMetrics) -> Self {
        let servers: Vec<Server> = spec
            .servers
            .iter()
            .map(|s| Server::new(s.clone(), &spec.name, spec.health.check.as_ref(), metrics))
            .collect();
        static IDS: AtomicU64 = AtomicU64::new(0);
        Upstream {
            id: IDS.fetch_add(1, Ordering::Relaxed),
            balancer: Balancer::new(spec.balance.clone(), &servers),
            servers,
            spec,
        }
    }

    /// Its name in the configuration.
    pub fn name(&self) -> &str {
        &self.spec.name
    }

    /// Records a failure of server `i`, taking it out after enough in a row.
    pub(crate) fn failed(&self, i: usize, cause: Failure) {
        let server = &self.servers[i];
        server.metrics.failure(cause);
        if server.health.failed(&self.spec.health) == Change::WentDown {
            server.metrics.health_change(false);
            tracing::warn!(
                upstream = %self.spec.name,
                server = %server.spec.address,
                "upstream server taken out of rotation for {:?} after {} failure(s) in a row (last: {})",
                self.spec.health.interval,
                self.spec.health.fails,
                cause.name(),
            );
        }
    }

    /// Records an active check of server `i`.
    pub(crate) fn probed(&self, i: usize, result: Result<u16, CheckError>) {
        let (Some(check), server) = (&self.spec.health.check, &self.servers[i]) else {
            return;
        };
        match server
            .health
            .probed(result.is_ok(), &self.spec.health, check)
        {
            Change::WentDown => {
                server.metrics.health_change(false);
                let last = result.err();
                tracing::warn!(
                    upstream = %self.spec.name,
                    server = %server.spec.address,
                    kind = last.as_ref().map_or("", |e| e.kind()),
                    "upstream server taken out of rotation: {} health check(s) of {} failed in a row (last: {})",
                    self.spec.health.fails,
                    check.path,
                    last.as_ref().map(|e| e.to_string()).unwrap_or_default(),
                );
            }
            Change::CameBack => {
                server.metrics.health_change(true);
                tracing::info!(upstream = %self.spec.name, server = %server.spec.address, "upstream server back in rotation: {} health check(s) passed", check.passes);
            }
            Change::None => {}
        }
    }

    pub(crate) fn succeeded(&self, i: usize) {
        let server = &self.servers[i];
        if server.health.succeeded() == Change::CameBack {
            server.metrics.health_change(true);
            tracing::info!(upstream = %self.spec.name, server = %server.spec.address, "upstream server back in rotation");
        }
    }
}

/// One server of an upstream.
#[derive(Debug)]
pub(crate) struct Server {
    pub(crate) spec: ServerSpec,
    /// Kept across reloads with its series (the registry in [`ProxyMetrics`]).
    pub(crate) health: Arc<Health>,
    /// Requests in progress, every worker's (least_conn reads it).
    active: AtomicUsize,
    pub(crate) metrics: Arc<ServerMetrics>,
}

impl Server {
    /// Server `spec` of `upstream`, whose active checks are `check`. A server the
    /// running configuration has too (its upstream's name, its address) keeps its health
    /// and series: out of rotation if it was, as README says a reload does.
    pub(crate) fn new(
        spec: ServerSpec,
        upstream: &str,
        check: Option<&Check>,
        metrics: &ProxyMetrics,
    ) -> Self {
        let (series, health) = metrics.server(upstream, spec.address);
        // Without active checks nothing would ever bring back a server they took out.
        if check.is_none() && health.forget_checks() == Change::CameBack {
            series.health_change(true);
        }
        Server {
            metrics: series,
            spec,
            health,
            active: AtomicUsize::new(0),
        }
    }

    pub(crate) fn active(&self) -> usize {
        self.active.load(Ordering::Relaxed)
    }

    /// Counts a request in progress; [`InProgress`] undoes it.
    pub(crate) fn enter(&self) {
        self.active.fetch_add(1, Ordering::Relaxed);
        self.metrics.active(1);
    }

    fn leave(&self) {
        self.active.fetch_sub(1, Ordering::Relaxed);
        self.metrics.active(-1);
    }
}

/// A request in progress on a server, until dropped (its response body may outlive the
/// call that chose the server, so it owns its upstream).
#[derive(Debug)]
pub(crate) struct InProgress {
    pub(crate) upstream: Arc<Upstream>,
    pub(crate) server: usize,
}

impl InProgress {
    pub(crate) fn new(upstream: Arc<Upstream>, server: usize) -> Self {
        upstream.servers[server].enter();
        InProgress { upstream, server }
    }

    pub(crate) fn server(&self) -> &Server {
        &self.upstream.servers[self.server]
    }
}

impl Drop for InProgress {
    fn drop(&mut self) {
        self.upstream.servers[self.server].leave();
    }
}
