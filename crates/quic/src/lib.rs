//! HTTP/3 over QUIC, its handshakes computed by the crypto engine like TCP's.
//!
//! quinn-proto is the QUIC stack (sans-IO, on rustls 0.23 with any crypto provider, so
//! the site's engine signing keys and key-exchange groups serve QUIC as they serve TCP),
//! with terminus's patch that splits accepting a connection from processing its first
//! packet (`third_party/quinn-proto/TERMINUS.md`). terminus drives it itself, one
//! endpoint per worker, instead of through quinn's async driver, whose endpoint mutex
//! would be held across a suspended handshake:
//!
//! - [`admission`]: which new connections are taken, made to Retry, or refused.
//! - [`config`]: the quinn-proto server configuration from the site's rustls one.
//! - [`endpoint`]: a worker's UDP socket and endpoint: datagrams routed to connections.
//! - `connection`: one connection's task: its handshake on the crypto bridge, then its
//!   timers and datagrams, the connection shared with its HTTP/3 side.
//! - `transport`: the `h3` crate's QUIC traits over such a connection.
//! - [`routing`]: connection IDs that name their worker, and datagrams the kernel gave
//!   to another worker (a client whose address changed) handed to the owner.
//! - [`QuicMetrics`]: connections and handshakes.
//!
//! The socket's I/O is quinn-udp's: up to eight datagrams a read (`recvmmsg`, and runs of
//! one flow coalesced by GRO), datagrams of one size sent in one call (GSO), ECN marks
//! both ways, and each datagram's destination address (a wildcard socket answers from
//! the address it was reached at).

pub mod admission;
pub mod config;
mod connection;
pub mod endpoint;
mod metrics;
pub mod routing;
pub mod succession;
pub mod transport;

use std::any::Any;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::rc::Rc;

/// A connection whose handshake completed (or, with 0-RTT taken, whose server flight is
/// out: see [`Early`]), for the server to serve HTTP/3 on.
pub struct Established {
    /// The connection, as the `h3` crate takes it (`h3::server::builder().build(..)`).
    pub h3: H3Connection,
    /// The client's address.
    pub remote: SocketAddr,
    /// The address it reached.
    pub local: SocketAddr,
    /// The name the client asked for.
    pub sni: Option<String>,
    /// The handshake's context: its timeline, its payer.
    pub handshake: terminus_engine::HandshakeContext,
    /// Whether the handshake is yet to complete (a connection that took 0-RTT data is
    /// handed over as soon as its server flight leaves).
    pub early: Early,
}

/// Whether a connection's handshake is yet to complete. Until it completes, what the
/// client sent may be 0-RTT data replayed by someone who captured it (RFC 8446 section
/// 8): a request read then is served only if it is safe to repeat (RFC 8470). Once the
/// client's Finished is in, no replay can have got this far.
#[derive(Clone, Debug)]
pub struct Early(Rc<std::cell::Cell<bool>>);

impl Early {
    /// Whether the handshake is still to complete.
    pub fn now(&self) -> bool {
        self.0.get()
    }
}

/// What a worker does with each established connection.
pub type OnEstablished = Rc<dyn Fn(Established)>;

/// A worker's admission of QUIC handshakes. The server's certificate resolver, which
/// rustls calls once it has the whole ClientHello (on the crypto bridge, where nothing
/// is computed yet), asks its question with `terminus_tls::handshake::bridge::ask`; the
/// connection's driver hands it here and tells the resolver the decision (a `bool`).
/// Asked once per handshake: a second ClientHello (after a HelloRetryRequest) is told
/// the first's decision.
pub type Admit = Rc<dyn Fn(Box<dyn Any>) -> Pin<Box<dyn Future<Output = Admission>>>>;

/// What [`Admit`] decided for one handshake.
pub struct Admission {
    /// Whether the handshake goes on (else rustls fails it: the client gets an alert).
    pub admitted: bool,
    /// Who pays for the handshake's crypto, from here on.
    pub payer: Option<Box<dyn terminus_engine::Payer>>,
    /// Held until the handshake ends (its room in the worker's admission).
    pub hold: Option<Box<dyn Any>>,
}

/// What a worker gives its QUIC endpoints.
#[derive(Clone)]
pub struct Hooks {
    /// Serves each established connection.
    pub on_established: OnEstablished,
    /// Admits each handshake at its ClientHello.
    pub admit: Admit,
}

pub use transport::H3Connection;

pub use admission::{Limits, Retry};
pub use config::{server_config, ConfigError, H3_ALPN};
pub use endpoint::serve;
pub use metrics::{QuicMetrics, QUIC_METRICS};
pub use quinn_proto::ServerConfig;
pub use routing::{members, Member};
pub use succession::{Predecessor, Succession};
