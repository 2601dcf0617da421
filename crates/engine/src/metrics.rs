//! Engine counters, shared by the workers of one process and read by the admin endpoint.

use std::fmt::Write as _;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::time::Duration;

use crate::backend::BackendKind;
use crate::op::OpKind;

/// A fixed-bucket histogram of durations (seconds), lock-free.
#[derive(Debug)]
pub struct Histogram {
    bounds: &'static [f64],
    buckets: Vec<AtomicU64>,
    count: AtomicU64,
    sum_us: AtomicU64,
}

impl Histogram {
    pub fn new(bounds: &'static [f64]) -> Self {
        Self {
            bounds,
            buckets: bounds.iter().map(|_| AtomicU64::new(0)).collect(),
            count: AtomicU64::new(0),
            sum_us: AtomicU64::new(0),
        }
    }

    pub fn observe(&self, d: Duration) {
        let secs = d.as_secs_f64();
        if let Some(i) = self.bounds.iter().position(|&b| secs <= b) {
            self.buckets[i].fetch_add(1, Ordering::Relaxed);
        }
        self.count.fetch_add(1, Ordering::Relaxed);
        self.sum_us
            .fetch_add(d.as_micros() as u64, Ordering::Relaxed);
    }

    /// Appends the Prometheus text lines of this histogram (no HELP/TYPE header).
    pub fn render(&self, out: &mut String, name: &str, labels: &str) {
        let sep = if labels.is_empty() { "" } else { "," };
        let mut cumulative = 0;
        for (bound, bucket) in self.bounds.iter().zip(&self.buckets) {
            cumulative += bucket.load(Ordering::Relaxed);
            let _ = writeln!(
                out,
                "{name}_bucket{{{labels}{sep}le=\"{bound}\"}} {cumulative}"
            );
        }
        let count = self.count.load(Ordering::Relaxed);
        let _ = writeln!(out, "{name}_bucket{{{labels}{sep}le=\"+Inf\"}} {count}");
        let braces = if labels.is_empty() {
            String::new()
        } else {
            format!("{{{labels}}}")
        };
        let _ = writeln!(
            out,
            "{name}_sum{braces} {}",
            self.sum_us.load(Ordering::Relaxed) as f64 / 1e6
        );
        let _ = writeln!(out, "{name}_count{braces} {count}");
    }
}

/// Queue-wait and compute-time buckets: 10 µs to 50 ms.
const ENGINE_BOUNDS: &[f64] = &[
    0.00001, 0.000025, 0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.05,
];

/// Counters for one operation kind.
#[derive(Debug)]
pub struct OpCounters {
    /// Requests submitted to the engine.
    pub requests: AtomicU64,
    /// Requests that ended in an error.
    pub errors: AtomicU64,
    /// Requests submitted and not yet answered.
    pub in_queue: AtomicI64,
    /// Batches handed to the backend, and the requests in them.
    pub batches: AtomicU64,
    pub batched_requests: AtomicU64,
    /// Requests a batching backend computed one by one: their batch was below the
    /// operation's crossover, or the request has no batched form.
    pub scalar_computed: AtomicU64,
    /// Summed microseconds from submit to answer.
    pub latency_us_sum: AtomicU64,
    /// Batches by size: `batch_sizes[n - 1]` counts batches of n requests (n <= 8; larger
    /// batches, from backends without lanes, count as 8).
    pub batch_sizes: [AtomicU64; 8],
    /// Submit to hand-over to the backend, per request.
    pub queue_wait: Histogram,
    /// One backend dispatch (compute, for backends that compute on the worker).
    pub dispatch: Histogram,
}

impl Default for OpCounters {
    fn default() -> Self {
        Self {
            requests: AtomicU64::new(0),
            errors: AtomicU64::new(0),
            in_queue: AtomicI64::new(0),
            batches: AtomicU64::new(0),
            batched_requests: AtomicU64::new(0),
            scalar_computed: AtomicU64::new(0),
            latency_us_sum: AtomicU64::new(0),
            batch_sizes: Default::default(),
            queue_wait: Histogram::new(ENGINE_BOUNDS),
            dispatch: Histogram::new(ENGINE_BOUNDS),
        }
    }
}

impl OpCounters {
    pub fn batch(&self, size: usize) {
        self.batch_sizes[size.clamp(1, 8) - 1].fetch_add(1, Ordering::Relaxed);
    }
}

/// All engine counters of the process for one backend.
#[derive(Debug)]
pub struct EngineMetrics {
    backend: BackendKind,
    ops: [OpCounters; OpKind::COUNT],
}

impl EngineMetrics {
    pub fn new(backend: BackendKind) -> Self {
        Self {
            backend,
            ops: std::array::from_fn(|_| OpCounters::default()),
        }
    }

    pub fn backend(&self) -> BackendKind {
        self.backend
    }

    pub fn op(&self, kind: OpKind) -> &OpCounters {
        &self.ops[kind.index()]
    }

    pub fn add(counter: &AtomicU64, n: u64) {
        counter.fetch_add(n, Ordering::Relaxed);
    }
}
