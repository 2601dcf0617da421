//! What one load thread records: HDR latency histograms per phase, outcomes and errors by
//! kind, and what the handshakes negotiated. Threads' stats merge into the run's.

use std::collections::BTreeMap;
use std::time::Duration;

use hdrhistogram::Histogram;
use serde::Serialize;

/// The phases timed separately.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// TCP connect: SYN sent to connection established.
    Connect,
    /// TLS handshake: ClientHello written to handshake complete.
    Handshake,
    /// An answered request (any status): open loop, from its scheduled send time to the
    /// last response byte (so waiting for a connection, and with `--new-connection` the
    /// connect and handshake, count, as in wrk2); closed loop, from the request write.
    Request,
    /// A request that got no answer (refused, reset, timed out...): from its scheduled
    /// send time (open loop) or its start (closed loop) until it failed. Kept apart so
    /// that failures neither vanish from the latency report nor pass for fast answers.
    Failed,
    /// `--idle`: the answered request that woke a connection after its idle time, from
    /// its write (what the server's idle-connection savings may cost).
    AfterIdle,
}

impl Phase {
    pub const ALL: [Phase; 5] = [
        Phase::Connect,
        Phase::Handshake,
        Phase::Request,
        Phase::Failed,
        Phase::AfterIdle,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Phase::Connect => "connect",
            Phase::Handshake => "handshake",
            Phase::Request => "request",
            Phase::Failed => "failed",
            Phase::AfterIdle => "after_idle",
        }
    }
}

/// Latency histogram in microseconds, 1 µs to 1 hour at 3 significant digits (values
/// beyond an hour are clamped to it).
#[derive(Debug, Clone)]
pub struct Latency(Histogram<u64>);

const MAX_US: u64 = 3_600_000_000;

impl Default for Latency {
    fn default() -> Self {
        Latency(Histogram::new_with_bounds(1, MAX_US, 3).expect("valid histogram bounds"))
    }
}

/// Percentiles of one phase, in milliseconds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct Percentiles {
    pub count: u64,
    pub mean: f64,
    pub p50: f64,
    pub p90: f64,
    pub p95: f64,
    pub p99: f64,
    pub p999: f64,
    pub max: f64,
}

impl Latency {
    pub fn record(&mut self, d: Duration) {
        let us = (d.as_micros() as u64).clamp(1, MAX_US);
        self.0
            .record(us)
            .expect("value within the histogram's bounds");
    }

    pub fn merge(&mut self, other: &Latency) {
        self.0
            .add(&other.0)
            .expect("histograms with the same bounds");
    }

    /// The value at quantile `q` (0..=1), in milliseconds.
    pub fn quantile_ms(&self, q: f64) -> f64 {
        if self.0.is_empty() {
            return 0.0;
        }
        self.0.value_at_quantile(q) as f64 / 1e3
    }

    pub fn percentiles(&self) -> Percentiles {
        if self.0.is_empty() {
            return Percentiles::default();
        }
        Percentiles {
            count: self.0.len(),
            mean: self.0.mean() / 1e3,
            p50: self.quantile_ms(0.50),
            p90: self.quantile_ms(0.90),
            p95: self.quantile_ms(0.95),
            p99: self.quantile_ms(0.99),
            p999: self.quantile_ms(0.999),
            max: self.0.max() as f64 / 1e3,
        }
    }
}

/// Everything one thread (or the merged run) counted.
#[derive(Debug, Clone, Default)]
pub struct Stats {
    pub connect: Latency,
    pub handshake: Latency,
    pub request: Latency,
    pub failed: Latency,
    pub after_idle: Latency,
    /// Requests answered with 1xx-3xx.
    pub ok: u64,
    pub errors: BTreeMap<String, u64>,
    /// Completed handshakes, and how many of them resumed a session.
    pub handshakes: u64,
    pub resumed: u64,
    /// "TLSv1_3 TLS13_AES_256_GCM_SHA384 X25519" -> handshakes.
    pub negotiated: BTreeMap<String, u64>,
    /// Requests scheduled (open loop) or started (closed loop).
    pub issued: u64,
}

impl Stats {
    pub fn latency(&self, phase: Phase) -> &Latency {
        match phase {
            Phase::Connect => &self.connect,
            Phase::Handshake => &self.handshake,
            Phase::Request => &self.request,
            Phase::Failed => &self.failed,
            Phase::AfterIdle => &self.after_idle,
        }
    }

    pub fn record(&mut self, phase: Phase, d: Duration) {
        match phase {
            Phase::Connect => self.connect.record(d),
            Phase::Handshake => self.handshake.record(d),
            Phase::Request => self.request.record(d),
            Phase::Failed => self.failed.record(d),
            Phase::AfterIdle => self.after_idle.record(d),
        }
    }

    pub fn error(&mut self, kind: String) {
        *self.errors.entry(kind).or_default() += 1;
    }

    pub fn errors_total(&self) -> u64 {
        self.errors.values().sum()
    }

    pub fn merge(&mut self, other: &Stats) {
        self.connect.merge(&other.connect);
        self.handshake.merge(&other.handshake);
        self.request.merge(&other.request);
        self.failed.merge(&other.failed);
        self.after_idle.merge(&other.after_idle);
        self.ok += other.ok;
        for (k, v) in &other.errors {
            *self.errors.entry(k.clone()).or_default() += v;
        }
        self.handshakes += other.handshakes;
        self.resumed += other.resumed;
        for (k, v) in &other.negotiated {
            *self.negotiated.entry(k.clone()).or_default() += v;
        }
        self.issued += other.issued;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn close(a: f64, b: f64) -> bool {
        // HDR keeps 3 significant digits: 0.1% relative error at most.
        (a - b).abs() <= b.abs() * 1e-3 + 1e-9
    }

    #[test]
    fn percentiles_of_known_inputs() {
        let mut l = Latency::default();
        for ms in 1..=1000u64 {
            l.record(Duration::from_millis(ms));
        }
        let p = l.percentiles();
        assert_eq!(p.count, 1000);
        assert!(close(p.p50, 500.0), "{p:?}");
        assert!(close(p.p90, 900.0), "{p:?}");
        assert!(close(p.p99, 990.0), "{p:?}");
        assert!(close(p.p999, 999.0), "{p:?}");
        assert!(close(p.max, 1000.0), "{p:?}");
        assert!(close(p.mean, 500.5), "{p:?}");
    }

    #[test]
    fn a_tail_shows_in_the_high_percentiles_only() {
        // 990 fast requests (1 ms) and 10 stalled ones (2 s): the p99 sits on the edge,
        // p99.9 and max must show the stall: what coordinated omission would hide.
        let mut l = Latency::default();
        for _ in 0..990 {
            l.record(Duration::from_millis(1));
        }
        for _ in 0..10 {
            l.record(Duration::from_secs(2));
        }
        let p = l.percentiles();
        assert!(
            close(p.p50, 1.0) && close(p.p90, 1.0) && close(p.p99, 1.0),
            "{p:?}"
        );
        assert!(close(p.p999, 2000.0) && close(p.max, 2000.0), "{p:?}");
    }

    #[test]
    fn merge_adds_counts_and_keeps_extremes() {
        let mut a = Stats::default();
        let mut b = Stats::default();
        a.record(Phase::Handshake, Duration::from_micros(100));
        b.record(Phase::Handshake, Duration::from_micros(300));
        a.error("timeout".into());
        b.error("timeout".into());
        b.error("http_status:404".into());
        a.ok = 3;
        b.ok = 4;
        a.merge(&b);
        let p = a.handshake.percentiles();
        assert_eq!(p.count, 2);
        assert!(close(p.max, 0.3) && close(p.p50, 0.1), "{p:?}");
        assert_eq!(a.ok, 7);
        assert_eq!(a.errors["timeout"], 2);
        assert_eq!(a.errors_total(), 3);
    }

    #[test]
    fn empty_and_out_of_range() {
        let mut l = Latency::default();
        assert_eq!(l.percentiles(), Percentiles::default());
        l.record(Duration::ZERO);
        l.record(Duration::from_secs(10_000));
        let p = l.percentiles();
        assert_eq!(p.count, 2);
        assert!(close(p.max, 3_600_000.0), "{p:?}");
    }
}
