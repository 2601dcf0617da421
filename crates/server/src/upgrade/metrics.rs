//! The handover's series: this process's generation, what the process it replaced
//! still holds while it drains (it reports its open connections every second over the
//! control connection), and the upgrades this process tried that failed.

use std::sync::atomic::{AtomicU64, Ordering};

use terminus_metrics::{Exposition, Kind, Labels, Render};

/// The process-wide figures (one process, one handover at a time).
pub(crate) struct UpgradeMetrics {
    generation: AtomicU64,
    predecessor_connections: AtomicU64,
    failures: AtomicU64,
}

/// See [`UpgradeMetrics`].
pub(crate) static UPGRADE: UpgradeMetrics = UpgradeMetrics {
    generation: AtomicU64::new(1),
    predecessor_connections: AtomicU64::new(0),
    failures: AtomicU64::new(0),
};

impl UpgradeMetrics {
    pub(crate) fn generation(&self, generation: u64) {
        self.generation.store(generation, Ordering::Relaxed);
    }

    /// What the process this one replaced still has open (0 once it has exited).
    pub(crate) fn predecessor_connections(&self, open: u64) {
        self.predecessor_connections.store(open, Ordering::Relaxed);
    }

    pub(crate) fn failed(&self) {
        self.failures.fetch_add(1, Ordering::Relaxed);
    }
}

impl Render for UpgradeMetrics {
    fn render(&self, out: &mut Exposition) {
        out.header(
            "terminus_process_generation",
            Kind::Gauge,
            "This process's generation: 1 for a process started as such, one more for each `terminus upgrade` since.",
        );
        out.sample(
            "terminus_process_generation",
            &Labels::NONE,
            self.generation.load(Ordering::Relaxed),
        );
        out.header(
            "terminus_upgrade_predecessor_connections",
            Kind::Gauge,
            "Connections the process this one replaced still serves while it drains (0 once it has exited).",
        );
        out.sample(
            "terminus_upgrade_predecessor_connections",
            &Labels::NONE,
            self.predecessor_connections.load(Ordering::Relaxed),
        );
        out.header(
            "terminus_upgrade_failures_total",
            Kind::Counter,
            "Upgrades this process tried that failed (the new process did not start, or died, or went quiet): this process served on.",
        );
        out.sample(
            "terminus_upgrade_failures_total",
            &Labels::NONE,
            self.failures.load(Ordering::Relaxed),
        );
    }
}
