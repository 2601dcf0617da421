//! The machine's crypto capacity as this server sees it: measured at start-up and on
//! reload (what each configured operation costs with the backend, in ACU; the crossovers
//! the multibuffer backend batches by, from the same timings), the tenants charged by
//! those costs, and how both are reported: Prometheus series and the `GET /capacity`
//! table ([`report`]).

mod report;

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use terminus_admission::tenant::Tenants;
use terminus_capacity::simd;
use terminus_capacity::{scu_per_core, AcuCosts, Capacity, CIPHERS};
use terminus_engine::cost::{crossover_label, Crossovers, Operation, Workload};
use terminus_engine::{BackendKind, KxGroup};

use crate::placement::Placed;
use crate::site::Site;

pub(crate) use report::CapacityReport;

/// How long SCU is measured per cipher at start-up.
const SCU_SAMPLE: Duration = Duration::from_millis(10);

/// The server's capacity: its backend and workers, its costs, its tenants.
pub struct Machine {
    pub(crate) backend: BackendKind,
    /// The multibuffer backend's crossovers, measured with the costs.
    pub(crate) crossovers: Arc<Crossovers>,
    pub(crate) tenants: Arc<Tenants>,
    /// Mbps of each record cipher per core, by [`CIPHERS`]' order, once measured.
    pub(crate) scu: OnceLock<Vec<(&'static str, f64)>>,
    /// Where crypto_mb batches run, and what start-up measured of their after-effect.
    pub(crate) simd: Placed,
}

impl Machine {
    /// Unmeasured: the costs of a scalar core until [`Machine::measure`].
    pub(crate) fn new(backend: BackendKind, simd: Placed) -> Self {
        Self {
            backend,
            crossovers: Arc::new(Crossovers::default()),
            tenants: Arc::new(Tenants::new(AcuCosts::unmeasured(simd.crypto_cores))),
            scu: OnceLock::new(),
            simd,
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
        let quick = || Capacity::quick(self.backend, &workloads).map_err(|e| e.to_string());
        let capacity = match self.on_crypto_cores(quick) {
            Ok(c) => c,
            Err(e) => {
                tracing::warn!("crypto capacity not measured ({e}); quotas are charged by a scalar core's costs");
                return;
            }
        };
        let costs = AcuCosts::from_capacity(&capacity, self.simd.crypto_cores);
        if self.backend == BackendKind::Multibuffer {
            self.set_crossovers(&capacity);
        }
        let summary: Vec<String> = capacity
            .rates
            .iter()
            .map(|r| format!("{} {:.3}", r.op.name(), costs.of(r.op).0))
            .collect();
        tracing::info!(
            "crypto capacity with the {} backend: {:.0} ACU per core, {:.0} for {}; ACU per operation: {}",
            self.backend.name(),
            costs.acu_per_core,
            costs.machine_acu(),
            self.crypto_cores(),
            summary.join(", ")
        );
        self.tenants.set_costs(costs);
    }

    fn set_crossovers(&self, capacity: &Capacity) {
        let summary: Vec<String> = capacity
            .costs()
            .into_iter()
            .map(|(op, cost)| {
                self.crossovers.set(op, cost.crossover());
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

    /// Runs `f` where handshake crypto runs: with dedicated cores on a thread confined to
    /// them (a measurement's crypto_mb batches must not run on a worker's core, at start-up
    /// or on reload: if the thread cannot be confined, nothing is measured), else here.
    /// On reload the measurement shares those cores with the live crypto threads, so its
    /// rates can come out somewhat low.
    fn on_crypto_cores<T: Send>(
        &self,
        f: impl FnOnce() -> Result<T, String> + Send,
    ) -> Result<T, String> {
        let Some(split) = &self.simd.dedicated else {
            return f();
        };
        let cpus = &split.crypto;
        std::thread::scope(|s| {
            s.spawn(|| {
                terminus_sys::run_current_thread_on(cpus)
                    .map_err(|e| format!("cannot run on the crypto CPUs {cpus:?}: {e}"))?;
                f()
            })
            .join()
            .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
        })
    }

    /// The cores the machine's capacity counts: those computing handshake crypto, one per
    /// worker or the dedicated ones (`crypto.simd`).
    pub(crate) fn crypto_cores(&self) -> String {
        match self.simd.placement() {
            simd::Placement::Dedicated => format!("{} dedicated cores", self.simd.crypto_cores),
            _ => format!("{} workers", self.simd.crypto_cores),
        }
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

/// The RSA-2048 signature ACU are counted in, with a key generated once per process
/// (a configuration need not have an RSA-2048 certificate).
pub(crate) fn unit() -> &'static Workload {
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
