//! When to renew a certificate and how long to wait after a failure: policy only, every
//! input given (times, the random draw), so that it is tested without a clock or a CA.
//!
//! - **ARI first** (RFC 9773): the CA's suggested window, at a uniformly random point in
//!   it, as section 4.2 asks (a fleet of clients spreads its renewals over the window);
//!   a window already past means now.
//! - **Else by the lifetime**: at 2/3 of it (Let's Encrypt's 90-day certificate, day
//!   60; certbot and Caddy renew with a third left), at 1/2 for a certificate of under
//!   10 days (a 6-day `shortlived` one renews with 3 days left, time for retries); the
//!   point is drawn from a window of a fifteenth of the lifetime around it, so that
//!   certificates issued together do not all renew in the same second.
//! - **Failures back off**: 1 minute, doubling to 24 hours, each delay drawn between
//!   its half and itself (decorrelated, so that instances that failed together do not
//!   retry together); a CA's Retry-After is honoured when it asks for longer.

use std::time::{Duration, SystemTime};

/// Lifetimes under this renew at half, not two thirds.
pub const SHORT_LIFETIME: Duration = Duration::from_secs(10 * 24 * 3600);

/// The first retry after a failure.
pub const FIRST_RETRY: Duration = Duration::from_secs(60);

/// The longest wait between two attempts.
pub const LONGEST_RETRY: Duration = Duration::from_secs(24 * 3600);

/// A certificate's validity, as the renewal policy needs it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Validity {
    /// notBefore.
    pub not_before: SystemTime,
    /// notAfter.
    pub not_after: SystemTime,
}

impl Validity {
    /// Its lifetime (zero for one that ends before it begins).
    pub fn lifetime(&self) -> Duration {
        self.not_after
            .duration_since(self.not_before)
            .unwrap_or_default()
    }

    /// Whether it can still be served at `now`.
    pub fn valid_at(&self, now: SystemTime) -> bool {
        self.not_before <= now && now < self.not_after
    }
}

/// When to renew a certificate valid for `validity`: a point of ARI's `window` if the CA
/// gave one, else of the window around 2/3 of the lifetime (1/2 under 10 days).
/// `draw` is uniform in [0, 1): the random point.
pub fn renew_at(
    validity: Validity,
    window: Option<(SystemTime, SystemTime)>,
    draw: f64,
) -> SystemTime {
    let draw = draw.clamp(0.0, 1.0);
    let (start, end) = match window {
        Some((start, end)) if start < end => (start, end),
        Some((start, _)) => return start,
        None => {
            let life = validity.lifetime();
            let at = if life < SHORT_LIFETIME {
                life / 2
            } else {
                life * 2 / 3
            };
            let half_width = life / 30;
            (
                validity.not_before + at - half_width,
                validity.not_before + at + half_width,
            )
        }
    };
    start + end.duration_since(start).unwrap_or_default().mul_f64(draw)
}

/// Waits between failed attempts.
#[derive(Debug, Clone, Default)]
pub struct Backoff {
    failures: u32,
}

impl Backoff {
    /// The wait after one more failure: 1 min doubling to 24 h, drawn from its upper
    /// half by `draw` (uniform in [0, 1)), or the CA's `retry_after` if that is longer.
    pub fn failed(&mut self, retry_after: Option<Duration>, draw: f64) -> Duration {
        let doubled = FIRST_RETRY
            .checked_mul(1u32 << self.failures.min(16))
            .unwrap_or(LONGEST_RETRY)
            .min(LONGEST_RETRY);
        self.failures = self.failures.saturating_add(1);
        let jittered = doubled.mul_f64(0.5 + 0.5 * draw.clamp(0.0, 1.0));
        match retry_after {
            Some(asked) if asked > jittered => asked.min(LONGEST_RETRY),
            _ => jittered,
        }
    }

    /// An attempt succeeded: the next failure waits the first delay again.
    pub fn succeeded(&mut self) {
        self.failures = 0;
    }

    /// Failures in a row.
    pub fn failures(&self) -> u32 {
        self.failures
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const DAY: Duration = Duration::from_secs(86_400);

    fn issued(days: u32) -> Validity {
        let not_before = SystemTime::UNIX_EPOCH + DAY * 20_000;
        Validity {
            not_before,
            not_after: not_before + DAY * days,
        }
    }

    #[test]
    fn a_ninety_day_certificate_renews_around_day_sixty_at_a_random_point() {
        let v = issued(90);
        let at = |draw| {
            renew_at(v, None, draw)
                .duration_since(v.not_before)
                .unwrap()
        };
        assert_eq!(at(0.0), DAY * 57);
        assert_eq!(at(0.5), DAY * 60);
        assert_eq!(at(0.999_999).as_secs() / 86_400, 62);
        assert!(at(0.25) < at(0.75));
    }

    #[test]
    fn a_short_lived_certificate_renews_around_half_its_life() {
        let v = issued(6);
        let mid = renew_at(v, None, 0.5).duration_since(v.not_before).unwrap();
        assert_eq!(mid, DAY * 3);
        // Just over 10 days is not short-lived.
        let v = issued(11);
        let mid = renew_at(v, None, 0.5).duration_since(v.not_before).unwrap();
        assert_eq!(mid, DAY * 11 * 2 / 3);
    }

    #[test]
    fn ari_s_window_comes_first_at_a_random_point_and_a_degenerate_one_is_its_start() {
        let v = issued(90);
        let start = v.not_before + DAY * 10;
        let end = start + DAY * 2;
        assert_eq!(renew_at(v, Some((start, end)), 0.0), start);
        assert_eq!(renew_at(v, Some((start, end)), 0.5), start + DAY);
        // A window that is a point (or reversed) is its start.
        assert_eq!(renew_at(v, Some((end, start)), 0.7), end);
    }

    #[test]
    fn failures_back_off_from_a_minute_to_a_day_and_honour_retry_after() {
        let mut b = Backoff::default();
        assert_eq!(b.failed(None, 1.0), FIRST_RETRY);
        assert_eq!(b.failed(None, 1.0), FIRST_RETRY * 2);
        assert_eq!(
            b.failed(None, 0.0),
            FIRST_RETRY * 2,
            "drawn from the upper half"
        );
        for _ in 0..20 {
            b.failed(None, 1.0);
        }
        assert_eq!(b.failed(None, 1.0), LONGEST_RETRY);
        // The CA asks for longer than the backoff would wait: its wish, up to a day.
        let mut b = Backoff::default();
        assert_eq!(b.failed(Some(DAY / 4), 1.0), DAY / 4);
        assert_eq!(b.failed(Some(DAY * 3), 1.0), LONGEST_RETRY);
        assert_eq!(b.failed(Some(Duration::from_secs(1)), 1.0), FIRST_RETRY * 4);
        b.succeeded();
        assert_eq!(b.failed(None, 1.0), FIRST_RETRY);
    }
}
