//! Process-wide counters and their Prometheus text rendering for `GET /metrics`.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use terminus_engine::cost::Crossovers;
use terminus_engine::{EngineMetrics, Histogram, OpKind, ThreadPool};
use terminus_tls::{ErrorSource, FallbackCause, HandshakeError, SendMethod, TrafficCounters};

const HANDSHAKE_BOUNDS: &[f64] = &[
    0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
];

/// Why a handshake failed (label values of `terminus_handshake_failures_total`), each
/// with whose fault it is.
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
}

impl HandshakeFailure {
    const ALL: [HandshakeFailure; 6] = [
        Self::Timeout,
        Self::ClientClosed,
        Self::Tls,
        Self::Io,
        Self::Crypto,
        Self::Internal,
    ];

    pub fn of(e: &HandshakeError) -> Self {
        match (e.source(), e) {
            (ErrorSource::CryptoBackend, _) => Self::Crypto,
            (ErrorSource::Internal, _) => Self::Internal,
            (ErrorSource::Client, HandshakeError::Eof) => Self::ClientClosed,
            (ErrorSource::Client, HandshakeError::Io(_)) => Self::Io,
            (ErrorSource::Client, _) => Self::Tls,
        }
    }

    fn name(self) -> &'static str {
        match self {
            Self::Timeout => "timeout",
            Self::ClientClosed => "client_closed",
            Self::Tls => "tls_error",
            Self::Io => "io_error",
            Self::Crypto => "crypto_error",
            Self::Internal => "internal_error",
        }
    }

    fn source(self) -> ErrorSource {
        match self {
            Self::Crypto => ErrorSource::CryptoBackend,
            Self::Internal => ErrorSource::Internal,
            _ => ErrorSource::Client,
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

#[derive(Debug)]
pub struct Metrics {
    pub connections_open: AtomicI64,
    pub connections_total: AtomicU64,
    pub accept_errors: AtomicU64,
    handshakes: Mutex<BTreeMap<HandshakeLabels, u64>>,
    handshake_failures: [AtomicU64; HandshakeFailure::ALL.len()],
    pub handshake_duration: Histogram,
    responses: [AtomicU64; 5],
    data_paths: [AtomicU64; 2],
    ktls_fallbacks: [AtomicU64; FallbackCause::ALL.len()],
    pub ktls_refused: AtomicU64,
    pub traffic: Arc<TrafficCounters>,
    pub engine: Arc<EngineMetrics>,
    pub pool: Option<Arc<ThreadPool>>,
    /// The multibuffer backend's crossovers; `None` on other backends.
    pub crossovers: Option<Arc<Crossovers>>,
}

impl Metrics {
    pub fn new(
        engine: Arc<EngineMetrics>,
        pool: Option<Arc<ThreadPool>>,
        crossovers: Option<Arc<Crossovers>>,
    ) -> Self {
        Self {
            connections_open: AtomicI64::new(0),
            connections_total: AtomicU64::new(0),
            accept_errors: AtomicU64::new(0),
            handshakes: Mutex::new(BTreeMap::new()),
            handshake_failures: Default::default(),
            handshake_duration: Histogram::new(HANDSHAKE_BOUNDS),
            responses: Default::default(),
            data_paths: Default::default(),
            ktls_fallbacks: Default::default(),
            ktls_refused: AtomicU64::new(0),
            traffic: Arc::new(TrafficCounters::default()),
            engine,
            pool,
            crossovers,
        }
    }

    pub fn handshake_completed(&self, labels: HandshakeLabels, took: Duration) {
        *self
            .handshakes
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .entry(labels)
            .or_default() += 1;
        self.handshake_duration.observe(took);
    }

    pub fn handshake_failed(&self, why: HandshakeFailure) {
        self.handshake_failures[why as usize].fetch_add(1, Ordering::Relaxed);
    }

    pub fn data_path(&self, path: DataPath) {
        self.data_paths[path as usize].fetch_add(1, Ordering::Relaxed);
    }

    pub fn ktls_fallback(&self, cause: FallbackCause) {
        self.ktls_fallbacks[cause as usize].fetch_add(1, Ordering::Relaxed);
    }

    pub fn response(&self, status: u16) {
        let class = (status / 100).clamp(1, 5) as usize - 1;
        self.responses[class].fetch_add(1, Ordering::Relaxed);
    }

    /// Prometheus text exposition format.
    pub fn render(&self) -> String {
        let mut out = String::with_capacity(8192);
        let o = &mut out;
        let load = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let header = |o: &mut String, name: &str, kind: &str, help: &str| {
            let _ = writeln!(o, "# HELP {name} {help}\n# TYPE {name} {kind}");
        };

        header(
            o,
            "terminus_connections_open",
            "gauge",
            "Client connections open now.",
        );
        let _ = writeln!(
            o,
            "terminus_connections_open {}",
            self.connections_open.load(Ordering::Relaxed)
        );
        header(
            o,
            "terminus_connections_total",
            "counter",
            "Client connections accepted.",
        );
        let _ = writeln!(
            o,
            "terminus_connections_total {}",
            load(&self.connections_total)
        );
        header(
            o,
            "terminus_accept_errors_total",
            "counter",
            "accept() failures (EMFILE and the like).",
        );
        let _ = writeln!(
            o,
            "terminus_accept_errors_total {}",
            load(&self.accept_errors)
        );

        header(
            o,
            "terminus_handshakes_total",
            "counter",
            "Completed TLS handshakes.",
        );
        for (l, n) in self
            .handshakes
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
        {
            let _ = writeln!(
                o,
                "terminus_handshakes_total{{version=\"{}\",cipher_suite=\"{}\",key_type=\"{}\"}} {n}",
                l.version, l.cipher_suite, l.key_type
            );
        }
        header(
            o,
            "terminus_handshake_failures_total",
            "counter",
            "TLS handshakes that did not complete, by whose fault (client, crypto_backend, internal) and reason.",
        );
        for why in HandshakeFailure::ALL {
            let _ = writeln!(
                o,
                "terminus_handshake_failures_total{{source=\"{}\",reason=\"{}\"}} {}",
                why.source().name(),
                why.name(),
                load(&self.handshake_failures[why as usize])
            );
        }
        header(
            o,
            "terminus_handshake_duration_seconds",
            "histogram",
            "Accept to handshake completion.",
        );
        self.handshake_duration
            .render(o, "terminus_handshake_duration_seconds", "");

        header(
            o,
            "terminus_http_responses_total",
            "counter",
            "HTTP responses by status class.",
        );
        for (i, n) in self.responses.iter().enumerate() {
            let _ = writeln!(
                o,
                "terminus_http_responses_total{{code=\"{}xx\"}} {}",
                i + 1,
                load(n)
            );
        }
        header(
            o,
            "terminus_bytes_received_total",
            "counter",
            "Bytes read from client sockets.",
        );
        let _ = writeln!(
            o,
            "terminus_bytes_received_total {}",
            load(&self.traffic.bytes_in)
        );
        header(
            o,
            "terminus_bytes_sent_total",
            "counter",
            "Bytes written to client sockets.",
        );
        let _ = writeln!(
            o,
            "terminus_bytes_sent_total {}",
            load(&self.traffic.bytes_out)
        );

        header(
            o,
            "terminus_connections_by_data_path_total",
            "counter",
            "Connections after their handshake, by record layer (kernel TLS or rustls).",
        );
        for (path, n) in ["ktls", "userspace"].iter().zip(&self.data_paths) {
            let _ = writeln!(
                o,
                "terminus_connections_by_data_path_total{{path=\"{path}\"}} {}",
                load(n)
            );
        }
        header(
            o,
            "terminus_ktls_fallbacks_total",
            "counter",
            "Connections of ktls = auto/required listeners that kernel TLS did not take, by cause.",
        );
        for cause in FallbackCause::ALL {
            let _ = writeln!(
                o,
                "terminus_ktls_fallbacks_total{{cause=\"{}\"}} {}",
                cause.name(),
                load(&self.ktls_fallbacks[cause as usize])
            );
        }
        header(
            o,
            "terminus_ktls_refused_total",
            "counter",
            "Connections closed because their ktls = required listener could not hand them to the kernel.",
        );
        let _ = writeln!(
            o,
            "terminus_ktls_refused_total {}",
            load(&self.ktls_refused)
        );
        header(
            o,
            "terminus_ktls_key_update_closes_total",
            "counter",
            "Kernel TLS connections closed cleanly after a client KeyUpdate the kernel cannot follow.",
        );
        let _ = writeln!(
            o,
            "terminus_ktls_key_update_closes_total {}",
            load(&self.traffic.key_update_closes)
        );
        header(
            o,
            "terminus_response_bytes_total",
            "counter",
            "Application bytes sent to clients, by how: rustls (userspace), write/sendfile/splice to a kernel TLS socket.",
        );
        for method in SendMethod::ALL {
            let _ = writeln!(
                o,
                "terminus_response_bytes_total{{method=\"{}\"}} {}",
                method.name(),
                self.traffic.sent_by(method)
            );
        }

        let backend = self.engine.backend().name();
        let per_op = |o: &mut String,
                      name: &str,
                      kind: &str,
                      help: &str,
                      value: &dyn Fn(OpKind) -> String| {
            header(o, name, kind, help);
            for op in OpKind::ALL {
                let _ = writeln!(
                    o,
                    "{name}{{op=\"{}\",backend=\"{backend}\"}} {}",
                    op.name(),
                    value(op)
                );
            }
        };
        let e = &self.engine;
        per_op(
            o,
            "terminus_crypto_requests_total",
            "counter",
            "Operations submitted to the crypto engine.",
            &|op| load(&e.op(op).requests).to_string(),
        );
        per_op(
            o,
            "terminus_crypto_errors_total",
            "counter",
            "Engine operations that failed.",
            &|op| load(&e.op(op).errors).to_string(),
        );
        per_op(
            o,
            "terminus_crypto_queue_depth",
            "gauge",
            "Engine operations submitted and not yet answered.",
            &|op| e.op(op).in_queue.load(Ordering::Relaxed).to_string(),
        );
        per_op(
            o,
            "terminus_crypto_batches_total",
            "counter",
            "Batches handed to the backend.",
            &|op| load(&e.op(op).batches).to_string(),
        );
        per_op(
            o,
            "terminus_crypto_batched_requests_total",
            "counter",
            "Operations in those batches.",
            &|op| load(&e.op(op).batched_requests).to_string(),
        );
        per_op(
            o,
            "terminus_crypto_latency_seconds_sum",
            "counter",
            "Summed submit-to-answer time.",
            &|op| format!("{}", load(&e.op(op).latency_us_sum) as f64 / 1e6),
        );
        header(
            o,
            "terminus_crypto_batch_size",
            "histogram",
            "Requests per batch handed to the backend.",
        );
        for op in OpKind::ALL {
            let c = e.op(op);
            let labels = format!("op=\"{}\",backend=\"{backend}\"", op.name());
            let mut cumulative = 0;
            for (i, n) in c.batch_sizes.iter().enumerate() {
                cumulative += load(n);
                let _ = writeln!(
                    o,
                    "terminus_crypto_batch_size_bucket{{{labels},le=\"{}\"}} {cumulative}",
                    i + 1
                );
            }
            let _ = writeln!(
                o,
                "terminus_crypto_batch_size_bucket{{{labels},le=\"+Inf\"}} {cumulative}"
            );
            let _ = writeln!(
                o,
                "terminus_crypto_batch_size_sum{{{labels}}} {}",
                load(&c.batched_requests)
            );
            let _ = writeln!(
                o,
                "terminus_crypto_batch_size_count{{{labels}}} {}",
                load(&c.batches)
            );
        }
        header(
            o,
            "terminus_crypto_queue_wait_seconds",
            "histogram",
            "Submit to hand-over to the backend, per request.",
        );
        for op in OpKind::ALL {
            let labels = format!("op=\"{}\",backend=\"{backend}\"", op.name());
            e.op(op)
                .queue_wait
                .render(o, "terminus_crypto_queue_wait_seconds", &labels);
        }
        header(
            o,
            "terminus_crypto_dispatch_seconds",
            "histogram",
            "One backend dispatch: compute time for backends that compute on the worker, hand-over for threads.",
        );
        for op in OpKind::ALL {
            let labels = format!("op=\"{}\",backend=\"{backend}\"", op.name());
            e.op(op)
                .dispatch
                .render(o, "terminus_crypto_dispatch_seconds", &labels);
        }
        if let Some(crossovers) = &self.crossovers {
            header(
                o,
                "terminus_crypto_crossover",
                "gauge",
                "Smallest batch the multibuffer backend computes in one call (9: never); measured=\"1\" when measured on this CPU at start-up.",
            );
            for (op, crossover, measured) in crossovers.all() {
                let _ = writeln!(
                    o,
                    "terminus_crypto_crossover{{op=\"{}\",measured=\"{}\"}} {crossover}",
                    op.name(),
                    u8::from(measured)
                );
            }
        }
        header(
            o,
            "terminus_crypto_sync_fallbacks_total",
            "counter",
            "Operations computed synchronously outside a handshake coroutine.",
        );
        let _ = writeln!(
            o,
            "terminus_crypto_sync_fallbacks_total {}",
            terminus_tls::handshake::bridge::SYNC_FALLBACKS.load(Ordering::Relaxed)
        );
        if let Some(pool) = &self.pool {
            header(
                o,
                "terminus_crypto_offload_queued",
                "gauge",
                "Operations waiting for a crypto thread.",
            );
            let _ = writeln!(o, "terminus_crypto_offload_queued {}", pool.queued());
            header(
                o,
                "terminus_crypto_offload_backpressure_total",
                "counter",
                "Dispatches that waited for room in the full offload queue.",
            );
            let _ = writeln!(
                o,
                "terminus_crypto_offload_backpressure_total {}",
                load(&pool.backpressure_waits)
            );
        }
        out
    }
}
