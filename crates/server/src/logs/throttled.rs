//! Lines a client can cause as often as it likes, said at most once per period: the
//! first at once, the ones held back counted into the next that is said (each caller
//! words its own line, and keeps a metric where every occurrence matters). Where a
//! listener turns connections away for several reasons, each reason has its own period
//! ([`ByReason`]): a scanner's refusals, said often, never hold back the first line
//! about another reason (a real peer's failure).

use std::time::{Duration, Instant};

/// One line per `every` at most.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Throttled {
    every: Duration,
    last: Option<Instant>,
    held: u64,
}

impl Throttled {
    pub(crate) const fn new(every: Duration) -> Self {
        Throttled {
            every,
            last: None,
            held: 0,
        }
    }

    /// Whether to say the line now: with how many were held back since the last one
    /// said; None: held back (and counted).
    pub(crate) fn now(&mut self) -> Option<u64> {
        let now = Instant::now();
        if self
            .last
            .is_some_and(|last| now.duration_since(last) < self.every)
        {
            self.held += 1;
            return None;
        }
        self.last = Some(now);
        Some(std::mem::take(&mut self.held))
    }

    /// [`Self::now`] as the words that end the line: none, or how many were held back.
    pub(crate) fn now_with_held(&mut self) -> Option<String> {
        self.now().map(|held| match held {
            0 => String::new(),
            n => format!(" ({n} more since the last such line)"),
        })
    }
}

/// Warnings about connections turned away, one [`Throttled`] per reason (a reason is an
/// index below `N`); each warning ends by naming the series that counts them all.
#[derive(Debug)]
pub(crate) struct ByReason<const N: usize> {
    reasons: [Throttled; N],
    series: &'static str,
}

impl<const N: usize> ByReason<N> {
    /// Each reason said at most once per `every`; all of them counted in `series`.
    pub(crate) const fn new(every: Duration, series: &'static str) -> Self {
        ByReason {
            reasons: [Throttled::new(every); N],
            series,
        }
    }

    /// Warns `line()` for `reason`, unless one was said for it within the period.
    pub(crate) fn warn(&mut self, reason: usize, line: impl FnOnce() -> String) {
        match self.reasons[reason].now() {
            None => {}
            Some(0) => tracing::warn!("{}", line()),
            Some(held) => tracing::warn!(
                "{} (and {held} more for that reason since the last such line: {} counts them by reason)",
                line(),
                self.series
            ),
        }
    }

    /// Whether a line for `reason` would be said now (for tests).
    #[cfg(test)]
    fn now(&mut self, reason: usize) -> Option<u64> {
        self.reasons[reason].now()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The first line is said, the next ones within the period are held and counted
    /// into the first said after it.
    #[test]
    fn one_line_a_period_the_rest_counted_into_the_next() {
        let mut t = Throttled::new(Duration::from_millis(50));
        assert_eq!(t.now(), Some(0));
        assert_eq!(t.now(), None);
        assert_eq!(t.now(), None);
        std::thread::sleep(Duration::from_millis(60));
        assert_eq!(t.now(), Some(2));
        assert_eq!(t.now(), None);
    }

    /// One reason said often holds back its own lines, not another's.
    #[test]
    fn each_reason_has_its_own_period() {
        let mut t = ByReason::<2>::new(Duration::from_secs(60), "x_total");
        assert_eq!(t.now(0), Some(0));
        for _ in 0..100 {
            assert_eq!(t.now(0), None);
        }
        assert_eq!(t.now(1), Some(0));
        assert_eq!(t.now(1), None);
    }
}
