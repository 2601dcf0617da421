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

use std::cell::RefCell;
use std::task::Waker;

/// The request-body bytes a worker holds at most (beyond each HTTP/2 connection's
/// first 64 KiB window, which the protocol grants before any setting can refuse it):
/// sixteen connections' worth of uploads at a full 1 MiB window each.
pub const WORKER_LIMIT: usize = 16 << 20;

/// Waiters are woken once this much is free again: enough for a window update worth
/// sending.
const WAKE_AT: usize = 16 << 10;

struct Budget {
    held: usize,
    /// Connections waiting for room, woken together when some is given back.
    waiting: Vec<Waker>,
}

thread_local! {
    static BUDGET: RefCell<Budget> = const {
        RefCell::new(Budget {
            held: 0,
            waiting: Vec::new(),
        })
    };
}

/// Takes `n` bytes of the worker's budget if all of them are free (nothing otherwise).
pub fn try_take(n: usize) -> bool {
    BUDGET.with_borrow_mut(|b| {
        let fits = b.held + n <= WORKER_LIMIT;
        if fits {
            b.held += n;
        }
        fits
    })
}

/// Takes as much of `n` bytes as is free; when that is less than `n`, `waker` is woken
/// once some is given back.
pub fn take_up_to(n: usize, waker: &Waker) -> usize {
    BUDGET.with_borrow_mut(|b| {
        let got = n.min(WORKER_LIMIT - b.held);
        b.held += got;
        if got < n && !b.waiting.iter().any(|w| w.will_wake(waker)) {
            b.waiting.push(waker.clone());
        }
        got
    })
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
            b.held = b.held.saturating_sub(n);
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

/// What the worker holds now.
pub fn held() -> usize {
    BUDGET.with_borrow(|b| b.held)
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
        assert_eq!(take_up_to(5000, &waker), 1000, "what is free");
        assert_eq!(held(), WORKER_LIMIT);
        give(100);
        assert_eq!(count.0.load(Ordering::SeqCst), 0, "too little to wake for");
        give(WAKE_AT);
        assert_eq!(count.0.load(Ordering::SeqCst), 1);
        give(WORKER_LIMIT);
        assert_eq!(held(), 0);
    }
}
