//! The HTTP/1.1 codec, without I/O: message heads parsed and encoded ([`head`]), bodies
//! framed both ways ([`framing`]). The server's connections use it toward clients, and
//! the reverse proxy toward upstreams, so the two sides cannot disagree about where a
//! message ends: the disagreement request smuggling lives on.

pub mod framing;
pub mod head;

pub use framing::{
    chunk_head, chunked_end, request_framing, Decoded, Decoder, Framing, Malformed, ResponseFraming,
};
pub use head::{encode_response_head, expects_continue, parse_request, wants_keep_alive, MAX_HEAD};
