//! HTTP/1.1, served by terminus itself rather than hyper: a file body leaves
//! through the transport's `send_file` (sendfile(2) on a kernel TLS socket, a
//! read-and-encrypt loop with one reused buffer on rustls), which hyper's body-as-chunks
//! model cannot express. hyper still serves HTTP/2.
//!
//! Behaviour follows nginx: keep-alive by default on HTTP/1.1 and on request on 1.0;
//! pipelined requests are answered in order; a request's header must be complete within
//! `timeouts.request_header` of its first byte and the next request must start within
//! `timeouts.keepalive`; a response that makes no progress for `timeouts.keepalive` is
//! abandoned; request bodies up to 64 KiB are read and dropped, longer or chunked ones end
//! the connection after the answer; Content-Length together with Transfer-Encoding is
//! refused (request smuggling). On shutdown an idle connection closes at once and a busy
//! one after its response.
//!
//! [`codec`] parses and encodes (no I/O), [`conn`] runs a connection, [`transport`] is
//! what the record layer offers.

mod codec;
mod conn;
mod transport;

pub(crate) use conn::serve;
pub(crate) use transport::Transport;

/// File reads and body discards go this much at a time (four TLS records).
const FILE_CHUNK: usize = 64 * 1024;
