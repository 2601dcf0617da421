//! The machine's crypto capacity as this server sees it: measured at start-up and on
//! reload (what each configured operation costs with the backend, in ACU; the crossovers
//! the multibuffer backend batches by, from the same timings), the tenants charged by
//! those costs, and how both are reported: Prometheus series and the `GET /capacity`
//! table ([`report`]).

mod report;

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use terminus_capacity::tenant::Tenants;
use terminus_engine::capacity::{scu_per_core, AcuCosts, Capacity, CIPHERS};
use terminus_engine::cost::{crossover_label, Crossovers, Operation, Workload};
use terminus_engine::simd::{self, after_effect, Decision, Inputs, Ratio};
use terminus_engine::{BackendKind, KxGroup};

use crate::site::Site;

pub(crate) use report::CapacityReport;

/// How long SCU is measured per cipher at start-up.
const SCU_SAMPLE: Duration = Duration::from_millis(10);

/// The server's capacity: its backend and workers, its costs, its tenants.
pub struct Machine {
    pub(crate) backend: BackendKind,
    /// The machine's capacity counts one core per worker.
    pub(crate) workers: usize,
    /// The multibuffer backend's crossovers, measured with the costs.
    pub(crate) crossovers: Arc<Crossovers>,
    pub(crate) tenants: Arc<Tenants>,
    /// Mbps of each record cipher per core, by [`CIPHERS`]' order, once measured.
    pub(crate) scu: OnceLock<Vec<(&'static str, f64)>>,
    /// What crypto_mb batches cost scalar code afterwards, and what `crypto.simd =
    /// "auto"` would choose from it: measured once, with the multibuffer backend.
    pub(crate) simd: OnceLock<(Operation, Ratio, Decision)>,
}

impl Machine {
    /// Unmeasured: the costs of a scalar core until [`Machine::measure`].
    pub fn new(backend: BackendKind, workers: usize) -> Self {
        Self {
            backend,
            workers,
            crossovers: Arc::new(Crossovers::default()),
            tenants: Arc::new(Tenants::new(AcuCosts::unmeasured(workers))),
            scu: OnceLock::new(),
            simd: OnceLock::new(),
        }
    }

    /// Times every operation `site` can ask for (its certificates' signatures and every
    /// key-exchange group) with the backend, sets the tenants' costs and the crossovers
    /// from them, and logs what it found. Takes a few milliseconds per operation.
    pub fn measure(&self, site: &Site) {
        self.scu.get_or_init(|| {
            CIPHERS
                .into_iter()
                .map(|(name, cipher)| (name, scu_per_core(cipher, SCU_SAMPLE)))
                .collect()
        });
        let own: Vec<Workload> = site
            .signing_keys
            .iter()
            .filter_map(|k| Workload::for_key(k.clone()))
            .chain(
                KxGroup::ALL
                    .into_iter()
                    .filter_map(|g| Workload::for_group(g).ok()),
            )
            .collect();
        let mut workloads: Vec<&Workload> = own.iter().collect();
        if !own.iter().any(|w| w.op == Operation::Rsa2048) {
            workloads.push(unit());
        }
        let capacity = match Capacity::quick(self.backend, &workloads) {
            Ok(c) => c,
            Err(e) => {
                tracing::warn!("crypto capacity not measured ({e}); quotas are charged by a scalar core's costs");
                return;
            }
        };
        let costs = AcuCosts::from_capacity(&capacity, self.workers);
        if self.backend == BackendKind::Multibuffer {
            self.set_crossovers(&capacity);
            // Once per process: a reload does not change the CPU.
            if let Some(w) = own.first().filter(|_| self.simd.get().is_none()) {
                if let Some((ratio, decision)) = measure_after_effect(w, self.workers) {
                    let _ = self.simd.set((w.op, ratio, decision));
                }
            }
        }
        let summary: Vec<String> = capacity
            .rates
            .iter()
            .map(|r| format!("{} {:.3}", r.op.name(), costs.of(r.op).0))
            .collect();
        tracing::info!(
            "crypto capacity with the {} backend: {:.0} ACU per core, {:.0} for {} workers; ACU per operation: {}",
            self.backend.name(),
            costs.acu_per_core,
            costs.machine_acu(),
            self.workers,
            summary.join(", ")
        );
        self.tenants.set_costs(costs);
    }

    fn set_crossovers(&self, capacity: &Capacity) {
        let summary: Vec<String> = self
            .crossovers
            .set_from(capacity)
            .into_iter()
            .map(|(op, cost)| {
                format!(
                    "{} {} (scalar {:.0} us, 8-lane call {:.0} us)",
                    op.name(),
                    crossover_label(cost.crossover()),
                    cost.scalar.as_secs_f64() * 1e6,
                    cost.batch.as_secs_f64() * 1e6
                )
            })
            .collect();
        tracing::info!(
            "multibuffer crossovers measured on this CPU (smallest batch computed in one call): {}",
            summary.join(", ")
        );
    }

    /// The machine's committed ACU over all tenants, and what it has.
    pub fn committed(&self) -> (f64, f64) {
        let committed = self
            .tenants
            .all()
            .iter()
            .filter_map(|t| t.quota())
            .map(|q| q.acu)
            .sum();
        (committed, self.tenants.costs().machine_acu())
    }
}

/// The after-effect of `workload`'s batches on the first CPU this process may use (some
/// 75 ms, on a thread pinned there; the neighbour core, 285 ms more, only where that
/// core shows an after-effect, since only then can it change the choice), and what
/// `auto` would choose from it; logged. `None` where it could not be measured.
fn measure_after_effect(workload: &Workload, workers: usize) -> Option<(Ratio, Decision)> {
    let allowed = terminus_sys::allowed_cpus().unwrap_or_default();
    let this = *allowed.first()?;
    let measured = std::thread::scope(|s| {
        s.spawn(|| {
            terminus_sys::pin_current_thread(this)
                .map_err(|e| format!("pinning to CPU {this}: {e}"))?;
            let mut settings = after_effect::Settings::default();
            let alone = after_effect::measure(workload, &settings)?;
            if alone.same_core.loss() <= simd::placement::NOISE_FLOOR {
                return Ok(alone);
            }
            settings.neighbour = after_effect::neighbour_of(this, &allowed);
            after_effect::measure(workload, &settings)
        })
        .join()
        .unwrap_or_else(|_| Err("the measuring thread panicked".into()))
    });
    let effect = match measured {
        Ok(effect) => effect,
        Err(e) => {
            tracing::warn!("the after-effect of crypto_mb batches was not measured: {e}");
            return None;
        }
    };
    let neighbour = effect.neighbour_loss();
    let spare_core = workers < allowed.len();
    let ratio = effect.same_core;
    let decision = simd::decide(&Inputs::measured(true, ratio.loss(), neighbour, spare_core));
    tracing::info!(
        "crypto_mb batches ({}) leave scalar code on CPU {this} at {ratio} of its speed; crypto.simd = \"auto\" would choose {}: {}",
        workload.op.name(),
        decision.placement.name(),
        decision.why
    );
    Some((ratio, decision))
}

/// The RSA-2048 signature ACU are counted in, with a key generated once per process
/// (a configuration need not have an RSA-2048 certificate).
fn unit() -> &'static Workload {
    static UNIT: OnceLock<Workload> = OnceLock::new();
    UNIT.get_or_init(|| {
        Workload::generate(Operation::Rsa2048).expect("aws-lc generates RSA-2048 keys")
    })
}

/// The tenants' quotas as a fleet shares them: every tenant with a quota, what its
/// clients asked for and used here, and this instance's share set back on its account.
pub(crate) struct FleetQuotas(pub Arc<Tenants>);

impl terminus_fleet::shares::Quotas for FleetQuotas {
    fn tenants(&self) -> Vec<terminus_fleet::shares::TenantLoad> {
        self.0
            .all()
            .iter()
            .filter_map(|t| {
                let quota = t.quota()?;
                let usage = t.usage();
                Some(terminus_fleet::shares::TenantLoad {
                    name: t.name().to_owned(),
                    offered: usage.offered_acu,
                    used: usage.acu.iter().sum(),
                    quota: quota.acu,
                })
            })
            .collect()
    }

    fn set_share(&self, tenant: &str, share: f64) {
        if let Some(account) = self.0.get(tenant) {
            account.set_share(std::time::Instant::now(), share);
        }
    }
}
