//! The handshake a crypto request belongs to, as the engine sees it.
//!
//! Every request reaches [`Engine::submit`](crate::Engine::submit) with the
//! [`HandshakeContext`] of its handshake: which host it serves, the [`Payer`] every
//! request is charged to, and a [`Timeline`] the engine writes each request's queue,
//! dispatch and answer times into (what per-phase latency is computed from). The context
//! is made when the connection is accepted and travels with it until the handshake ends;
//! it lives on the worker's thread and is never shared with another.

use std::cell::{Ref, RefCell};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use crate::op::OpKind;
use crate::payer::Payer;
use crate::signing_key::KeyAlgorithm;

/// One crypto request of a handshake, from queueing to its answer.
#[derive(Debug, Clone)]
pub struct CryptoEvent {
    /// What was asked for.
    pub kind: OpKind,
    /// The key that signed, for signatures.
    pub key: Option<KeyAlgorithm>,
    /// When the request entered the engine's queue.
    pub queued: Instant,
    /// When its batch went to the backend, and how many requests that batch held; `None`
    /// when the request was answered without being dispatched (the backend went away).
    pub dispatched: Option<(Instant, usize)>,
    /// When the answer came back to the handshake.
    pub answered: Instant,
    /// Whether the backend computed it (false: a crypto error).
    pub ok: bool,
}

/// One flight of handshake records written to the client.
#[derive(Debug, Clone, Copy)]
pub struct Flight {
    /// When the flight was handed to the socket.
    pub at: Instant,
    /// Its size in bytes, record headers included.
    pub bytes: usize,
}

/// Timestamps of one handshake, in the order they happen.
#[derive(Debug, Clone)]
pub struct Timeline {
    /// When the connection was accepted.
    pub accepted: Instant,
    /// The first bytes of the ClientHello were read.
    pub first_byte: Option<Instant>,
    /// The whole ClientHello was read and parsed.
    pub client_hello: Option<Instant>,
    /// The tenant's quota admitted the handshake (after any wait it asked for).
    pub admitted: Option<Instant>,
    /// Every crypto request, in the order they were queued.
    pub crypto: Vec<CryptoEvent>,
    /// Every flight written, in order.
    pub flights: Vec<Flight>,
    /// Each wait for the client's next flight after the ClientHello: from when the
    /// handshake had nothing left to send to when whole records of the reply were read.
    pub client_waits: Vec<(Instant, Instant)>,
    /// The handshake completed.
    pub finished: Option<Instant>,
}

impl Timeline {
    fn new(accepted: Instant) -> Self {
        Self {
            accepted,
            first_byte: None,
            client_hello: None,
            admitted: None,
            crypto: Vec::new(),
            flights: Vec::new(),
            client_waits: Vec::new(),
            finished: None,
        }
    }
}

/// What travels with a connection from accept to the end of its handshake.
pub struct HandshakeContext {
    id: u64,
    host: Option<Arc<str>>,
    /// The client's address (after a PROXY header), for a keyless signer's audit.
    client: Option<std::net::IpAddr>,
    /// Who is charged, once admitted (a tenant's hold on its quota).
    payer: std::cell::OnceCell<Box<dyn Payer>>,
    timeline: RefCell<Timeline>,
    /// See [`HandshakeContext::check_first_signature`].
    first_signature: RefCell<Option<Box<dyn FnOnce() -> bool>>>,
}

impl std::fmt::Debug for HandshakeContext {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HandshakeContext")
            .field("id", &self.id)
            .field("host", &self.host)
            .field("charged", &self.payer.get().is_some())
            .field("timeline", &self.timeline)
            .finish_non_exhaustive()
    }
}

impl HandshakeContext {
    /// A context for a connection accepted at `accepted`; the host is known once the
    /// ClientHello has been read ([`HandshakeContext::hello`]), the payer once the
    /// handshake is admitted ([`HandshakeContext::charge_to`]).
    pub fn new(accepted: Instant) -> Self {
        // Process-wide, so that probes from every worker name a handshake unambiguously.
        static NEXT_ID: AtomicU64 = AtomicU64::new(1);
        Self {
            id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
            host: None,
            client: None,
            payer: std::cell::OnceCell::new(),
            timeline: RefCell::new(Timeline::new(accepted)),
            first_signature: RefCell::new(None),
        }
    }

    /// The context of a handshake with the client at `ip`.
    pub fn with_client(mut self, ip: std::net::IpAddr) -> Self {
        self.client = Some(ip);
        self
    }

    /// The client's address, where the connection told it.
    pub fn client(&self) -> Option<std::net::IpAddr> {
        self.client
    }

    /// A context for a handshake starting now, outside a server connection (the load
    /// generator's own handshakes).
    pub fn starting_now() -> Self {
        Self::new(Instant::now())
    }

    /// The connection's number, unique in the process: what the USDT probes of one
    /// handshake share.
    pub fn id(&self) -> u64 {
        self.id
    }

    /// Records the parsed ClientHello, when its first bytes arrived, and the server name
    /// it asked for.
    pub fn hello(&mut self, host: Option<Arc<str>>, first_byte: Instant) {
        self.host = host;
        let timeline = self.timeline.get_mut();
        timeline.first_byte = Some(first_byte);
        timeline.client_hello = Some(Instant::now());
    }

    /// The server name the client asked for (SNI), if any.
    pub fn host(&self) -> Option<&str> {
        self.host.as_deref()
    }

    /// The host, shared (what a keyless request carries, without a copy).
    pub fn host_shared(&self) -> Option<Arc<str>> {
        self.host.clone()
    }

    /// Charges the handshake's crypto requests to `payer` (the tenant that admitted it),
    /// which also decides where they stand in the engine's queues.
    ///
    /// Once: a handshake is admitted once (a later payer is ignored). Takes `&self` so
    /// that a QUIC handshake can be charged from inside its own crypto steps, where the
    /// context is lent to the engine (its admission happens at the ClientHello, which
    /// rustls reads there).
    pub fn charge_to(&self, payer: impl Payer + 'static) {
        let charged = self.payer.set(Box::new(payer)).is_ok();
        debug_assert!(charged, "a handshake charged twice");
        if charged {
            self.timeline.borrow_mut().admitted = Some(Instant::now());
        }
    }

    /// Has `check` decide whether the handshake may sign, the first time it asks to: for
    /// a handshake admitted as a resumption, which costs no signature, and which rustls
    /// may still turn into a full one (the ticket for another name or suite). `false`
    /// refuses the signature ([`CryptoError::Refused`](crate::CryptoError::Refused)).
    pub fn check_first_signature(&mut self, check: impl FnOnce() -> bool + 'static) {
        *self.first_signature.get_mut() = Some(Box::new(check));
    }

    /// Whether the handshake may sign now (the check, if any, runs once).
    pub(crate) fn may_sign(&self) -> bool {
        let check = self.first_signature.borrow_mut().take();
        check.is_none_or(|check| check())
    }

    /// Lets the payer go once the handshake's crypto is done, so that its admission's
    /// estimate is settled then (for a context kept past the handshake, as a QUIC
    /// connection's is, for its observation), not when the connection closes.
    pub fn settle(&mut self) {
        self.payer.take();
    }

    /// Who is charged; `None` before admission (and for handshakes outside a server).
    pub fn payer(&self) -> Option<&dyn Payer> {
        self.payer.get().map(|p| p.as_ref())
    }

    /// The timestamps so far (borrowed: the engine may still be writing to it).
    pub fn timeline(&self) -> Ref<'_, Timeline> {
        self.timeline.borrow()
    }

    /// Notes a flight of `bytes` handed to the socket now.
    pub fn flight(&self, bytes: usize) {
        self.timeline.borrow_mut().flights.push(Flight {
            at: Instant::now(),
            bytes,
        });
    }

    /// Notes a wait for the client's next flight, from `since` to now.
    pub fn waited_for_client(&self, since: Instant) {
        self.timeline
            .borrow_mut()
            .client_waits
            .push((since, Instant::now()));
    }

    /// Notes that the handshake completed now.
    pub fn finished(&self) {
        self.timeline.borrow_mut().finished = Some(Instant::now());
    }

    pub(crate) fn crypto(&self, event: CryptoEvent) {
        terminus_probes::crypto_done(self.id, event.kind.name(), event.ok, || {
            let ns = |d: std::time::Duration| d.as_nanos() as u64;
            match event.dispatched {
                Some((at, _)) => (
                    ns(at.saturating_duration_since(event.queued)),
                    ns(event.answered.saturating_duration_since(at)),
                ),
                None => (
                    ns(event.answered.saturating_duration_since(event.queued)),
                    0,
                ),
            }
        });
        if let (Some(payer), true) = (self.payer.get(), event.ok) {
            payer.charge(event.kind, event.key);
        }
        self.timeline.borrow_mut().crypto.push(event);
    }

    /// The key type that signed for this handshake; `None` when nothing was signed
    /// (a resumed handshake).
    pub fn signed_with(&self) -> Option<KeyAlgorithm> {
        self.timeline.borrow().crypto.iter().find_map(|e| e.key)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_signature_check_runs_once_and_decides() {
        let runs = std::rc::Rc::new(std::cell::Cell::new(0));
        let mut ctx = HandshakeContext::starting_now();
        assert!(ctx.may_sign(), "no check: every signature may go");
        let counted = runs.clone();
        ctx.check_first_signature(move || {
            counted.set(counted.get() + 1);
            false
        });
        assert!(!ctx.may_sign(), "the check refused");
        assert!(ctx.may_sign(), "and only the first time");
        assert_eq!(runs.get(), 1);
    }
}
