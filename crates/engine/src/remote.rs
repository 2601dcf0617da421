//! Keys held elsewhere: the seam between the engine and a keyless client.
//!
//! A certificate whose private key stays on a keyless signer is represented here by a
//! [`RemoteKey`]: the engine knows only the key's algorithm (for the schemes rustls may
//! choose and for the handshake's accounting) and where to send a request. What a
//! request looks like on the wire, which signer gets it, the connection pool and the
//! deadline are the keyless client's (`terminus-keyless`).

use std::fmt;
use std::sync::Arc;

use rustls::SignatureScheme;

use crate::backend::Reply;
use crate::signing_key::KeyAlgorithm;

/// A private key on a keyless signer.
pub trait RemoteKey: Send + Sync + fmt::Debug {
    /// What kind of key it is.
    fn algorithm(&self) -> KeyAlgorithm;

    /// The DER SubjectPublicKeyInfo (from the certificate: this process has no key).
    fn subject_public_key_info(&self) -> &[u8];

    /// Sends a request to sign `digest` (by `scheme`'s hash) for the handshake `about`,
    /// and answers `reply` with the signature or why there is none, within the key's
    /// deadline. Called on the worker's thread, inside its runtime: the implementation
    /// may spawn local tasks.
    fn sign(
        self: Arc<Self>,
        scheme: SignatureScheme,
        digest: Vec<u8>,
        about: Handshake,
        reply: Reply,
    );
}

/// What a signer is told of the handshake it signs for (its audit log's): the SNI and
/// the client's address, where known.
#[derive(Debug, Clone, Default)]
pub struct Handshake {
    /// The name the client asked for.
    pub server_name: Option<Arc<str>>,
    /// The client's address.
    pub client: Option<std::net::IpAddr>,
}
