//! One load thread: a current-thread runtime whose tasks are the connections.
//!
//! - **Open loop** (`--rate`): a scheduler puts each request on a queue at its scheduled
//!   time, whatever the server is doing; a free connection task takes it, and when none
//!   is free a new one starts (up to the connection cap, then requests wait in the queue
//!   with their clock running). Latency counts from the scheduled time, so a stalled
//!   server shows as latency instead of as fewer requests sent (no coordinated omission).
//! - **Closed loop** (`--connections`): each connection task sends its next request as
//!   soon as the previous answer is in, like wrk.
//! - **Idle** (`--connections` with `--idle`): each connection makes one request, all
//!   stay open and idle for the duration once every one is open, then each makes one
//!   more: what a server holds for idle connections, and what waking them costs.

use std::cell::{Cell, RefCell};
use std::collections::VecDeque;
use std::rc::Rc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use terminus_engine::{Engine, EngineMetrics, EngineSpec};
use tokio::sync::{watch, Notify};
use tokio::time::Instant;

use crate::conn::{Conn, Endpoint, OpenFailed};
use crate::failure::Failure;
use crate::stats::{Phase, Stats};

/// What one thread does.
pub struct ThreadPlan {
    pub endpoint: Endpoint,
    pub load: ThreadLoad,
    /// When the first request is due (the same for every thread).
    pub start: std::time::Instant,
    pub duration: Duration,
    pub timeout: Duration,
    pub new_connection: bool,
    pub stats: Arc<Mutex<Stats>>,
    /// `--batch-kx`: this thread's engine counts into these metrics, with their backend.
    pub kx_engine: Option<Arc<EngineMetrics>>,
}

pub enum ThreadLoad {
    /// The whole run offers `rate` requests/s; thread `index` of `threads` sends
    /// requests `index`, `index + threads`, ... of that schedule (threads interleave).
    /// At most `max_connections` open at once.
    Open {
        rate: f64,
        index: usize,
        threads: usize,
        max_connections: usize,
    },
    /// `connections` connection tasks, back to back; with `idle`, one request each,
    /// then idle, then one more.
    Closed {
        connections: usize,
        idle: Option<Idle>,
    },
}

/// `--idle`: connections opening at once, per thread: they arrive over time, as a
/// server's idle connections do, not as one burst of handshakes (whose memory a server
/// may keep for the next burst, and which is not what idle connections cost).
const IDLE_OPENING: usize = 64;

/// `--idle`: what the connection tasks of every thread share.
#[derive(Clone)]
pub struct Idle {
    /// Connections whose first request is done (answered or not).
    pub opened: Arc<AtomicUsize>,
    /// Of those, the ones still open (to idle).
    pub held: Arc<AtomicUsize>,
    /// When the idle time ends: set once every connection is open.
    pub until: watch::Receiver<Option<std::time::Instant>>,
}

/// Runs the plan to its end (the duration, then the requests in flight finish or time
/// out); returns when the last request finished.
pub fn run(plan: ThreadPlan) -> std::io::Result<std::time::Instant> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        // Partial key-exchange batches (--batch-kx) go when the loop would sleep.
        .on_thread_park(terminus_engine::worker_idle)
        .build()?;
    let local = tokio::task::LocalSet::new();
    local.block_on(&rt, async move {
        let start = Instant::from_std(plan.start);
        let end = start + plan.duration;
        let ctx = Rc::new(Worker {
            endpoint: plan.endpoint,
            timeout: plan.timeout,
            new_connection: plan.new_connection,
            stats: plan.stats,
            engine: plan.kx_engine.map(thread_engine),
        });
        match plan.load {
            ThreadLoad::Open {
                rate,
                index,
                threads,
                max_connections,
            } => {
                // Request k of the run is due k/rate seconds after the start; computed
                // from k, not summed, so no rounding drifts the schedule.
                let due = (index..)
                    .step_by(threads)
                    .map(move |k| start + Duration::from_secs_f64(k as f64 / rate))
                    .take_while(move |at| *at < end);
                open_loop(ctx, due, max_connections).await
            }
            ThreadLoad::Closed { connections, idle } => {
                tokio::time::sleep_until(start).await;
                let opening = Rc::new(tokio::sync::Semaphore::new(IDLE_OPENING));
                let tasks: Vec<_> = (0..connections)
                    .map(|_| {
                        let (ctx, idle, opening) = (ctx.clone(), idle.clone(), opening.clone());
                        tokio::task::spawn_local(async move {
                            let mut conn = None;
                            if let Some(idle) = idle {
                                return ctx.idle(&mut conn, idle, &opening).await;
                            }
                            while Instant::now() < end {
                                ctx.stats.lock().unwrap().issued += 1;
                                ctx.serve(&mut conn, None, Phase::Request).await;
                            }
                        })
                    })
                    .collect();
                for t in tasks {
                    let _ = t.await;
                }
            }
        }
    });
    Ok(std::time::Instant::now())
}

/// One engine per thread, as a server worker has, with the server's flush policy and the
/// multibuffer backend's default crossovers.
fn thread_engine(metrics: Arc<EngineMetrics>) -> Engine {
    EngineSpec::new(metrics.backend()).build(metrics)
}

/// Requests waiting for a connection task, and the tasks waiting for requests.
#[derive(Default)]
struct Queue {
    due: RefCell<VecDeque<Instant>>,
    wake: Notify,
    /// Tasks parked on `wake` that no notification has been sent to yet.
    idle: Cell<usize>,
    /// Connection tasks started so far.
    tasks: Cell<usize>,
    closed: Cell<bool>,
}

async fn open_loop(ctx: Rc<Worker>, due: impl Iterator<Item = Instant>, max_connections: usize) {
    let queue = Rc::new(Queue::default());
    let mut tasks = Vec::new();
    for at in due {
        if at > Instant::now() {
            tokio::time::sleep_until(at).await;
        }
        // Every request that is due by now goes out, even if the timer woke late.
        queue.due.borrow_mut().push_back(at);
        ctx.stats.lock().unwrap().issued += 1;
        if queue.idle.get() > 0 {
            queue.idle.set(queue.idle.get() - 1);
            queue.wake.notify_one();
        } else if queue.tasks.get() < max_connections {
            queue.tasks.set(queue.tasks.get() + 1);
            let (ctx, queue) = (ctx.clone(), queue.clone());
            tasks.push(tokio::task::spawn_local(async move {
                let mut conn = None;
                loop {
                    let next = queue.due.borrow_mut().pop_front();
                    match next {
                        Some(at) => ctx.serve(&mut conn, Some(at), Phase::Request).await,
                        None if queue.closed.get() => break,
                        None => {
                            queue.idle.set(queue.idle.get() + 1);
                            queue.wake.notified().await;
                        }
                    }
                }
            }));
        }
    }
    queue.closed.set(true);
    queue.wake.notify_waiters();
    for t in tasks {
        let _ = t.await;
    }
}

/// What a connection task needs.
struct Worker {
    endpoint: Endpoint,
    timeout: Duration,
    new_connection: bool,
    stats: Arc<Mutex<Stats>>,
    engine: Option<Engine>,
}

impl Worker {
    /// `--idle`: one request (once one of the `opening` permits is free), then the
    /// connection waits with the others until all are open and stays idle until
    /// `idle.until`, then one more request ([`Phase::AfterIdle`]).
    async fn idle(
        &self,
        conn: &mut Option<Conn>,
        mut idle: Idle,
        opening: &tokio::sync::Semaphore,
    ) {
        let permit = opening.acquire().await.expect("never closed");
        self.stats.lock().unwrap().issued += 1;
        self.serve(conn, None, Phase::Request).await;
        drop(permit);
        if conn.is_some() {
            idle.held.fetch_add(1, Ordering::Relaxed);
        }
        idle.opened.fetch_add(1, Ordering::Relaxed);
        let until = match idle.until.wait_for(Option::is_some).await {
            Ok(until) => until.expect("waited for it"),
            Err(_) => return,
        };
        if conn.is_none() {
            return;
        }
        tokio::time::sleep_until(Instant::from_std(until)).await;
        self.stats.lock().unwrap().issued += 1;
        self.serve(conn, None, Phase::AfterIdle).await;
    }

    /// One request: on `conn` if it is open, else on a new connection. `scheduled` is
    /// the open-loop send time the request latency counts from; an answer's latency is
    /// recorded as `phase`.
    async fn serve(&self, conn: &mut Option<Conn>, scheduled: Option<Instant>, phase: Phase) {
        let started = Instant::now();
        let deadline = started + self.timeout;
        let outcome = match self.attempt(conn, deadline).await {
            // A kept-alive connection the server had closed, or a request it did not
            // process (HTTP/2's GOAWAY): one retry on a new one, as browsers and wrk
            // do. The failure is real only if that one fails too.
            Err(Attempt {
                failure,
                reused: true,
            }) if failure.is_retryable() => {
                *conn = None;
                self.attempt(conn, deadline).await
            }
            other => other,
        };
        let mut stats = self.stats.lock().unwrap();
        match outcome {
            Ok((sent, response)) => {
                stats.record(phase, scheduled.unwrap_or(sent).elapsed());
                if response.status >= 400 {
                    stats.error(Failure::Status(response.status).kind());
                } else {
                    stats.ok += 1;
                }
                if !response.reusable || self.new_connection {
                    *conn = None;
                }
            }
            Err(Attempt { failure, .. }) => {
                stats.record(Phase::Failed, scheduled.unwrap_or(started).elapsed());
                stats.error(failure.kind());
                *conn = None;
            }
        }
    }

    /// Opens a connection if needed and sends the request; returns when it was sent and
    /// the response.
    async fn attempt(
        &self,
        conn: &mut Option<Conn>,
        deadline: Instant,
    ) -> Result<(Instant, crate::http1::Response), Attempt> {
        if conn.is_none() {
            match self.endpoint.open(deadline, self.engine.as_ref()).await {
                Ok(opened) => {
                    let mut stats = self.stats.lock().unwrap();
                    if let Some(connect) = opened.connect {
                        stats.record(Phase::Connect, connect);
                    }
                    stats.record(Phase::Handshake, opened.handshake);
                    stats.handshakes += 1;
                    stats.resumed += u64::from(opened.resumed);
                    *stats.negotiated.entry(opened.negotiated).or_default() += 1;
                    *conn = Some(opened.conn);
                }
                Err(OpenFailed { failure, connect }) => {
                    if let Some(c) = connect {
                        self.stats.lock().unwrap().record(Phase::Connect, c);
                    }
                    return Err(Attempt {
                        failure,
                        reused: false,
                    });
                }
            }
        }
        let c = conn.as_mut().expect("opened above");
        let reused = c.used > 0;
        if !self.endpoint.rtt.is_zero() {
            // The request answers the server's last flight or response.
            tokio::time::sleep(self.endpoint.rtt).await;
        }
        let sent = Instant::now();
        c.request(&self.endpoint, deadline)
            .await
            .map(|r| (sent, r))
            .map_err(|failure| Attempt { failure, reused })
    }
}

/// A failed attempt, and whether it was on a connection that had served before.
struct Attempt {
    failure: Failure,
    reused: bool,
}
