//! TLS for terminus: certificates and SNI, the handshake driver, and the coroutine bridge
//! that lets rustls's synchronous signing and key-exchange calls wait on the crypto engine.
//!
//! - [`certs`] loads certificate chains and keys and says exactly what is wrong with them;
//! - [`resolver`] picks the virtual host by SNI and the RSA or ECDSA certificate by the
//!   client's signature schemes;
//! - [`handshake`] holds the driver, the coroutine [`handshake::bridge`], and the
//!   engine-backed signer and key-exchange groups rustls calls into;
//! - [`ktls`] hands the record layer to the kernel after the handshake (sendfile, splice);
//! - [`record`] is terminus's own record layer after the handshake (records sealed and
//!   opened in place), and frames whole records before rustls or the kernel sees them;
//! - [`secure`] is the server's userspace TLS stream on it, where the kernel cannot take
//!   over; [`pool`] lends it buffers per thread, so that an idle connection holds none;
//! - [`stream`] is rustls's buffered connection as a stream, for the load generator's
//!   client connections;
//! - [`client_auth`] is client certificates (mutual TLS): a server's policy as a rustls
//!   verifier, tickets bound to what its files hold, the revocations a resumed session is
//!   checked against, the verified identity;
//! - [`client`] is how terminus's own client side (the load generator, the proxy's TLS
//!   upstreams) trusts a server.

pub mod activity;
pub mod certs;
pub mod client;
pub mod client_auth;
pub mod config;
pub mod handshake;
pub mod ktls;
pub mod pool;
pub mod record;
pub mod resolver;
pub mod secure;
pub mod selfsigned;
pub mod stream;

pub use activity::Activity;
pub use certs::{CertError, LoadedCert};
pub use client_auth::{
    ClientAuthError, ClientAuthMode, ClientAuthPolicy, ClientIdentity, LoadedPolicy, PolicyTickets,
    Revocations,
};
pub use config::{TlsSettings, TlsSettingsError};
pub use handshake::{handshake, read_client_hello, ClientHelloRead, Handshake, HandshakeError};
pub use ktls::{FallbackCause, KernelSupport, KtlsStream, Offload};
pub use record::{RecordError, RecordLayer};
pub use resolver::{SniResolver, VirtualHostCerts};
pub use secure::SecureStream;
pub use stream::{SendMethod, TlsStream, TrafficCounters};
