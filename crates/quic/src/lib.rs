//! HTTP/3 over QUIC, its handshakes computed by the crypto engine like TCP's.
//!
//! quinn-proto is the QUIC stack (sans-IO, on rustls 0.23 with any crypto provider, so
//! the site's engine signing keys and key-exchange groups serve QUIC as they serve TCP),
//! with terminus's patch that splits accepting a connection from processing its first
//! packet (`third_party/quinn-proto/TERMINUS.md`). terminus drives it itself, one
//! endpoint per worker, instead of through quinn's async driver, whose endpoint mutex
//! would be held across a suspended handshake:
//!
//! - [`config`]: the quinn-proto server configuration from the site's rustls one.
//! - [`endpoint`]: a worker's UDP socket and endpoint: datagrams routed to connections.
//! - `connection`: one connection's task: its handshake on the crypto bridge, then its
//!   timers and datagrams.
//! - [`QuicMetrics`]: connections and handshakes.
//!
//! Not yet: the HTTP/3 layer (h3) over the connections, Retry and the handshake limits,
//! connection IDs that name their worker, GSO/GRO (quinn-udp).

pub mod config;
mod connection;
pub mod endpoint;
mod metrics;

pub use config::{server_config, H3_ALPN};
pub use endpoint::serve;
pub use metrics::{QuicMetrics, QUIC_METRICS};
pub use quinn_proto::ServerConfig;
