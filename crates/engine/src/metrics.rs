//! The engine's series, shared by the workers of one process: per operation kind and
//! backend, what was asked, how it was batched, how long it waited. The engine updates
//! them through the methods here and renders them itself.

use std::time::Duration;

use terminus_metrics::{label_values, Exposition, Histograms, Labelled, Labels, Render};

use crate::backend::{BackendKind, FallbackCause};
use crate::op::OpKind;

/// Queue-wait and compute-time buckets: 10 µs to 50 ms.
const ENGINE_BOUNDS: &[f64] = &[
    0.00001, 0.000025, 0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.05,
];
/// Batch sizes: one bucket per lane count.
const BATCH_BOUNDS: &[f64] = &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0];

const OPS: usize = OpKind::COUNT;
const CAUSES: usize = FallbackCause::ALL.len();

/// Where `kind`'s count for `cause` is in the fallbacks series (causes are declared in
/// `FallbackCause::ALL`'s order).
fn fallback_slot(kind: OpKind, cause: FallbackCause) -> usize {
    kind.index() * CAUSES + cause as usize
}

/// All engine series of the process for one backend.
#[derive(Debug)]
pub struct EngineMetrics {
    backend: BackendKind,
    requests: Labelled<OPS>,
    errors: Labelled<OPS>,
    in_queue: Labelled<OPS>,
    batches: Labelled<OPS>,
    batched_requests: Labelled<OPS>,
    scalar_computed: Labelled<OPS>,
    /// By operation and cause (`op * CAUSES + cause`).
    fallbacks: Labelled<{ OPS * CAUSES }>,
    /// Submit to answer, summed in µs.
    latency: Labelled<OPS>,
    batch_size: Histograms<OPS>,
    queue_wait: Histograms<OPS>,
    dispatch: Histograms<OPS>,
}

impl EngineMetrics {
    /// Empty counters, labelled with `backend`.
    pub fn new(backend: BackendKind) -> Self {
        let labels = || {
            label_values(
                "op",
                OpKind::ALL.map(OpKind::name),
                &Labels::of([("backend", backend.name())]),
            )
        };
        Self {
            backend,
            requests: Labelled::counter(
                "terminus_crypto_requests_total",
                "Operations submitted to the crypto engine.",
                labels(),
            ),
            errors: Labelled::counter(
                "terminus_crypto_errors_total",
                "Engine operations that failed.",
                labels(),
            ),
            in_queue: Labelled::gauge(
                "terminus_crypto_queue_depth",
                "Engine operations submitted and not yet answered.",
                labels(),
            ),
            batches: Labelled::counter(
                "terminus_crypto_batches_total",
                "Batches handed to the backend.",
                labels(),
            ),
            batched_requests: Labelled::counter(
                "terminus_crypto_batched_requests_total",
                "Operations in those batches.",
                labels(),
            ),
            scalar_computed: Labelled::counter(
                "terminus_crypto_scalar_computed_total",
                "Operations a batching backend computed one by one: their batch was below the crossover, or they have no batched form.",
                labels(),
            ),
            fallbacks: Labelled::counter(
                "terminus_crypto_fallbacks_total",
                "Operations a batching backend recomputed on the scalar path after its batch failed them (the handshake went on).",
                std::array::from_fn(|i| {
                    Labels::of([
                        ("op", OpKind::ALL[i / CAUSES].name()),
                        ("cause", FallbackCause::ALL[i % CAUSES].name()),
                        ("backend", backend.name()),
                    ])
                }),
            ),
            latency: Labelled::counter(
                "terminus_crypto_latency_seconds_sum",
                "Summed submit-to-answer time.",
                labels(),
            )
            .scaled(1e6),
            batch_size: Histograms::new(
                "terminus_crypto_batch_size",
                "Requests per batch handed to the backend.",
                BATCH_BOUNDS,
                labels(),
            ),
            queue_wait: Histograms::new(
                "terminus_crypto_queue_wait_seconds",
                "Submit to hand-over to the backend, per request.",
                ENGINE_BOUNDS,
                labels(),
            ),
            dispatch: Histograms::new(
                "terminus_crypto_dispatch_seconds",
                "One backend dispatch: compute time for backends that compute on the worker, hand-over for threads.",
                ENGINE_BOUNDS,
                labels(),
            ),
        }
    }

    /// The backend these counters are labelled with.
    pub fn backend(&self) -> BackendKind {
        self.backend
    }

    pub(crate) fn submitted(&self, kind: OpKind) {
        self.requests.inc(kind.index());
        self.in_queue.add(kind.index(), 1);
    }

    /// The request left the engine (answered, or its handshake went away).
    pub(crate) fn left(&self, kind: OpKind) {
        self.in_queue.add(kind.index(), -1);
    }

    pub(crate) fn answered(&self, kind: OpKind, took: Duration, ok: bool) {
        self.latency.add(kind.index(), took.as_micros() as i64);
        if !ok {
            self.errors.inc(kind.index());
        }
    }

    /// A batch of requests that waited `waits` goes to the backend.
    pub(crate) fn batch(&self, kind: OpKind, waits: impl ExactSizeIterator<Item = Duration>) {
        let i = kind.index();
        self.batches.inc(i);
        self.batched_requests.add(i, waits.len() as i64);
        self.batch_size.get(i).observe(waits.len() as u64);
        for wait in waits {
            self.queue_wait.get(i).observe_duration(wait);
        }
    }

    pub(crate) fn dispatched(&self, kind: OpKind, took: Duration) {
        self.dispatch.get(kind.index()).observe_duration(took);
    }

    pub(crate) fn computed_scalar(&self, kind: OpKind) {
        self.scalar_computed.inc(kind.index());
    }

    pub(crate) fn fell_back(&self, kind: OpKind, cause: FallbackCause) {
        self.fallbacks.inc(fallback_slot(kind, cause));
    }

    /// Requests of `kind` recomputed on the scalar path for `cause`.
    pub fn fallbacks(&self, kind: OpKind, cause: FallbackCause) -> u64 {
        self.fallbacks.get(fallback_slot(kind, cause)) as u64
    }

    /// Requests of `kind` submitted so far.
    pub fn requests(&self, kind: OpKind) -> u64 {
        self.requests.get(kind.index()) as u64
    }

    /// Batches of `kind` handed to the backend so far.
    pub fn batches(&self, kind: OpKind) -> u64 {
        self.batches.get(kind.index()) as u64
    }

    /// Requests of `kind` in those batches.
    pub fn batched_requests(&self, kind: OpKind) -> u64 {
        self.batched_requests.get(kind.index()) as u64
    }

    /// Requests of `kind` a batching backend computed one by one.
    pub fn scalar_computed(&self, kind: OpKind) -> u64 {
        self.scalar_computed.get(kind.index()) as u64
    }
}

impl Render for EngineMetrics {
    fn render(&self, out: &mut Exposition) {
        self.requests.render(out);
        self.errors.render(out);
        self.in_queue.render(out);
        self.batches.render(out);
        self.batched_requests.render(out);
        self.scalar_computed.render(out);
        self.fallbacks.render(out);
        self.latency.render(out);
        self.batch_size.render(out);
        self.queue_wait.render(out);
        self.dispatch.render(out);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `fallback_slot` reads a cause's place off its discriminant, the labels off `ALL`.
    #[test]
    fn fallback_causes_are_declared_in_label_order() {
        for (i, cause) in FallbackCause::ALL.into_iter().enumerate() {
            assert_eq!(cause as usize, i, "{cause:?}");
        }
    }
}
