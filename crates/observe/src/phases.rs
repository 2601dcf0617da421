//! A handshake's time, split into phases that cover it exactly once.
//!
//! The timeline is a sequence of events (accepted, first ClientHello byte, ClientHello
//! parsed, admitted, each crypto request queued, dispatched and
//! answered, each wait for the client's next flight, finished). Each event starts a
//! phase, which lasts until the next event: so the phases never overlap, leave no gap,
//! and add up to accept → finished by construction. What the server does between events
//! (rustls's own work, writing flights, waiting for the worker's event loop) is
//! [`Phase::Server`].

use std::time::{Duration, Instant};

use terminus_engine::{OpKind, Timeline};

/// Where a handshake was, between two events of its timeline.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// Accepted, no byte of the ClientHello read yet: the client's first flight in
    /// transit (and the accept queue, for a worker that accepted late).
    HelloWait,
    /// The ClientHello arriving, first byte to parsed: larger hellos (post-quantum key
    /// shares) span several segments.
    HelloRead,
    /// ClientHello parsed to admitted: admission control, and the tenant's quota with
    /// any wait it asks for.
    Admission,
    /// Admitted, before the first crypto request (or the first flight, for a handshake
    /// that computes nothing): rustls choosing the certificate and building its answer.
    ToCrypto,
    /// Crypto requests queued in the engine, waiting for their batch.
    CryptoQueue,
    /// Crypto requests being computed by the backend.
    CryptoCompute,
    /// A signature requested of a keyless signer: the round trip, the signer's queue
    /// and its batch.
    RemoteSign,
    /// Everything else on the server: rustls between crypto requests, writing flights,
    /// runnable but waiting for the worker.
    Server,
    /// Waiting for the client's next flight (a round trip, and the client's own work).
    Client,
}

impl Phase {
    /// Every phase, in the order a full handshake meets them.
    pub const ALL: [Phase; 9] = [
        Phase::HelloWait,
        Phase::HelloRead,
        Phase::Admission,
        Phase::ToCrypto,
        Phase::CryptoQueue,
        Phase::CryptoCompute,
        Phase::RemoteSign,
        Phase::Server,
        Phase::Client,
    ];

    /// How many phases there are.
    pub const COUNT: usize = Self::ALL.len();

    /// The `phase` label value.
    pub fn name(self) -> &'static str {
        match self {
            Phase::HelloWait => "hello_wait",
            Phase::HelloRead => "hello_read",
            Phase::Admission => "admission",
            Phase::ToCrypto => "to_crypto",
            Phase::CryptoQueue => "crypto_queue",
            Phase::CryptoCompute => "crypto_compute",
            Phase::RemoteSign => "remote_sign",
            Phase::Server => "server",
            Phase::Client => "client",
        }
    }
}

/// A completed handshake's time by phase.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Breakdown {
    /// Accept to finished.
    pub total: Duration,
    /// By [`Phase`], in [`Phase::ALL`]'s order; they add up to `total`.
    pub phases: [Duration; Phase::COUNT],
}

impl Breakdown {
    /// The breakdown of a finished handshake; `None` for one that did not finish.
    pub fn of(t: &Timeline) -> Option<Self> {
        let end = t.finished?;
        // At most 4 + 3 per crypto request + 2 per client wait + 1: a TLS 1.2 full
        // handshake has 17, well within the inline capacity.
        let mut events: Vec<(Instant, Phase)> =
            Vec::with_capacity(5 + 3 * t.crypto.len() + 2 * t.client_waits.len());
        events.push((t.accepted, Phase::HelloWait));
        if let Some(at) = t.first_byte {
            events.push((at, Phase::HelloRead));
        }
        if let Some(at) = t.client_hello {
            events.push((at, Phase::Admission));
            events.push((t.admitted.unwrap_or(at), Phase::ToCrypto));
        }
        if let Some(first) = t.flights.first() {
            // A flight written before any crypto request ends ToCrypto (a resumed TLS
            // 1.2 handshake computes nothing); after one, it changes nothing.
            events.push((first.at, Phase::Server));
        }
        for e in &t.crypto {
            if e.kind == OpKind::RemoteSign {
                events.push((e.queued, Phase::RemoteSign));
                events.push((e.answered, Phase::Server));
                continue;
            }
            events.push((e.queued, Phase::CryptoQueue));
            if let Some((at, _)) = e.dispatched {
                events.push((at, Phase::CryptoCompute));
            }
            events.push((e.answered, Phase::Server));
        }
        for &(since, until) in &t.client_waits {
            events.push((since, Phase::Client));
            events.push((until, Phase::Server));
        }
        // Stable: events at the same instant keep the causal order they were pushed in.
        events.sort_by_key(|&(at, _)| at);
        let mut phases = [Duration::ZERO; Phase::COUNT];
        let clamp = |at: Instant| at.clamp(t.accepted, end.max(t.accepted));
        for (i, &(at, phase)) in events.iter().enumerate() {
            let next = events.get(i + 1).map_or(end, |&(next, _)| next);
            phases[phase as usize] += clamp(next).saturating_duration_since(clamp(at));
        }
        Some(Self {
            total: end.saturating_duration_since(t.accepted),
            phases,
        })
    }

    /// The time spent in `phase`.
    pub fn get(&self, phase: Phase) -> Duration {
        self.phases[phase as usize]
    }
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

    use terminus_engine::context::{CryptoEvent, Flight};
    use terminus_engine::{KeyAlgorithm, OpKind};

    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    /// A TLS 1.3 full handshake laid out on a known clock: every phase a distinct length.
    fn full(t0: Instant) -> Timeline {
        let at = |n| t0 + ms(n);
        Timeline {
            accepted: t0,
            first_byte: Some(at(1)),
            client_hello: Some(at(3)),
            admitted: Some(at(7)),
            crypto: vec![
                CryptoEvent {
                    kind: OpKind::X25519,
                    key: None,
                    queued: at(12),
                    dispatched: Some((at(18), 1)),
                    answered: at(25),
                    ok: true,
                },
                CryptoEvent {
                    kind: OpKind::EcdsaSign,
                    key: Some(KeyAlgorithm::EcdsaP256),
                    queued: at(26),
                    dispatched: Some((at(28), 1)),
                    answered: at(31),
                    ok: true,
                },
            ],
            flights: vec![Flight {
                at: at(33),
                bytes: 2000,
            }],
            client_waits: vec![(at(34), at(54))],
            finished: Some(at(55)),
        }
    }

    #[test]
    fn a_full_handshake_splits_into_its_phases_exactly() {
        let b = Breakdown::of(&full(Instant::now())).unwrap();
        let expect = [
            (Phase::HelloWait, 1),
            (Phase::HelloRead, 2),
            (Phase::Admission, 4),
            (Phase::ToCrypto, 5),
            (Phase::CryptoQueue, 6 + 2),
            (Phase::CryptoCompute, 7 + 3),
            // 25-26, 31-34 and 54-55.
            (Phase::Server, 1 + 3 + 1),
            (Phase::Client, 20),
        ];
        for (phase, n) in expect {
            assert_eq!(b.get(phase), ms(n), "{}", phase.name());
        }
        assert_eq!(b.total, ms(55));
        assert_eq!(b.phases.iter().sum::<Duration>(), b.total);
    }

    #[test]
    fn a_handshake_without_crypto_or_quota_ends_to_crypto_at_its_first_flight() {
        let t0 = Instant::now();
        let mut t = full(t0);
        t.crypto.clear();
        t.admitted = None;
        let b = Breakdown::of(&t).unwrap();
        assert_eq!(b.get(Phase::Admission), Duration::ZERO);
        assert_eq!(b.get(Phase::ToCrypto), ms(30));
        assert_eq!(b.get(Phase::Server), ms(1 + 1));
        assert_eq!(b.phases.iter().sum::<Duration>(), b.total);
    }

    #[test]
    fn an_unfinished_handshake_has_no_breakdown() {
        let mut t = full(Instant::now());
        t.finished = None;
        assert_eq!(Breakdown::of(&t), None);
    }

    #[test]
    fn a_request_the_backend_never_dispatched_is_all_queue() {
        let t0 = Instant::now();
        let mut t = full(t0);
        t.crypto.truncate(1);
        t.crypto[0].dispatched = None;
        let b = Breakdown::of(&t).unwrap();
        assert_eq!(b.get(Phase::CryptoQueue), ms(13));
        assert_eq!(b.get(Phase::CryptoCompute), Duration::ZERO);
        assert_eq!(b.phases.iter().sum::<Duration>(), b.total);
    }
}
