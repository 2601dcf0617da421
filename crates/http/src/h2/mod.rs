//! HTTP/2 (RFC 9113) on terminus's own codec.
//!
//! nginx, HAProxy, h2o and Envoy each own their HTTP/2 codec, so that frames are read from
//! the bytes where they landed and responses written into the buffer they are sent from;
//! terminus does the same on its server side. In layers, each its own module, in the
//! order the connection task needs them:
//!
//! - [`frame`]: the 9-byte frame header and every frame type's payload, parsed in place
//!   from a buffer of plaintext (borrowing it) and encoded into one, with every check
//!   RFC 9113 section 6 puts on a frame by itself, each failure a connection or stream
//!   error with its code. What depends on the connection's state (stream states, header
//!   block sequencing, flow control, SETTINGS in force) is the layers above.
//! - [`hpack`]: field compression (RFC 7541): a decoder of the client's blocks that
//!   hands out fields where they lie, an encoder of responses that keeps no table.
//! - [`server::state`]: the server connection's state without I/O (streams, header
//!   blocks, flow control, settings), fed bytes and giving events.
//! - [`server`]: the connection task that runs it over a TLS stream and answers each
//!   stream with the [`crate::Responder`].
//!
//! The client side toward upstreams is hyper's (`terminus-proxy`'s `h2`).

pub mod frame;
pub mod hpack;
pub mod server;

pub use frame::{ErrorCode, Frame, FrameError, Head};
