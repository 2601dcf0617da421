//! Keyless signing's series, process-wide: a terminator's requests per signer (answered,
//! round trip, failures by cause, connections made) and a signer's requests by outcome
//! with their time in the signer. The signer's batch fill is its engine's
//! (`terminus_crypto_batch_size`), as for handshakes.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use terminus_metrics::{Buckets, Exposition, Kind, Labels, Render};

use crate::protocol::ErrorCode;

const SECONDS: &[f64] = &[
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0,
];

/// Why a request to a signer failed, as the `cause` label says it.
pub const CAUSES: [&str; 3] = ["connection", "timeout", "refused"];

/// One signer's series on a terminator.
#[derive(Debug)]
struct SignerSeries {
    answered: AtomicU64,
    round_trip: Buckets,
    failures: [AtomicU64; CAUSES.len()],
    connections: AtomicU64,
}

/// A terminator's series for the signers of a set, in the set's order.
#[derive(Debug)]
pub struct ClientMetrics {
    signers: Vec<Arc<SignerSeries>>,
}

impl ClientMetrics {
    /// The series of `addresses`, shared with any earlier set that named the same
    /// signer (a reload keeps counting where it was).
    pub fn for_signers(addresses: &[String]) -> Arc<Self> {
        let mut all = registry().clients.lock().expect("keyless metrics");
        Arc::new(Self {
            signers: addresses
                .iter()
                .map(|a| {
                    all.entry(a.clone())
                        .or_insert_with(|| {
                            Arc::new(SignerSeries {
                                answered: AtomicU64::new(0),
                                round_trip: Buckets::new(SECONDS),
                                failures: Default::default(),
                                connections: AtomicU64::new(0),
                            })
                        })
                        .clone()
                })
                .collect(),
        })
    }

    pub(crate) fn answered(&self, i: usize, round_trip: Duration) {
        self.signers[i].answered.fetch_add(1, Ordering::Relaxed);
        self.signers[i].round_trip.observe_duration(round_trip);
    }

    pub(crate) fn failed(&self, i: usize, cause: &str) {
        let c = CAUSES
            .iter()
            .position(|&c| c == cause)
            .expect("a known cause");
        self.signers[i].failures[c].fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn connected(&self, i: usize) {
        self.signers[i].connections.fetch_add(1, Ordering::Relaxed);
    }
}

/// A signer's outcomes: signed, or the error answered.
const OUTCOMES: [&str; 6] = [
    "signed",
    "key_not_found",
    "expired",
    "crypto_failed",
    "format",
    "other",
];

fn outcome(error: Option<ErrorCode>) -> usize {
    match error {
        None => 0,
        Some(ErrorCode::KeyNotFound) => 1,
        Some(ErrorCode::Expired) => 2,
        Some(ErrorCode::CryptoFailed) => 3,
        Some(ErrorCode::Format | ErrorCode::VersionMismatch) => 4,
        Some(_) => 5,
    }
}

/// Why a signer closed a connection before serving it, as the `reason` label says it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// Its source address is not in `[signer] allow`.
    NotAllowed,
    /// Its source address held its share of unauthenticated connections already.
    AddressFull,
    /// The unauthenticated budget was full, and it was the oldest.
    Evicted,
    /// It did not finish its handshake in time.
    HandshakeTimeout,
    /// Its handshake failed (no certificate, one not from the CA, bad TLS).
    HandshakeFailed,
    /// It authenticated, with the worker's terminator connections all taken.
    Full,
}

impl Refusal {
    /// Every reason, in the label's order.
    pub const ALL: [Refusal; 6] = [
        Refusal::NotAllowed,
        Refusal::AddressFull,
        Refusal::Evicted,
        Refusal::HandshakeTimeout,
        Refusal::HandshakeFailed,
        Refusal::Full,
    ];

    /// Its `reason` label.
    pub fn label(self) -> &'static str {
        match self {
            Refusal::NotAllowed => "not_allowed",
            Refusal::AddressFull => "address_full",
            Refusal::Evicted => "evicted",
            Refusal::HandshakeTimeout => "handshake_timeout",
            Refusal::HandshakeFailed => "handshake_failed",
            Refusal::Full => "full",
        }
    }
}

#[derive(Debug)]
struct Registry {
    clients: Mutex<BTreeMap<String, Arc<SignerSeries>>>,
    requests: [AtomicU64; OUTCOMES.len()],
    request_time: Buckets,
    connections: AtomicU64,
    refused: [AtomicU64; Refusal::ALL.len()],
}

fn registry() -> &'static Registry {
    static R: OnceLock<Registry> = OnceLock::new();
    R.get_or_init(|| Registry {
        clients: Mutex::default(),
        requests: Default::default(),
        request_time: Buckets::new(SECONDS),
        connections: AtomicU64::new(0),
        refused: Default::default(),
    })
}

/// Counts a request the signer answered, and its time from read to answer.
pub fn signer_answered(error: Option<ErrorCode>, took: Duration) {
    let r = registry();
    r.requests[outcome(error)].fetch_add(1, Ordering::Relaxed);
    r.request_time.observe_duration(took);
}

/// Counts a terminator's connection the signer accepted (past mutual TLS).
pub fn signer_connection() {
    registry().connections.fetch_add(1, Ordering::Relaxed);
}

/// Counts a connection the signer closed before serving it.
pub fn signer_refused(why: Refusal) {
    registry().refused[why as usize].fetch_add(1, Ordering::Relaxed);
}

/// Every keyless series, for the server's exposition.
#[derive(Debug, Default)]
pub struct KeylessMetrics;

impl Render for KeylessMetrics {
    fn render(&self, out: &mut Exposition) {
        let r = registry();
        let clients = r.clients.lock().expect("keyless metrics");
        const SIGNED: &str = "terminus_keyless_signatures_total";
        out.header(
            SIGNED,
            Kind::Counter,
            "Remote signatures answered, by signer.",
        );
        for (signer, s) in clients.iter() {
            out.sample(
                SIGNED,
                &Labels::of([("signer", signer)]),
                s.answered.load(Ordering::Relaxed),
            );
        }
        const RTT: &str = "terminus_keyless_round_trip_seconds";
        out.header(
            RTT,
            Kind::Histogram,
            "Remote signatures: request sent to answer read, by signer.",
        );
        for (signer, s) in clients.iter() {
            s.round_trip
                .render(out, RTT, &Labels::of([("signer", signer)]));
        }
        const FAILED: &str = "terminus_keyless_failures_total";
        out.header(
            FAILED,
            Kind::Counter,
            "Remote signatures that failed, by signer and cause.",
        );
        for (signer, s) in clients.iter() {
            for (cause, n) in CAUSES.iter().zip(&s.failures) {
                out.sample(
                    FAILED,
                    &Labels::of([("signer", signer), ("cause", cause)]),
                    n.load(Ordering::Relaxed),
                );
            }
        }
        const CONNECTED: &str = "terminus_keyless_connections_total";
        out.header(
            CONNECTED,
            Kind::Counter,
            "Connections made to signers, by signer.",
        );
        for (signer, s) in clients.iter() {
            out.sample(
                CONNECTED,
                &Labels::of([("signer", signer)]),
                s.connections.load(Ordering::Relaxed),
            );
        }
        const REQUESTS: &str = "terminus_signer_requests_total";
        out.header(
            REQUESTS,
            Kind::Counter,
            "Signing requests this signer answered, by outcome.",
        );
        for (name, n) in OUTCOMES.iter().zip(&r.requests) {
            out.sample(
                REQUESTS,
                &Labels::of([("outcome", name)]),
                n.load(Ordering::Relaxed),
            );
        }
        const TIME: &str = "terminus_signer_request_seconds";
        out.header(
            TIME,
            Kind::Histogram,
            "Signing requests: read to answered (the signer's queue and batch).",
        );
        r.request_time.render(out, TIME, &Labels::NONE);
        const CONNS: &str = "terminus_signer_connections_total";
        out.header(
            CONNS,
            Kind::Counter,
            "Terminators' connections accepted past mutual TLS.",
        );
        out.sample(CONNS, &Labels::NONE, r.connections.load(Ordering::Relaxed));
        const REFUSED: &str = "terminus_signer_refused_total";
        out.header(
            REFUSED,
            Kind::Counter,
            "Connections the signer closed before serving them, by reason: not_allowed (its address is not in [signer] allow; closed at accept), address_full (its address held its share of unauthenticated connections), evicted (the oldest unauthenticated one, for a newcomer), handshake_timeout, handshake_failed (no or a bad client certificate), full (every terminator slot taken).",
        );
        for (why, n) in Refusal::ALL.iter().zip(&r.refused) {
            out.sample(
                REFUSED,
                &Labels::of([("reason", why.label())]),
                n.load(Ordering::Relaxed),
            );
        }
    }
}
