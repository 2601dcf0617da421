//! Where crypto_mb batches run (`crypto.simd`), decided once at start-up: the after-effect
//! of batches measured on this machine (for `auto`, and reported whatever the setting),
//! the allowed CPUs split between workers and crypto threads, and how many workers that
//! leaves. The rule is [`terminus_capacity::simd::decide`]; the crypto threads are
//! [`terminus_engine::ThreadPool::dedicated`].
//!
//! The counts the configuration leaves to the machine are decided here too: a worker per
//! CPU, a crypto core per eight CPUs, a crypto thread per CPU.

use std::sync::Arc;

use terminus_capacity::simd::{self, after_effect, cores, Decision, Inputs, Placement, Ratio};
use terminus_engine::cost::{Crossovers, Operation, Workload};
use terminus_engine::{BackendKind, EngineMetrics, ThreadPool};

use crate::StartError;
use terminus_config::Config;

/// What start-up measured of the after-effect, and what `auto` would choose from it.
#[derive(Debug, Clone)]
pub(crate) struct Measured {
    /// The batched operation measured.
    pub(crate) op: Operation,
    /// Scalar speed right after batches over after scalar work, on the batching core.
    pub(crate) ratio: Ratio,
    /// `auto`'s choice, and why.
    pub(crate) auto: Decision,
}

/// The placement in force.
#[derive(Debug, Clone)]
pub(crate) struct Placed {
    /// How many workers run.
    pub(crate) workers: usize,
    /// Dedicated: the CPUs of the workers and of the crypto threads; `None` inline.
    pub(crate) dedicated: Option<cores::Split>,
    /// Physical cores computing handshake crypto: the workers' inline, the crypto
    /// threads' dedicated. The machine's crypto capacity counts these.
    pub(crate) crypto_cores: usize,
    /// The measurement, with the multibuffer backend.
    pub(crate) measured: Option<Measured>,
}

/// The CPUs this machine has (as the standard library counts them: the affinity mask
/// and cgroup quota included); 1 if it will not say.
pub(crate) fn cpu_count() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// `workers`, or one per CPU.
pub(crate) fn workers(config: &Config) -> usize {
    config.workers.unwrap_or_else(cpu_count)
}

/// `crypto.threads` (the `threads` backend's pool), or one per CPU.
pub(crate) fn crypto_threads(config: &Config) -> usize {
    config.crypto.threads.unwrap_or_else(cpu_count)
}

/// `crypto.simd_cores`, or one crypto core per eight CPUs: a core of crypto_mb batches
/// signs for several workers' handshakes (bench/README, issue 40).
pub(crate) fn simd_cores(config: &Config) -> usize {
    config
        .crypto
        .simd_cores
        .unwrap_or_else(|| cpu_count().div_ceil(8))
}

impl Placed {
    /// Inline, as configured, nothing measured: for `terminus check`.
    pub(crate) fn unmeasured(config: &Config) -> Self {
        Self {
            workers: workers(config),
            dedicated: None,
            crypto_cores: workers(config),
            measured: None,
        }
    }

    /// `Inline` or `Dedicated`.
    pub(crate) fn placement(&self) -> Placement {
        match self.dedicated {
            Some(_) => Placement::Dedicated,
            None => Placement::Inline,
        }
    }

    /// The CPUs of the crypto threads: none inline.
    pub(crate) fn crypto_cpus(&self) -> &[usize] {
        self.dedicated.as_ref().map_or(&[], |s| &s.crypto)
    }

    /// The CPUs worker `id` may run on: its own with `pin`, else those of the workers
    /// when a core is dedicated (so no worker runs there), else `None` (anywhere).
    pub(crate) fn cpus_of_worker(&self, id: usize, pin: bool) -> Option<Vec<usize>> {
        let cpus = match &self.dedicated {
            Some(split) => split.workers.clone(),
            None if pin => allowed_cpus(),
            None => return None,
        };
        if pin {
            return Some(vec![cpus[id % cpus.len()]]);
        }
        Some(cpus)
    }

    /// With `dedicated`, the crypto threads, one pinned to each crypto CPU, computing
    /// with crypto_mb; `None` inline.
    pub(crate) fn start_pool(
        &self,
        capacity: usize,
        metrics: Arc<EngineMetrics>,
        crossovers: Arc<Crossovers>,
    ) -> Result<Option<Arc<ThreadPool>>, StartError> {
        let Some(split) = &self.dedicated else {
            return Ok(None);
        };
        Ok(Some(ThreadPool::dedicated(
            &split.crypto,
            capacity,
            metrics,
            crossovers,
        )?))
    }

    /// One line for the log.
    pub(crate) fn describe(&self) -> String {
        match &self.dedicated {
            Some(split) => format!(
                "crypto_mb batches on dedicated CPUs {:?}, workers on {:?}",
                split.crypto, split.workers
            ),
            None => "crypto_mb batches inline, on the workers".to_owned(),
        }
    }
}

/// Why `crypto.simd` cannot be placed as configured.
#[derive(Debug, thiserror::Error)]
pub enum PlacementError {
    /// `dedicated`, and no core of its own is left beside the workers.
    #[error(
        "{config}: crypto.simd = \"dedicated\" needs {crypto_cores} physical core(s) of its own beside the workers, and this process may use CPUs {allowed:?}{}",
        match workers {
            None => "; lower crypto.simd_cores, or use inline".to_owned(),
            Some(workers) => format!(
                " with workers = {workers}; lower workers or crypto.simd_cores, or leave workers unset (then there is one per CPU left)"
            ),
        }
    )]
    NoDedicatedCore {
        /// The configuration's file (or the embedded default).
        config: String,
        /// The physical cores asked for (`crypto.simd_cores`).
        crypto_cores: usize,
        /// The CPUs this process may use.
        allowed: Vec<usize>,
        /// `workers`, where configured.
        workers: Option<usize>,
    },
}

/// Decides `crypto.simd` for `backend`: with `measure` (the operation batched; `serve`
/// passes the RSA-2048 unit of ACU), measures the after-effect (some 75 ms) for `auto`
/// and the metrics; applies the setting (for `auto`, the rule; unmeasured, inline) and
/// splits the CPUs. An error where `dedicated` cannot have a core of its own.
pub(crate) fn place(
    config: &Config,
    backend: BackendKind,
    measure: Option<&Workload>,
) -> Result<Placed, StartError> {
    let allowed = allowed_cpus();
    let inline = |measured| Placed {
        measured,
        ..Placed::unmeasured(config)
    };
    if backend != BackendKind::Multibuffer {
        if config.crypto.simd == Placement::Dedicated {
            tracing::warn!(
                "{}: crypto.simd = \"dedicated\" has nothing to place: the {} backend computes no crypto_mb batches{}",
                config.source,
                backend.name(),
                if terminus_config::BackendChoice::Auto == config.crypto.backend {
                    " (crypto_mb does not run on this CPU)"
                } else {
                    ""
                }
            );
        }
        return Ok(inline(None));
    }
    let crypto_cores = simd_cores(config);
    let split = cores::split(&allowed, crypto_cores, terminus_sys::smt_siblings);
    // The workers as configured must fit beside the crypto cores.
    let split = split.filter(|s| config.workers.is_none_or(|w| w <= s.workers.len()));
    let measured = measure.and_then(|w| measure_after_effect(w, &allowed, split.is_some()));
    let placement = match config.crypto.simd {
        Placement::Auto => match &measured {
            Some(m) => m.auto.placement,
            None => Placement::Inline,
        },
        chosen => chosen,
    };
    if placement != Placement::Dedicated {
        return Ok(inline(measured));
    }
    let Some(split) = split else {
        return Err(PlacementError::NoDedicatedCore {
            config: config.source.clone(),
            crypto_cores,
            allowed,
            workers: config.workers,
        }
        .into());
    };
    Ok(Placed {
        workers: config.workers.unwrap_or(split.workers.len()),
        dedicated: Some(split),
        crypto_cores,
        measured,
    })
}

/// The CPUs this process may use (its affinity mask); CPU 0 if the kernel will not say.
fn allowed_cpus() -> Vec<usize> {
    terminus_sys::allowed_cpus()
        .ok()
        .filter(|c| !c.is_empty())
        .unwrap_or_else(|| vec![0])
}

/// The after-effect of `workload`'s batches on the first CPU this process may use (some
/// 75 ms, on a thread pinned there; the neighbour core, 285 ms more, only where that
/// core shows an after-effect, since only then can it change the choice), and what
/// `auto` would choose from it with or without a `spare_core`; logged. `None` where it
/// could not be measured.
fn measure_after_effect(
    workload: &Workload,
    allowed: &[usize],
    spare_core: bool,
) -> Option<Measured> {
    let this = *allowed.first()?;
    let measured = (|| {
        let mut settings = after_effect::Settings::default();
        let alone = after_effect::measure_on(this, workload, &settings)?;
        if alone.same_core.loss() <= simd::placement::NOISE_FLOOR {
            return Ok(alone);
        }
        settings.neighbour = after_effect::neighbour_of(this, allowed);
        after_effect::measure_on(this, workload, &settings)
    })();
    let effect = match measured {
        Ok(effect) => effect,
        Err(e) => {
            tracing::warn!("the after-effect of crypto_mb batches was not measured: {e}");
            return None;
        }
    };
    let ratio = effect.same_core;
    let auto = simd::decide(&Inputs::measured(
        true,
        ratio.loss(),
        effect.neighbour_loss(),
        spare_core,
    ));
    tracing::info!(
        "crypto_mb batches ({}) leave scalar code on CPU {this} at {ratio} of its speed; crypto.simd = \"auto\" would choose {}: {}",
        workload.op.name(),
        auto.placement.name(),
        auto.why
    );
    Some(Measured {
        op: workload.op,
        ratio,
        auto,
    })
}
