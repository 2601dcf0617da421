//! The server's series (connections, handshakes, responses, data paths) and the
//! exposition `GET /metrics` serves, with every crate's series in it.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use terminus_engine::{EngineMetrics, ThreadPool};
use terminus_error::{Classify, Source};
use terminus_http::Http2Trouble;
use terminus_metrics::{label_values, Counter, Exposition, Gauge, Kind, Labelled, Labels, Render};
use terminus_observe::HandshakeSeries;
use terminus_proxy::ProxyMetrics;
use terminus_tls::handshake::bridge::BridgeMetrics;
use terminus_tls::{FallbackCause, HandshakeError, TrafficCounters};

use crate::admin::Refusal as AdminRefusal;
use crate::admission::Refusal;

/// The protocols responses are counted by, as ALPN names them.
const PROTOCOLS: [&str; 3] = ["http/1.1", "h2", "h3"];
use crate::capacity::{CapacityReport, Machine};

/// Why a handshake failed (label values of `terminus_handshake_failures_total`), each
/// with whose fault it is: a [`HandshakeError`]'s kind and source in the error
/// vocabulary, and the timeout, which the server's own clock decides.
#[derive(Debug, Clone, Copy)]
pub enum HandshakeFailure {
    Timeout,
    ClientClosed,
    Tls,
    Io,
    /// The crypto backend could not compute an operation.
    Crypto,
    /// terminus's own fault.
    Internal,
    /// Plain HTTP on a TLS port (answered with a 400 page).
    PlainHttp,
}

impl HandshakeFailure {
    const ALL: [HandshakeFailure; 7] = [
        Self::Timeout,
        Self::ClientClosed,
        Self::Tls,
        Self::Io,
        Self::Crypto,
        Self::Internal,
        Self::PlainHttp,
    ];

    /// The series `e` is counted in: the one its kind names (each series' source label
    /// is fixed when the series are made, so that every one shows from the start; the
    /// unit test holds the two to the error's own).
    pub fn of(e: &HandshakeError) -> Self {
        let kind = e.kind();
        let series = Self::ALL.into_iter().find(|why| why.name() == kind);
        debug_assert!(series.is_some(), "no handshake failure series for {kind}");
        series.unwrap_or(Self::Internal)
    }

    pub fn name(self) -> &'static str {
        match self {
            Self::Timeout => "timeout",
            Self::ClientClosed => "client_closed",
            Self::Tls => "tls_error",
            Self::Io => "io_error",
            Self::Crypto => "crypto_error",
            Self::Internal => "internal_error",
            Self::PlainHttp => "plain_http",
        }
    }

    fn source(self) -> Source {
        match self {
            Self::Crypto => Source::CryptoBackend,
            Self::Internal => Source::Internal,
            _ => Source::Client,
        }
    }
}

/// Which record layer carries a connection after its handshake.
#[derive(Debug, Clone, Copy)]
pub enum DataPath {
    Kernel,
    Userspace,
}

/// Labels of one completed-handshake series.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct HandshakeLabels {
    pub version: &'static str,
    pub cipher_suite: &'static str,
    pub key_type: &'static str,
}

/// One worker's own series: what `terminus top` shows per worker. The worker updates
/// them; its CPU time is read from the kernel when the page is rendered.
#[derive(Debug)]
pub struct WorkerSeries {
    id: usize,
    /// The worker thread's id, for its CPU time.
    tid: Option<u32>,
    handshakes: AtomicU64,
    open: AtomicI64,
}

impl WorkerSeries {
    pub(crate) fn handshake_completed(&self) {
        self.handshakes.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn connections(&self, delta: i64) {
        self.open.fetch_add(delta, Ordering::Relaxed);
    }

    /// Connections open on the worker now.
    pub(crate) fn open(&self) -> i64 {
        self.open.load(Ordering::Relaxed)
    }
}

/// Every worker's series, in worker order.
#[derive(Debug, Default)]
struct Workers(Mutex<Vec<Arc<WorkerSeries>>>);

impl Render for Workers {
    fn render(&self, out: &mut Exposition) {
        let workers = self.0.lock().unwrap_or_else(|p| p.into_inner()).clone();
        let label = |w: &WorkerSeries| Labels::NONE.with("worker", w.id);
        out.family(
            "terminus_worker_handshakes_total",
            Kind::Counter,
            "Completed TLS handshakes, by worker.",
            workers
                .iter()
                .map(|w| (label(w), w.handshakes.load(Ordering::Relaxed) as f64)),
        );
        out.family(
            "terminus_worker_connections_open",
            Kind::Gauge,
            "Client connections open now, by worker.",
            workers
                .iter()
                .map(|w| (label(w), w.open.load(Ordering::Relaxed) as f64)),
        );
        out.family(
            "terminus_worker_cpu_seconds_total",
            Kind::Counter,
            "CPU time of each worker's thread (user and system; the kernel's clock-tick resolution).",
            workers.iter().filter_map(|w| {
                let cpu = terminus_sys::task_cpu_time(w.tid?).ok()?;
                Some((label(w), cpu.as_secs_f64()))
            }),
        );
    }
}

/// The server's own series, and the engine's, the TLS crate's and the crypto pool's,
/// rendered together for `GET /metrics`.
#[derive(Debug)]
pub struct Metrics {
    connections_open: Gauge,
    connections_total: Counter,
    accept_errors: Counter,
    handshakes: Handshakes,
    handshake_failures: Labelled<{ HandshakeFailure::ALL.len() }>,
    /// Completed handshakes' duration and phases (terminus-observe).
    pub phases: HandshakeSeries,
    workers: Workers,
    responses: Labelled<15>,
    data_paths: Labelled<2>,
    ktls_fallbacks: Labelled<{ FallbackCause::ALL.len() }>,
    ktls_refused: Counter,
    handshakes_refused: Labelled<{ Refusal::ALL.len() }>,
    http2_trouble: Labelled<{ Http2Trouble::NAMES.len() }>,
    admin_refused: Labelled<{ AdminRefusal::NAMES.len() }>,
    /// Shared with every connection's record layer.
    pub traffic: Arc<TrafficCounters>,
    /// Shared with every worker's engine.
    pub engine: Arc<EngineMetrics>,
    pool: Option<Arc<ThreadPool>>,
    /// The machine's capacity and its tenants (the multibuffer crossovers with them).
    capacity: CapacityReport,
    /// Every upstream server's series, across reloads.
    pub proxy: Arc<ProxyMetrics>,
    /// Session tickets and their keys, and the fleet's store.
    fleet: Arc<terminus_fleet::Fleet>,
    /// ACME orders and certificates, where a server has `certificates = "acme"`.
    acme: Option<Arc<terminus_acme::AcmeMetrics>>,
    /// The per-client limits: what they refused, what their tables hold.
    clients: Arc<terminus_admission::clients::Clients>,
}

/// Completed handshakes by version, suite and key type: label values seen at run time
/// (a handful: the configured versions, suites and key types).
#[derive(Debug, Default)]
struct Handshakes(Mutex<BTreeMap<HandshakeLabels, u64>>);

impl Render for Handshakes {
    fn render(&self, out: &mut Exposition) {
        const NAME: &str = "terminus_handshakes_total";
        out.header(NAME, Kind::Counter, "Completed TLS handshakes.");
        for (l, n) in self.0.lock().unwrap_or_else(|p| p.into_inner()).iter() {
            let labels = Labels::of([
                ("version", l.version),
                ("cipher_suite", l.cipher_suite),
                ("key_type", l.key_type),
            ]);
            out.sample(NAME, &labels, n);
        }
    }
}

impl Metrics {
    pub fn new(
        engine: Arc<EngineMetrics>,
        pool: Option<Arc<ThreadPool>>,
        machine: Arc<Machine>,
        proxy: Arc<ProxyMetrics>,
        fleet: Arc<terminus_fleet::Fleet>,
        acme: Option<Arc<terminus_acme::AcmeMetrics>>,
        clients: Arc<terminus_admission::clients::Clients>,
    ) -> Self {
        Self {
            connections_open: Gauge::new(
                "terminus_connections_open",
                "Client connections open now.",
            ),
            connections_total: Counter::new(
                "terminus_connections_total",
                "Client connections accepted.",
            ),
            accept_errors: Counter::new(
                "terminus_accept_errors_total",
                "accept() failures (EMFILE and the like).",
            ),
            handshakes: Handshakes::default(),
            handshake_failures: Labelled::counter(
                "terminus_handshake_failures_total",
                "TLS handshakes that did not complete, by whose fault (client, crypto_backend, internal) and reason.",
                HandshakeFailure::ALL.map(|why| {
                    Labels::of([("source", why.source().name()), ("reason", why.name())])
                }),
            ),
            phases: HandshakeSeries::default(),
            workers: Workers::default(),
            responses: Labelled::counter(
                "terminus_http_responses_total",
                "HTTP responses by status class and protocol (its ALPN name).",
                std::array::from_fn(|i| {
                    Labels::NONE
                        .with("code", format_args!("{}xx", i / PROTOCOLS.len() + 1))
                        .with("protocol", PROTOCOLS[i % PROTOCOLS.len()])
                }),
            ),
            data_paths: Labelled::counter(
                "terminus_connections_by_data_path_total",
                "Connections after their handshake, by record layer (kernel TLS or rustls).",
                label_values("path", ["ktls", "userspace"], &Labels::NONE),
            ),
            ktls_fallbacks: Labelled::counter(
                "terminus_ktls_fallbacks_total",
                "Connections of ktls = auto/required listeners that kernel TLS did not take, by cause.",
                label_values("cause", FallbackCause::ALL.map(FallbackCause::name), &Labels::NONE),
            ),
            ktls_refused: Counter::new(
                "terminus_ktls_refused_total",
                "Connections closed because their ktls = required listener could not hand them to the kernel.",
            ),
            handshakes_refused: Labelled::counter(
                "terminus_handshakes_refused_total",
                "Connections turned away by admission control (limits.handshake_queue): reset at accept, or refused with an alert after the ClientHello; and handshakes refused by their tenant's quota (tenant_quota).",
                label_values("cause", Refusal::ALL.map(Refusal::name), &Labels::NONE),
            ),
            http2_trouble: Labelled::counter(
                "terminus_http2_trouble_total",
                "HTTP/2 clients' trouble by cause: connections ended with an error code (goaway_*: goaway_enhance_your_calm is a flood the glitch count stopped, rapid reset among them), requests refused (stream_malformed, stream_refused past 128 streams, stream_too_large answered 431), streams reset for a broken rule (stream_reset), and streams the client reset (client_reset).",
                label_values("cause", Http2Trouble::NAMES, &Labels::NONE),
            ),
            admin_refused: Labelled::counter(
                "terminus_admin_refused_total",
                "Connections the admin listener closed, by reason: address_full (its address held 8 already; closed at accept), evicted (the oldest of the address holding the most, for a newcomer with all 64 taken).",
                label_values("reason", AdminRefusal::NAMES, &Labels::NONE),
            ),
            traffic: Arc::new(TrafficCounters::default()),
            engine,
            pool,
            capacity: CapacityReport(machine),
            proxy,
            fleet,
            acme,
            clients,
        }
    }

    /// The series of worker `id`, which runs on the calling thread.
    pub(crate) fn worker(&self, id: usize) -> Arc<WorkerSeries> {
        let series = Arc::new(WorkerSeries {
            id,
            tid: terminus_sys::current_tid().ok(),
            handshakes: AtomicU64::new(0),
            open: AtomicI64::new(0),
        });
        let mut workers = self.workers.0.lock().unwrap_or_else(|p| p.into_inner());
        workers.retain(|w| w.id != id);
        workers.push(series.clone());
        workers.sort_by_key(|w| w.id);
        series
    }

    pub fn connection_opened(&self) {
        self.connections_open.add(1);
        self.connections_total.inc();
    }

    pub fn connection_closed(&self) {
        self.connections_open.add(-1);
    }

    /// The connections open now, all workers together.
    pub fn connections_open(&self) -> u64 {
        self.connections_open.get().max(0) as u64
    }

    pub fn accept_failed(&self) {
        self.accept_errors.inc();
    }

    pub fn handshake_completed(&self, labels: HandshakeLabels) {
        *self
            .handshakes
            .0
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .entry(labels)
            .or_default() += 1;
    }

    pub fn handshake_failed(&self, why: HandshakeFailure) {
        self.handshake_failures.inc(why as usize);
    }

    pub fn data_path(&self, path: DataPath) {
        self.data_paths.inc(path as usize);
    }

    pub fn ktls_fallback(&self, cause: FallbackCause) {
        self.ktls_fallbacks.inc(cause as usize);
    }

    pub fn ktls_refused(&self) {
        self.ktls_refused.inc();
    }

    pub(crate) fn handshake_refused(&self, why: Refusal) {
        self.handshakes_refused.inc(why as usize);
    }

    /// HTTP/2 trouble on a connection (see [`Http2Trouble`]).
    pub(crate) fn http2_trouble(&self, what: Http2Trouble) {
        self.http2_trouble.inc(what.index());
    }

    /// A connection the admin listener closed.
    pub(crate) fn admin_refused(&self, why: AdminRefusal) {
        self.admin_refused.inc(why as usize);
    }

    /// A response of `status` over HTTP `version`.
    pub fn response(&self, status: u16, version: hyper::Version) {
        let class = (status / 100).clamp(1, 5) as usize - 1;
        let protocol = match version {
            hyper::Version::HTTP_2 => 1,
            hyper::Version::HTTP_3 => 2,
            _ => 0,
        };
        self.responses.inc(class * PROTOCOLS.len() + protocol);
    }

    /// The `GET /capacity` table.
    pub fn capacity(&self) -> String {
        self.capacity.json(self.fleet.shares())
    }

    /// The fleet's instances this one has seen report on tenants' quotas (itself among
    /// them), by id; `None` without a store sharing quotas.
    pub(crate) fn fleet_instances(&self) -> Option<Vec<String>> {
        let mut ids: Vec<String> = self
            .fleet
            .shares()?
            .into_values()
            .flat_map(|view| view.instances.into_iter().map(|(id, _, _)| id))
            .collect();
        ids.sort();
        ids.dedup();
        Some(ids)
    }

    /// Prometheus text exposition format.
    pub fn render(&self) -> String {
        let mut out = Exposition::new();
        let own: [&dyn Render; 14] = [
            &self.connections_open,
            &self.connections_total,
            &self.accept_errors,
            &self.handshakes,
            &self.handshake_failures,
            &self.phases,
            &self.responses,
            &self.data_paths,
            &self.ktls_fallbacks,
            &self.ktls_refused,
            &self.handshakes_refused,
            &self.http2_trouble,
            &self.admin_refused,
            &self.workers,
        ];
        for series in own {
            series.render(&mut out);
        }
        self.clients.render(&mut out);
        self.traffic.render(&mut out);
        self.engine.render(&mut out);
        self.capacity.render(&mut out);
        BridgeMetrics.render(&mut out);
        terminus_quic::QUIC_METRICS.render(&mut out);
        terminus_http::compress::stats::STATS.render(&mut out);
        terminus_http::body::budget::STATS.render(&mut out);
        crate::logs::LogMetrics.render(&mut out);
        crate::upgrade::metrics::UPGRADE.render(&mut out);
        terminus_keyless::metrics::KeylessMetrics.render(&mut out);
        self.proxy.render(&mut out);
        self.fleet.render(&mut out);
        if let Some(acme) = &self.acme {
            acme.render(&mut out);
        }
        if let Some(pool) = &self.pool {
            pool.render(&mut out);
        }
        out.into_text()
    }
}

#[cfg(test)]
mod tests {
    use rustls::SignatureScheme;
    use terminus_engine::{CryptoError, OpKind};
    use terminus_error::{Classify, Source};
    use terminus_tls::handshake::Downgrade;
    use terminus_tls::HandshakeError;

    use super::HandshakeFailure;

    /// Each handshake error is counted in the series its kind names, under the source
    /// the error vocabulary gives it.
    #[test]
    fn a_failed_handshake_is_counted_by_its_kind_and_source() {
        let crypto = |e| {
            (
                HandshakeError::Crypto(e),
                Source::CryptoBackend,
                "crypto_error",
            )
        };
        let internal = |e| {
            (
                HandshakeError::Crypto(e),
                Source::Internal,
                "internal_error",
            )
        };
        let cases = [
            (HandshakeError::Eof, Source::Client, "client_closed"),
            (
                HandshakeError::Io(std::io::ErrorKind::ConnectionReset.into()),
                Source::Client,
                "io_error",
            ),
            (HandshakeError::PlainText, Source::Client, "plain_http"),
            (
                HandshakeError::Downgrade(Downgrade::NoCommonVersion),
                Source::Client,
                "tls_error",
            ),
            (
                HandshakeError::Tls(rustls::Error::DecryptError),
                Source::Client,
                "tls_error",
            ),
            (
                HandshakeError::Crypto(CryptoError::BadPeerKey("X25519")),
                Source::Client,
                "tls_error",
            ),
            crypto(CryptoError::SignFailed),
            crypto(CryptoError::KeyGenFailed("P-256")),
            crypto(CryptoError::BackendGone("threads")),
            internal(CryptoError::SchemeMismatch(SignatureScheme::ED25519)),
            internal(CryptoError::KeyMismatch("P-256")),
            internal(CryptoError::WrongOutput(OpKind::X25519)),
            internal(CryptoError::Refused),
        ];
        for (error, source, kind) in cases {
            assert_eq!((error.kind(), error.source()), (kind, source), "{error}");
            let series = HandshakeFailure::of(&error);
            assert_eq!((series.name(), series.source()), (kind, source), "{error}");
        }
    }
}
