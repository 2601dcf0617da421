//! Connections to upstream servers: TCP, then TLS where the upstream has `tls` (the name
//! it is checked against, the protocol offered by ALPN), all within the connect timeout,
//! as nginx's `proxy_connect_timeout` covers its upstream handshake. Whatever the
//! transport, the exchanges above see one [`Stream`].

mod stream;
mod tls;

pub(crate) use stream::{ReadHalf, Stream, WriteHalf};
pub use tls::{UpstreamTls, UpstreamTlsError};

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use rustls::pki_types::ServerName;
use tokio::net::TcpStream;

use crate::metrics::Failure;
use crate::spec::ServerSpec;

/// Why a connection could not be made: the failure for metrics and retries, and the
/// detail for the log.
#[derive(Debug)]
pub(crate) struct ConnectFailed {
    pub(crate) failure: Failure,
    pub(crate) detail: String,
}

/// A new connection to `server`, TLS when `tls` says so, and how long it took.
pub(crate) async fn connect(
    server: &ServerSpec,
    tls: Option<&UpstreamTls>,
    within: Duration,
) -> Result<(Stream, Duration), ConnectFailed> {
    let started = Instant::now();
    let (tcp, _) = tcp(server.address, within).await?;
    let Some(tls) = tls else {
        return Ok((Stream::Tcp(tcp), started.elapsed()));
    };
    let handshake = tls.connector().connect(tls.name_for(server), tcp);
    match tokio::time::timeout_at((started + within).into(), handshake).await {
        Err(_) => Err(ConnectFailed {
            failure: Failure::ConnectTimeout,
            detail: format!("no TLS handshake within {within:?}"),
        }),
        Ok(Err(e)) => Err(ConnectFailed {
            failure: Failure::Tls,
            detail: format!("TLS handshake: {e}"),
        }),
        Ok(Ok(stream)) => Ok((Stream::Tls(Box::new(stream)), started.elapsed())),
    }
}

/// A new TCP connection to `address`, and how long it took.
pub(crate) async fn tcp(
    address: SocketAddr,
    within: Duration,
) -> Result<(TcpStream, Duration), ConnectFailed> {
    let started = Instant::now();
    match tokio::time::timeout(within, TcpStream::connect(address)).await {
        Err(_) => Err(ConnectFailed {
            failure: Failure::ConnectTimeout,
            detail: format!("no connection within {within:?}"),
        }),
        Ok(Err(e)) => Err(ConnectFailed {
            failure: Failure::ConnectError,
            detail: format!("connect: {e}"),
        }),
        Ok(Ok(tcp)) => {
            // Heads and small bodies go out at once, not after a delayed ACK.
            let _ = tcp.set_nodelay(true);
            Ok((tcp, started.elapsed()))
        }
    }
}

/// The name a server is asked for and checked against when `tls` names none: the host
/// as the configuration wrote it, else its IP address (checked against the certificate's
/// IP addresses; no SNI is sent for an address).
fn default_name(server: &ServerSpec) -> ServerName<'static> {
    server
        .host
        .as_deref()
        .and_then(|h| ServerName::try_from(h.to_owned()).ok())
        .unwrap_or_else(|| ServerName::IpAddress(server.address.ip().into()))
}
