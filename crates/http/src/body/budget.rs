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
//!   Such a connection waits on [`on_pressure`]; when the budget itself keeps another
//!   short of room ([`give_way`]), it is asked to go (GOAWAY: it takes no new stream, so
//!   it gives all of it back, and its client opens a new connection when it has more
//!   to send).
//!
//! A taker never takes less than a window update's worth only to give it back: every
//! give wakes the waiters, so that would wake them, the taker too, for ever. The
//! waiters' and holders' lists hold each connection once a round ([`Ticket`]).
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
    /// Connections waiting for room, woken together when some is given back; each
    /// listed once a round (a round ends when the list is woken).
    waiting: Vec<Waker>,
    waiting_round: u64,
    /// How many connections the budget itself keeps short until they have what they
    /// want (woken, they are out of `waiting` but still short).
    short: usize,
    /// What the most short of them lacks, less what connections asked to go have
    /// given back since: while above 0, a holder of room it has no use for goes
    /// ([`give_way`]), and no more of them than that.
    shortfall: usize,
    /// Connections holding room they have no use for now, woken when someone is kept
    /// short of room; listed once a round, as `waiting`.
    idle_holders: Vec<Waker>,
    holders_round: u64,
}

thread_local! {
    static BUDGET: RefCell<Budget> = const {
        RefCell::new(Budget {
            held: 0,
            waiting: Vec::new(),
            waiting_round: 0,
            short: 0,
            shortfall: 0,
            idle_holders: Vec::new(),
            holders_round: 0,
        })
    };
}

/// Where a connection is on one of the budget's lists: the round it was listed in
/// (it is on the list while that round lasts). Listing it again in the same round
/// adds nothing, so a connection polled many times while it waits costs no scan and
/// no growth.
#[derive(Debug, Default)]
pub struct Ticket(Option<u64>);

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

/// What [`take_up_to`] took.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Taken {
    /// The bytes taken: 0, or between the minimum asked for and all of them.
    pub got: usize,
    /// The budget itself (not the connection's fair share) could not give the rest:
    /// what is free is less than what is missing. The connections holding room for
    /// nothing have been asked for it.
    pub short: bool,
}

/// Takes for an HTTP/2 window as much of `n` bytes as is free and fair for a
/// connection already holding `holds`, and nothing if that is less than `min` (a
/// taker never takes what it would give straight back: each give wakes the waiters):
/// what windows hold stays within [`WINDOWS_LIMIT`], and a connection holds at most
/// [`FAIR_FLOOR`] or half of what it holds and what is free together, whichever is more.
pub fn take_up_to(n: usize, min: usize, holds: usize) -> Taken {
    let (taken, idle_holders) = BUDGET.with_borrow_mut(|b| {
        let free = WINDOWS_LIMIT.saturating_sub(b.held);
        let fair = FAIR_FLOOR.max((holds + free) / 2).saturating_sub(holds);
        let mut got = n.min(free).min(fair);
        if got < min {
            got = 0;
        }
        b.held += got;
        STATS.held.fetch_add(got as u64, Ordering::Relaxed);
        // The budget, not the share, holds it back: what is free is less than what
        // its share would let it take.
        let short = got < n && free < n.min(fair);
        if short {
            // What its share would let it take and it did not get: no more holders go
            // than that brings back.
            b.shortfall = b.shortfall.max(n.min(fair) - got);
        }
        let holders = if short {
            b.holders_round += 1;
            std::mem::take(&mut b.idle_holders)
        } else {
            Vec::new()
        };
        (Taken { got, short }, holders)
    });
    for w in idle_holders {
        w.wake();
    }
    taken
}

/// `waker` is woken once room is given back (listed once a round, by `ticket`).
pub fn wait(waker: &Waker, ticket: &mut Ticket) {
    BUDGET.with_borrow_mut(|b| {
        if ticket.0 != Some(b.waiting_round) {
            b.waiting.push(waker.clone());
            ticket.0 = Some(b.waiting_round);
        }
    });
}

/// Gives back `n` bytes taken before; the waiters are woken once a window update's
/// worth is free for windows.
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
            if WINDOWS_LIMIT.saturating_sub(b.held) < WAKE_AT || b.waiting.is_empty() {
                return;
            }
            b.waiting_round += 1;
            std::mem::take(&mut b.waiting)
        };
        for w in waiting {
            w.wake();
        }
    });
}

/// `waker` no longer waits for room (its connection wants no more, or ended).
pub fn stop_waiting(waker: &Waker, ticket: &mut Ticket) {
    let Some(round) = ticket.0.take() else {
        return;
    };
    let _ = BUDGET.try_with(|b| {
        let mut b = b.borrow_mut();
        if b.waiting_round == round {
            b.waiting.retain(|w| !w.will_wake(waker));
        }
    });
}

/// A connection starts (`true`) or stops (`false`) being kept short of room by the
/// budget ([`Taken::short`]), until it has what it wants: what [`give_way`] asks.
pub fn waits(start: bool) {
    let _ = BUDGET.try_with(|b| {
        let mut b = b.borrow_mut();
        b.short = if start {
            b.short + 1
        } else {
            b.short.saturating_sub(1)
        };
        if b.short == 0 {
            b.shortfall = 0;
        }
    });
}

/// A connection holding `holds` bytes of room it has no use for asks whether to go:
/// yes while a connection is kept short and what it lacks is not yet on its way back
/// (counted given as this one goes, for the metrics too); so one short taker sends
/// away as many holders as cover its shortfall, not every one.
pub fn give_way(holds: usize) -> bool {
    let go = BUDGET.with_borrow_mut(|b| {
        if b.short == 0 || b.shortfall == 0 {
            return false;
        }
        b.shortfall = b.shortfall.saturating_sub(holds);
        true
    });
    if go {
        STATS.gave_way.fetch_add(1, Ordering::Relaxed);
    }
    go
}

/// `waker` (a connection holding room it has no use for now) is woken when a taker
/// is kept short: once, after which it is off the list until it asks again (listed
/// once a round, by `ticket`).
pub fn on_pressure(waker: &Waker, ticket: &mut Ticket) {
    BUDGET.with_borrow_mut(|b| {
        if ticket.0 != Some(b.holders_round) {
            b.idle_holders.push(waker.clone());
            ticket.0 = Some(b.holders_round);
        }
    });
}

/// `waker` no longer holds room it has no use for (its connection needs it again, or
/// ended).
pub fn stop_holding(waker: &Waker, ticket: &mut Ticket) {
    let Some(round) = ticket.0.take() else {
        return;
    };
    let _ = BUDGET.try_with(|b| {
        let mut b = b.borrow_mut();
        if b.holders_round == round {
            b.idle_holders.retain(|w| !w.will_wake(waker));
        }
    });
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

    fn counter() -> (Arc<Count>, Waker) {
        let count = Arc::new(Count(AtomicUsize::new(0)));
        let waker = Waker::from(count.clone());
        (count, waker)
    }

    #[test]
    fn the_budget_is_never_exceeded_and_waiters_are_woken_when_room_comes_back() {
        let (count, waker) = counter();
        let mut ticket = Ticket::default();
        assert!(try_take(WINDOWS_LIMIT - 1000));
        let taken = take_up_to(5000, 0, 0);
        assert_eq!(taken.got, 1000, "what is free for windows");
        assert!(taken.short, "the budget, not the fair share, kept it short");
        wait(&waker, &mut ticket);
        wait(&waker, &mut ticket);
        assert_eq!(BUDGET.with_borrow(|b| b.waiting.len()), 1, "listed once");
        assert!(try_take(WORKER_LIMIT - WINDOWS_LIMIT));
        assert!(!try_take(1), "all or nothing");
        assert_eq!(held(), WORKER_LIMIT);
        give(WORKER_LIMIT - WINDOWS_LIMIT);
        assert_eq!(
            count.0.load(Ordering::SeqCst),
            0,
            "room the proxy's copies gave back is no room for windows"
        );
        give(100);
        assert_eq!(count.0.load(Ordering::SeqCst), 0, "too little to wake for");
        give(WAKE_AT);
        assert_eq!(count.0.load(Ordering::SeqCst), 1);
        give(WORKER_LIMIT);
        assert_eq!(held(), 0);
        give(WAKE_AT);
        assert_eq!(
            count.0.load(Ordering::SeqCst),
            1,
            "woken once, off the list"
        );
    }

    /// Less than the minimum asked for is not taken at all: taking it to give it back
    /// would wake every waiter, the taker among them, for ever (the worker spun at a
    /// whole core with a few KiB free).
    #[test]
    fn a_take_below_its_minimum_takes_nothing_and_wakes_no_one() {
        let (count, waker) = counter();
        let mut ticket = Ticket::default();
        assert!(try_take(WINDOWS_LIMIT - 5000));
        wait(&waker, &mut ticket);
        let taken = take_up_to(64 << 10, 16 << 10, 0);
        assert_eq!(taken.got, 0);
        assert!(taken.short);
        assert_eq!(held(), WINDOWS_LIMIT - 5000);
        assert_eq!(
            count.0.load(Ordering::SeqCst),
            0,
            "nothing given back, no one woken"
        );
        give(WINDOWS_LIMIT - 5000);
        stop_waiting(&waker, &mut ticket);
    }

    /// Beyond its first MiB a taker gets half of what is free, so a newcomer finds
    /// room; one its share holds back wakes no one; one the budget keeps short (less is
    /// free than its share) wakes the connections holding room for nothing, once, and
    /// as many of them go as cover what it lacks.
    #[test]
    fn a_large_taker_leaves_half_and_a_short_one_sends_away_enough_idle_holders() {
        let (holder, holder_waker) = counter();
        let mut holding = Ticket::default();
        on_pressure(&holder_waker, &mut holding);
        on_pressure(&holder_waker, &mut holding);
        assert_eq!(
            BUDGET.with_borrow(|b| b.idle_holders.len()),
            1,
            "listed once"
        );
        let first = take_up_to(WINDOWS_LIMIT, 0, 0);
        assert_eq!(first.got, WINDOWS_LIMIT / 2, "half of what was free");
        assert!(!first.short, "held back by its share, not by the budget");
        let again = take_up_to(WINDOWS_LIMIT, 0, first.got);
        assert_eq!(again.got, 0, "taking again does not get more than half");
        assert!(!again.short, "its share, not the budget, holds it back");
        let second = take_up_to(WORKER_LIMIT, 0, 0);
        assert_eq!(second.got, WINDOWS_LIMIT / 4, "half of what was left");
        assert!(!second.short, "still its share");
        assert_eq!(holder.0.load(Ordering::SeqCst), 0, "no one asked to go");
        // What is left is less than a newcomer's first MiB.
        assert!(try_take(WINDOWS_LIMIT / 4 - FAIR_FLOOR / 2));
        let third = take_up_to(FAIR_FLOOR, 0, 0);
        assert_eq!(third.got, FAIR_FLOOR / 2);
        assert!(third.short, "less is free than its share");
        assert_eq!(holder.0.load(Ordering::SeqCst), 1, "asked, once");
        let fourth = take_up_to(FAIR_FLOOR, 0, 0);
        assert!(fourth.short);
        assert_eq!(
            holder.0.load(Ordering::SeqCst),
            1,
            "not asked again: off the list"
        );
        // Short, it sends away holders until what it lacks is on its way back.
        waits(true);
        assert!(give_way(FAIR_FLOOR / 4), "a quarter of what it lacks");
        assert!(give_way(FAIR_FLOOR), "the rest");
        assert!(!give_way(FAIR_FLOOR), "no more holders than cover it");
        waits(false);
        // Asking again puts a holder back; one that ended is forgotten.
        on_pressure(&holder_waker, &mut holding);
        stop_holding(&holder_waker, &mut holding);
        assert!(BUDGET.with_borrow(|b| b.idle_holders.is_empty()));
        give(WINDOWS_LIMIT);
        assert_eq!(held(), 0);
    }
}
