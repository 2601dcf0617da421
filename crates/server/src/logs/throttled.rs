//! Lines a client can cause as often as it likes, said at most once per period: the
//! first at once, the ones held back counted into the next that is said (each caller
//! words its own line, and keeps a metric where every occurrence matters).

use std::time::{Duration, Instant};

/// One line per `every` at most.
#[derive(Debug)]
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
}
