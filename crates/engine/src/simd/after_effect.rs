//! The after-effect of crypto_mb batches on scalar code, measured.
//!
//! The probe is a fixed scalar workload: a chain of dependent multiplies and shifts, the
//! shape of parsing (each step waits for the last), which the compiler cannot turn into
//! vector code. Its throughput is taken in a short window right after a burst of batches
//! and, as the baseline, right after a burst of the probe itself (scalar work only), in
//! alternating rounds; a frequency licence shows as a ratio below 1. Where another core
//! is free, a thread pinned there runs the probe throughout while this core alternates
//! batches with scalar work: what the batches cost a neighbour.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use crate::cost::Workload;

/// How long and how often to measure.
#[derive(Debug, Clone)]
pub struct Settings {
    /// Rounds of each comparison (the median is reported).
    pub rounds: usize,
    /// Batches (or scalar work) before each probe window: longer than a licence change
    /// takes (Intel documents some 500 µs).
    pub burst: Duration,
    /// The probe window right after a burst: shorter than a licence lasts (about 2 ms).
    pub probe: Duration,
    /// The core a neighbour probe runs on, pinned; `None` measures this core only.
    pub neighbour: Option<usize>,
}

impl Default for Settings {
    /// Some 60 ms on this core, and 140 ms more with a neighbour.
    fn default() -> Self {
        Self {
            rounds: 9,
            burst: Duration::from_millis(3),
            probe: Duration::from_millis(1),
            neighbour: None,
        }
    }
}

/// A ratio taken over rounds.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Ratio {
    /// The median round.
    pub median: f64,
    /// The lowest round.
    pub low: f64,
    /// The highest round.
    pub high: f64,
}

impl Ratio {
    /// The median, lowest and highest of `rounds`; `None` for no rounds.
    pub fn of(mut rounds: Vec<f64>) -> Option<Self> {
        rounds.retain(|r| r.is_finite());
        if rounds.is_empty() {
            return None;
        }
        rounds.sort_by(f64::total_cmp);
        Some(Self {
            median: rounds[rounds.len() / 2],
            low: rounds[0],
            high: rounds[rounds.len() - 1],
        })
    }

    /// The share of throughput lost at the median (0 when nothing was lost).
    pub fn loss(&self) -> f64 {
        (1.0 - self.median).max(0.0)
    }
}

/// What crypto_mb batches cost scalar code on this machine.
#[derive(Debug, Clone)]
pub struct AfterEffect {
    /// The probe's throughput on this core right after batches over right after scalar
    /// work only: 1.0 is no after-effect.
    pub same_core: Ratio,
    /// A neighbour core's probe throughput while this core runs batches over while it
    /// runs scalar work; `None` where no neighbour was measured.
    pub neighbour: Option<Ratio>,
    /// The kernel's `AVX512_elapsed_ms` for the measuring thread right after the batches
    /// (`/proc/<pid>/task/<tid>/arch_status`, x86 kernels from 5.2 on): how long since the
    /// kernel last saw AVX-512 state in use; `None` where the kernel does not say.
    pub avx512_elapsed_ms: Option<i64>,
}

/// One link of the probe: 64 dependent multiply-xorshift steps.
fn probe_step(mut x: u64) -> u64 {
    for _ in 0..64 {
        x ^= x >> 29;
        x = x.wrapping_mul(0xbf58_476d_1ce4_e5b9);
        x ^= x >> 32;
    }
    x
}

/// Probe steps done in `window`.
fn probe_for(window: Duration) -> u64 {
    let start = Instant::now();
    let (mut steps, mut x) = (0u64, 1u64);
    while start.elapsed() < window {
        x = probe_step(x);
        steps += 1;
    }
    std::hint::black_box(x);
    steps
}

/// Runs `workload` in full batches for `window`; false if a batch failed.
fn batches_for(workload: &Workload, window: Duration) -> bool {
    let start = Instant::now();
    while start.elapsed() < window {
        if !workload.run_batch() {
            return false;
        }
    }
    true
}

/// Measures the after-effect of `workload`'s batches (it must be one crypto_mb runs:
/// call only where [`crate::multibuffer::applicable`]). The calling thread is "this
/// core": pin it first for the numbers to mean one core.
pub fn measure(workload: &Workload, settings: &Settings) -> Result<AfterEffect, String> {
    let rounds = settings.rounds.max(1);
    let mut same = Vec::with_capacity(rounds);
    for round in 0..rounds {
        // Alternating which comes first, so that neither always follows the other.
        let after = |batched: bool| -> Result<u64, String> {
            if batched {
                if !batches_for(workload, settings.burst) {
                    return Err(format!("{}: a crypto_mb batch failed", workload.op.name()));
                }
            } else {
                probe_for(settings.burst);
            }
            Ok(probe_for(settings.probe))
        };
        let (scalar, batched) = if round.is_multiple_of(2) {
            let s = after(false)?;
            (s, after(true)?)
        } else {
            let b = after(true)?;
            (after(false)?, b)
        };
        same.push(batched as f64 / scalar.max(1) as f64);
    }
    // What the kernel says right after one more burst of batches.
    batches_for(workload, settings.burst);
    let elapsed = avx512_elapsed_ms();
    let neighbour = match settings.neighbour {
        Some(cpu) => Some(neighbour(workload, settings, cpu)?),
        None => None,
    };
    Ok(AfterEffect {
        same_core: Ratio::of(same).expect("at least one round"),
        neighbour,
        avx512_elapsed_ms: elapsed,
    })
}

/// A probe pinned to `cpu` throughout, its steps counted per phase while this core
/// alternates phases of scalar work and of batches.
fn neighbour(workload: &Workload, settings: &Settings, cpu: usize) -> Result<Ratio, String> {
    let phase = settings.burst * 5;
    let steps = AtomicU64::new(0);
    let stop = AtomicBool::new(false);
    std::thread::scope(|s| {
        let probe = s.spawn(|| {
            terminus_sys::pin_current_thread(cpu)
                .map_err(|e| format!("pinning the neighbour probe to CPU {cpu}: {e}"))?;
            let mut x = 1u64;
            while !stop.load(Ordering::Relaxed) {
                x = probe_step(x);
                steps.fetch_add(1, Ordering::Relaxed);
            }
            std::hint::black_box(x);
            Ok::<(), String>(())
        });
        let rate_during = |batched: bool| -> Result<f64, String> {
            let (start, before) = (Instant::now(), steps.load(Ordering::Relaxed));
            if batched {
                if !batches_for(workload, phase) {
                    return Err(format!("{}: a crypto_mb batch failed", workload.op.name()));
                }
            } else {
                probe_for(phase);
            }
            let done = steps.load(Ordering::Relaxed) - before;
            Ok(done as f64 / start.elapsed().as_secs_f64())
        };
        let measured = (|| -> Result<Option<Ratio>, String> {
            // The probe thread's first phase is spent starting and pinning.
            rate_during(false)?;
            let mut rounds = Vec::new();
            for round in 0..settings.rounds.max(1) {
                let (scalar, batched) = if round.is_multiple_of(2) {
                    let s = rate_during(false)?;
                    (s, rate_during(true)?)
                } else {
                    let b = rate_during(true)?;
                    (rate_during(false)?, b)
                };
                rounds.push(batched / scalar);
            }
            Ok(Ratio::of(rounds))
        })();
        stop.store(true, Ordering::Relaxed);
        probe.join().expect("the neighbour probe")?;
        measured?.ok_or_else(|| "the neighbour probe counted nothing".to_owned())
    })
}

/// This thread's `AVX512_elapsed_ms` from the kernel, where it has one.
pub fn avx512_elapsed_ms() -> Option<i64> {
    let tid = terminus_sys::current_tid().ok()?;
    let status = std::fs::read_to_string(format!("/proc/self/task/{tid}/arch_status")).ok()?;
    parse_arch_status(&status)
}

fn parse_arch_status(status: &str) -> Option<i64> {
    status
        .lines()
        .find_map(|l| l.strip_prefix("AVX512_elapsed_ms:"))
        .and_then(|v| v.trim().parse().ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_ratio_is_the_median_of_its_rounds_with_their_range() {
        let r = Ratio::of(vec![0.9, 1.1, 0.8, f64::NAN, 1.0]).unwrap();
        assert_eq!((r.median, r.low, r.high), (1.0, 0.8, 1.1));
        assert_eq!(r.loss(), 0.0);
        assert!((Ratio::of(vec![0.85]).unwrap().loss() - 0.15).abs() < 1e-9);
        assert!(Ratio::of(vec![]).is_none());
    }

    #[test]
    fn arch_status_gives_the_avx512_field_or_nothing() {
        assert_eq!(parse_arch_status("AVX512_elapsed_ms:\t17\n"), Some(17));
        assert_eq!(parse_arch_status("AVX512_elapsed_ms:\t-1\n"), Some(-1));
        assert_eq!(parse_arch_status("something_else: 3\n"), None);
    }

    /// The measurement on this machine's real crypto_mb; on a CPU without IFMA it says
    /// so and is skipped, visibly.
    #[test]
    fn batches_and_scalar_work_are_both_measured_on_crypto_mb() {
        if !terminus_testkit::runs_with_ifma(crate::multibuffer::applicable()) {
            return;
        }
        let workload = Workload::generate(crate::cost::Operation::EcdsaP256).unwrap();
        let settings = Settings {
            rounds: 3,
            neighbour: (terminus_sys::configured_cpus() > 1).then_some(1),
            ..Settings::default()
        };
        let effect = measure(&workload, &settings).unwrap();
        // A ratio of two throughputs of the same probe: positive and finite, whatever
        // this machine's after-effect is.
        for r in std::iter::once(effect.same_core).chain(effect.neighbour) {
            assert!(
                r.low > 0.0 && r.high.is_finite() && r.low <= r.median && r.median <= r.high,
                "{r:?}"
            );
        }
    }
}
