//! Why a request (or a stream) could not be forwarded, in the error vocabulary: its kind,
//! whose fault, the status the client is answered with, and where it happened.

use std::fmt;
use std::net::SocketAddr;

use hyper::StatusCode;
use terminus_error::{Classify, Source};

use crate::metrics::Failure;

/// What went wrong.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProxyErrorKind {
    /// The last server tried failed so (after the one retry allowed, where it was).
    Failed(Failure),
    /// Every server is down.
    NoServerUp,
    /// The server tried failed, and no other is up to try the request on.
    NoOtherServer,
    /// The server closed a reused connection as the request went out, and the request
    /// was not safe to send again.
    StaleReused,
    /// The client's request body failed: nobody is waiting for the answer.
    ClientBody,
    /// A CONNECT that opens no WebSocket.
    NotAWebSocket,
    /// A WebSocket over HTTP/2, and the upstream is not HTTP/1.1 (the only protocol its
    /// upgrade goes to).
    WebSocketUpstream,
    /// The upstream's answer to a WebSocket opening was no switch of protocol.
    BadUpgrade,
}

/// Why a request could not be forwarded, and what to answer the client.
#[derive(Debug)]
pub struct ProxyError {
    /// What went wrong.
    pub kind: ProxyErrorKind,
    /// The status to answer the client with.
    pub status: StatusCode,
    /// The upstream's name.
    pub upstream: String,
    /// The server last tried, if one was.
    pub server: Option<SocketAddr>,
    /// What happened, for the log.
    pub detail: String,
}

impl fmt::Display for ProxyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "upstream {:?}", self.upstream)?;
        if let Some(s) = self.server {
            write!(f, " server {s}")?;
        }
        write!(f, ": {} ({})", self.detail, self.status.as_u16())
    }
}

impl std::error::Error for ProxyError {}

impl Classify for ProxyError {
    fn kind(&self) -> &'static str {
        match self.kind {
            ProxyErrorKind::Failed(failure) => failure.name(),
            ProxyErrorKind::NoServerUp => "no_server_up",
            ProxyErrorKind::NoOtherServer => "no_other_server",
            ProxyErrorKind::StaleReused => "stale_connection",
            ProxyErrorKind::ClientBody => "client_body",
            ProxyErrorKind::NotAWebSocket => "connect_not_websocket",
            ProxyErrorKind::WebSocketUpstream => "websocket_upstream_not_http1",
            ProxyErrorKind::BadUpgrade => "bad_upgrade",
        }
    }

    /// A WebSocket over HTTP/2 to an upstream that cannot take it is the client's
    /// request meeting a limit, not a fault to alert on: any client could fill the log
    /// with it at error level.
    fn source(&self) -> Source {
        match self.kind {
            ProxyErrorKind::ClientBody
            | ProxyErrorKind::NotAWebSocket
            | ProxyErrorKind::WebSocketUpstream => Source::Client,
            _ => Source::Upstream,
        }
    }

    /// A server's failure or a stale connection: the next request may find a server
    /// that answers (this one already had its retry where one was allowed).
    fn retryable(&self) -> bool {
        matches!(
            self.kind,
            ProxyErrorKind::Failed(_) | ProxyErrorKind::StaleReused
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_clients_mistake_is_logged_quietly_and_an_upstreams_loudly() {
        let error = |kind| ProxyError {
            kind,
            status: StatusCode::BAD_GATEWAY,
            upstream: "app".into(),
            server: None,
            detail: String::new(),
        };
        let body = error(ProxyErrorKind::ClientBody);
        assert_eq!(body.source().level(), tracing::Level::DEBUG);
        let timeout = error(ProxyErrorKind::Failed(Failure::ResponseTimeout));
        assert_eq!(timeout.source().level(), tracing::Level::WARN);
        assert_eq!(timeout.kind(), "response_timeout");
        assert!(timeout.retryable() && !body.retryable());
    }
}
