//! A `[[stream]]` connection's application: its bytes to one of the stream's upstream
//! servers and back. Terminated TLS moves by splice(2) where the kernel holds the
//! records (kTLS: the plaintext never enters terminus), else through rustls; passed-through
//! TLS moves by splice between the two plain sockets, after the ClientHello terminus
//! read to choose the stream. Either ends when both directions have.

use std::net::SocketAddr;
use std::sync::Arc;

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
        let conn = match stream::open(&upstream, peer, info.local).await {
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
        let mut conn = conn;
        let (moved, relay) = match records {
            Records::Kernel(mut s) => (
                splice_bidirectional(&mut s, &conn.socket).await,
                Relay::Splice,
            ),
            Records::Userspace(mut s) => (
                tokio::io::copy_bidirectional(&mut *s, &mut conn.socket).await,
                Relay::Userspace,
            ),
        };
        finish(conn, StreamMode::Terminate, relay, moved, peer);
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
            Ok(()) => splice_plain(&accepted.socket, &conn.socket)
                .await
                .map(|(up, down)| (up + hello.len() as u64, down)),
            Err(e) => Err(e),
        };
        finish(conn, StreamMode::Passthrough, Relay::Splice, moved, peer);
    }
}

fn finish(
    conn: StreamConn,
    mode: StreamMode,
    relay: Relay,
    moved: std::io::Result<(u64, u64)>,
    peer: SocketAddr,
) {
    let server = conn.server();
    match moved {
        Ok((up, down)) => {
            tracing::debug!(client = %peer, %server, up, down, "stream ended");
            conn.finished(mode, relay, up, down);
        }
        Err(e) => {
            tracing::debug!(client = %peer, %server, "stream broken off: {e}");
            conn.finished(mode, relay, 0, 0);
        }
    }
}
