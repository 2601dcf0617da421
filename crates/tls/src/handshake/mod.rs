//! The handshake path.
//!
//! [`driver`] moves TLS bytes between the socket and rustls and runs every
//! `process_new_packets()` inside a coroutine ([`bridge`]). When rustls calls into
//! [`signer`] or [`kx`] from there, the call suspends the coroutine with a crypto request;
//! the driver awaits the worker's engine and resumes the coroutine with the result.

pub mod bridge;
mod driver;
mod kx;
mod signer;

pub use driver::{handshake, Handshake, HandshakeError};
pub use kx::EngineKxGroup;
pub use signer::EngineSigningKey;
