//! Why one request failed, and the stable name the report counts it under.
//!
//! Kinds are meant to be grepped and compared across servers: `connect_refused`,
//! `connect_timeout`, `connect_error`, `tls_alert_received:<alert>` (the server sent a
//! fatal alert), `tls_alert_sent:<alert>` (we rejected the server, e.g.
//! `tls_alert_sent:unknown_ca` when its certificate does not chain to `--cacert`),
//! `tls_error`, `handshake_timeout`, `timeout` (no complete response in time), `http_status:<code>`, `http_protocol`, `unprocessed` (the
//! server said it did not process the request: an HTTP/2 GOAWAY or REFUSED_STREAM),
//! `closed` (the peer closed or reset the connection mid-exchange) and `io_error`.

use std::io;

use rustls::AlertDescription;

/// One failed request (or connection attempt).
#[derive(Debug)]
pub enum Failure {
    Connect(io::Error),
    ConnectTimeout,
    /// The TLS handshake failed; the rustls error says why, if rustls produced one.
    Handshake(io::Error),
    /// The handshake did not finish within `--timeout`.
    HandshakeTimeout,
    /// No (complete) response within `--timeout`.
    Timeout,
    /// A complete response with a 4xx or 5xx status.
    Status(u16),
    /// The response was not HTTP we could read.
    Protocol(String),
    /// The server did not process the request and said so (RFC 9113 section 8.7: a
    /// stream past a graceful GOAWAY's last one, or refused): safe to send again.
    Unprocessed(String),
    /// After the handshake: reset, early close, or another socket error.
    Io(io::Error),
}

impl Failure {
    /// The report's name for this failure.
    pub fn kind(&self) -> String {
        match self {
            Failure::Connect(e) if e.kind() == io::ErrorKind::ConnectionRefused => {
                "connect_refused".into()
            }
            Failure::Connect(e) if e.kind() == io::ErrorKind::TimedOut => "connect_timeout".into(),
            // The server reset the connection before the client saw it established: a
            // server shedding load at accept.
            Failure::Connect(e) if peer_closed(e) => "connect_reset".into(),
            Failure::Connect(_) => "connect_error".into(),
            Failure::ConnectTimeout => "connect_timeout".into(),
            Failure::Handshake(e) => match rustls_error(e) {
                Some(rustls::Error::AlertReceived(alert)) => {
                    format!("tls_alert_received:{}", alert_name(*alert))
                }
                Some(rustls::Error::InvalidCertificate(cert)) => format!(
                    "tls_alert_sent:{}",
                    alert_name(AlertDescription::from(cert.clone()))
                ),
                Some(_) => "tls_error".into(),
                None => io_kind(e),
            },
            Failure::HandshakeTimeout => "handshake_timeout".into(),
            Failure::Timeout => "timeout".into(),
            Failure::Status(code) => format!("http_status:{code}"),
            Failure::Protocol(_) => "http_protocol".into(),
            Failure::Unprocessed(_) => "unprocessed".into(),
            Failure::Io(e) => match rustls_error(e) {
                Some(rustls::Error::AlertReceived(alert)) => {
                    format!("tls_alert_received:{}", alert_name(*alert))
                }
                Some(_) => "tls_error".into(),
                None => io_kind(e),
            },
        }
    }
}

impl Failure {
    /// After the handshake, the peer closed or reset the connection: what a kept-alive
    /// connection the server has dropped looks like.
    pub fn is_closed(&self) -> bool {
        matches!(self, Failure::Io(e) if rustls_error(e).is_none() && peer_closed(e))
    }

    /// What a client sends again on a new connection, as browsers do: a kept-alive
    /// connection the server had closed, or a request it said it did not process.
    pub fn is_retryable(&self) -> bool {
        self.is_closed() || matches!(self, Failure::Unprocessed(_))
    }
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Failure::Connect(e) => write!(f, "connect: {e}"),
            Failure::ConnectTimeout => write!(f, "connect: timed out"),
            Failure::Handshake(e) => write!(f, "TLS handshake: {e}"),
            Failure::HandshakeTimeout => write!(f, "TLS handshake: timed out"),
            Failure::Timeout => write!(f, "no response within the timeout"),
            Failure::Status(code) => write!(f, "HTTP status {code}"),
            Failure::Protocol(why) => write!(f, "HTTP: {why}"),
            Failure::Unprocessed(why) => write!(f, "not processed by the server: {why}"),
            Failure::Io(e) => write!(f, "{e}"),
        }
    }
}

fn rustls_error(e: &io::Error) -> Option<&rustls::Error> {
    e.get_ref()?.downcast_ref::<rustls::Error>()
}

fn io_kind(e: &io::Error) -> String {
    if peer_closed(e) {
        "closed".into()
    } else if e.kind() == io::ErrorKind::TimedOut {
        "timeout".into()
    } else {
        "io_error".into()
    }
}

/// The peer closed or reset the connection (kind `closed`).
fn peer_closed(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::UnexpectedEof
            | io::ErrorKind::ConnectionReset
            | io::ErrorKind::ConnectionAborted
            | io::ErrorKind::BrokenPipe
    )
}

/// The RFC 8446 name of an alert: `HandshakeFailure` -> `handshake_failure`,
/// `UnknownCA` -> `unknown_ca`.
pub fn alert_name(alert: AlertDescription) -> String {
    let camel = format!("{alert:?}");
    let mut out = String::with_capacity(camel.len() + 4);
    let mut prev_lower = false;
    for c in camel.chars() {
        if c.is_ascii_uppercase() && prev_lower {
            out.push('_');
        }
        prev_lower = c.is_ascii_lowercase() || c.is_ascii_digit();
        out.push(c.to_ascii_lowercase());
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tls(e: rustls::Error) -> io::Error {
        io::Error::new(io::ErrorKind::InvalidData, e)
    }

    #[test]
    fn alert_names_follow_the_rfc() {
        assert_eq!(
            alert_name(AlertDescription::HandshakeFailure),
            "handshake_failure"
        );
        assert_eq!(alert_name(AlertDescription::UnknownCA), "unknown_ca");
        assert_eq!(
            alert_name(AlertDescription::ProtocolVersion),
            "protocol_version"
        );
        assert_eq!(alert_name(AlertDescription::BadRecordMac), "bad_record_mac");
    }

    #[test]
    fn kinds() {
        let refused = io::Error::from(io::ErrorKind::ConnectionRefused);
        assert_eq!(Failure::Connect(refused).kind(), "connect_refused");
        assert_eq!(
            Failure::Handshake(tls(rustls::Error::AlertReceived(
                AlertDescription::HandshakeFailure
            )))
            .kind(),
            "tls_alert_received:handshake_failure"
        );
        assert_eq!(
            Failure::Handshake(tls(rustls::Error::InvalidCertificate(
                rustls::CertificateError::UnknownIssuer
            )))
            .kind(),
            "tls_alert_sent:unknown_ca"
        );
        assert_eq!(
            Failure::Handshake(io::Error::from(io::ErrorKind::UnexpectedEof)).kind(),
            "closed"
        );
        assert_eq!(Failure::Status(404).kind(), "http_status:404");
        assert_eq!(Failure::Protocol("x".into()).kind(), "http_protocol");
    }
}
