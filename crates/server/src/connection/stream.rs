//! A `[[stream]]` connection's application: its bytes to one of the stream's upstream
//! servers and back. Terminated TLS moves by splice(2) where the kernel holds the
//! records (kTLS: the plaintext never enters terminus), else through rustls; passed-through
//! TLS moves by splice between the two plain sockets, after the ClientHello terminus
//! read to choose the stream. Either ends when both directions have, or when nothing has
//! moved for the upstream's idle timeout.

use std::net::SocketAddr;
use std::sync::Arc;

use terminus_proxy::relay;
use terminus_proxy::stream::{self, Relay, StreamConn, StreamMode};
use terminus_proxy::Upstream;
use terminus_tls::ktls::{splice_bidirectional, splice_plain};
use tokio::io::AsyncWriteExt;

use super::data_path::{Records, Secured};
use super::hello::Hello;

impl Secured {
    /// Carries the decrypted stream to `upstream` until both sides are done.
    pub(super) async fn relay(self, upstream: Arc<Upstream>) {
        let Secured {
            records,
            info,
            _open,
            ..
        } = self;
        let peer = info.peer;
        let mut conn = match stream::open(&upstream, peer, info.local).await {
            Ok(conn) => conn,
            Err(e) => {
                tracing::warn!(client = %peer, "stream not opened: {e}");
                // An orderly close (close_notify), so the client sees a refusal, not a
                // reset it could take for a network fault.
                match records {
                    Records::Kernel(mut s) => drop(s.shutdown().await),
                    Records::Userspace(mut s) => drop(s.shutdown().await),
                }
                return;
            }
        };
        let idle = conn.idle();
        let (how, moved) = match records {
            Records::Kernel(mut s) => (
                Relay::Splice,
                splice_bidirectional(&mut s, &conn.socket, idle).await,
            ),
            Records::Userspace(s) => (
                Relay::Userspace,
                relay::relay(*s, &mut conn.socket, idle).await,
            ),
        };
        finish(conn, StreamMode::Terminate, how, moved, peer);
    }
}

impl Hello {
    /// Hands the connection, ClientHello first, to `upstream` untouched.
    pub(super) async fn pass_through(self, upstream: Arc<Upstream>) {
        let Hello { accepted, read, .. } = self;
        let peer = accepted.peer;
        let local = accepted
            .socket
            .local_addr()
            .unwrap_or_else(|_| SocketAddr::from(([0, 0, 0, 0], 0)));
        let mut conn = match stream::open(&upstream, peer, local).await {
            Ok(conn) => conn,
            Err(e) => {
                tracing::warn!(client = %peer, "passthrough stream not opened: {e}");
                return;
            }
        };
        let hello = read.into_bytes();
        let moved = match conn.socket.write_all(&hello).await {
            Ok(()) => {
                let (up, down, ended) =
                    splice_plain(&accepted.socket, &conn.socket, conn.idle()).await;
                (up + hello.len() as u64, down, ended)
            }
            Err(e) => (0, 0, Err(e)),
        };
        finish(conn, StreamMode::Passthrough, Relay::Splice, moved, peer);
    }
}

/// Counts the stream's bytes, whichever way it ended.
fn finish(
    conn: StreamConn,
    mode: StreamMode,
    relay: Relay,
    (up, down, ended): (u64, u64, std::io::Result<()>),
    peer: SocketAddr,
) {
    let server = conn.server();
    match ended {
        Ok(()) => tracing::debug!(client = %peer, %server, up, down, "stream ended"),
        Err(e) => tracing::debug!(client = %peer, %server, up, down, "stream broken off: {e}"),
    }
    conn.finished(mode, relay, up, down);
}
