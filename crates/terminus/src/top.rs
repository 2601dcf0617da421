//! `terminus top`: a live view of a running terminus through its admin listener, like
//! `htop` for handshakes. Every interval it reads `GET /metrics` and shows what changed
//! since the last read: handshakes per second full and resumed, where their time went
//! (each phase's p50 and p99), how full the crypto batches were, errors by cause, and
//! each worker's load. `--once --json` is the same for scripts.

use std::collections::BTreeMap;
use std::io::{IsTerminal, Write};
use std::time::{Duration, Instant};

use serde_json::{json, Map, Value};
use terminus_observe::scrape::{Histogram, Scrape};
use terminus_observe::Phase;

use crate::admin::AdminError;

pub struct TopArgs {
    pub admin: String,
    pub interval: Duration,
    pub once: bool,
    pub json: bool,
}

/// Runs until interrupted (or once); Err says what could not be read.
pub fn run(args: TopArgs) -> Result<(), AdminError> {
    let capacity = crate::admin::get_json(&args.admin, "/capacity").ok();
    let backend = capacity
        .as_ref()
        .and_then(|c| c["backend"].as_str())
        .unwrap_or("?")
        .to_owned();
    let terminal = std::io::stdout().is_terminal() && !args.json;
    let mut before = (Instant::now(), scrape(&args.admin)?);
    loop {
        std::thread::sleep(args.interval);
        let now = (Instant::now(), scrape(&args.admin)?);
        let view = View::between(&before, &now, &backend);
        let mut out = std::io::stdout().lock();
        let text = if args.json {
            format!("{}\n", view.json())
        } else {
            view.text(&args.admin)
        };
        if terminal {
            // Home and clear, then the page: a terminal shows one view at a time.
            let _ = write!(out, "\x1b[H\x1b[2J");
        }
        if out
            .write_all(text.as_bytes())
            .and_then(|_| out.flush())
            .is_err()
        {
            // The reader went away (a closed pipe): nothing more to show.
            return Ok(());
        }
        if args.once {
            return Ok(());
        }
        before = now;
    }
}

fn scrape(admin: &str) -> Result<Scrape, AdminError> {
    crate::admin::get(admin, "/metrics").map(|text| Scrape::parse(&text))
}

/// A phase's (or the total's) latency over the interval, in seconds.
struct Latency {
    p50: Option<f64>,
    p99: Option<f64>,
    mean: Option<f64>,
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

/// One crypto operation's traffic over the interval.
struct Crypto {
    requests: f64,
    batches: f64,
    batched: f64,
    queued: f64,
    /// The multibuffer backend's crossover batch (9: never batched); `None` for the others.
    crossover: Option<f64>,
}

struct Worker {
    handshakes: f64,
    open: f64,
    /// Share of one core, 0 to 1; `None` where the kernel's figures were not read.
    busy: Option<f64>,
}

/// What changed between two scrapes, per second.
struct View {
    seconds: f64,
    backend: String,
    full: f64,
    resumed: f64,
    failed: BTreeMap<String, f64>,
    refused: BTreeMap<String, f64>,
    total: Latency,
    phases: Vec<(Phase, Latency, f64)>,
    first_response: Latency,
    crypto: BTreeMap<String, Crypto>,
    open: f64,
    ktls: f64,
    userspace: f64,
    workers: BTreeMap<String, Worker>,
}

impl View {
    fn between(before: &(Instant, Scrape), now: &(Instant, Scrape), backend: &str) -> Self {
        let seconds = now.0.duration_since(before.0).as_secs_f64().max(1e-3);
        let (a, b) = (&before.1, &now.1);
        let rate = |name: &str, filter: &[(&str, &str)]| {
            ((b.sum(name, filter) - a.sum(name, filter)) / seconds).max(0.0)
        };
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
        const TOTAL: &str = "terminus_handshake_duration_seconds";
        const PHASE: &str = "terminus_handshake_phase_seconds";
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
        Self {
            seconds,
            backend: backend.to_owned(),
            full: histogram(TOTAL, &[("mode", "full")]).count / seconds,
            resumed: histogram(TOTAL, &[("mode", "resumed")]).count / seconds,
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
        }
    }

    fn ktls_share(&self) -> Option<f64> {
        let all = self.ktls + self.userspace;
        (all > 0.0).then(|| self.ktls / all)
    }

    fn json(&self) -> Value {
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
                        "batch_fill": (c.batches > 0.0).then(|| round(c.batched / c.batches, 2)),
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
            "failed_per_s": per_s(&self.failed),
            "refused_per_s": per_s(&self.refused),
            "handshake": self.total.json(),
            "phases": phases,
            "to_first_response": self.first_response.json(),
            "crypto": crypto,
            "connections_open": self.open,
            "ktls_share": self.ktls_share().map(|s| round(s, 3)),
            "workers": workers,
        })
    }

    fn text(&self, admin: &str) -> String {
        let ms = |s: Option<f64>| s.map_or("-".to_owned(), |s| format!("{:.3}", s * 1e3));
        let mut t = String::new();
        let mut line = |s: String| {
            t.push_str(&s);
            t.push('\n');
        };
        line(format!(
            "terminus at {admin}   backend {}   every {:.1} s",
            self.backend, self.seconds
        ));
        line(format!(
            "handshakes/s  full {:.1}  resumed {:.1}   connections open {}   kTLS {}",
            self.full,
            self.resumed,
            self.open,
            self.ktls_share()
                .map_or("-".to_owned(), |s| format!("{:.0}%", s * 100.0))
        ));
        line(String::new());
        line(format!(
            "{:<18} {:>9} {:>9} {:>9} {:>6}",
            "phase", "p50 ms", "p99 ms", "mean ms", "share"
        ));
        for (p, l, share) in &self.phases {
            line(format!(
                "{:<18} {:>9} {:>9} {:>9} {:>5.1}%",
                p.name(),
                ms(l.p50),
                ms(l.p99),
                ms(l.mean),
                share * 100.0
            ));
        }
        for (name, l) in [
            ("handshake", &self.total),
            ("to 1st response", &self.first_response),
        ] {
            line(format!(
                "{:<18} {:>9} {:>9} {:>9}",
                name,
                ms(l.p50),
                ms(l.p99),
                ms(l.mean)
            ));
        }
        line(String::new());
        line(format!(
            "{:<16} {:>10} {:>10} {:>8} {:>7} {:>10}",
            "crypto op", "req/s", "batches/s", "fill", "queued", "crossover"
        ));
        for (op, c) in &self.crypto {
            let fill = if c.batches > 0.0 {
                format!("{:.2}", c.batched / c.batches)
            } else {
                "-".to_owned()
            };
            let crossover = c.crossover.map_or("-".to_owned(), |n| format!("{n:.0}"));
            line(format!(
                "{:<16} {:>10.1} {:>10.1} {:>8} {:>7} {:>10}",
                op, c.requests, c.batches, fill, c.queued, crossover
            ));
        }
        line(String::new());
        line(format!(
            "{:<8} {:>13} {:>10} {:>6}",
            "worker", "handshakes/s", "open", "cpu"
        ));
        for (w, s) in &self.workers {
            line(format!(
                "{:<8} {:>13.1} {:>10} {:>6}",
                w,
                s.handshakes,
                s.open,
                s.busy
                    .map_or("-".to_owned(), |b| format!("{:.0}%", b * 100.0))
            ));
        }
        let causes = |m: &BTreeMap<String, f64>| {
            if m.is_empty() {
                "none".to_owned()
            } else {
                m.iter()
                    .map(|(k, v)| format!("{k} {v:.1}"))
                    .collect::<Vec<_>>()
                    .join("  ")
            }
        };
        line(String::new());
        line(format!("failed/s   {}", causes(&self.failed)));
        line(format!("refused/s  {}", causes(&self.refused)));
        t
    }
}

fn round(x: f64, places: i32) -> f64 {
    let f = 10f64.powi(places);
    (x * f).round() / f
}
