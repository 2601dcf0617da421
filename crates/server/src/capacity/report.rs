//! How capacity is reported: Prometheus series for the machine and every tenant, and the
//! `GET /capacity` table (JSON), laid out like an appliance's crypto capacity page: the
//! machine's total, what is allocated to tenants, what is used and what is free.

use std::collections::BTreeMap;
use std::sync::Arc;

use serde_json::{json, Value};
use terminus_admission::tenant::{Class, QuotaRefusal, TenantAccount, Usage};
use terminus_capacity::simd::Placement;
use terminus_engine::cost::Operation;
use terminus_fleet::shares::TenantView;
use terminus_metrics::{Exposition, Kind, Labels, Render};

use super::Machine;

/// The machine's capacity and its tenants, for `/metrics` and `/capacity`.
#[derive(Clone)]
pub(crate) struct CapacityReport(pub(crate) Arc<Machine>);

impl std::fmt::Debug for CapacityReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CapacityReport")
            .field("backend", &self.0.backend)
            .finish_non_exhaustive()
    }
}

impl CapacityReport {
    /// The `GET /capacity` document; with `fleet`, what this instance knows of the
    /// fleet's quotas.
    pub(crate) fn json(&self, fleet: Option<BTreeMap<String, TenantView>>) -> String {
        let m = &self.0;
        let costs = m.tenants.costs();
        let tenants = m.tenants.all();
        let (allocated, total) = m.committed();
        let used: f64 = tenants.iter().map(|t| t.usage().acu_per_s).sum();
        let doc = json!({
            "backend": m.backend.name(),
            "workers": m.simd.workers,
            "crypto_cores": m.simd.crypto_cores,
            "simd": {
                "placement": m.simd.placement().name(),
                "crypto_cpus": m.simd.crypto_cpus(),
                "after_effect": m.simd.measured.as_ref().map(|x| json!({
                    "op": x.op.name(),
                    "ratio": x.ratio.median,
                    "low": x.ratio.low,
                    "high": x.ratio.high,
                    "auto": x.auto.placement.name(),
                    "why": x.auto.why,
                })),
            },
            "acu": {
                "per_core": round(costs.acu_per_core),
                "total": round(total),
                "allocated": round(allocated),
                "free": round((total - allocated).max(0.0)),
                "used_per_s": round(used),
            },
            "scu_per_core": m.scu.get().map(|scu| {
                scu.iter().map(|(name, mbps)| (name.to_string(), json!(round(*mbps)))).collect::<serde_json::Map<_, _>>()
            }),
            "acu_cost": Operation::ALL.iter().map(|op| {
                let (acu, measured) = costs.of(*op);
                (op.name().to_owned(), json!({ "acu": (acu * 1e4).round() / 1e4, "measured": measured }))
            }).collect::<serde_json::Map<_, _>>(),
            "tenants": tenants.iter().map(|t| tenant(t)).collect::<Vec<_>>(),
            "fleet": fleet.map(|view| fleet_json(&view)),
        });
        let mut text = serde_json::to_string_pretty(&doc).expect("JSON of plain values");
        text.push('\n');
        text
    }
}

/// Each tenant's split of its quota among the instances this one sees.
fn fleet_json(view: &BTreeMap<String, TenantView>) -> Value {
    let instances = view.values().map(|v| v.instances.len()).max().unwrap_or(0);
    json!({
        "instances": instances,
        "tenants": view.iter().map(|(name, v)| {
            (name.clone(), json!({
                "share": (v.share * 1e4).round() / 1e4,
                "instances": v.instances.iter().map(|(id, share, report)| json!({
                    "id": id,
                    "share": (share * 1e4).round() / 1e4,
                    "demand_acu_per_s": round(report.demand),
                    "used_acu_per_s": round(report.used),
                })).collect::<Vec<_>>(),
            }))
        }).collect::<serde_json::Map<_, _>>(),
    })
}

fn tenant(t: &TenantAccount) -> Value {
    let usage = t.usage();
    let quota = t.quota().map(|q| {
        json!({
            "acu": q.acu,
            "acu_peak": q.acu_peak,
            "scu": q.scu,
            "over_quota": q.over_quota.name(),
            "max_wait_ms": q.max_wait.as_secs_f64() * 1e3,
        })
    });
    let free = t.quota().map(|q| round((q.acu - usage.acu_per_s).max(0.0)));
    let by_class = |values: [f64; 3]| {
        Class::ALL
            .iter()
            .map(|c| (c.name().to_owned(), json!(round(values[*c as usize]))))
            .collect::<serde_json::Map<_, _>>()
    };
    json!({
        "name": t.name(),
        "quota": quota,
        "share": (usage.share * 1e4).round() / 1e4,
        "used_acu_per_s": round(usage.acu_per_s),
        "free_acu_per_s": free,
        "acu_total": by_class(usage.acu),
        "handshakes_admitted": by_class(usage.admitted.map(|n| n as f64)),
        "handshakes_refused": QuotaRefusal::ALL.iter().map(|c| (c.name().to_owned(), json!(usage.refused[*c as usize]))).collect::<serde_json::Map<_, _>>(),
        "waiting": usage.waiting,
        "bulk_bytes": usage.bulk_bytes,
        "paced_writes": usage.paced_writes,
        "paced_seconds": usage.paced_seconds,
    })
}

fn round(x: f64) -> f64 {
    (x * 10.0).round() / 10.0
}

impl Render for CapacityReport {
    fn render(&self, out: &mut Exposition) {
        let m = &self.0;
        render_costs(m, out);
        render_simd(m, out);
        render_tenants(m, out);
    }
}

/// The machine's capacity: ACU per core and in all, what each operation costs, SCU.
fn render_costs(m: &Machine, out: &mut Exposition) {
    let costs = m.tenants.costs();
    out.header(
        "terminus_admission_acu",
        Kind::Gauge,
        "ACU (RSA-2048 private-key operations per second) with the crypto backend, per core and for the workers' cores, measured at start-up.",
    );
    out.sample(
        "terminus_admission_acu",
        &Labels::of([("scope", "core")]),
        costs.acu_per_core,
    );
    out.sample(
        "terminus_admission_acu",
        &Labels::of([("scope", "machine")]),
        costs.machine_acu(),
    );
    out.header(
        "terminus_admission_acu_cost",
        Kind::Gauge,
        "What one operation costs in ACU with the crypto backend; measured=\"0\": a scalar core's ratio, not measured here.",
    );
    for op in Operation::ALL {
        let (acu, measured) = costs.of(op);
        let labels = Labels::NONE
            .with("op", op.name())
            .with("measured", u8::from(measured));
        out.sample("terminus_admission_acu_cost", &labels, acu);
    }
    if let Some(scu) = m.scu.get() {
        out.header(
            "terminus_admission_scu",
            Kind::Gauge,
            "SCU (Mbps of 16 KiB records sealed) per core, by cipher.",
        );
        for (name, mbps) in scu {
            out.sample(
                "terminus_admission_scu",
                &Labels::of([("cipher", name)]),
                mbps,
            );
        }
    }
}

/// Where crypto_mb's batches run, and why: the crossovers, the placement, the measured
/// after-effect and what `auto` would choose from it.
fn render_simd(m: &Machine, out: &mut Exposition) {
    if m.backend == terminus_engine::BackendKind::Multibuffer {
        m.crossovers.render(out);
    }
    if m.backend == terminus_engine::BackendKind::Multibuffer {
        out.header(
            "terminus_crypto_simd",
            Kind::Gauge,
            "Where crypto_mb batches run (crypto.simd; 1 for the placement in force).",
        );
        for p in [Placement::Inline, Placement::Dedicated] {
            let chosen = u8::from(m.simd.placement() == p);
            out.sample(
                "terminus_crypto_simd",
                &Labels::of([("placement", p.name())]),
                chosen,
            );
        }
    }
    if let Some(measured) = &m.simd.measured {
        let (op, ratio, decision) = (measured.op, measured.ratio, &measured.auto);
        out.header(
            "terminus_crypto_mb_after_effect",
            Kind::Gauge,
            "Scalar code's speed on a core right after crypto_mb batches over after scalar work, measured at start-up (1: no AVX-512 frequency after-effect).",
        );
        let labels = Labels::of([("op", op.name())]);
        out.sample("terminus_crypto_mb_after_effect", &labels, ratio.median);
        out.header(
            "terminus_crypto_simd_auto",
            Kind::Gauge,
            "What crypto.simd = \"auto\" would choose from the measured after-effect (1 for the placement chosen).",
        );
        for p in [Placement::Inline, Placement::Dedicated] {
            let chosen = u8::from(decision.placement == p);
            out.sample(
                "terminus_crypto_simd_auto",
                &Labels::of([("placement", p.name())]),
                chosen,
            );
        }
    }
}

/// Each tenant's quota, use, admissions, refusals and pacing.
fn render_tenants(m: &Machine, out: &mut Exposition) {
    let tenants = m.tenants.all();
    let usages: Vec<_> = tenants.iter().map(|t| (t, t.usage())).collect();
    let label = |t: &TenantAccount| Labels::of([("tenant", t.name())]);
    // One sample per tenant, or per tenant and `key="value"` for each of `values`.
    let each = |value: &dyn Fn(&Usage) -> f64| -> Vec<(Labels, f64)> {
        usages.iter().map(|(t, u)| (label(t), value(u))).collect()
    };
    let by = |key: &str, values: &dyn Fn(&Usage) -> Vec<(&'static str, f64)>| {
        usages
            .iter()
            .flat_map(|(t, u)| {
                values(u)
                    .into_iter()
                    .map(move |(v, n)| (label(t).with(key, v), n))
            })
            .collect::<Vec<_>>()
    };
    let classes = |counts: &[f64]| Class::ALL.map(|c| (c.name(), counts[c as usize])).to_vec();
    out.family(
        "terminus_tenant_quota_acu",
        Kind::Gauge,
        "A tenant's quota: committed and peak ACU per second.",
        usages
            .iter()
            .filter_map(|(t, _)| t.quota().map(|q| (t, q)))
            .flat_map(|(t, q)| {
                [("committed", q.acu), ("peak", q.acu_peak)]
                    .map(|(limit, acu)| (label(t).with("limit", limit), acu))
            }),
    );
    out.family(
        "terminus_tenant_acu_total",
        Kind::Counter,
        "ACU charged to a tenant's handshakes, by whose capacity they used (committed, borrowed; unmetered: a tenant without a quota).",
        by("class", &|u| classes(&u.acu)),
    );
    out.family(
        "terminus_tenant_acu_per_second",
        Kind::Gauge,
        "ACU a tenant used in the last whole second.",
        each(&|u| u.acu_per_s),
    );
    out.family(
        "terminus_tenant_crypto_ops_total",
        Kind::Counter,
        "Crypto operations computed for a tenant's handshakes, by operation.",
        by("op", &|u| {
            Operation::ALL
                .iter()
                .zip(u.ops)
                .filter(|(_, n)| *n > 0)
                .map(|(op, n)| (op.name(), n as f64))
                .collect()
        }),
    );
    out.family(
        "terminus_tenant_handshakes_admitted_total",
        Kind::Counter,
        "A tenant's handshakes admitted (by its quota, then taken on by admission control), by whose capacity they use.",
        by("class", &|u| classes(&u.admitted.map(|n| n as f64))),
    );
    out.family(
        "terminus_tenant_handshakes_refused_total",
        Kind::Counter,
        "A tenant's handshakes refused by its quota, by cause.",
        by("cause", &|u| {
            QuotaRefusal::ALL
                .map(|c| (c.name(), u.refused[c as usize] as f64))
                .to_vec()
        }),
    );
    out.family(
        "terminus_tenant_quota_waiting",
        Kind::Gauge,
        "A tenant's handshakes waiting for its quota now.",
        each(&|u| u.waiting as f64),
    );
    out.family(
        "terminus_tenant_bulk_bytes_total",
        Kind::Counter,
        "Bytes a tenant with an SCU quota sent after its handshakes.",
        each(&|u| u.bulk_bytes as f64),
    );
    out.family(
        "terminus_tenant_paced_writes_total",
        Kind::Counter,
        "Writes that waited for their tenant's SCU quota.",
        each(&|u| u.paced_writes as f64),
    );
    out.family(
        "terminus_tenant_paced_seconds_total",
        Kind::Counter,
        "How long writes waited for their tenant's SCU quota, in all.",
        each(&|u| u.paced_seconds),
    );
    out.header(
        "terminus_tenant_quota_wait_seconds",
        Kind::Histogram,
        "How long a tenant's queued handshakes waited for its quota.",
    );
    for (t, _) in &usages {
        t.waits()
            .render(out, "terminus_tenant_quota_wait_seconds", &label(t));
    }
}
