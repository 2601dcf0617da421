//! Who pays for a handshake's crypto: the seam between the engine's mechanism and the
//! policy that decides who may use how much (tenants' quotas, in `terminus-admission`).
//!
//! The engine asks a payer two things: where its requests stand in line (fair queueing
//! between payers by their weights, borrowed capacity behind committed) and to be charged
//! each request it computed. It knows nothing of quotas, waits or refusals.

use crate::{KeyAlgorithm, OpKind};

/// What a handshake carries once admitted ([`crate::HandshakeContext::charge_to`]).
pub trait Payer {
    /// The same for every handshake of one payer: fair queueing keeps one virtual clock
    /// for each.
    fn id(&self) -> usize;

    /// What a request of `kind` (signed with `key`) costs, and the payer's weight in fair
    /// queueing: a cost over a weight is how far the payer's clock moves.
    fn cost_and_weight(&self, kind: OpKind, key: Option<KeyAlgorithm>) -> (f64, f64);

    /// Its requests use borrowed capacity: they wait behind every committed one.
    fn borrowed(&self) -> bool;

    /// Charges one request of `kind` the engine computed.
    fn charge(&self, kind: OpKind, key: Option<KeyAlgorithm>);
}

/// A payer chosen at run time (a QUIC handshake's, handed over by the server's hook).
impl Payer for Box<dyn Payer> {
    fn id(&self) -> usize {
        (**self).id()
    }

    fn cost_and_weight(&self, kind: OpKind, key: Option<KeyAlgorithm>) -> (f64, f64) {
        (**self).cost_and_weight(kind, key)
    }

    fn borrowed(&self) -> bool {
        (**self).borrowed()
    }

    fn charge(&self, kind: OpKind, key: Option<KeyAlgorithm>) {
        (**self).charge(kind, key)
    }
}
