//! The contract between the engine's queues and whatever computes the operations.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Instant;

use tokio::sync::oneshot;

use crate::cost::Crossovers;
use crate::engine::{Engine, FlushPolicy};
use crate::metrics::EngineMetrics;
use crate::multibuffer::MultibufferBackend;
use crate::op::{CryptoError, CryptoOp, CryptoOutput, OpKind};
use crate::scalar::{self, ScalarBackend};
use crate::threads::{ThreadPool, ThreadPoolBackend};

/// Which backend computes the operations (`crypto.backend` in the config).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum BackendKind {
    /// Each operation computed alone on the worker (aws-lc-rs).
    Scalar,
    /// Operations sent to a shared thread pool (the comparison for asynchronous offload).
    Threads,
    /// 8-lane crypto_mb batches where the CPU has AVX-512 IFMA.
    Multibuffer,
}

impl BackendKind {
    /// Every backend, in the order `terminus speed` lists them.
    pub const ALL: [BackendKind; 3] = [
        BackendKind::Scalar,
        BackendKind::Threads,
        BackendKind::Multibuffer,
    ];

    /// The configuration name.
    pub fn name(self) -> &'static str {
        match self {
            BackendKind::Scalar => "scalar",
            BackendKind::Threads => "threads",
            BackendKind::Multibuffer => "multibuffer",
        }
    }

    /// The backend the configuration `name` means.
    pub fn from_name(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|b| b.name() == name)
    }

    /// What `auto` means on this CPU: crypto_mb where it runs (AVX-512 IFMA), else scalar.
    pub fn auto() -> Self {
        if crate::multibuffer::applicable() {
            BackendKind::Multibuffer
        } else {
            BackendKind::Scalar
        }
    }

    /// One worker's backend of this kind (see [`EngineSpec`]): on `pool` where it
    /// computes as this kind (`threads`, or `multibuffer` on dedicated cores); else
    /// `Multibuffer` on the worker, deciding small batches by `crossovers` (only chosen
    /// where crypto_mb runs), and scalar on the worker for the others.
    fn backend(
        self,
        metrics: Arc<EngineMetrics>,
        crossovers: Arc<Crossovers>,
        pool: Option<&Arc<ThreadPool>>,
    ) -> Box<dyn Backend> {
        match (self, pool) {
            (kind, Some(pool)) if pool.kind() == kind => {
                Box::new(ThreadPoolBackend::new(pool.clone(), metrics))
            }
            (BackendKind::Multibuffer, _) => Box::new(
                MultibufferBackend::new(metrics)
                    .expect("multibuffer is only chosen where crypto_mb runs")
                    .with_crossovers(crossovers),
            ),
            _ => Box::new(ScalarBackend),
        }
    }
}

/// How a thread's engine is built: one per server worker, one per `terminus load
/// --batch-kx` thread, from the same description so the two cannot drift apart.
#[derive(Clone)]
pub struct EngineSpec {
    /// Which backend computes.
    pub backend: BackendKind,
    /// When queued requests are flushed to it.
    pub policy: FlushPolicy,
    /// The multibuffer backend's crossovers (measured at start-up by the server; the
    /// defaults elsewhere).
    pub crossovers: Arc<Crossovers>,
    /// The crypto threads of the `threads` backend, or of `multibuffer` when dedicated.
    pub pool: Option<Arc<ThreadPool>>,
}

impl EngineSpec {
    /// `backend` with the default flush policy and crossovers and no thread pool.
    pub fn new(backend: BackendKind) -> Self {
        Self {
            backend,
            policy: FlushPolicy::default(),
            crossovers: Arc::default(),
            pool: None,
        }
    }

    /// A new engine for the calling thread, counting into `metrics`.
    pub fn build(&self, metrics: Arc<EngineMetrics>) -> Engine {
        let backend =
            self.backend
                .backend(metrics.clone(), self.crossovers.clone(), self.pool.as_ref());
        Engine::new(backend, self.policy, metrics)
    }
}

/// A queued operation and the channel its result goes back through.
pub struct Job {
    op: CryptoOp,
    reply: Reply,
    pub(crate) queued_at: Instant,
}

impl Job {
    pub(crate) fn new(
        op: CryptoOp,
    ) -> (Self, oneshot::Receiver<Result<CryptoOutput, CryptoError>>) {
        let (tx, rx) = oneshot::channel();
        let job = Job {
            op,
            reply: Reply(tx),
            queued_at: Instant::now(),
        };
        (job, rx)
    }

    /// The kind of operation queued.
    pub(crate) fn kind(&self) -> OpKind {
        self.op.kind()
    }

    /// Whether nobody waits for the answer any more.
    pub(crate) fn abandoned(&self) -> bool {
        self.reply.0.is_closed()
    }

    /// The operation, and where its answer goes.
    pub fn into_parts(self) -> (CryptoOp, Reply) {
        (self.op, self.reply)
    }
}

/// Completes one job. Dropping it unanswered makes the waiting handshake fail.
pub struct Reply(oneshot::Sender<Result<CryptoOutput, CryptoError>>);

impl Reply {
    /// Answers the handshake waiting for this job.
    pub fn complete(self, result: Result<CryptoOutput, CryptoError>) {
        // The handshake may have timed out and gone; its result is then of no use.
        let _ = self.0.send(result);
    }

    /// Answers with `op` computed on the scalar path, on this thread, for a backend that
    /// could not compute it its own way; counted in `metrics` by `cause`. Only if the
    /// scalar path fails too does the handshake get an error.
    pub(crate) fn fall_back(self, op: CryptoOp, cause: FallbackCause, metrics: &EngineMetrics) {
        metrics.fell_back(op.kind(), cause);
        self.complete(scalar::compute(op));
    }
}

/// Why a backend computed a request on the scalar path instead of its own way (on the
/// worker, or for a batch's lane on the dedicated crypto thread that ran the batch): the handshake does not pay for a fault of the batched code, the CPU or the
/// offload.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FallbackCause {
    /// The batched call reported an error for the request's lane.
    LaneError,
    /// The lane's result failed its check (an RSA signature that does not verify).
    CheckFailed,
    /// The batch refused the request's inputs, which the scalar path takes.
    BadInput,
    /// The offload queue stayed full past the bounded wait (the `threads` backend).
    QueueFull,
    /// The offload threads are gone.
    BackendGone,
}

impl FallbackCause {
    /// Every cause, in label order.
    pub const ALL: [FallbackCause; 5] = [
        FallbackCause::LaneError,
        FallbackCause::CheckFailed,
        FallbackCause::BadInput,
        FallbackCause::QueueFull,
        FallbackCause::BackendGone,
    ];

    /// The metrics label.
    pub fn name(self) -> &'static str {
        match self {
            FallbackCause::LaneError => "lane_error",
            FallbackCause::CheckFailed => "check_failed",
            FallbackCause::BadInput => "bad_input",
            FallbackCause::QueueFull => "queue_full",
            FallbackCause::BackendGone => "backend_gone",
        }
    }
}

/// Computes flushed batches. One instance per worker; `!Send` is fine.
pub trait Backend {
    /// Which backend this is (for metrics and logs).
    fn kind(&self) -> BackendKind;

    /// How many requests of `op` this backend computes in one go; 1 means no batching,
    /// so a queue is flushed as soon as it holds a request.
    fn max_batch(&self, op: crate::OpKind) -> usize;

    /// `None` when the backend takes a batch now; else a wait that ends when it has room,
    /// or when it has been full so long that the worker had better compute the next batch
    /// itself. The engine chooses which requests go only then: requests wait for a full
    /// offload queue in the engine's fair queue, where tenants' weights order them, not
    /// in the backend's FIFO.
    fn ready(&self) -> Option<Pin<Box<dyn Future<Output = ()> + '_>>> {
        None
    }

    /// Computes `batch`, or hands it over, at once: its requests are all of one
    /// [`crate::OpKind`] (the engine flushes one queue at a time), and it comes right
    /// after [`Backend::ready`]. Results arrive through each job's [`Reply`], now or later.
    fn dispatch(&self, batch: Vec<Job>);
}
