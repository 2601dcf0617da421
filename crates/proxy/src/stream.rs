//! Streams (`[[stream]]`): a client's bytes carried to one of an upstream's servers and
//! back with no HTTP in between, after terminus terminated the client's TLS or without
//! touching it (passthrough). This module opens the upstream side as requests do
//! (balancing, passive health, one retry on a failed connect, the PROXY header) and
//! counts what moved; the server relays the bytes, by `splice(2)` where both ends are
//! kernel sockets.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Instant;

use hyper::StatusCode;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;

use crate::balance::hash;
use crate::connect::tcp;
use crate::error::{ProxyError, ProxyErrorKind};
use crate::health::now_ms;
use crate::metrics::{Failure, Phase};
use crate::spec::{Balance, HashKey};
use crate::upstream::{InProgress, Upstream};

/// How a stream reached terminus.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StreamMode {
    /// terminus completed the handshake; the upstream gets the plaintext.
    Terminate,
    /// The client's TLS goes to the upstream untouched, chosen by the ClientHello's SNI.
    Passthrough,
}

/// How a stream's bytes moved.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Relay {
    /// Kernel to kernel through a pipe; the bytes never entered terminus.
    Splice,
    /// Read into terminus and written out (rustls decrypting, or no splice).
    Userspace,
}

/// A stream's connection to its upstream server, counted in progress until finished.
#[derive(Debug)]
pub struct StreamConn {
    /// The connection, the PROXY header (if configured) already sent.
    pub socket: TcpStream,
    progress: InProgress,
    started: Instant,
}

/// Opens a connection for the stream of `client` (accepted at `local`) to one of
/// `upstream`'s servers: another server once if the first cannot be reached.
pub async fn open(
    upstream: &Arc<Upstream>,
    client: SocketAddr,
    local: SocketAddr,
) -> Result<StreamConn, ProxyError> {
    let key = match upstream.spec.balance {
        Balance::Hash(HashKey::ClientIp) => Some(hash(&client.ip())),
        _ => None,
    };
    let error = |kind, server: Option<usize>, detail: String| ProxyError {
        kind,
        // A stream has no status to answer with: 502 in its log line, as nginx's stream
        // module's $status.
        status: StatusCode::BAD_GATEWAY,
        upstream: upstream.spec.name.clone(),
        server: server.map(|i| upstream.servers[i].spec.address),
        detail,
    };
    let mut excluded = None;
    loop {
        let Some(i) = upstream
            .balancer
            .choose(&upstream.servers, key, excluded, now_ms())
        else {
            let (kind, cause) = match excluded {
                Some(_) => (ProxyErrorKind::NoOtherServer, "no other server to retry on"),
                None => (ProxyErrorKind::NoServerUp, "no server is up"),
            };
            return Err(error(kind, excluded, cause.into()));
        };
        let server = &upstream.servers[i];
        let progress = InProgress::new(upstream.clone(), i);
        let connected = match tcp(server.spec.address, upstream.spec.timeouts.connect).await {
            Ok((mut socket, took)) => {
                server.metrics.latency(Phase::Connect, took);
                server.metrics.connection(false);
                let header = upstream
                    .spec
                    .proxy_protocol
                    .map(|v| crate::proxy_protocol::encode(v, client, local));
                let sent = match header {
                    Some(h) => socket.write_all(&h).await,
                    None => Ok(()),
                };
                sent.map(|()| socket)
                    .map_err(|e| (Failure::Io, format!("writing the PROXY header: {e}")))
            }
            Err(f) => Err((f.failure, f.detail)),
        };
        match connected {
            Ok(socket) => {
                upstream.succeeded(i);
                return Ok(StreamConn {
                    socket,
                    progress,
                    started: Instant::now(),
                });
            }
            Err((failure, detail)) => {
                upstream.failed(i, failure);
                tracing::warn!(upstream = %upstream.spec.name, server = %server.spec.address, "stream connect failed: {detail}");
                if excluded.is_some() {
                    return Err(error(ProxyErrorKind::Failed(failure), Some(i), detail));
                }
                server.metrics.retry();
                excluded = Some(i);
            }
        }
    }
}

impl StreamConn {
    /// The server it went to.
    pub fn server(&self) -> SocketAddr {
        self.progress.server().spec.address
    }

    /// How long the stream may move nothing either way before it is closed: the
    /// upstream's `timeouts.idle`.
    pub fn idle(&self) -> std::time::Duration {
        self.progress.upstream.spec.timeouts.idle
    }

    /// Counts the stream's end: the bytes each way (to the upstream, to the client) and
    /// how they moved.
    pub fn finished(self, mode: StreamMode, relay: Relay, up: u64, down: u64) {
        let metrics = &self.progress.server().metrics;
        metrics.stream(mode, relay, up, down);
        metrics.latency(Phase::Total, self.started.elapsed());
    }
}
