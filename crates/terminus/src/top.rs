//! `terminus top`: a live view of a running terminus through its admin listener, like
//! `htop` for handshakes. Every interval it reads `GET /metrics` and shows what changed
//! since the last read: handshakes per second full and resumed, where their time went
//! (each phase's p50 and p99), how full the crypto batches were, errors by cause, and
//! each worker's load. `--once --json` is the same for scripts.

use std::collections::BTreeMap;
use std::io::{IsTerminal, Write};
use std::time::{Duration, Instant};

use serde_json::Value;
use terminus_observe::rates::Rates;
use terminus_observe::scrape::Scrape;

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

/// What changed between two scrapes (computed by `terminus_observe::rates`, as the admin
/// listener's status page computes it), shown as text.
struct View(Rates);

impl std::ops::Deref for View {
    type Target = Rates;

    fn deref(&self) -> &Rates {
        &self.0
    }
}

impl View {
    fn between(before: &(Instant, Scrape), now: &(Instant, Scrape), backend: &str) -> Self {
        let seconds = now.0.duration_since(before.0).as_secs_f64();
        View(Rates::between((0.0, &before.1), (seconds, &now.1), backend))
    }

    fn json(&self) -> Value {
        self.0.json()
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
            let fill = c.fill().map_or("-".to_owned(), |f| format!("{f:.2}"));
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
        if !self.signers.is_empty() {
            line(String::new());
            line(format!(
                "{:<24} {:>8} {:>9} {:>9}  failures/s",
                "keyless signer", "sig/s", "rtt p50", "rtt p99"
            ));
            for (addr, s) in &self.signers {
                line(format!(
                    "{:<24} {:>8.1} {:>9} {:>9}  {}",
                    addr,
                    s.signatures,
                    ms(s.round_trip.p50),
                    ms(s.round_trip.p99),
                    causes(&s.failures)
                ));
            }
        }
        if let Some(s) = &self.signing {
            line(String::new());
            line(format!(
                "signing for terminators: {}   read to answered p50 {} ms, p99 {} ms (batch fill: the crypto table)",
                causes(&s.requests),
                ms(s.time.p50),
                ms(s.time.p99)
            ));
        }
        line(String::new());
        line(format!("failed/s   {}", causes(&self.failed)));
        line(format!("refused/s  {}", causes(&self.refused)));
        t
    }
}
