//! HTTP/1.1's server side: a file body leaves through the transport's `send_file`
//! (sendfile(2) on a kernel TLS socket, a read-and-encrypt loop on rustls, with a buffer
//! the worker lends for the response), which a body-as-chunks model cannot express.
//!
//! A connection between requests holds no buffer of terminus's own (rustls keeps its
//! record buffer): the request head's buffer is released once nothing of a next request
//! is in it, and taken again when the transport says bytes came ([`ReadReady`]) or
//! given back when a read finds none; what a request needs lives on the heap for its
//! time.
//!
//! Behaviour follows nginx: keep-alive by default on HTTP/1.1 and on request on 1.0;
//! pipelined requests are answered in order; a request's header must be complete within
//! `timeouts.request_header` of its first byte, each read of its body within as long, and
//! the next request must start within `timeouts.keepalive`; a response that makes no
//! progress for `timeouts.keepalive` is abandoned. Request bodies (content-length or
//! chunked, with `100 Continue` sent when the responder first wants a body the client is
//! holding back) stream to the responder; one it leaves unread ends the connection after
//! the answer. Content-Length together with Transfer-Encoding, and any coding but
//! `chunked`, are refused (request smuggling). On shutdown an idle connection closes at
//! once and a busy one after its response.
//!
//! The codec (heads and body framing, no I/O) is [`crate::h1`]'s, shared with the
//! client side and the proxy's upstream side; here [`conn`] runs a connection,
//! [`request_body`] feeds a request's body to its responder, [`respond`] writes a
//! response, [`transport`] is what the record layer offers.

mod conn;
mod request_body;
mod respond;
#[cfg(test)]
mod tests;
mod transport;

pub use conn::{drain_gently, serve};
pub use transport::{ReadReady, Transport};

/// File reads go this much at a time (four TLS records).
const FILE_CHUNK: usize = 64 * 1024;
