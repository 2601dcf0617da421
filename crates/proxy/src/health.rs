//! Passive health: a server that fails `fails` times in a row is out for `interval`,
//! then tried again (nginx's `max_fails`/`fail_timeout`). The state is shared by every
//! worker through atomics, so a server one worker found dead is skipped by all of them,
//! without a lock on the request path.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use crate::spec;

/// Milliseconds on a process-wide monotonic clock (0 is the first call).
pub(crate) fn now_ms() -> u64 {
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    EPOCH.get_or_init(Instant::now).elapsed().as_millis() as u64
}

/// One server's health, as its recent requests saw it.
#[derive(Debug, Default)]
pub(crate) struct Health {
    fails_in_a_row: AtomicU32,
    /// On [`now_ms`]'s clock; the server is out until then.
    down_until: AtomicU64,
}

/// What a request's outcome changed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Change {
    None,
    WentDown,
    CameBack,
}

impl Health {
    pub(crate) fn is_up(&self, now: u64) -> bool {
        self.down_until.load(Ordering::Relaxed) <= now
    }

    /// Counts a failure; the server goes out at the `fails`th in a row.
    pub(crate) fn failed(&self, spec: &spec::Health) -> Change {
        let fails = self.fails_in_a_row.fetch_add(1, Ordering::Relaxed) + 1;
        if fails < spec.fails.max(1) {
            return Change::None;
        }
        self.fails_in_a_row.store(0, Ordering::Relaxed);
        let until = now_ms() + duration_ms(spec.interval);
        let before = self.down_until.swap(until, Ordering::Relaxed);
        if before <= now_ms() {
            Change::WentDown
        } else {
            Change::None
        }
    }

    /// A request completed: the failure count starts again.
    pub(crate) fn succeeded(&self) -> Change {
        self.fails_in_a_row.store(0, Ordering::Relaxed);
        // A server tried again after its interval and answering is back; it was counted
        // down, so count it up once.
        if self.down_until.swap(0, Ordering::Relaxed) != 0 {
            Change::CameBack
        } else {
            Change::None
        }
    }
}

fn duration_ms(d: Duration) -> u64 {
    d.as_millis().min(u64::MAX as u128 / 2) as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn out_after_fails_in_a_row_and_back_after_success() {
        let spec = spec::Health {
            fails: 2,
            interval: Duration::from_secs(60),
        };
        let h = Health::default();
        assert!(h.is_up(now_ms()));
        assert_eq!(h.failed(&spec), Change::None);
        assert_eq!(h.succeeded(), Change::None, "a success resets the count");
        assert_eq!(h.failed(&spec), Change::None);
        assert!(h.is_up(now_ms()));
        assert_eq!(h.failed(&spec), Change::WentDown);
        assert!(!h.is_up(now_ms()));
        assert!(h.is_up(now_ms() + 61_000), "tried again after the interval");
        assert_eq!(h.succeeded(), Change::CameBack);
        assert!(h.is_up(now_ms()));
    }
}
