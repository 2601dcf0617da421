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

use terminus_engine::cost::Workload;

use crate::MeasureError;

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
    /// Some 75 ms on this core (9 rounds of 2 x (3 + 1) ms), and 285 ms more with a
    /// neighbour (19 phases of 15 ms).
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

impl std::fmt::Display for Ratio {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:.3}x [{:.3}-{:.3}]", self.median, self.low, self.high)
    }
}

/// What crypto_mb batches cost scalar code on this machine.
#[derive(Debug)]
pub struct AfterEffect {
    /// The probe's throughput on this core right after batches over right after scalar
    /// work only: 1.0 is no after-effect.
    pub same_core: Ratio,
    /// A neighbour core's probe throughput while this core runs batches over while it
    /// runs scalar work; `None` where none was asked for, an error where the probe could
    /// not run there (its CPU not allowed, say).
    pub neighbour: Option<Result<Ratio, MeasureError>>,
    /// The kernel's `AVX512_elapsed_ms` for the measuring thread right after the batches
    /// (`/proc/<pid>/task/<tid>/arch_status`, x86 kernels from 5.2 on): how long since the
    /// kernel last saw AVX-512 state in use; `None` where the kernel does not say.
    pub avx512_elapsed_ms: Option<i64>,
}

impl AfterEffect {
    /// The share of a neighbour's throughput lost, where it was measured.
    pub fn neighbour_loss(&self) -> Option<f64> {
        self.neighbour
            .as_ref()
            .and_then(|n| n.as_ref().ok())
            .map(Ratio::loss)
    }
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

/// Measures the after-effect of `workload`'s batches (it must be one crypto_mb runs:
/// call only where [`terminus_engine::multibuffer::applicable`]). The calling thread is "this
/// core": pin it first for the numbers to mean one core.
pub fn measure(workload: &Workload, settings: &Settings) -> Result<AfterEffect, MeasureError> {
    let same = alternating(settings.rounds, |batched| {
        if batched {
            run_batches(workload, settings.burst)?;
        } else {
            probe_for(settings.burst);
        }
        Ok(probe_for(settings.probe) as f64)
    })?;
    // What the kernel says right after one more burst of batches.
    run_batches(workload, settings.burst)?;
    let elapsed = avx512_elapsed_ms();
    let neighbour = settings
        .neighbour
        .map(|cpu| neighbour(workload, settings, cpu));
    Ok(AfterEffect {
        same_core: Ratio::of(same).ok_or(MeasureError::NothingCounted { neighbour: false })?,
        neighbour,
        avx512_elapsed_ms: elapsed,
    })
}

/// [`measure`] on a thread of its own pinned to `cpu`, so that the numbers are one core's
/// whatever the caller's affinity.
pub fn measure_on(
    cpu: usize,
    workload: &Workload,
    settings: &Settings,
) -> Result<AfterEffect, MeasureError> {
    std::thread::scope(|s| {
        s.spawn(|| {
            terminus_sys::pin_current_thread(cpu)
                .map_err(|source| MeasureError::Pin { cpu, source })?;
            measure(workload, settings)
        })
        .join()
        .unwrap_or(Err(MeasureError::Panicked))
    })
}

/// `rounds` ratios of `measure(true)` over `measure(false)`, which one goes first
/// alternating from round to round so that neither always follows the other.
fn alternating(
    rounds: usize,
    mut measure: impl FnMut(bool) -> Result<f64, MeasureError>,
) -> Result<Vec<f64>, MeasureError> {
    let mut ratios = Vec::with_capacity(rounds.max(1));
    let mut batched_first = false;
    for _ in 0..rounds.max(1) {
        let first = measure(batched_first)?;
        let second = measure(!batched_first)?;
        let (batched, scalar) = if batched_first {
            (first, second)
        } else {
            (second, first)
        };
        ratios.push(batched / scalar);
        batched_first = !batched_first;
    }
    Ok(ratios)
}

/// Runs `workload` in full batches for `window`.
fn run_batches(workload: &Workload, window: Duration) -> Result<(), MeasureError> {
    let start = Instant::now();
    while start.elapsed() < window {
        if !workload.run_batch() {
            return Err(MeasureError::Batch(workload.op));
        }
    }
    Ok(())
}

/// Stops the neighbour probe however the measurement ends, a panic included: the
/// thread scope would otherwise wait for it forever.
struct StopOnDrop<'a>(&'a AtomicBool);

impl Drop for StopOnDrop<'_> {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Relaxed);
    }
}

/// A probe pinned to `cpu` throughout, its steps counted per phase while this core
/// alternates phases of scalar work and of batches.
fn neighbour(workload: &Workload, settings: &Settings, cpu: usize) -> Result<Ratio, MeasureError> {
    let phase = settings.burst * 5;
    let steps = AtomicU64::new(0);
    let stop = AtomicBool::new(false);
    let (pinned_tx, pinned_rx) = std::sync::mpsc::channel();
    std::thread::scope(|s| {
        let _stop = StopOnDrop(&stop);
        s.spawn(|| {
            let pinned = terminus_sys::pin_current_thread(cpu)
                .map_err(|source| MeasureError::NeighbourPin { cpu, source });
            let ok = pinned.is_ok();
            let _ = pinned_tx.send(pinned);
            let mut x = 1u64;
            while ok && !stop.load(Ordering::Relaxed) {
                x = probe_step(x);
                steps.fetch_add(1, Ordering::Relaxed);
            }
            std::hint::black_box(x);
        });
        pinned_rx
            .recv()
            .map_err(|_| MeasureError::NeighbourNotStarted)??;
        let rate_during = |batched: bool| -> Result<f64, MeasureError> {
            let (start, before) = (Instant::now(), steps.load(Ordering::Relaxed));
            if batched {
                run_batches(workload, phase)?;
            } else {
                probe_for(phase);
            }
            let done = steps.load(Ordering::Relaxed) - before;
            Ok(done as f64 / start.elapsed().as_secs_f64())
        };
        // The probe's first phase is spent getting onto its CPU.
        rate_during(false)?;
        let rounds = alternating(settings.rounds, rate_during)?;
        Ratio::of(rounds).ok_or(MeasureError::NothingCounted { neighbour: true })
    })
}

/// A CPU `allowed` to this process that is not `cpu` or one of its SMT siblings (a
/// sibling shares the core, so it would measure contention, not a licence).
pub fn neighbour_of(cpu: usize, allowed: &[usize]) -> Option<usize> {
    let siblings = terminus_sys::smt_siblings(cpu);
    allowed
        .iter()
        .copied()
        .find(|&c| c != cpu && !siblings.contains(&c))
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
    fn a_lone_cpu_has_no_neighbour() {
        assert_eq!(neighbour_of(0, &[0]), None);
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
        if !terminus_testkit::runs_with_ifma(terminus_engine::multibuffer::applicable()) {
            return;
        }
        let workload = Workload::generate(terminus_engine::cost::Operation::EcdsaP256).unwrap();
        let allowed = terminus_sys::allowed_cpus().unwrap();
        let settings = Settings {
            rounds: 3,
            neighbour: neighbour_of(allowed[0], &allowed),
            ..Settings::default()
        };
        let effect = measure(&workload, &settings).unwrap();
        // A ratio of two throughputs of the same probe: positive and finite, whatever
        // this machine's after-effect is.
        let neighbour = effect.neighbour.map(|n| n.unwrap());
        for r in std::iter::once(effect.same_core).chain(neighbour) {
            assert!(
                r.low > 0.0 && r.high.is_finite() && r.low <= r.median && r.median <= r.high,
                "{r:?}"
            );
        }
    }
}
