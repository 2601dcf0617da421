//! One vocabulary for what went wrong, as Pingora's `ErrorType`, `ErrorSource` and
//! `RetryType`: an error that reaches a log line or a metric says what kind it is (a
//! short name, the metric label), whose fault it is ([`Source`]) and whether trying again
//! could help. How loudly it is logged follows from its source, not from each call site's
//! choice: a client's mistake is routine (debug), an upstream's is the operator's concern
//! (warn), terminus's own or its configuration's is an error.
//!
//! Each crate keeps its own error types, with their own fields; they implement
//! [`Classify`], and [`log`] writes any of them.

use std::fmt;

/// Whose fault an error is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Source {
    /// The client sent something wrong, went away, or was too slow.
    Client,
    /// An upstream server failed, timed out or answered wrongly.
    Upstream,
    /// terminus itself, or the machine (a resource, a system call).
    Internal,
    /// The crypto backend could not compute an operation (crypto_mb, an offload thread).
    CryptoBackend,
    /// The configuration asks for something that cannot work.
    Config,
}

impl Source {
    /// The metric label and log field.
    pub fn name(self) -> &'static str {
        match self {
            Self::Client => "client",
            Self::Upstream => "upstream",
            Self::Internal => "internal",
            Self::CryptoBackend => "crypto_backend",
            Self::Config => "config",
        }
    }

    /// How loudly an error of this source is logged.
    pub fn level(self) -> tracing::Level {
        match self {
            Self::Client => tracing::Level::DEBUG,
            Self::Upstream => tracing::Level::WARN,
            Self::Internal | Self::CryptoBackend | Self::Config => tracing::Level::ERROR,
        }
    }
}

/// An error in the vocabulary.
pub trait Classify: fmt::Display {
    /// What kind of error, as a metric label: `connect_timeout`, `no_server_up`, `listen`.
    fn kind(&self) -> &'static str;
    /// Whose fault it is.
    fn source(&self) -> Source;
    /// Whether the same operation, tried again (elsewhere or later), could succeed.
    fn retryable(&self) -> bool {
        false
    }
}

/// Logs `error` at its source's level: its kind and source as fields, the address of the
/// `peer` it happened to (the client, on a connection) as the `peer` field every
/// connection's log line has, and `what` (what could not be done) before the error's text.
pub fn log(error: &dyn Classify, peer: Option<&dyn fmt::Display>, what: &str) {
    let (kind, source) = (error.kind(), error.source().name());
    let peer = peer.map(tracing::field::display);
    match error.source().level() {
        tracing::Level::DEBUG => tracing::debug!(kind, source, peer, "{what}{error}"),
        tracing::Level::WARN => tracing::warn!(kind, source, peer, "{what}{error}"),
        _ => tracing::error!(kind, source, peer, "{what}{error}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_level_follows_whose_fault_it_is() {
        assert_eq!(Source::Client.level(), tracing::Level::DEBUG);
        assert_eq!(Source::Upstream.level(), tracing::Level::WARN);
        assert_eq!(Source::Internal.level(), tracing::Level::ERROR);
        assert_eq!(Source::CryptoBackend.level(), tracing::Level::ERROR);
        assert_eq!(Source::Config.level(), tracing::Level::ERROR);
    }
}
