//! A rate limit in the form of the generic cell rate algorithm (GCRA, ITU-T I.371), with
//! uses of any size: a quota of `rate` units per second that tolerates a burst.
//!
//! The meter keeps one number, the theoretical arrival time (TAT): when the units used so
//! far would have been used up at exactly `rate`. A use conforms while the TAT is no more
//! than the tolerance ahead of now. Unlike a token bucket refilled on a timer, a use that
//! does not conform yet knows at once how long it would have to wait, so a handshake
//! that would wait longer than its bound is refused without waiting, and one that waits
//! takes its place in line the moment it decides to (the TAT moves past it), so that
//! waiters never stampede when the quota comes back.

/// One rate limit. Times are seconds on the caller's clock (the tenant's epoch).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Meter {
    /// Units per second.
    rate: f64,
    /// How far ahead of now the TAT may be, in seconds: the burst, as time at `rate`.
    tolerance: f64,
    /// Theoretical arrival time.
    tat: f64,
}

impl Meter {
    /// A meter of `rate` units per second letting `burst` seconds of it through at once.
    pub(crate) const fn new(rate: f64, burst: f64) -> Self {
        Self {
            rate,
            tolerance: burst,
            tat: 0.0,
        }
    }

    /// How long a use at `now` must wait to conform: zero when it conforms now (within a
    /// nanosecond: the arithmetic is in floating point).
    pub(crate) fn wait(&self, now: f64) -> f64 {
        let wait = self.tat - self.tolerance - now;
        if wait > 1e-9 {
            wait
        } else {
            0.0
        }
    }

    /// Counts `units` used at `now` (after any wait [`Meter::wait`] asked for).
    pub(crate) fn charge(&mut self, now: f64, units: f64) {
        self.tat = self.tat.max(now) + units / self.rate;
    }

    /// Changes the rate to `rate` at `now`, keeping what is owed: the units used ahead
    /// of the old rate are owed at the new one (a share of a fleet's quota that moves
    /// neither forgives a burst nor punishes one twice).
    pub(crate) fn rescale(&mut self, now: f64, rate: f64) {
        if self.tat > now {
            self.tat = now + (self.tat - now) * self.rate / rate;
        }
        self.rate = rate;
    }

    /// The theoretical arrival time: from then on the meter is as good as a new one (it
    /// owes nothing), so up to then it holds what a new one would not.
    pub(crate) fn due(&self) -> f64 {
        self.tat
    }

    /// Corrects what was charged by `units` (negative: gives some back), once the true
    /// cost of a use charged at an estimate is known.
    pub(crate) fn adjust(&mut self, units: f64) {
        self.tat += units / self.rate;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Uses of one unit offered at `offered` per second for `seconds`, each admitted if it
    /// conforms, or after waiting up to `bound`: how many units got through.
    fn offer(meter: &mut Meter, offered: f64, seconds: f64, bound: f64) -> f64 {
        let mut through = 0.0;
        let n = (offered * seconds) as usize;
        for i in 0..n {
            let now = i as f64 / offered;
            if meter.wait(now) <= bound {
                meter.charge(now, 1.0);
                through += 1.0;
            }
        }
        through
    }

    #[test]
    fn a_flood_gets_the_rate_and_one_burst() {
        let mut meter = Meter::new(100.0, 0.1);
        let through = offer(&mut meter, 1000.0, 10.0, 0.0);
        // 10 s at 100/s, the 0.1 s burst (10) and the use that opens the count.
        assert!(
            (1000.0..=1011.0).contains(&through),
            "{through} through at a 100/s meter offered 1000/s for 10 s"
        );
    }

    #[test]
    fn below_the_rate_everything_conforms() {
        let mut meter = Meter::new(100.0, 0.1);
        assert_eq!(offer(&mut meter, 50.0, 10.0, 0.0), 500.0);
    }

    #[test]
    fn a_wait_takes_its_place_in_line() {
        let mut meter = Meter::new(10.0, 0.0);
        meter.charge(0.0, 1.0);
        assert_eq!(meter.wait(0.0), 0.1);
        // The first waiter charges now; the next one's wait is behind it.
        meter.charge(0.0, 1.0);
        assert!((meter.wait(0.0) - 0.2).abs() < 1e-9);
        // Waiting no longer than 0.15 s: the second waiter is refused, so uses going
        // through stay at the rate however many wait.
        assert!(meter.wait(0.0) > 0.15);
    }

    #[test]
    fn a_rescaled_meter_keeps_what_is_owed_in_units() {
        let mut meter = Meter::new(100.0, 0.0);
        meter.charge(0.0, 50.0);
        assert!((meter.wait(0.0) - 0.5).abs() < 1e-9);
        // Half the rate: the 50 units owed take twice as long.
        meter.rescale(0.0, 50.0);
        assert!((meter.wait(0.0) - 1.0).abs() < 1e-9);
        // Past the debt, a new rate changes nothing owed.
        meter.rescale(2.0, 10.0);
        assert_eq!(meter.wait(2.0), 0.0);
    }

    #[test]
    fn an_adjustment_settles_an_estimate() {
        let mut a = Meter::new(10.0, 0.0);
        a.charge(0.0, 1.0);
        a.adjust(2.0);
        let mut b = Meter::new(10.0, 0.0);
        b.charge(0.0, 3.0);
        assert!((a.wait(0.0) - b.wait(0.0)).abs() < 1e-9);
        a.adjust(-3.0);
        assert_eq!(a.wait(0.0), 0.0, "all given back");
    }
}
