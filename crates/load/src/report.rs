//! The run's result: a human table and the `--json` object.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use serde::Serialize;
use terminus_engine::{EngineMetrics, KxGroup, OpKind};

use crate::stats::{Percentiles, Phase, Stats};

/// Everything a run measured. Serialized as the `--json` output.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    /// How the run was set up (flattened into the JSON object).
    #[serde(flatten)]
    pub run: RunInfo,
    /// Requests answered with a 1xx-3xx status.
    pub requests: u64,
    /// Requests scheduled (open loop) or started (closed loop).
    pub issued: u64,
    /// Failed requests by kind (see `failure.rs`).
    pub errors: BTreeMap<String, u64>,
    pub errors_total: u64,
    /// From the first scheduled request to the last answer.
    pub duration_s: f64,
    /// Achieved: `requests / duration_s`.
    pub rate: f64,
    pub handshakes: u64,
    pub resumed_handshakes: u64,
    /// "TLSv1.3 TLS13_AES_256_GCM_SHA384 X25519" -> handshakes.
    pub negotiated: BTreeMap<String, u64>,
    /// `connect`, `handshake`, `request` (answered), `failed` (until the failure): count,
    /// mean, p50, p90, p95, p99, p999, max (ms).
    pub latency_ms: BTreeMap<&'static str, Percentiles>,
    /// user+system CPU of the load generator over the run.
    pub client_cpu_s: f64,
    /// Client CPU per request (and so per handshake with --new-connection), µs.
    pub client_cpu_us_per_request: f64,
    /// `--batch-kx`: what the client's crypto engine did (absent otherwise).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kx_engine: Option<KxEngineReport>,
}

/// The client's key exchanges through the engine, over every load thread.
#[derive(Debug, Clone, Serialize)]
pub struct KxEngineReport {
    /// `multibuffer` (crypto_mb, AVX-512 IFMA) or `scalar`.
    pub backend: &'static str,
    /// Key generations and shared secrets submitted.
    pub requests: u64,
    /// Batches the engine flushed, and the requests in them.
    pub batches: u64,
    pub mean_batch: f64,
    /// Requests the multibuffer backend computed one by one (batch below its crossover).
    pub scalar_computed: u64,
}

impl KxEngineReport {
    pub fn new(metrics: &EngineMetrics) -> Self {
        let sum = |f: fn(&EngineMetrics, OpKind) -> u64| -> u64 {
            KxGroup::ALL
                .into_iter()
                .map(|g| f(metrics, g.op_kind()))
                .sum()
        };
        let batches = sum(EngineMetrics::batches);
        KxEngineReport {
            backend: metrics.backend().name(),
            requests: sum(EngineMetrics::requests),
            batches,
            mean_batch: sum(EngineMetrics::batched_requests) as f64 / batches.max(1) as f64,
            scalar_computed: sum(EngineMetrics::scalar_computed),
        }
    }
}

impl Report {
    pub fn new(run: RunInfo, stats: &Stats, duration_s: f64, client_cpu_s: f64) -> Report {
        let latency_ms = Phase::ALL
            .iter()
            .map(|p| (p.name(), stats.latency(*p).percentiles()))
            .collect();
        let finished = stats.ok + stats.errors_total();
        Report {
            run,
            requests: stats.ok,
            issued: stats.issued,
            errors: stats.errors.clone(),
            errors_total: stats.errors_total(),
            duration_s,
            rate: if duration_s > 0.0 {
                stats.ok as f64 / duration_s
            } else {
                0.0
            },
            handshakes: stats.handshakes,
            resumed_handshakes: stats.resumed,
            negotiated: stats.negotiated.clone(),
            latency_ms,
            client_cpu_s,
            client_cpu_us_per_request: if finished > 0 {
                client_cpu_s * 1e6 / finished as f64
            } else {
                0.0
            },
            kx_engine: None,
        }
    }

    pub fn json(&self) -> String {
        serde_json::to_string_pretty(self).expect("a report always serializes")
    }

    /// The table printed without `--json`.
    pub fn text(&self) -> String {
        let mut out = String::new();
        let how = match self.run.target_rate {
            Some(r) => format!(
                "open loop at {r} req/s (at most {} connections)",
                self.run.connections
            ),
            None => format!("closed loop, {} connections", self.run.connections),
        };
        let reuse = match (self.run.new_connection, self.run.resume) {
            (true, true) => "new connection per request, sessions resumed",
            (true, false) => "new connection and full handshake per request",
            (false, _) => "keep-alive",
        };
        let _ = writeln!(
            out,
            "{}: {how}, {} thread(s), {reuse}{}",
            self.run.url,
            self.run.threads,
            match self.run.http {
                "HTTP/1.1" => String::new(),
                other => format!(", {other}"),
            }
        );
        let _ = writeln!(
            out,
            "  {} requests in {:.2} s: {:.1} req/s; {} errors of {} issued",
            self.requests, self.duration_s, self.rate, self.errors_total, self.issued
        );
        let _ = writeln!(
            out,
            "  {} handshakes ({} resumed); client CPU {:.2} s, {:.0} us per request",
            self.handshakes,
            self.resumed_handshakes,
            self.client_cpu_s,
            self.client_cpu_us_per_request
        );
        for (what, n) in &self.negotiated {
            let _ = writeln!(out, "    {what}: {n}");
        }
        if let Some(kx) = &self.kx_engine {
            let _ = writeln!(
                out,
                "  key exchanges through the {} engine: {} in {} batches (mean {:.1}), {} computed one by one",
                kx.backend, kx.requests, kx.batches, kx.mean_batch, kx.scalar_computed
            );
        }
        let _ = writeln!(
            out,
            "\n  latency (ms)      p50       p90       p99     p99.9       max     count"
        );
        for phase in Phase::ALL {
            let p = self.latency_ms[phase.name()];
            if matches!(phase, Phase::Failed | Phase::AfterIdle) && p.count == 0 {
                continue;
            }
            let _ = writeln!(
                out,
                "  {:<10} {:>9.3} {:>9.3} {:>9.3} {:>9.3} {:>9.3} {:>9}",
                phase.name(),
                p.p50,
                p.p90,
                p.p99,
                p.p999,
                p.max,
                p.count
            );
        }
        if !self.errors.is_empty() {
            let _ = writeln!(out, "\n  errors");
            for (kind, n) in &self.errors {
                let _ = writeln!(out, "    {kind:<36} {n}");
            }
        }
        out
    }
}

/// How the run was set up.
#[derive(Debug, Clone, Serialize)]
pub struct RunInfo {
    pub url: String,
    /// `"rate"` (open loop) or `"connections"` (closed loop).
    pub mode: &'static str,
    /// Open loop: the offered requests/s.
    pub target_rate: Option<f64>,
    /// Closed loop: connections; open loop: the cap on connections at once.
    pub connections: usize,
    pub threads: usize,
    pub new_connection: bool,
    pub resume: bool,
    /// `"HTTP/1.1"`, `"HTTP/2"` or `"HTTP/3"`.
    pub http: &'static str,
}
