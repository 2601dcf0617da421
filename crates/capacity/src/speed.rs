//! `terminus speed`'s throughput measurement, like `openssl speed`: operations per second
//! of a [`Workload`] on some threads, scalar or in full 8-lane batches.

use std::time::{Duration, Instant};

use crypto_mb_sys::LANES;
use terminus_engine::cost::Workload;

/// Operations per second of `workload` over `duration` on `threads` threads at once (each
/// pinned to nothing: the kernel spreads them), scalar or in full batches.
pub fn throughput(workload: &Workload, batched: bool, duration: Duration, threads: usize) -> f64 {
    let per_call = if batched { LANES } else { 1 };
    let start = Instant::now();
    let total: usize = std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads.max(1))
            .map(|_| {
                s.spawn(|| {
                    let mut ops = 0;
                    while start.elapsed() < duration {
                        let ok = if batched {
                            workload.run_batch()
                        } else {
                            workload.run_scalar()
                        };
                        if ok {
                            ops += per_call;
                        }
                    }
                    ops
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("speed thread"))
            .sum()
    });
    total as f64 / start.elapsed().as_secs_f64()
}
