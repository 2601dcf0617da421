//! The handshake path, in two stages.
//!
//! [`hello`] reads the ClientHello with rustls's `Acceptor`, before any configuration is
//! chosen, so the caller can route by SNI. [`driver`] then completes the handshake: it
//! moves TLS bytes between the socket and rustls and runs every step of rustls inside a
//! coroutine ([`bridge`]). [`downgrade`] refuses, before the driver starts, the
//! ClientHellos whose versions rustls would answer with the wrong alert or not refuse. When rustls calls into [`signer`] or [`kx`] from there, the call
//! suspends the coroutine with a crypto request; the driver awaits the worker's engine
//! and resumes the coroutine with the result. [`error`] keeps a failure's source across
//! rustls.

// The coroutine boundary: switching stacks under rustls's synchronous calls.
#[allow(unsafe_code)]
pub mod bridge;
mod downgrade;
mod driver;
mod error;
mod hello;
mod kx;
mod signer;

pub use driver::{handshake, Handshake, Session};
pub use error::{Downgrade, HandshakeError};
pub use hello::{read_client_hello, ClientHelloRead};
pub use kx::EngineKxGroup;
pub use signer::EngineSigningKey;
