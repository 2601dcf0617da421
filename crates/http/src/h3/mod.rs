//! HTTP/3: the server side over terminus's QUIC connections ([`server`]). The codec is
//! the h3 crate's; the proxy speaks HTTP/1.1 or HTTP/2 to upstreams.

pub mod server;
