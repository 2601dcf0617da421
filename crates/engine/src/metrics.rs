//! Engine counters, shared by the workers of one process and read by the admin endpoint.

use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};

use crate::backend::BackendKind;
use crate::op::OpKind;

/// Counters for one operation kind.
#[derive(Debug, Default)]
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
            ops: Default::default(),
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
