//! terminus's reverse proxy: requests a route sends to an `[[upstream]]` go to one of its
//! servers and the response streams back, bodies both ways under back-pressure.
//!
//! The parts are kept apart the way Pingora keeps its pool and load balancing apart from
//! the proxy:
//! - [`spec`]: what an upstream is, as configured (the server's config resolves TOML
//!   into it);
//! - [`upstream`]: an upstream at run time, shared by every worker: servers, their
//!   [`health`] (failures in a row take a server out; [`checks`] probe it actively),
//!   and the [`balance`]r;
//! - [`connect`]: new connections to servers, plain or TLS;
//! - [`pool`]: each worker's idle connections, reused under keep-alive;
//! - [`forward`]: a request's way through: head rewritten ([`headers`]), server chosen,
//!   connection taken or opened, exchange run ([`http1`], or HTTP/2 over TLS or in
//!   cleartext for gRPC backends), the response streamed back in `terminus_http::Body` (a body that stalls
//!   ends at [`stall`]'s timeout, either protocol), retried where safe (a body sent
//!   out is held for that while small: [`replay`]);
//! - [`tunnel`]: an upgraded connection (WebSocket) carried both ways by [`relay`];
//!   an HTTP/2 client's WebSocket (RFC 8441) is translated for HTTP/1.1 upstreams by
//!   [`websocket`];
//! - [`stream`]: `[[stream]]` connections (TCP after TLS, or TLS passthrough) to their
//!   upstream;
//! - [`metrics`]: per-server series.

pub mod balance;
pub mod checks;
pub mod connect;
mod error;
pub mod forward;
mod h2;
pub mod headers;
pub mod health;
pub mod http1;
pub mod metrics;
pub mod pool;
pub mod proxy_protocol;
pub mod relay;
mod replay;
pub mod spec;
mod stall;
pub mod stream;
pub mod tunnel;
pub mod upstream;
mod websocket;

pub use error::{ProxyError, ProxyErrorKind};
pub use forward::forward;
pub use headers::Origin;
pub use metrics::ProxyMetrics;
pub use pool::Pool;
pub use spec::UpstreamSpec;
pub use upstream::Upstream;
