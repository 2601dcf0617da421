//! The `threads` backend: a small pool of crypto threads behind a bounded queue.
//!
//! It stands in for an offload device (QAT): the worker hands an operation over and goes
//! on running other connections; the completion wakes the handshake later. When the
//! queue is full, requests wait for room in the engine's queue (where fair queueing
//! chooses between tenants) instead of the offload queue growing, for [`QUEUE_WAIT`] at
//! most: then the worker computes the next one itself, as it does when the threads are
//! gone (counted as fallbacks).

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::thread;
use std::time::Duration;

use terminus_metrics::{Counter, Exposition, Kind, Render};

use crate::backend::{Backend, BackendKind, FallbackCause, Job};
use crate::metrics::EngineMetrics;
use crate::op::OpKind;
use crate::scalar;

/// The longest a flush waits for room in the full queue: past it, threads that busy
/// are no better than the worker.
pub const QUEUE_WAIT: Duration = Duration::from_millis(10);
/// How often a waiting flush looks for room.
const QUEUE_POLL: Duration = Duration::from_millis(1);

/// The crypto threads, shared by all workers of the process.
pub struct ThreadPool {
    tx: flume::Sender<Job>,
    /// Times a dispatch found the queue full and had to wait.
    backpressure_waits: Counter,
    threads: usize,
    capacity: usize,
}

impl std::fmt::Debug for ThreadPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ThreadPool")
            .field("threads", &self.threads)
            .field("capacity", &self.capacity)
            .finish()
    }
}

impl ThreadPool {
    /// Starts `threads` crypto threads fed by a queue of at most `capacity` operations.
    /// The threads exit when the last handle to the pool is dropped.
    pub fn start(threads: usize, capacity: usize) -> std::io::Result<Arc<Self>> {
        let (tx, rx) = flume::bounded::<Job>(capacity.max(1));
        for i in 0..threads.max(1) {
            let rx = rx.clone();
            thread::Builder::new()
                .name(format!("crypto-{i}"))
                .spawn(move || {
                    while let Ok(job) = rx.recv() {
                        let (op, reply) = job.into_parts();
                        reply.complete(scalar::compute(op));
                    }
                })?;
        }
        Ok(Arc::new(Self {
            tx,
            backpressure_waits: Counter::new(
                "terminus_crypto_offload_backpressure_total",
                "Flushes that waited for room in the full offload queue.",
            ),
            threads: threads.max(1),
            capacity: capacity.max(1),
        }))
    }

    /// Operations waiting for a crypto thread right now.
    pub fn queued(&self) -> usize {
        self.tx.len()
    }
}

impl Render for ThreadPool {
    fn render(&self, out: &mut Exposition) {
        out.header(
            "terminus_crypto_offload_queued",
            Kind::Gauge,
            "Operations waiting for a crypto thread.",
        );
        out.sample("terminus_crypto_offload_queued", "", self.queued());
        self.backpressure_waits.render(out);
    }
}

/// A worker's handle on the shared [`ThreadPool`].
#[derive(Debug, Clone)]
pub struct ThreadPoolBackend {
    pool: Arc<ThreadPool>,
    metrics: Arc<EngineMetrics>,
}

impl ThreadPoolBackend {
    /// A backend sending its jobs to `pool`, counting fallbacks into `metrics`.
    pub fn new(pool: Arc<ThreadPool>, metrics: Arc<EngineMetrics>) -> Self {
        Self { pool, metrics }
    }

    /// Computes `job` here, on the worker.
    fn fall_back(&self, job: Job, cause: FallbackCause) {
        let (op, reply) = job.into_parts();
        reply.fall_back(op, cause, &self.metrics);
    }
}

impl Backend for ThreadPoolBackend {
    fn kind(&self) -> BackendKind {
        BackendKind::Threads
    }

    fn max_batch(&self, _op: OpKind) -> usize {
        1
    }

    fn ready(&self) -> Option<Pin<Box<dyn Future<Output = ()> + '_>>> {
        if !self.pool.tx.is_full() {
            return None;
        }
        Some(Box::pin(async move {
            self.pool.backpressure_waits.inc();
            let deadline = tokio::time::Instant::now() + QUEUE_WAIT;
            while self.pool.tx.is_full() && tokio::time::Instant::now() < deadline {
                tokio::time::sleep(QUEUE_POLL).await;
            }
        }))
    }

    fn dispatch(&self, batch: Vec<Job>) {
        for job in batch {
            // Still full after `ready` (it gave up waiting, or another worker took the
            // room): the worker computes.
            match self.pool.tx.try_send(job) {
                Ok(()) => {}
                Err(flume::TrySendError::Full(job)) => {
                    self.fall_back(job, FallbackCause::QueueFull)
                }
                Err(flume::TrySendError::Disconnected(job)) => {
                    self.fall_back(job, FallbackCause::BackendGone)
                }
            }
        }
    }
}
