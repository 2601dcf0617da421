//! A server's health, shared by every worker through atomics (a server one worker found
//! dead is skipped by all of them, without a lock on the request path):
//! - passive, always on: a server that fails `fails` requests in a row is out for
//!   `interval`, then tried again (nginx's `max_fails`/`fail_timeout`);
//! - active, with `health.path`: [`crate::checks`] probes every server each `interval`;
//!   `fails` failed probes in a row take it out until `passes` pass in a row (HAProxy's
//!   `fall`/`rise`), which also brings back a server passive health took out.

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
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
    /// Active checks found it down; it stays out until enough of them pass.
    checked_down: AtomicBool,
    probes_failed: AtomicU32,
    probes_passed: AtomicU32,
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
        self.down_until.load(Ordering::Relaxed) <= now && !self.checked_down.load(Ordering::Relaxed)
    }

    /// Counts an active check's result.
    pub(crate) fn probed(&self, passed: bool, spec: &spec::Health, check: &spec::Check) -> Change {
        let was_up = self.is_up(now_ms());
        if passed {
            self.probes_failed.store(0, Ordering::Relaxed);
            let passes = self.probes_passed.fetch_add(1, Ordering::Relaxed) + 1;
            if passes >= check.passes.max(1) {
                self.checked_down.store(false, Ordering::Relaxed);
                self.down_until.store(0, Ordering::Relaxed);
                self.fails_in_a_row.store(0, Ordering::Relaxed);
            }
        } else {
            self.probes_passed.store(0, Ordering::Relaxed);
            let fails = self.probes_failed.fetch_add(1, Ordering::Relaxed) + 1;
            if fails >= spec.fails.max(1) {
                self.checked_down.store(true, Ordering::Relaxed);
            }
        }
        match (was_up, self.is_up(now_ms())) {
            (true, false) => Change::WentDown,
            (false, true) => Change::CameBack,
            _ => Change::None,
        }
    }

    /// Counts a failure; the server goes out at the `fails`th in a row.
    pub(crate) fn failed(&self, spec: &spec::Health) -> Change {
        let fails = self.fails_in_a_row.fetch_add(1, Ordering::Relaxed) + 1;
        if fails < spec.fails.max(1) {
            return Change::None;
        }
        self.fails_in_a_row.store(0, Ordering::Relaxed);
        // Checks bring it back after `passes` of them in a row from now.
        self.probes_passed.store(0, Ordering::Relaxed);
        let until = now_ms() + duration_ms(spec.interval);
        let before = self.down_until.swap(until, Ordering::Relaxed);
        if before <= now_ms() {
            Change::WentDown
        } else {
            Change::None
        }
    }

    /// The upstream has no active checks any more (a reload took them away): what they
    /// found no longer holds the server out.
    pub(crate) fn forget_checks(&self) -> Change {
        let was_up = self.is_up(now_ms());
        self.checked_down.store(false, Ordering::Relaxed);
        self.probes_failed.store(0, Ordering::Relaxed);
        self.probes_passed.store(0, Ordering::Relaxed);
        if !was_up && self.is_up(now_ms()) {
            Change::CameBack
        } else {
            Change::None
        }
    }

    /// A request completed: the failure count starts again.
    pub(crate) fn succeeded(&self) -> Change {
        self.fails_in_a_row.store(0, Ordering::Relaxed);
        // A server tried again after its interval and answering is back; it was counted
        // down, so count it up once (unless active checks still hold it out).
        if self.down_until.swap(0, Ordering::Relaxed) != 0
            && !self.checked_down.load(Ordering::Relaxed)
        {
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
            check: None,
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

    #[test]
    fn active_checks_take_out_after_fails_and_bring_back_after_passes() {
        let spec = spec::Health {
            fails: 2,
            interval: Duration::from_secs(60),
            check: None,
        };
        let check = spec::Check {
            path: "/".into(),
            timeout: Duration::from_secs(1),
            passes: 2,
        };
        let h = Health::default();
        assert_eq!(h.probed(false, &spec, &check), Change::None);
        assert_eq!(h.probed(false, &spec, &check), Change::WentDown);
        assert!(
            !h.is_up(now_ms() + 3_600_000),
            "out until checks pass, not for a time"
        );
        assert_eq!(
            h.succeeded(),
            Change::None,
            "a request does not override the checks"
        );
        assert_eq!(h.probed(true, &spec, &check), Change::None);
        assert_eq!(h.probed(true, &spec, &check), Change::CameBack);
        // Passive marking, then passing checks bring the server back early.
        let passive = spec::Health { fails: 1, ..spec };
        assert_eq!(h.failed(&passive), Change::WentDown);
        assert!(!h.is_up(now_ms()));
        h.probed(true, &passive, &check);
        assert_eq!(h.probed(true, &passive, &check), Change::CameBack);
    }
}
