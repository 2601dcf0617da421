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
//! Three rules keep a few clients from holding it all:
//! - Windows hold at most [`WINDOWS_LIMIT`]; the rest is for the proxy's copies.
//! - A connection's window holds at most [`FAIR_FLOOR`], or half of what it holds and
//!   what is free together: each newcomer finds room while others hold theirs.
//! - A window once opened cannot be taken back (HTTP/2 has no such frame), so a
//!   connection whose uploads ended may go on holding what its window still allows.
//!   Such a connection waits on [`on_pressure`]; when another one is kept waiting for
//!   room ([`pressed`]), it is asked to go (GOAWAY: it takes no new stream, so what
//!   its window allows beyond its open streams' own windows is given back at once,
//!   and its client opens a new connection when it has more to send).
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

/// What HTTP/2 windows may hold of it, all connections together: the rest is kept for
/// the proxy's copies, so that windows held open cannot make every retry impossible.
pub const WINDOWS_LIMIT: usize = 12 << 20;

/// What a connection's window may hold of [`WINDOWS_LIMIT`] whatever others hold; past
/// it, at most half of what it holds and what is free together.
pub const FAIR_FLOOR: usize = 1 << 20;

/// Waiters are woken once this much is free again: enough for a window update worth
/// sending.
const WAKE_AT: usize = 16 << 10;

struct Budget {
    held: usize,
    /// Connections waiting for room, woken together when some is given back.
    waiting: Vec<Waker>,
    /// How many connections wait for room until they have what they want (woken,
    /// they are out of `waiting` but still short).
    short: usize,
    /// Connections holding room they have no use for now, woken when someone waits
    /// (each removes itself when it stops holding or ends).
    idle_holders: Vec<Waker>,
}

thread_local! {
    static BUDGET: RefCell<Budget> = const {
        RefCell::new(Budget {
            held: 0,
            waiting: Vec::new(),
            short: 0,
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

/// Takes for an HTTP/2 window as much of `n` bytes as is free and fair for a
/// connection already holding `holds` (see the module): what windows hold stays within
/// [`WINDOWS_LIMIT`], and a connection holds at most [`FAIR_FLOOR`] or half of what it
/// holds and what is free together, whichever is more. When that is less than `n`,
/// `waker` is woken once some is given back, and the connections holding room for
/// nothing are asked for it.
pub fn take_up_to(n: usize, holds: usize, waker: &Waker) -> usize {
    let (got, idle_holders) = BUDGET.with_borrow_mut(|b| {
        let free = WINDOWS_LIMIT.saturating_sub(b.held);
        let fair = FAIR_FLOOR.max((holds + free) / 2).saturating_sub(holds);
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

/// `waker` no longer holds room it has no use for (its connection needs it again, or
/// ended).
pub fn stop_holding(waker: &Waker) {
    let _ = BUDGET.try_with(|b| {
        (b.borrow_mut().idle_holders).retain(|w| !w.will_wake(waker));
    });
}

/// A connection starts (`true`) or stops (`false`) waiting for room, until it has what
/// it wants: what [`pressed`] counts.
pub fn waits(start: bool) {
    let _ = BUDGET.try_with(|b| {
        let mut b = b.borrow_mut();
        b.short = if start {
            b.short + 1
        } else {
            b.short.saturating_sub(1)
        };
    });
}

/// Whether a connection is kept waiting for room: a connection holding room it has no
/// use for should give it back.
pub fn pressed() -> bool {
    BUDGET.with_borrow(|b| b.short > 0)
}

/// `waker` (a connection holding room it has no use for now) is woken when a taker
/// has to wait for room: once, after which it is off the list until it calls again
/// (on the list once however often it calls).
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
        assert!(try_take(WINDOWS_LIMIT - 1000));
        assert_eq!(
            take_up_to(5000, 0, &waker),
            1000,
            "what is free for windows"
        );
        assert!(try_take(WORKER_LIMIT - WINDOWS_LIMIT));
        assert!(!try_take(1), "all or nothing");
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
        assert_eq!(first, WINDOWS_LIMIT / 2, "half of what was free");
        let again = take_up_to(WORKER_LIMIT, first, &waiter);
        assert_eq!(again, 0, "taking again does not get more than half");
        assert_eq!(
            holder.0.load(Ordering::SeqCst),
            1,
            "woken when a taker fell short"
        );
        waits(true);
        assert!(pressed());
        let second = take_up_to(WORKER_LIMIT, 0, &waiter);
        assert_eq!(second, WINDOWS_LIMIT / 4, "half of what was left");
        let newcomer = take_up_to(FAIR_FLOOR, 0, &waiter);
        assert_eq!(
            newcomer, FAIR_FLOOR,
            "a newcomer's first MiB while a quarter is free"
        );
        assert!(
            try_take(WORKER_LIMIT - WINDOWS_LIMIT),
            "the proxy's copies have room windows cannot take"
        );
        give(WORKER_LIMIT - WINDOWS_LIMIT);
        give(first + second + newcomer);
        assert!(
            BUDGET.with_borrow(|b| b.waiting.is_empty()),
            "waiters woken"
        );
        waits(false);
        assert!(
            !pressed(),
            "no one is short once the waiter has what it wants"
        );
        assert_eq!(held(), 0);
        // A holder woken once is woken by the next short taker only if it asked again,
        // and is listed once however often it asks.
        let woken = holder.0.load(Ordering::SeqCst);
        on_pressure(&Waker::from(holder.clone()));
        on_pressure(&Waker::from(holder.clone()));
        assert_eq!(take_up_to(WORKER_LIMIT, 0, &waiter), WINDOWS_LIMIT / 2);
        assert_eq!(holder.0.load(Ordering::SeqCst), woken + 1);
        assert_eq!(take_up_to(WORKER_LIMIT, WINDOWS_LIMIT / 2, &waiter), 0);
        assert_eq!(
            holder.0.load(Ordering::SeqCst),
            woken + 1,
            "not asked again"
        );
        give(WINDOWS_LIMIT / 2);
        stop_waiting(&waiter);
        // A holder that ended is forgotten.
        let gone = Arc::new(Count(AtomicUsize::new(0)));
        on_pressure(&Waker::from(gone.clone()));
        stop_holding(&Waker::from(gone.clone()));
        assert!(BUDGET.with_borrow(|b| b.idle_holders.is_empty()));
    }
}
