//! What the ACME thread reports: each certificate's expiry and next renewal, and orders
//! by result.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::SystemTime;

use terminus_metrics::{label_values, Exposition, Kind, Labelled, Labels, Render};

use crate::store::CertKind;

/// Order results, in the metrics' order.
const RESULTS: [&str; 2] = ["issued", "failed"];

/// One certificate's times, Unix seconds: notAfter, and the next order (renewal or retry).
#[derive(Debug, Default, Clone, Copy)]
struct Times {
    expiry: Option<u64>,
    next: Option<u64>,
}

/// The ACME series.
pub struct AcmeMetrics {
    orders: Labelled<2>,
    /// Certificates taken from a fleet's store, and given to it.
    fleet: Labelled<2>,
    /// By (first name, key type).
    certificates: Mutex<BTreeMap<(String, &'static str), Times>>,
}

impl std::fmt::Debug for AcmeMetrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AcmeMetrics").finish_non_exhaustive()
    }
}

fn unix(t: SystemTime) -> u64 {
    t.duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

impl Default for AcmeMetrics {
    fn default() -> Self {
        Self {
            orders: Labelled::counter(
                "terminus_acme_orders_total",
                "ACME orders, by result.",
                label_values("result", RESULTS, &Labels::NONE),
            ),
            fleet: Labelled::counter(
                "terminus_acme_fleet_certificates_total",
                "ACME certificates taken from the fleet's store (another instance ordered them) and given to it.",
                label_values("way", ["taken", "given"], &Labels::NONE),
            ),
            certificates: Mutex::default(),
        }
    }
}

impl AcmeMetrics {
    fn entry(&self, name: &str, kind: CertKind, f: impl FnOnce(&mut Times)) {
        let mut map = self
            .certificates
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        f(map.entry((name.to_owned(), kind.name())).or_default())
    }

    pub(crate) fn expires(&self, name: &str, kind: CertKind, at: SystemTime) {
        self.entry(name, kind, |e| e.expiry = Some(unix(at)));
    }

    pub(crate) fn next(&self, name: &str, kind: CertKind, at: SystemTime) {
        self.entry(name, kind, |e| e.next = Some(unix(at)));
    }

    pub(crate) fn fleet(&self, taken: bool) {
        self.fleet.inc(usize::from(!taken));
    }

    pub(crate) fn ordered(&self, issued: bool) {
        self.orders.inc(usize::from(!issued));
    }
}

impl Render for AcmeMetrics {
    fn render(&self, out: &mut Exposition) {
        self.orders.render(out);
        self.fleet.render(out);
        let map = self
            .certificates
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        for (series, help, pick) in [
            (
                "terminus_acme_certificate_expiry_seconds",
                "When each ACME certificate expires (notAfter), Unix seconds.",
                0,
            ),
            (
                "terminus_acme_next_renewal_seconds",
                "When each ACME certificate is next ordered (renewal, or retry after a failure), Unix seconds.",
                1,
            ),
        ] {
            out.header(series, Kind::Gauge, help);
            for ((name, key), times) in map.iter() {
                let value = if pick == 0 { times.expiry } else { times.next };
                if let Some(v) = value {
                    out.sample(series, &Labels::of([("name", name), ("key", key)]), v);
                }
            }
        }
    }
}
