//! Giving back what a burst of connections left behind, once it is over.
//!
//! glibc keeps freed memory in its arenas: 9,000 connections that came and went left
//! 128 MiB resident in nginx and 134 MiB in HAProxy (bench/idle-memory), and did the
//! same in terminus. Every 10 s one housekeeping thread reads how much resident memory
//! the allocator holds free (the process's anonymous RSS less what the allocator has
//! handed out; glibc's own "free" count includes pages already given back) and, when
//! that rose by more than [`GROWTH`] over the lowest reading since the last release (a
//! burst's memory came back to it), returns the free pages to the kernel
//! (`malloc_trim`). A steady load, whose free memory stays within a band, is not trimmed
//! again and again. The coroutine stacks a burst left are each worker's own
//! (`bridge::trim_idle_stacks`, in `worker.rs`).

use std::time::{Duration, Instant};

use tokio::sync::watch;

/// How far free memory must rise over its low point to be worth releasing.
pub(crate) const GROWTH: usize = 16 << 20;
/// How often the allocator is looked at.
pub(crate) const EVERY: Duration = Duration::from_secs(10);

/// The policy: when free memory has risen enough since its low point to release it.
#[derive(Debug, Default)]
pub(crate) struct FreeMemoryWatch {
    /// The lowest reading since the last release; `None` right after one.
    low: Option<usize>,
}

impl FreeMemoryWatch {
    /// Takes one reading of the resident bytes the allocator holds free; true when they
    /// should go back to the kernel now.
    pub(crate) fn release_now(&mut self, free: usize) -> bool {
        let low = *self.low.insert(self.low.map_or(free, |l| l.min(free)));
        if free > low.saturating_add(GROWTH) {
            // The next reading, after the release, is the new low point.
            self.low = None;
            return true;
        }
        false
    }
}

/// Runs on its own thread until `shutdown`: the allocator's locks are taken while it
/// trims, but no worker's event loop waits on the walk.
pub(crate) fn housekeeping(mut shutdown: watch::Receiver<bool>) {
    // Only for its timer: the wait between readings ends early at shutdown.
    let Ok(timer) = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
    else {
        return;
    };
    let mut watch = FreeMemoryWatch::default();
    // The first reading is before any burst: the low point a burst's end rises from.
    let Some(free) = resident_free() else {
        return;
    };
    watch.release_now(free);
    loop {
        let stopped = timer.block_on(async {
            tokio::time::timeout(EVERY, shutdown.wait_for(|&stop| stop))
                .await
                .is_ok()
        });
        if stopped {
            return;
        }
        let Some(free) = resident_free() else {
            return;
        };
        if watch.release_now(free) {
            let started = Instant::now();
            terminus_sys::release_free_memory();
            tracing::debug!(
                "returned the allocator's free memory ({} MiB) to the kernel in {:?}",
                free >> 20,
                started.elapsed()
            );
        }
    }
}

/// Resident anonymous memory not handed out by the allocator: its free chunks' resident
/// pages, and what else is anonymous (thread and coroutine stacks), which moves little.
fn resident_free() -> Option<usize> {
    let in_use = terminus_sys::allocator_in_use_bytes()?;
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let kib: usize = status
        .lines()
        .find_map(|l| l.strip_prefix("RssAnon:"))?
        .split_whitespace()
        .next()?
        .parse()
        .ok()?;
    Some((kib * 1024).saturating_sub(in_use))
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: usize = 1 << 20;

    #[test]
    fn free_memory_is_released_once_when_a_burst_gives_it_back() {
        let mut w = FreeMemoryWatch::default();
        // A steady load: free memory moves within a band.
        for free in [20, 25, 18, 30, 22].map(|m| m * MIB) {
            assert!(!w.release_now(free));
        }
        // A burst holds memory, then frees it: the rise over the low point is released.
        assert!(!w.release_now(5 * MIB));
        assert!(w.release_now(140 * MIB));
        // Released: little is left resident, and that is not released again and again.
        for free in [12, 14, 11, 13, 12].map(|m| m * MIB) {
            assert!(!w.release_now(free));
        }
        // The next burst's end.
        assert!(w.release_now(120 * MIB));
    }
}
