//! What the QUIC endpoints report: connections accepted, handshakes completed and
//! failed, across the process's workers.

use terminus_metrics::{Counter, Exposition, Render};

/// The process's QUIC series, every worker's endpoint counting in them.
pub static QUIC_METRICS: QuicMetrics = QuicMetrics::new();

/// The QUIC series.
pub struct QuicMetrics {
    accepted: Counter,
    handshakes: Counter,
    failed: Counter,
    retried: Counter,
    refused: Counter,
    handed_over: Counter,
    handover_dropped: Counter,
    passed: Counter,
}

impl std::fmt::Debug for QuicMetrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("QuicMetrics").finish_non_exhaustive()
    }
}

impl QuicMetrics {
    const fn new() -> Self {
        Self {
            accepted: Counter::new(
                "terminus_quic_connections_total",
                "QUIC connections accepted (their first packet taken).",
            ),
            handshakes: Counter::new(
                "terminus_quic_handshakes_total",
                "QUIC handshakes completed.",
            ),
            failed: Counter::new(
                "terminus_quic_handshake_failures_total",
                "QUIC connections closed before their handshake completed.",
            ),
            retried: Counter::new(
                "terminus_quic_retries_total",
                "New QUIC connections sent a Retry (their address to be proven first).",
            ),
            refused: Counter::new(
                "terminus_quic_refused_total",
                "New QUIC connections refused: the worker's handshakes in flight at [http3] max_handshakes.",
            ),
            handed_over: Counter::new(
                "terminus_quic_handed_over_total",
                "QUIC datagrams one worker read for a connection another worker owns (its client's address changed), handed to that worker.",
            ),
            passed: Counter::new(
                "terminus_quic_passed_to_predecessor_total",
                "QUIC datagrams of connections the process this one replaced (terminus upgrade) still serves, passed to it while it drains.",
            ),
            handover_dropped: Counter::new(
                "terminus_quic_handover_dropped_total",
                "QUIC datagrams for a connection another worker owns that could not be handed to it (its queue full, the worker gone, or over 1,500 bytes): dropped.",
            ),
        }
    }

    pub(crate) fn accepted(&self) {
        self.accepted.inc();
    }

    pub(crate) fn handshaken(&self) {
        self.handshakes.inc();
    }

    pub(crate) fn failed(&self) {
        self.failed.inc();
    }

    pub(crate) fn retried(&self) {
        self.retried.inc();
    }

    pub(crate) fn refused(&self) {
        self.refused.inc();
    }

    pub(crate) fn handed_over(&self) {
        self.handed_over.inc();
    }

    pub(crate) fn passed_to_predecessor(&self) {
        self.passed.inc();
    }

    pub(crate) fn handover_dropped(&self) {
        self.handover_dropped.inc();
    }
}

impl Render for QuicMetrics {
    fn render(&self, out: &mut Exposition) {
        self.accepted.render(out);
        self.handshakes.render(out);
        self.failed.render(out);
        self.retried.render(out);
        self.refused.render(out);
        self.handed_over.render(out);
        self.passed.render(out);
        self.handover_dropped.render(out);
    }
}
