//! The HTTP/1.1 codec, without I/O: message heads parsed and encoded ([`head`]), bodies
//! framed both ways ([`framing`]), for requests and responses alike. The server's
//! connections use it toward clients, and the reverse proxy toward upstreams, so the two
//! sides cannot disagree about where a message ends: the disagreement request smuggling
//! lives on.

pub mod client;
pub mod framing;
pub mod head;
pub mod raw;
pub mod server;

pub use framing::{
    chunk_head, chunked_end, request_framing, response_framing, Decoded, Decoder, Framing,
    Malformed, ResponseFraming,
};
pub use head::{
    encode_request_head, encode_response_head, expects_continue, has_token, itoa, keeps_alive,
    parse_request, parse_request_head, parse_response, parse_response_head, token_bytes, tokens,
    wants_keep_alive, ResponseHead, MAX_HEAD,
};
pub use raw::{is_name, Fields, PassedFields, RawHead};
