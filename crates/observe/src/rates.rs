//! What changed between two scrapes of `/metrics`, per second: handshakes full and
//! resumed, where their time went (each phase's p50, p99, mean and share), how full the
//! crypto batches were, errors by cause, each worker's load. `terminus top` shows it, and
//! so does the admin listener's status page: one computation, so the two never disagree.

use std::collections::BTreeMap;

use serde_json::{json, Map, Value};

use crate::scrape::{Histogram, Scrape};
use crate::Phase;

/// The whole handshake's histogram (accept to its end).
const TOTAL: &str = "terminus_handshake_duration_seconds";
/// Each phase's histogram.
const PHASE: &str = "terminus_handshake_phase_seconds";

/// The per-second change of the series `name` (its label sets matching `filter` summed)
/// from `a` to `b`, `seconds` apart; never negative (a counter that went back, a series
/// that is gone, counts as no change).
pub fn rate(a: &Scrape, b: &Scrape, seconds: f64, name: &str, filter: &[(&str, &str)]) -> f64 {
    ((b.sum(name, filter) - a.sum(name, filter)) / seconds.max(1e-3)).max(0.0)
}

/// A phase's (or the whole handshake's) latency over the interval, in seconds.
#[derive(Debug, Clone, Copy, Default)]
pub struct Latency {
    /// The median; `None` without observations.
    pub p50: Option<f64>,
    /// The 99th percentile.
    pub p99: Option<f64>,
    /// The mean.
    pub mean: Option<f64>,
}

impl Latency {
    fn of(h: &Histogram) -> Self {
        Self {
            p50: h.quantile(0.5),
            p99: h.quantile(0.99),
            mean: h.mean(),
        }
    }

    fn json(&self) -> Value {
        let ms = |s: Option<f64>| s.map(|s| round(s * 1e3, 3));
        json!({ "p50_ms": ms(self.p50), "p99_ms": ms(self.p99), "mean_ms": ms(self.mean) })
    }
}

/// One crypto operation's traffic over the interval, per second.
#[derive(Debug, Clone, Copy)]
pub struct Crypto {
    /// Requests.
    pub requests: f64,
    /// Batches handed to the backend.
    pub batches: f64,
    /// Requests in those batches.
    pub batched: f64,
    /// Requests in the engine's queues now.
    pub queued: f64,
    /// The multibuffer backend's crossover batch (9: never batched); `None` for the others.
    pub crossover: Option<f64>,
}

impl Crypto {
    /// Requests per batch; `None` without batches.
    pub fn fill(&self) -> Option<f64> {
        (self.batches > 0.0).then(|| self.batched / self.batches)
    }
}

/// One worker over the interval.
#[derive(Debug, Clone, Copy)]
pub struct Worker {
    /// Completed handshakes per second.
    pub handshakes: f64,
    /// Connections open now.
    pub open: f64,
    /// Share of one core, 0 to 1; `None` where the kernel's figures were not read.
    pub busy: Option<f64>,
}

/// A terminator's traffic to one keyless signer over the interval.
#[derive(Debug, Clone, Default)]
pub struct Signer {
    /// Signatures answered per second.
    pub signatures: f64,
    /// Failed requests per second, by cause.
    pub failures: BTreeMap<String, f64>,
    /// Request sent to answer read.
    pub round_trip: Latency,
}

/// This instance's own signing for keyless terminators over the interval.
#[derive(Debug, Clone, Default)]
pub struct Signing {
    /// Requests answered per second, by outcome (`signed`, or the error).
    pub requests: BTreeMap<String, f64>,
    /// Read to answered: the signer's queue and batch.
    pub time: Latency,
}

/// What changed between two scrapes, per second.
#[derive(Debug, Clone)]
pub struct Rates {
    /// The seconds between the scrapes.
    pub seconds: f64,
    /// The crypto backend's name.
    pub backend: String,
    /// Full handshakes per second.
    pub full: f64,
    /// Resumed handshakes per second.
    pub resumed: f64,
    /// HTTP responses per second (every status, every protocol).
    pub requests: f64,
    /// Failed handshakes per second, by reason.
    pub failed: BTreeMap<String, f64>,
    /// Refused handshakes per second, by cause.
    pub refused: BTreeMap<String, f64>,
    /// The whole handshake's latency.
    pub total: Latency,
    /// Each phase's latency and its share of all handshakes' time.
    pub phases: Vec<(Phase, Latency, f64)>,
    /// From the handshake's end to the first response.
    pub first_response: Latency,
    /// By operation.
    pub crypto: BTreeMap<String, Crypto>,
    /// Connections open now.
    pub open: f64,
    /// Connections handed to kernel TLS per second.
    pub ktls: f64,
    /// Connections left in userspace TLS per second.
    pub userspace: f64,
    /// By worker (its number).
    pub workers: BTreeMap<String, Worker>,
    /// Keyless signers this terminator asked, by address.
    pub signers: BTreeMap<String, Signer>,
    /// Signing for keyless terminators, where this instance is a signer that answered.
    pub signing: Option<Signing>,
}

impl Rates {
    /// From `before` to `now` (each a scrape and when it was read, in seconds on any one
    /// clock), with the crypto backend named `backend`.
    pub fn between(before: (f64, &Scrape), now: (f64, &Scrape), backend: &str) -> Self {
        let seconds = (now.0 - before.0).max(1e-3);
        let (a, b) = (before.1, now.1);
        let rate = |name: &str, filter: &[(&str, &str)]| rate(a, b, seconds, name, filter);
        let rates = |name: &str, label: &str| {
            let earlier = a.by(name, label, &[]);
            b.by(name, label, &[])
                .into_iter()
                .map(|(k, v)| {
                    let d = v - earlier.get(&k).copied().unwrap_or(0.0);
                    (k, (d / seconds).max(0.0))
                })
                .filter(|(_, v)| *v > 0.0)
                .collect::<BTreeMap<_, _>>()
        };
        let histogram = |name: &str, filter: &[(&str, &str)]| {
            b.histogram(name, filter).since(&a.histogram(name, filter))
        };
        let total = histogram(TOTAL, &[]);
        let phases = Phase::ALL
            .iter()
            .map(|&p| {
                let h = histogram(PHASE, &[("phase", p.name())]);
                let share = if total.sum > 0.0 {
                    h.sum / total.sum
                } else {
                    0.0
                };
                (p, Latency::of(&h), share)
            })
            .collect();
        let mut crypto = BTreeMap::new();
        let crossovers = b.by("terminus_crypto_crossover", "op", &[]);
        for (op, requests) in rates("terminus_crypto_requests_total", "op") {
            let filter = [("op", op.as_str())];
            crypto.insert(
                op.clone(),
                Crypto {
                    requests,
                    batches: rate("terminus_crypto_batches_total", &filter),
                    batched: rate("terminus_crypto_batched_requests_total", &filter),
                    queued: b.sum("terminus_crypto_queue_depth", &filter),
                    crossover: crossovers.get(&op).copied(),
                },
            );
        }
        let earlier_cpu = a.by("terminus_worker_cpu_seconds_total", "worker", &[]);
        let cpu = b.by("terminus_worker_cpu_seconds_total", "worker", &[]);
        let handshakes = rates("terminus_worker_handshakes_total", "worker");
        let workers = b
            .by("terminus_worker_connections_open", "worker", &[])
            .into_iter()
            .map(|(w, open)| {
                let busy = match (cpu.get(&w), earlier_cpu.get(&w)) {
                    (Some(now), Some(then)) => Some(((now - then) / seconds).clamp(0.0, 1.0)),
                    _ => None,
                };
                let handshakes = handshakes.get(&w).copied().unwrap_or(0.0);
                (
                    w,
                    Worker {
                        handshakes,
                        open,
                        busy,
                    },
                )
            })
            .collect();
        let mut signers: BTreeMap<String, Signer> = BTreeMap::new();
        for (signer, _) in b.by("terminus_keyless_signatures_total", "signer", &[]) {
            let filter = [("signer", signer.as_str())];
            let failures = {
                let earlier = a.by("terminus_keyless_failures_total", "cause", &filter);
                b.by("terminus_keyless_failures_total", "cause", &filter)
                    .into_iter()
                    .map(|(k, v)| {
                        (
                            k.clone(),
                            ((v - earlier.get(&k).copied().unwrap_or(0.0)) / seconds).max(0.0),
                        )
                    })
                    .filter(|(_, v)| *v > 0.0)
                    .collect()
            };
            signers.insert(
                signer.clone(),
                Signer {
                    signatures: rate("terminus_keyless_signatures_total", &filter),
                    failures,
                    round_trip: Latency::of(&histogram(
                        "terminus_keyless_round_trip_seconds",
                        &filter,
                    )),
                },
            );
        }
        let signing_requests = rates("terminus_signer_requests_total", "outcome");
        let signing = (!signing_requests.is_empty()).then(|| Signing {
            requests: signing_requests,
            time: Latency::of(&histogram("terminus_signer_request_seconds", &[])),
        });
        Self {
            seconds,
            backend: backend.to_owned(),
            full: histogram(TOTAL, &[("mode", "full")]).count / seconds,
            resumed: histogram(TOTAL, &[("mode", "resumed")]).count / seconds,
            requests: rate("terminus_http_responses_total", &[]),
            failed: rates("terminus_handshake_failures_total", "reason"),
            refused: rates("terminus_handshakes_refused_total", "cause"),
            total: Latency::of(&total),
            phases,
            first_response: Latency::of(&histogram(
                "terminus_handshake_to_first_response_seconds",
                &[],
            )),
            crypto,
            open: b.sum("terminus_connections_open", &[]),
            ktls: rate(
                "terminus_connections_by_data_path_total",
                &[("path", "ktls")],
            ),
            userspace: rate(
                "terminus_connections_by_data_path_total",
                &[("path", "userspace")],
            ),
            workers,
            signers,
            signing,
        }
    }

    /// The share of new connections kernel TLS took; `None` without any.
    pub fn ktls_share(&self) -> Option<f64> {
        let all = self.ktls + self.userspace;
        (all > 0.0).then(|| self.ktls / all)
    }

    /// Requests per batch over every operation; `None` without batches.
    pub fn fill(&self) -> Option<f64> {
        let batches: f64 = self.crypto.values().map(|c| c.batches).sum();
        let batched: f64 = self.crypto.values().map(|c| c.batched).sum();
        (batches > 0.0).then(|| batched / batches)
    }

    /// `terminus top --json`'s document.
    pub fn json(&self) -> Value {
        let phases: Map<String, Value> = self
            .phases
            .iter()
            .map(|(p, l, share)| {
                let mut v = l.json();
                v["share"] = json!(round(*share, 4));
                (p.name().to_owned(), v)
            })
            .collect();
        let crypto: Map<String, Value> = self
            .crypto
            .iter()
            .map(|(op, c)| {
                (
                    op.clone(),
                    json!({
                        "requests_per_s": round(c.requests, 1),
                        "batches_per_s": round(c.batches, 1),
                        "batch_fill": c.fill().map(|f| round(f, 2)),
                        "queue_depth": c.queued,
                        "crossover": c.crossover,
                    }),
                )
            })
            .collect();
        let workers: Map<String, Value> = self
            .workers
            .iter()
            .map(|(w, s)| {
                (
                    w.clone(),
                    json!({
                        "handshakes_per_s": round(s.handshakes, 1),
                        "connections_open": s.open,
                        "cpu_busy": s.busy.map(|b| round(b, 3)),
                    }),
                )
            })
            .collect();
        let per_s = |m: &BTreeMap<String, f64>| -> Map<String, Value> {
            m.iter()
                .map(|(k, v)| (k.clone(), json!(round(*v, 1))))
                .collect()
        };
        json!({
            "interval_s": round(self.seconds, 3),
            "backend": self.backend,
            "handshakes_per_s": { "full": round(self.full, 1), "resumed": round(self.resumed, 1) },
            "requests_per_s": round(self.requests, 1),
            "failed_per_s": per_s(&self.failed),
            "refused_per_s": per_s(&self.refused),
            "handshake": self.total.json(),
            "phases": phases,
            "to_first_response": self.first_response.json(),
            "crypto": crypto,
            "connections_open": self.open,
            "ktls_share": self.ktls_share().map(|s| round(s, 3)),
            "workers": workers,
            "keyless_signers": self.signers.iter().map(|(addr, s)| {
                (addr.clone(), json!({
                    "signatures_per_s": round(s.signatures, 1),
                    "failures_per_s": per_s(&s.failures),
                    "round_trip": s.round_trip.json(),
                }))
            }).collect::<Map<String, Value>>(),
            "signing": self.signing.as_ref().map(|s| json!({
                "requests_per_s": per_s(&s.requests),
                "time": s.time.json(),
            })),
        })
    }
}

/// `x` rounded to `places` decimal places.
pub fn round(x: f64, places: i32) -> f64 {
    let f = 10f64.powi(places);
    (x * f).round() / f
}

#[cfg(test)]
mod tests {
    use super::*;

    const BEFORE: &str = "terminus_http_responses_total{code=\"2xx\",protocol=\"h2\"} 10
terminus_crypto_requests_total{op=\"x25519\",backend=\"scalar\"} 5
terminus_crypto_batches_total{op=\"x25519\",backend=\"scalar\"} 5
terminus_crypto_batched_requests_total{op=\"x25519\",backend=\"scalar\"} 5
terminus_worker_connections_open{worker=\"0\"} 1
terminus_worker_cpu_seconds_total{worker=\"0\"} 1
";

    #[test]
    fn rates_are_the_change_per_second() {
        let before = Scrape::parse(BEFORE);
        let now = Scrape::parse(
            &BEFORE
                .replace("} 10\n", "} 30\n")
                .replace("} 5\n", "} 25\n")
                .replace(
                    "cpu_seconds_total{worker=\"0\"} 1",
                    "cpu_seconds_total{worker=\"0\"} 2",
                ),
        );
        let r = Rates::between((1.0, &before), (3.0, &now), "scalar");
        assert_eq!(r.seconds, 2.0);
        assert_eq!(r.requests, 10.0);
        assert_eq!(r.crypto["x25519"].requests, 10.0);
        assert_eq!(r.fill(), Some(1.0));
        assert_eq!(r.workers["0"].busy, Some(0.5));
        assert_eq!(r.json()["requests_per_s"], json!(10.0));
        // Backwards (a restarted server's counters): no change, never negative.
        let back = Rates::between((1.0, &now), (3.0, &before), "scalar");
        assert_eq!(back.requests, 0.0);
    }
}
