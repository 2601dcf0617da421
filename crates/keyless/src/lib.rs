//! Keyless signing (issue 55): terminators that face clients hold no private key and ask a
//! signer for each handshake's signature; the signer batches the requests of every
//! terminator into the same crypto engine as its own handshakes.
//!
//! - [`protocol`]: the wire format, Cloudflare's keyless protocol (gokeyless's
//!   `protocol/protocol.md`): an 8-byte header naming the request's ID, then
//!   tag-length-value items. Requests are pipelined on a connection and answered in any
//!   order, matched by ID.

pub mod protocol;
