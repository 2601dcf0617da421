//! The worker's idle signal: the moment its event loop has nothing left to run.
//!
//! A partial batch is worth holding only while another request could still join it. When
//! the worker is about to sleep, none can before the next network event, so holding the
//! batch only adds latency (a handshake waiting a round trip for its client's next flight
//! is in flight, so "everyone is parked" does not say this). tokio's current-thread
//! runtime calls its `on_thread_park` hook exactly then, and looks for work again after
//! it: the hook, [`worker_idle`], wakes every flush waiting on this thread's idleness.
//!
//! The signal is per thread because the hook is a plain `Fn` shared by the runtime, while
//! each worker's engine lives on its own thread.
//!
//! The same hook and its `on_thread_unpark` twin, [`worker_awake`], add up how long the
//! thread slept ([`parked_time`]): a worker that never sleeps has no capacity to spare,
//! however little CPU it got (on a shared machine a saturated worker may be on the CPU
//! well under all of the time, and its CPU share would call it idle).

use std::cell::{Cell, RefCell};
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

thread_local! {
    static IDLE: RefCell<Idle> = RefCell::default();
    /// When this thread last parked (None while awake), and how long it slept in all.
    static PARKED: Cell<(Option<Instant>, Duration)> = const { Cell::new((None, Duration::ZERO)) };
}

#[derive(Default)]
struct Idle {
    /// How many times this thread went idle with someone waiting for it.
    epoch: u64,
    waiting: Vec<Waker>,
}

/// Reports that this thread's event loop is about to sleep. Install it as the worker
/// runtime's hook: `Builder::on_thread_park(terminus_engine::worker_idle)`. Costs a
/// thread-local check when nothing waits.
pub fn worker_idle() {
    PARKED.with(|p| p.set((Some(Instant::now()), p.get().1)));
    let waiting = IDLE.with(|idle| {
        let mut idle = idle.borrow_mut();
        if idle.waiting.is_empty() {
            return Vec::new();
        }
        idle.epoch += 1;
        std::mem::take(&mut idle.waiting)
    });
    for waker in waiting {
        waker.wake();
    }
}

/// Reports that this thread's event loop woke up: install it beside [`worker_idle`] as
/// `Builder::on_thread_unpark(terminus_engine::worker_awake)`.
pub fn worker_awake() {
    PARKED.with(|p| {
        if let (Some(since), total) = p.get() {
            p.set((None, total + since.elapsed()));
        }
    });
}

/// How long this thread's event loop has slept so far (parked with nothing to run).
pub fn parked_time() -> Duration {
    PARKED.with(|p| match p.get() {
        (Some(since), total) => total + since.elapsed(),
        (None, total) => total,
    })
}

/// Resolves the next time this thread goes idle after its first poll.
pub(crate) fn next_idle() -> NextIdle {
    NextIdle { since: None }
}

pub(crate) struct NextIdle {
    since: Option<u64>,
}

impl Future for NextIdle {
    type Output = ();

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        IDLE.with(|idle| {
            let mut idle = idle.borrow_mut();
            match self.since {
                Some(since) if since != idle.epoch => Poll::Ready(()),
                _ => {
                    self.since = Some(idle.epoch);
                    if !idle.waiting.iter().any(|w| w.will_wake(cx.waker())) {
                        idle.waiting.push(cx.waker().clone());
                    }
                    Poll::Pending
                }
            }
        })
    }
}
