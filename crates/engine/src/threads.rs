//! Crypto threads behind a bounded queue: the machinery of the `threads` backend, and of
//! the multibuffer backend when `crypto.simd = "dedicated"` places it off the workers.
//!
//! For `threads`, the pool stands in for an offload device (QAT): the worker hands an
//! operation over and goes on running other connections; the completion wakes the
//! handshake later; each operation is computed scalar. Dedicated, each thread is pinned
//! to a core of its own and owns a [`MultibufferBackend`]: workers hand over whole
//! batches, and a thread fills one crypto_mb call with batches of one kind from several
//! workers where they are queued together, so worker cores never run AVX-512 for
//! handshakes.
//!
//! When the queue is full, requests wait for room in the engine's queue (where fair
//! queueing chooses between tenants) instead of the offload queue growing, for
//! [`QUEUE_WAIT`] at most: then the worker computes the next one itself, scalar, as it
//! does when the threads are gone (counted as fallbacks).

use std::cell::Cell;
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::Duration;

use terminus_metrics::{Counter, Exposition, Kind, Labels, Render};

use crate::backend::{Backend, BackendKind, FallbackCause, Job};
use crate::cost::Crossovers;
use crate::metrics::EngineMetrics;
use crate::multibuffer::MultibufferBackend;
use crate::op::OpKind;
use crate::scalar;

/// The longest a flush waits for room in the full queue: past it, threads that busy
/// are no better than the worker.
pub const QUEUE_WAIT: Duration = Duration::from_millis(10);
/// How often a waiting flush looks for room.
const QUEUE_POLL: Duration = Duration::from_millis(1);

/// The crypto threads, shared by all workers of the process.
pub struct ThreadPool {
    tx: flume::Sender<Vec<Job>>,
    /// Operations sent and not yet taken by a thread.
    queued: Arc<AtomicUsize>,
    /// Times a dispatch found the queue full and had to wait.
    backpressure_waits: Counter,
    /// Batches a dedicated thread computed in one call with another's.
    merged: Arc<Counter>,
    /// Operations the threads computed.
    computed: Arc<Counter>,
    kind: BackendKind,
    threads: usize,
    /// The threads, joined by [`ThreadPool::stop`].
    handles: std::sync::Mutex<Vec<thread::JoinHandle<()>>>,
}

impl std::fmt::Debug for ThreadPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ThreadPool")
            .field("kind", &self.kind)
            .field("threads", &self.threads)
            .field("capacity", &self.tx.capacity().unwrap_or(0))
            .finish()
    }
}

impl ThreadPool {
    /// The `threads` backend: `threads` unpinned crypto threads computing scalar, fed by
    /// a queue of at most `capacity` operations. The threads exit when the last handle to
    /// the pool is dropped.
    pub fn start(threads: usize, capacity: usize) -> io::Result<Arc<Self>> {
        let (pool, rx) = Self::new(BackendKind::Threads, capacity, threads.max(1));
        pool.spawn(rx, "crypto", |_, queue, ready| {
            ready();
            while let Some(batch) = queue.recv() {
                for job in batch {
                    let (op, reply) = job.into_parts();
                    reply.complete(scalar::compute(op));
                }
            }
            Ok(())
        })
    }

    /// `crypto.simd = "dedicated"`: one thread pinned to each of `cpus`, each computing
    /// with its own multibuffer backend (counting into `metrics`, batching by
    /// `crossovers`), fed by a queue of some `capacity` operations. An error if a thread
    /// cannot be pinned or crypto_mb does not run here: a dedicated core that is not one
    /// would shield nothing.
    pub fn dedicated(
        cpus: &[usize],
        capacity: usize,
        metrics: Arc<EngineMetrics>,
        crossovers: Arc<Crossovers>,
    ) -> io::Result<Arc<Self>> {
        let (pool, rx) = Self::new(
            BackendKind::Multibuffer,
            capacity.div_ceil(crypto_mb_sys::LANES),
            cpus.len().max(1),
        );
        let merged = pool.merged.clone();
        let cpus = cpus.to_vec();
        pool.spawn(rx, "crypto-simd", move |i, queue, ready| {
            let cpu = cpus[i];
            terminus_sys::pin_current_thread(cpu).map_err(|e| {
                io::Error::new(
                    e.kind(),
                    format!("pinning a crypto thread to CPU {cpu}: {e}"),
                )
            })?;
            let backend = MultibufferBackend::new(metrics.clone())
                .ok_or_else(|| io::Error::other("crypto_mb does not run on this CPU"))?
                .with_crossovers(crossovers.clone());
            ready();
            serve_batches(&queue, &merged, |batch| backend.dispatch(batch));
            Ok(())
        })
    }

    /// The pool before its threads, and the receiving half of its queue for them.
    fn new(
        kind: BackendKind,
        capacity: usize,
        threads: usize,
    ) -> (Self, flume::Receiver<Vec<Job>>) {
        let (tx, rx) = flume::bounded(capacity.max(1));
        let pool = Self {
            tx,
            queued: Arc::default(),
            backpressure_waits: Counter::new(
                "terminus_crypto_offload_backpressure_total",
                "Flushes that waited for room in the full offload queue.",
            ),
            merged: Arc::new(Counter::new(
                "terminus_crypto_offload_merged_total",
                "Batches a dedicated crypto thread computed in one call with another worker's.",
            )),
            computed: Arc::new(Counter::new(
                "terminus_crypto_offload_computed_total",
                "Operations the crypto threads computed (not the workers).",
            )),
            kind,
            threads,
            handles: std::sync::Mutex::default(),
        };
        (pool, rx)
    }

    /// Starts the pool's threads, named `name-i`, each running `body(i, queue, ready)`,
    /// and returns once each has called `ready` (the pool) or one has failed (its error).
    /// The receiving half `rx` lives only in the threads: when the pool is dropped, they
    /// see the queue closed and exit.
    fn spawn<F>(self, rx: flume::Receiver<Vec<Job>>, name: &str, body: F) -> io::Result<Arc<Self>>
    where
        F: Fn(usize, Queue, &dyn Fn()) -> io::Result<()> + Send + Sync + 'static,
    {
        let n = self.threads;
        let pool = Arc::new(self);
        let body = Arc::new(body);
        let (started_tx, started) = std::sync::mpsc::channel::<io::Result<()>>();
        for i in 0..n {
            let queue = Queue {
                rx: rx.clone(),
                queued: pool.queued.clone(),
                computed: pool.computed.clone(),
            };
            let body = body.clone();
            // Each thread reports once and drops its sender with it, so that a thread
            // that ends without reporting (a panic) closes the channel once the others
            // have reported, instead of leaving start-up waiting.
            let report = Cell::new(Some(started_tx.clone()));
            let handle = thread::Builder::new()
                .name(format!("{name}-{i}"))
                .spawn(move || {
                    let send = |result| {
                        if let Some(tx) = report.take() {
                            let _ = tx.send(result);
                        }
                    };
                    if let Err(e) = body(i, queue, &|| send(Ok(()))) {
                        send(Err(e));
                    }
                })?;
            pool.handles
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .push(handle);
        }
        drop(started_tx);
        for _ in 0..n {
            match started.recv() {
                Ok(Ok(())) => {}
                Ok(Err(e)) => return Err(e),
                Err(_) => return Err(io::Error::other("a crypto thread ended at start")),
            }
        }
        Ok(pool)
    }

    /// Stops the crypto threads and waits for them: each computes what was queued before,
    /// then ends. For shutdown, once the workers that queue operations are gone (an
    /// operation queued after this waits for nothing and falls back to the worker).
    pub fn stop(&self) {
        let handles = std::mem::take(
            &mut *self
                .handles
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner),
        );
        for _ in &handles {
            // An empty batch is the stop message: dispatch never queues one.
            let _ = self.tx.send(Vec::new());
        }
        for handle in handles {
            let _ = handle.join();
        }
    }

    /// Operations waiting for a crypto thread right now.
    pub fn queued(&self) -> usize {
        self.queued.load(Ordering::Relaxed)
    }

    /// The backend the pool computes as: `threads`, or `multibuffer` when dedicated.
    pub fn kind(&self) -> BackendKind {
        self.kind
    }

    /// Operations a worker hands over at once: a batch dedicated, one for `threads`.
    fn lanes(&self) -> usize {
        match self.kind {
            BackendKind::Multibuffer => crypto_mb_sys::LANES,
            _ => 1,
        }
    }
}

/// A crypto thread's end of the queue: what it takes leaves the queued count and is
/// counted as computed by the crypto threads.
struct Queue {
    rx: flume::Receiver<Vec<Job>>,
    queued: Arc<AtomicUsize>,
    computed: Arc<Counter>,
}

impl Queue {
    /// The next batch, waiting for one; `None` once the pool is gone or stopped (the
    /// empty batch [`ThreadPool::stop`] sends).
    fn recv(&self) -> Option<Vec<Job>> {
        self.rx
            .recv()
            .ok()
            .filter(|b| !b.is_empty())
            .map(|b| self.took(b))
    }

    /// The next batch if one is queued: `Some(empty)` is the stop message.
    fn try_recv(&self) -> Option<Vec<Job>> {
        self.rx.try_recv().ok().map(|b| self.took(b))
    }

    fn took(&self, batch: Vec<Job>) -> Vec<Job> {
        self.queued.fetch_sub(batch.len(), Ordering::Relaxed);
        self.computed.add(batch.len() as u64);
        batch
    }
}

/// A dedicated thread's loop: each batch taken, with batches of the same operation queued
/// behind it added while they fit in one call, is computed by `compute`.
fn serve_batches(queue: &Queue, merged: &Counter, mut compute: impl FnMut(Vec<Job>)) {
    let mut held: Option<Vec<Job>> = None;
    loop {
        let Some(mut batch) = held.take().or_else(|| queue.recv()) else {
            return;
        };
        if batch.is_empty() {
            return; // the stop message, taken while merging
        }
        let kind = batch.first().map(Job::kind);
        while batch.len() < crypto_mb_sys::LANES {
            let Some(more) = queue.try_recv() else { break };
            if !more.is_empty()
                && more.first().map(Job::kind) == kind
                && batch.len() + more.len() <= crypto_mb_sys::LANES
            {
                merged.inc();
                batch.extend(more);
            } else {
                held = Some(more);
                break;
            }
        }
        compute(batch);
    }
}

impl Render for ThreadPool {
    fn render(&self, out: &mut Exposition) {
        out.header(
            "terminus_crypto_offload_queued",
            Kind::Gauge,
            "Operations waiting for a crypto thread.",
        );
        out.sample(
            "terminus_crypto_offload_queued",
            &Labels::NONE,
            self.queued(),
        );
        self.backpressure_waits.render(out);
        self.computed.render(out);
        if self.kind == BackendKind::Multibuffer {
            self.merged.render(out);
        }
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
}

impl Backend for ThreadPoolBackend {
    fn kind(&self) -> BackendKind {
        self.pool.kind
    }

    fn max_batch(&self, _op: OpKind) -> usize {
        self.pool.lanes()
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
        if batch.is_empty() {
            // An empty batch on the queue is the stop message (ThreadPool::stop).
            return;
        }
        let n = batch.len();
        self.pool.queued.fetch_add(n, Ordering::Relaxed);
        // Still full after `ready` (it gave up waiting, or another worker took the
        // room): the worker computes, scalar.
        let (batch, cause) = match self.pool.tx.try_send(batch) {
            Ok(()) => return,
            Err(flume::TrySendError::Full(batch)) => (batch, FallbackCause::QueueFull),
            Err(flume::TrySendError::Disconnected(batch)) => (batch, FallbackCause::BackendGone),
        };
        self.pool.queued.fetch_sub(n, Ordering::Relaxed);
        for job in batch {
            let (op, reply) = job.into_parts();
            reply.fall_back(op, cause, &self.metrics);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::op::{CryptoOp, KxGroup};

    /// A crypto thread's end of `rx`, counting from zero.
    fn queue(rx: flume::Receiver<Vec<Job>>) -> Queue {
        Queue {
            rx,
            queued: Arc::default(),
            computed: Arc::new(Counter::new("computed", "")),
        }
    }

    fn batch(group: KxGroup, n: usize) -> Vec<Job> {
        (0..n)
            .map(|_| Job::new(CryptoOp::KxGenerate { group }).0)
            .collect()
    }

    /// A thread that dies before it is ready fails the pool's start, even when the others
    /// started: start-up must not wait for it forever.
    #[test]
    fn a_crypto_thread_dying_at_start_fails_the_start() {
        let (done_tx, done) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let (pool, rx) = ThreadPool::new(BackendKind::Threads, 4, 2);
            let started = pool.spawn(rx, "dying", |i, queue, ready| {
                if i == 0 {
                    std::thread::sleep(Duration::from_millis(50));
                    panic!("thread 0 dies before it is ready (this panic is the test's)");
                }
                ready();
                while queue.recv().is_some() {}
                Ok(())
            });
            let _ = done_tx.send(started.is_err());
        });
        let failed = done
            .recv_timeout(Duration::from_secs(20))
            .expect("the start is still waiting for the dead thread");
        assert!(failed, "the start succeeded without thread 0");
    }

    /// Batches queued together are computed together while they are of one operation and
    /// fit in one call; the rest keep their order; every operation taken is counted.
    #[test]
    fn a_dedicated_thread_fills_one_call_with_batches_of_one_operation() {
        let (tx, rx) = flume::unbounded();
        let queue = queue(rx);
        let sizes = [
            (KxGroup::X25519, 4),
            (KxGroup::X25519, 3),
            (KxGroup::X25519, 2),
            (KxGroup::Secp256r1, 1),
            (KxGroup::X25519, 8),
            (KxGroup::Secp256r1, 5),
        ];
        for (group, n) in sizes {
            queue.queued.fetch_add(n, Ordering::Relaxed);
            tx.send(batch(group, n)).unwrap();
        }
        drop(tx);
        let merged = Counter::new("merged", "");
        let mut calls = Vec::new();
        serve_batches(&queue, &merged, |b| {
            calls.push((b[0].kind(), b.len()));
            assert!(
                b.iter().all(|j| j.kind() == b[0].kind()),
                "one operation per call"
            );
        });
        assert_eq!(
            calls,
            [
                (OpKind::X25519, 7),
                (OpKind::X25519, 2),
                (OpKind::P256, 1),
                (OpKind::X25519, 8),
                (OpKind::P256, 5),
            ]
        );
        assert_eq!(merged.get(), 1);
        assert_eq!(queue.queued.load(Ordering::Relaxed), 0);
        assert_eq!(queue.computed.get(), 23);
    }

    /// The stop message taken while batches are merged ends the thread after the batch in
    /// hand is computed; what was queued behind the message is left on the queue.
    #[test]
    fn a_stop_taken_while_merging_ends_the_thread_after_its_batch() {
        let (tx, rx) = flume::unbounded();
        let queue = queue(rx);
        for b in [
            batch(KxGroup::X25519, 3),
            Vec::new(),
            batch(KxGroup::X25519, 2),
        ] {
            queue.queued.fetch_add(b.len(), Ordering::Relaxed);
            tx.send(b).unwrap();
        }
        let merged = Counter::new("merged", "");
        let mut calls = Vec::new();
        serve_batches(&queue, &merged, |b| calls.push(b.len()));
        assert_eq!(calls, [3], "the batch in hand, then the stop");
        assert_eq!(tx.len(), 1, "the batch behind the stop is left queued");
    }

    /// Stopping the pool ends and joins every crypto thread, and what was queued before
    /// the stop is computed first (none is dropped unanswered).
    #[test]
    fn stop_computes_what_was_queued_and_joins_the_threads() {
        let pool = ThreadPool::start(2, 64).unwrap();
        let mut answers = Vec::new();
        for _ in 0..10 {
            let (job, answer) = Job::new(CryptoOp::KxGenerate {
                group: KxGroup::X25519,
            });
            pool.queued.fetch_add(1, Ordering::Relaxed);
            pool.tx.send(vec![job]).unwrap();
            answers.push(answer);
        }
        let (done_tx, done) = std::sync::mpsc::channel();
        let stopping = pool.clone();
        std::thread::spawn(move || {
            stopping.stop();
            let _ = done_tx.send(());
        });
        done.recv_timeout(Duration::from_secs(20))
            .expect("stop is still waiting for the crypto threads");
        assert!(pool.handles.lock().unwrap().is_empty());
        for mut answer in answers {
            assert!(
                matches!(answer.try_recv(), Ok(Ok(_))),
                "an operation queued before the stop was not computed"
            );
        }
        assert_eq!(pool.queued(), 0);
    }
}
