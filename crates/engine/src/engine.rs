//! The per-worker engine: queues per operation kind and the flush policy.
//!
//! A queue is flushed when it holds a full batch for the backend; when no request can join
//! it before the next network event: every handshake in flight on this worker is parked
//! waiting for crypto, or the worker's event loop is about to sleep (see [`crate::idle`]);
//! or when its oldest request has waited `max_batch_delay`. With a backend whose batch
//! size is 1 every request is flushed at once. Requests are taken from a queue only when
//! the backend would accept them (a full offload queue keeps them here), and when more
//! wait than a batch holds, [`crate::fair`] chooses which go first.

use std::cell::{Cell, RefCell};
use std::collections::VecDeque;
use std::rc::Rc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::backend::{Backend, BackendKind, Job};
use crate::busy::BusyTime;
use crate::context::{CryptoEvent, HandshakeContext};
use crate::fair::{self, Fair, Rank};
use crate::idle;
use crate::metrics::EngineMetrics;
use crate::op::{CryptoError, CryptoOp, CryptoOutput, OpKind};

/// When a partial batch is flushed.
#[derive(Debug, Clone, Copy)]
pub struct FlushPolicy {
    /// Upper bound on how long a request waits in a queue for company while the worker
    /// has other work.
    pub max_batch_delay: Duration,
}

impl Default for FlushPolicy {
    fn default() -> Self {
        Self {
            max_batch_delay: Duration::from_millis(2),
        }
    }
}

/// A worker's crypto engine. Cheap to clone; not `Send`: each worker owns one.
#[derive(Clone)]
pub struct Engine {
    inner: Rc<Inner>,
}

struct Inner {
    backend: Box<dyn Backend>,
    metrics: Arc<EngineMetrics>,
    policy: FlushPolicy,
    state: RefCell<State>,
    /// See [`Engine::before_dispatch`].
    before_dispatch: RefCell<Option<Rc<dyn Fn()>>>,
    /// See [`Engine::flush_task_time`].
    flush_tasks: BusyTime,
}

/// When a request's batch was dispatched and how large it was: written by the flush,
/// read by the submitter for its handshake's timeline. The job itself goes to the
/// backend (possibly another thread); this stays on the worker.
type Dispatched = Rc<Cell<Option<(Instant, usize)>>>;

#[derive(Default)]
struct State {
    queues: [VecDeque<(Job, Dispatched, Rank)>; OpKind::COUNT],
    fair: Fair,
    flush_armed: [bool; OpKind::COUNT],
    /// Handshakes running on this worker, and how many of them wait on the engine.
    in_flight: usize,
    parked: usize,
}

impl State {
    fn everyone_parked(&self) -> bool {
        self.parked >= self.in_flight
    }

    fn has_queued(&self) -> bool {
        self.queues.iter().any(|q| !q.is_empty())
    }
}

impl Engine {
    /// An engine flushing to `backend` under `policy`.
    pub fn new(
        backend: Box<dyn Backend>,
        policy: FlushPolicy,
        metrics: Arc<EngineMetrics>,
    ) -> Self {
        debug_assert_eq!(backend.kind(), metrics.backend());
        Self {
            inner: Rc::new(Inner {
                backend,
                metrics,
                policy,
                state: RefCell::new(State::default()),
                before_dispatch: RefCell::new(None),
                flush_tasks: BusyTime::default(),
            }),
        }
    }

    /// Which backend computes this engine's batches.
    pub fn backend_kind(&self) -> BackendKind {
        self.inner.backend.kind()
    }

    /// Runs `hook` before every batch goes to the backend. A worker's crypto is its
    /// longest stretch of CPU and comes back to back under load, while a task woken by
    /// the network waits behind every task already runnable: what must not wait that long
    /// (turning away connections a flood leaves in the listen queue) gets its turn here.
    pub fn before_dispatch(&self, hook: impl Fn() + 'static) {
        *self.inner.before_dispatch.borrow_mut() = Some(Rc::new(hook));
    }

    /// The worker's time in the engine's own flush tasks so far: batches computed when the
    /// worker ran out of other work or a deadline came (the batches a handshake's request
    /// fills are computed in that handshake's task, and count as its time).
    pub fn flush_task_time(&self) -> Duration {
        self.inner.flush_tasks.spent()
    }

    /// Registers a handshake in flight until the guard is dropped; the flush policy needs
    /// to know how many handshakes could still add requests.
    pub fn handshake_started(&self) -> HandshakeGuard {
        self.inner.state.borrow_mut().in_flight += 1;
        HandshakeGuard {
            engine: self.clone(),
        }
    }

    /// Queues `op`, a request of the handshake `ctx`, and waits for its result; the
    /// request's queue, dispatch and answer times go into `ctx`'s timeline.
    pub async fn submit(
        &self,
        op: CryptoOp,
        ctx: &HandshakeContext,
    ) -> Result<CryptoOutput, CryptoError> {
        let kind = op.kind();
        let key = match &op {
            CryptoOp::Sign { key, .. } | CryptoOp::SignDigest { key, .. } => Some(key.algorithm()),
            CryptoOp::RemoteSign { key, .. } => Some(key.algorithm()),
            _ => None,
        };
        if key.is_some() && !ctx.may_sign() {
            return Err(CryptoError::Refused);
        }
        self.inner.metrics.submitted(kind);
        terminus_probes::crypto_submit(ctx.id(), kind.name());
        let (job, answer) = Job::new(op);
        let started = job.queued_at;
        let dispatched = Dispatched::default();
        let parked = Parked::new(self, kind);
        if kind == OpKind::RemoteSign {
            // The signer batches: a request waiting here for company would only add
            // its wait to the round trip. The keyless client coalesces the writes of
            // requests made in the same turn of the event loop.
            dispatched.set(Some((started, 1)));
            let (op, reply) = job.into_parts();
            match op {
                CryptoOp::RemoteSign {
                    key,
                    scheme,
                    digest,
                } => {
                    let about = crate::RemoteHandshake {
                        server_name: ctx.host_shared(),
                        client: ctx.client(),
                    };
                    key.sign(scheme, digest, about, reply)
                }
                _ => unreachable!("the kind was RemoteSign"),
            }
        } else {
            self.queue(job, kind, key, &dispatched, ctx).await;
        }
        let result = answer
            .await
            .unwrap_or(Err(CryptoError::BackendGone(self.backend_kind().name())));
        drop(parked);
        let answered = Instant::now();
        self.inner
            .metrics
            .answered(kind, answered.duration_since(started), result.is_ok());
        ctx.crypto(CryptoEvent {
            kind,
            key,
            queued: started,
            dispatched: dispatched.get(),
            answered,
            ok: result.is_ok(),
        });
        result
    }

    /// Queues `job` and flushes as the policy says: at once when nothing else can join
    /// a batch or its queue holds a full one, else when the worker runs out of work or
    /// the oldest has waited long enough.
    async fn queue(
        &self,
        job: Job,
        kind: OpKind,
        key: Option<crate::KeyAlgorithm>,
        dispatched: &Dispatched,
        ctx: &HandshakeContext,
    ) {
        let (queue_full, everyone_parked) = {
            let mut st = self.inner.state.borrow_mut();
            let rank = st.fair.rank(ctx, kind, key);
            st.queues[kind.index()].push_back((job, dispatched.clone(), rank));
            (
                st.queues[kind.index()].len() >= self.inner.backend.max_batch(kind),
                st.everyone_parked(),
            )
        };
        if everyone_parked {
            // Nothing else can join any queue now: compute everything that waits.
            self.flush_all(Some(dispatched)).await;
        } else if queue_full {
            // Only this queue is ready; the others keep gathering.
            self.flush(kind, Some(dispatched)).await;
        } else {
            self.arm_flush(kind);
        }
    }

    /// Flushes every queue that holds requests, in full batches where possible (see
    /// [`Engine::flush`] for `own`).
    async fn flush_all(&self, own: Option<&Dispatched>) {
        for kind in OpKind::ALL {
            self.flush(kind, own).await;
        }
    }

    /// Flushes `kind`'s queue until it is empty, in full batches where possible. A
    /// submitter passes its `own` request: once that has gone, it leaves the waiting for
    /// a full backend to the other requests' submitters (or the armed flush), so that its
    /// handshake goes on as soon as its answer is in.
    async fn flush(&self, kind: OpKind, own: Option<&Dispatched>) {
        let max = self.inner.backend.max_batch(kind).max(1);
        loop {
            if self.inner.state.borrow().queues[kind.index()].is_empty() {
                return;
            }
            // Chosen only once the backend takes them: until then they wait here, in
            // fair order, and a request queued meanwhile may go first.
            if let Some(room) = self.inner.backend.ready() {
                if own.is_some_and(|own| own.get().is_some()) {
                    return;
                }
                room.await;
            }
            let hook = self.inner.before_dispatch.borrow().clone();
            if let Some(hook) = hook {
                if !self.inner.state.borrow().queues[kind.index()].is_empty() {
                    hook();
                }
            }
            let now = Instant::now();
            let batch: Vec<Job> = {
                let mut st = self.inner.state.borrow_mut();
                let st = &mut *st;
                let q = &mut st.queues[kind.index()];
                let n = q.len().min(max);
                let taken: Vec<_> = if q.len() > n {
                    let ranks: Vec<Rank> = q.iter().map(|(_, _, rank)| *rank).collect();
                    let chosen = fair::choose(&ranks, n);
                    // Back to front, so that each position is still where it was chosen.
                    let mut taken: Vec<_> =
                        chosen.iter().rev().filter_map(|&i| q.remove(i)).collect();
                    taken.reverse();
                    taken
                } else {
                    q.drain(..).collect()
                };
                if taken.is_empty() {
                    return;
                }
                taken
                    .into_iter()
                    .map(|(job, dispatched, rank)| {
                        st.fair.dispatched(rank);
                        dispatched.set(Some((now, n)));
                        job
                    })
                    // Nobody waits for these any more (their handshake timed out, or a
                    // keyless terminator gave up): computing them would only delay the
                    // others.
                    .filter(|job| !job.abandoned())
                    .collect()
            };
            if batch.is_empty() {
                continue;
            }
            let metrics = &self.inner.metrics;
            terminus_probes::batch(kind.name(), batch.len(), metrics.backend().name());
            metrics.batch(
                kind,
                batch.iter().map(|job| now.duration_since(job.queued_at)),
            );
            self.inner.backend.dispatch(batch);
            metrics.dispatched(kind, now.elapsed());
        }
    }

    /// Makes sure the requests of `kind` are flushed when the worker runs out of other
    /// work, or once the oldest has waited `max_batch_delay`, whichever comes first.
    fn arm_flush(&self, kind: OpKind) {
        {
            let mut st = self.inner.state.borrow_mut();
            if st.flush_armed[kind.index()] {
                return;
            }
            st.flush_armed[kind.index()] = true;
        }
        let engine = self.clone();
        tokio::task::spawn_local(async move {
            let flush = std::pin::pin!(engine.flush_armed(kind));
            engine.inner.flush_tasks.metered(flush).await;
        });
    }

    /// Flushes `kind`'s queue when the worker runs out of other work, or once its oldest
    /// request has waited `max_batch_delay`, until it stays empty.
    async fn flush_armed(&self, kind: OpKind) {
        loop {
            let oldest = self.inner.state.borrow().queues[kind.index()]
                .iter()
                .map(|(j, _, _)| j.queued_at)
                .min();
            let Some(oldest) = oldest else { break };
            // tokio's clock, which sleep_until keeps (and tests pause).
            let due = tokio::time::Instant::from_std(oldest + self.inner.policy.max_batch_delay);
            if tokio::time::Instant::now() < due {
                tokio::select! {
                    () = idle::next_idle() => {
                        // The hook ran before the runtime polled the network once more:
                        // handshakes woken by that poll run first and can still join.
                        tokio::task::yield_now().await;
                    }
                    () = tokio::time::sleep_until(due) => continue,
                }
            }
            self.flush(kind, None).await;
        }
        self.inner.state.borrow_mut().flush_armed[kind.index()] = false;
    }
}

/// Counts a handshake as parked on the engine while a submit waits.
struct Parked<'a> {
    engine: &'a Engine,
    kind: OpKind,
}

impl<'a> Parked<'a> {
    fn new(engine: &'a Engine, kind: OpKind) -> Self {
        engine.inner.state.borrow_mut().parked += 1;
        Self { engine, kind }
    }
}

impl Drop for Parked<'_> {
    fn drop(&mut self) {
        self.engine.inner.state.borrow_mut().parked -= 1;
        self.engine.inner.metrics.left(self.kind);
    }
}

/// Marks one handshake in flight; see [`Engine::handshake_started`].
pub struct HandshakeGuard {
    engine: Engine,
}

impl Drop for HandshakeGuard {
    fn drop(&mut self) {
        let flush = {
            let mut st = self.engine.inner.state.borrow_mut();
            st.in_flight -= 1;
            st.everyone_parked() && st.has_queued()
        };
        // The handshake that just ended was the last one not waiting on crypto: nothing
        // else will join the partial batches, so compute them now.
        if flush {
            let engine = self.engine.clone();
            tokio::task::spawn_local(async move {
                let flush = std::pin::pin!(engine.flush_all(None));
                engine.inner.flush_tasks.metered(flush).await
            });
        }
    }
}
