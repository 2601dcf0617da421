//! Keyless signing (issue 55): terminators that face clients hold no private key and ask a
//! signer for each handshake's signature; the signer batches the requests of every
//! terminator into the same crypto engine as its own handshakes.
//!
//! - [`protocol`]: the wire format, Cloudflare's keyless protocol (gokeyless's
//!   `protocol/protocol.md`): an 8-byte header naming the request's ID, then
//!   tag-length-value items. Requests are pipelined on a connection and answered in any
//!   order, matched by ID.
//! - [`keys`]: how a request names a key (its SKI), and which TLS scheme an operation is.
//! - [`signer`]: the signer's side, a terminator's connection served on a worker's engine.
//! - [`client`]: the terminator's side, the engine's `RemoteKey` for a certificate whose
//!   key is on signers, with its per-worker connections, deadline and failover.
//! - [`metrics`]: both sides' series.

pub mod client;
pub mod keys;
pub mod metrics;
pub mod protocol;
pub mod signer;
