//! What a worker holds of request bodies, all its connections together: one budget per
//! worker (a worker is one thread, so the budget is the thread's and takes no lock).
//!
//! Two things hold request bytes a client sent ahead of the server using them: an
//! HTTP/2 connection's receive window (what its client may send before the handler
//! takes it: [`crate::h2::server`] opens the window beyond the protocol's first 64 KiB
//! only with bytes taken from here, and waits for the budget to open it again), and the
//! proxy's copy of a body it may have to send again (held only while the budget allows;
//! past it the body is not held, and not sent again). So however many connections and
//! streams clients open, a worker holds at most [`WORKER_LIMIT`] of request bodies beyond
//! each HTTP/2 connection's first 64 KiB.
//!
//! Two rules keep one client from holding it all:
//! - Beyond its first [`FAIR_FLOOR`], a taker gets at most half of what is free at a
//!   time: what is left goes on being shared as more connections want some.
//! - A window once opened cannot be taken back (HTTP/2 has no such frame), so a
//!   connection whose uploads ended may go on holding what its window still allows.
//!   Such a connection waits on [`on_pressure`]; when another one is kept waiting for
//!   room ([`pressed`]), it is asked to go (GOAWAY: nothing of its is in flight, and
//!   its client opens a new connection when it has more to send) and gives it back.
//!
//! What all workers hold and how many connections were asked to go are in the metrics
//! ([`Stats`]).

use std::cell::RefCell;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::Waker;

use terminus_metrics::{Exposition, Kind, Labels, Render};

/// The request-body bytes a worker holds at most (beyond each HTTP/2 connection's
/// first 64 KiB window, which the protocol grants before any setting can refuse it):
/// sixteen connections' worth of uploads at a full 1 MiB window each.
pub const WORKER_LIMIT: usize = 16 << 20;

/// What a taker may hold before it gets only half of what is free at a time.
pub const FAIR_FLOOR: usize = 1 << 20;

/// Waiters are woken once this much is free again: enough for a window update worth
/// sending.
const WAKE_AT: usize = 16 << 10;

struct Budget {
    held: usize,
    /// Connections waiting for room, woken together when some is given back.
    waiting: Vec<Waker>,
    /// Connections holding room they have no use for now, woken when someone waits.
    idle_holders: Vec<Waker>,
}

thread_local! {
    static BUDGET: RefCell<Budget> = const {
        RefCell::new(Budget {
            held: 0,
            waiting: Vec::new(),
            idle_holders: Vec::new(),
        })
    };
}

/// Takes `n` bytes of the worker's budget if all of them are free (nothing otherwise).
pub fn try_take(n: usize) -> bool {
    BUDGET.with_borrow_mut(|b| {
        let fits = b.held + n <= WORKER_LIMIT;
        if fits {
            b.held += n;
            STATS.held.fetch_add(n as u64, Ordering::Relaxed);
        }
        fits
    })
}

/// Takes as much of `n` bytes as is free and fair for a taker already holding `holds`
/// (see the module); when that is less than `n`, `waker` is woken once some is given
/// back, and the connections holding room for nothing are asked for it.
pub fn take_up_to(n: usize, holds: usize, waker: &Waker) -> usize {
    let (got, idle_holders) = BUDGET.with_borrow_mut(|b| {
        let free = WORKER_LIMIT - b.held;
        let fair = FAIR_FLOOR.saturating_sub(holds).max(free / 2);
        let got = n.min(free).min(fair);
        b.held += got;
        STATS.held.fetch_add(got as u64, Ordering::Relaxed);
        if got == n {
            return (got, Vec::new());
        }
        if !b.waiting.iter().any(|w| w.will_wake(waker)) {
            b.waiting.push(waker.clone());
        }
        (got, std::mem::take(&mut b.idle_holders))
    });
    for w in idle_holders {
        w.wake();
    }
    got
}

/// Gives back `n` bytes taken before.
pub fn give(n: usize) {
    if n == 0 {
        return;
    }
    // A worker ending drops its connections after its thread's budget: nothing to wake.
    let _ = BUDGET.try_with(|b| {
        let waiting = {
            let mut b = b.borrow_mut();
            let n = n.min(b.held);
            b.held -= n;
            STATS.held.fetch_sub(n as u64, Ordering::Relaxed);
            if WORKER_LIMIT - b.held < WAKE_AT {
                return;
            }
            std::mem::take(&mut b.waiting)
        };
        for w in waiting {
            w.wake();
        }
    });
}

/// `waker` no longer waits for room (its connection wants no more, or ended).
pub fn stop_waiting(waker: &Waker) {
    let _ = BUDGET.try_with(|b| b.borrow_mut().waiting.retain(|w| !w.will_wake(waker)));
}

/// Whether a taker is waiting for room: a connection holding room it has no use for
/// should give it back.
pub fn pressed() -> bool {
    BUDGET.with_borrow(|b| !b.waiting.is_empty())
}

/// `waker` (a connection holding room it has no use for now) is woken when a taker
/// has to wait for room.
pub fn on_pressure(waker: &Waker) {
    BUDGET.with_borrow_mut(|b| {
        if !b.idle_holders.iter().any(|w| w.will_wake(waker)) {
            b.idle_holders.push(waker.clone());
        }
    });
}

/// A connection was asked to go to give its room back (counted for the metrics).
pub fn gave_way() {
    STATS.gave_way.fetch_add(1, Ordering::Relaxed);
}

/// What the worker holds now.
pub fn held() -> usize {
    BUDGET.with_borrow(|b| b.held)
}

/// The budget's numbers, all workers together.
pub static STATS: Stats = Stats {
    held: AtomicU64::new(0),
    gave_way: AtomicU64::new(0),
};

/// See [`STATS`].
pub struct Stats {
    held: AtomicU64,
    gave_way: AtomicU64,
}

impl Render for Stats {
    fn render(&self, out: &mut Exposition) {
        out.header(
            "terminus_request_body_budget_bytes",
            Kind::Gauge,
            "Request-body bytes the workers hold room for (HTTP/2 windows beyond their first 64 KiB, copies kept for a retry), all workers together; each worker holds at most 16 MiB.",
        );
        out.sample(
            "terminus_request_body_budget_bytes",
            &Labels::NONE,
            self.held.load(Ordering::Relaxed),
        );
        out.header(
            "terminus_request_body_budget_gave_way_total",
            Kind::Counter,
            "HTTP/2 connections with no upload under way asked to go (GOAWAY) to give back the window they held, because another was waiting for room.",
        );
        out.sample(
            "terminus_request_body_budget_gave_way_total",
            &Labels::NONE,
            self.gave_way.load(Ordering::Relaxed),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;
    use std::task::Wake;

    struct Count(AtomicUsize);
    impl Wake for Count {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    #[test]
    fn the_budget_is_never_exceeded_and_waiters_are_woken_when_room_comes_back() {
        let count = Arc::new(Count(AtomicUsize::new(0)));
        let waker = Waker::from(count.clone());
        assert!(try_take(WORKER_LIMIT - 1000));
        assert!(!try_take(1001), "all or nothing");
        assert_eq!(take_up_to(5000, 0, &waker), 1000, "what is free");
        assert_eq!(held(), WORKER_LIMIT);
        give(100);
        assert_eq!(count.0.load(Ordering::SeqCst), 0, "too little to wake for");
        give(WAKE_AT);
        assert_eq!(count.0.load(Ordering::SeqCst), 1);
        give(WORKER_LIMIT);
        assert_eq!(held(), 0);
    }

    /// Beyond its first MiB a taker gets half of what is free, so a newcomer finds
    /// room; one kept waiting wakes the connections holding room for nothing, once.
    #[test]
    fn a_large_taker_leaves_half_and_a_waiter_wakes_the_idle_holders() {
        let holder = Arc::new(Count(AtomicUsize::new(0)));
        let waiter = Waker::from(Arc::new(Count(AtomicUsize::new(0))));
        on_pressure(&Waker::from(holder.clone()));
        let first = take_up_to(WORKER_LIMIT, 0, &waiter);
        assert_eq!(first, WORKER_LIMIT / 2, "half of what was free");
        let second = take_up_to(WORKER_LIMIT, first, &waiter);
        assert_eq!(second, WORKER_LIMIT / 4, "half of what was left");
        assert_eq!(
            holder.0.load(Ordering::SeqCst),
            1,
            "woken when a taker fell short"
        );
        assert!(pressed());
        let newcomer = take_up_to(FAIR_FLOOR, 0, &waiter);
        assert_eq!(
            newcomer, FAIR_FLOOR,
            "a newcomer's first MiB while a quarter is free"
        );
        give(first + second + newcomer);
        assert!(!pressed(), "waiters woken and gone once room came back");
        assert_eq!(held(), 0);
    }
}
