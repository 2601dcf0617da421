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

use std::cell::RefCell;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, Waker};

thread_local! {
    static IDLE: RefCell<Idle> = RefCell::default();
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
