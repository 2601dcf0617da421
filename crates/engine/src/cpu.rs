//! The worker's CPU time spent polling chosen futures, so that a cost can be measured
//! from the work that makes it and nothing else on the thread: admission control weighs a
//! handshake by the CPU that handshakes take (their connections up to the end of the
//! handshake, and the engine's own batch tasks), not by what keep-alive requests took in
//! the same stretch of time.

use std::cell::Cell;
use std::future::{poll_fn, Future};
use std::pin::pin;
use std::time::Duration;

/// CPU time added up over the polls of the futures [`CpuMeter::metered`] runs.
#[derive(Debug, Default)]
pub struct CpuMeter {
    spent: Cell<Duration>,
}

impl CpuMeter {
    /// All the CPU metered so far.
    pub fn spent(&self) -> Duration {
        self.spent.get()
    }

    /// Runs `work`, adding the thread's CPU time in each of its polls. Two reads of the
    /// thread's CPU clock a poll (a system call each, well under a microsecond).
    pub async fn metered<F: Future>(&self, work: F) -> F::Output {
        let mut work = pin!(work);
        poll_fn(|cx| {
            let started = terminus_sys::thread_cpu_clock();
            let polled = work.as_mut().poll(cx);
            let took = terminus_sys::thread_cpu_clock().saturating_sub(started);
            self.spent.set(self.spent.get() + took);
            polled
        })
        .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_metered_work_counts() {
        let meter = CpuMeter::default();
        let spin = |n: u64| {
            let mut x = 0u64;
            for i in 0..n {
                x = x.wrapping_mul(31).wrapping_add(std::hint::black_box(i));
            }
            std::hint::black_box(x);
        };
        let runtime = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let started = terminus_sys::thread_cpu_clock();
        runtime.block_on(async {
            spin(20_000_000);
            meter.metered(async { spin(2_000_000) }).await;
            spin(20_000_000);
        });
        let all = terminus_sys::thread_cpu_clock() - started;
        let metered = meter.spent();
        assert!(metered > Duration::ZERO);
        // The metered tenth of the work, not the unmetered rest.
        assert!(metered * 4 < all, "{metered:?} of {all:?}");
    }
}
