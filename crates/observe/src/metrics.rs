//! The phase histograms `GET /metrics` serves, per label set: TLS version, key type,
//! full or resumed, tenant.
//!
//! Label sets are made as handshakes first meet them, and there are few (the configured
//! versions × key types × two modes × tenants), so the series are a short list searched
//! under a lock taken once per handshake; the buckets themselves are atomics.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use terminus_metrics::{Buckets, Exposition, Kind, Labels, Render};

use crate::phases::{Breakdown, Phase};

/// 10 µs to 10 s: a phase can be a few µs of rustls or seconds of a slow client.
const BOUNDS: &[f64] = &[
    0.00001, 0.000025, 0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05,
    0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];

/// What a completed handshake is labelled with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HandshakeLabels {
    /// `TLSv1.3`, `TLSv1.2`.
    pub version: &'static str,
    /// The key that signed (`rsa2048`, `ecdsa_p256`, ...), `none` when nothing was signed.
    pub key_type: &'static str,
    /// Whether a session was resumed.
    pub resumed: bool,
    /// The tenant the handshake was charged to.
    pub tenant: Arc<str>,
}

impl HandshakeLabels {
    fn labels(&self) -> Labels {
        Labels::of([
            ("version", self.version),
            ("key_type", self.key_type),
            ("mode", if self.resumed { "resumed" } else { "full" }),
            ("tenant", &self.tenant),
        ])
    }
}

/// The histograms of one label set.
#[derive(Debug)]
pub struct HandshakeSet {
    labels: Labels,
    total: Buckets,
    phases: [Buckets; Phase::COUNT],
    first_response: Buckets,
}

impl HandshakeSet {
    /// Records the time from the handshake's end to the first response on its connection.
    pub fn first_response(&self, after: Duration) {
        self.first_response.observe_duration(after);
    }
}

/// Every label set's histograms.
#[derive(Debug, Default)]
pub struct HandshakeSeries {
    sets: Mutex<Vec<(HandshakeLabels, Arc<HandshakeSet>)>>,
}

impl HandshakeSeries {
    /// Records a completed handshake; returns its label set, for the first response.
    pub fn handshake(&self, labels: HandshakeLabels, took: &Breakdown) -> Arc<HandshakeSet> {
        let set = self.set(labels);
        set.total.observe_duration(took.total);
        for (buckets, d) in set.phases.iter().zip(took.phases) {
            buckets.observe_duration(d);
        }
        set
    }

    fn set(&self, labels: HandshakeLabels) -> Arc<HandshakeSet> {
        let mut sets = self.sets.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((_, set)) = sets.iter().find(|(l, _)| *l == labels) {
            return set.clone();
        }
        let set = Arc::new(HandshakeSet {
            labels: labels.labels(),
            total: Buckets::new(BOUNDS),
            phases: std::array::from_fn(|_| Buckets::new(BOUNDS)),
            first_response: Buckets::new(BOUNDS),
        });
        sets.push((labels, set.clone()));
        set
    }
}

impl Render for HandshakeSeries {
    fn render(&self, out: &mut Exposition) {
        let sets: Vec<Arc<HandshakeSet>> = {
            let sets = self.sets.lock().unwrap_or_else(|p| p.into_inner());
            sets.iter().map(|(_, s)| s.clone()).collect()
        };
        family(
            out,
            "terminus_handshake_duration_seconds",
            "Completed TLS handshakes, accept to the handshake's end.",
            sets.iter().map(|s| (s.labels.clone(), &s.total)),
        );
        family(
            out,
            "terminus_handshake_phase_seconds",
            "Completed TLS handshakes' time by phase; a handshake's phases add up to its duration.",
            sets.iter().flat_map(|s| {
                let phases = Phase::ALL.iter().zip(&s.phases);
                phases.map(|(p, b)| (Labels::of([("phase", p.name())]).and(&s.labels), b))
            }),
        );
        family(
            out,
            "terminus_handshake_to_first_response_seconds",
            "From a handshake's end to the first response on its connection.",
            sets.iter().map(|s| (s.labels.clone(), &s.first_response)),
        );
    }
}

/// One histogram family: its header, then each label set's buckets.
fn family<'a>(
    out: &mut Exposition,
    name: &str,
    help: &str,
    series: impl Iterator<Item = (Labels, &'a Buckets)>,
) {
    out.header(name, Kind::Histogram, help);
    for (labels, buckets) in series {
        buckets.render(out, name, &labels);
    }
}

/// What a connection keeps of its handshake for its responses: the access log's
/// handshake fields, and the first response's time after the handshake.
#[derive(Debug)]
pub struct Observed {
    /// The connection's number (the probes').
    pub id: u64,
    /// When the handshake ended.
    pub ended: std::time::Instant,
    /// Its phases.
    pub breakdown: Breakdown,
    /// Where the first response is recorded.
    set: Arc<HandshakeSet>,
    responded: std::cell::Cell<bool>,
}

impl Observed {
    /// A handshake that ended at `ended`, recorded in `set`.
    pub fn new(
        id: u64,
        ended: std::time::Instant,
        breakdown: Breakdown,
        set: Arc<HandshakeSet>,
    ) -> Self {
        Self {
            id,
            ended,
            breakdown,
            set,
            responded: std::cell::Cell::new(false),
        }
    }

    /// Notes a response on the connection: the first is timed from the handshake's end.
    pub fn responded(&self) {
        if !self.responded.replace(true) {
            self.set.first_response(self.ended.elapsed());
        }
    }
}
