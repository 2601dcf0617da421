//! Handshake errors that remember whose fault they are.
//!
//! rustls's `Signer` and key-exchange traits can only return a `rustls::Error`, so a
//! crypto engine failure crosses rustls as `Error::Other` carrying the [`CryptoError`],
//! and the driver unwraps it again: a failing backend is not counted as a client's TLS
//! error (Pingora's `ErrorSource` makes the same distinction). Whose fault and what kind
//! are the error vocabulary's ([`Classify`]): the failures metric and the log level follow.

use std::io;
use std::sync::Arc;

use rustls::{OtherError, PeerMisbehaved};
use terminus_engine::{CryptoError, CryptoOutput, OpKind};
use terminus_error::{Classify, Source};

pub use super::downgrade::Downgrade;

/// Why a handshake did not complete.
#[derive(Debug, thiserror::Error)]
pub enum HandshakeError {
    #[error("i/o error during handshake: {0}")]
    /// The socket failed.
    Io(#[from] io::Error),
    #[error("client closed the connection during the handshake")]
    /// The client closed before the handshake ended.
    Eof,
    #[error("TLS handshake failed: {0}")]
    /// The TLS exchange failed (the client's fault, or rustls's verdict).
    Tls(rustls::Error),
    #[error("ClientHello refused: {0}")]
    /// A version check rustls leaves to the server refused the ClientHello.
    Downgrade(#[from] Downgrade),
    #[error("crypto engine failed during the handshake: {0}")]
    /// The crypto engine failed (ours).
    Crypto(CryptoError),
    #[error("plain HTTP sent to a TLS port")]
    /// The client's first bytes are text, not a TLS record: plain HTTP, most likely. No
    /// alert was sent: the caller answers in the client's protocol.
    PlainText,
}

impl Classify for HandshakeError {
    /// The `reason` label of `terminus_handshake_failures_total`.
    fn kind(&self) -> &'static str {
        match (self, self.source()) {
            (Self::Eof, _) => "client_closed",
            (Self::Io(_), _) => "io_error",
            (Self::PlainText, _) => "plain_http",
            (_, Source::CryptoBackend) => "crypto_error",
            (_, Source::Internal) => "internal_error",
            _ => "tls_error",
        }
    }

    fn source(&self) -> Source {
        match self {
            Self::Io(_) | Self::Eof | Self::Tls(_) | Self::Downgrade(_) | Self::PlainText => {
                Source::Client
            }
            Self::Crypto(e) => crypto_source(e),
        }
    }
}

fn crypto_source(e: &CryptoError) -> Source {
    match e {
        CryptoError::BadPeerKey(_) => Source::Client,
        CryptoError::SignFailed
        | CryptoError::KeyGenFailed(_)
        | CryptoError::BackendGone(_)
        | CryptoError::Remote(_) => Source::CryptoBackend,
        CryptoError::SchemeMismatch(_)
        | CryptoError::KeyMismatch(_)
        | CryptoError::WrongOutput(_)
        | CryptoError::Refused => Source::Internal,
    }
}

impl From<rustls::Error> for HandshakeError {
    /// Recovers an engine error that crossed rustls (see [`to_rustls`]).
    fn from(e: rustls::Error) -> Self {
        if let rustls::Error::Other(OtherError(inner)) = &e {
            if let Some(crypto) = inner.downcast_ref::<CryptoError>() {
                return Self::Crypto(crypto.clone());
            }
        }
        Self::Tls(e)
    }
}

/// An engine error as rustls can carry it. An invalid peer key share is the client's
/// protocol error and gets rustls's own error (and alert); everything else travels as
/// `Error::Other` for [`HandshakeError`] to recover.
pub(crate) fn to_rustls(e: CryptoError) -> rustls::Error {
    match e {
        CryptoError::BadPeerKey(_) => PeerMisbehaved::InvalidKeyShare.into(),
        other => rustls::Error::Other(OtherError(Arc::new(other))),
    }
}

/// The engine answered `asked` with a result of another kind: a bug, reported as one.
pub(crate) fn wrong_output(asked: OpKind, got: &CryptoOutput) -> rustls::Error {
    tracing::error!(
        "crypto engine answered a {} request with {got:?}",
        asked.name()
    );
    to_rustls(CryptoError::WrongOutput(asked))
}
