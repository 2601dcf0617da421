//! Handshake observability that is always on: every completed handshake's time split
//! into phases that add up to its total ([`phases`]), and histograms of them by TLS
//! version, key type, full or resumed, and tenant ([`metrics`]); and reading them back
//! from `/metrics` ([`scrape`]) as rates between two reads ([`rates`]), what `terminus
//! top` and the admin listener's status page show.
//!
//! The split comes from the [`Timeline`](terminus_engine::Timeline) the connection and
//! the engine write as the handshake goes: no extra clock reads beyond one per event, no
//! allocation per handshake beyond the timeline's own. The USDT probes for bpftrace are
//! the `terminus-probes` crate; this one is what an operator sees without attaching
//! anything.

pub mod metrics;
pub mod phases;
pub mod rates;
pub mod scrape;

pub use metrics::{HandshakeLabels, HandshakeSeries, HandshakeSet, Observed};
pub use phases::{Breakdown, Phase};
