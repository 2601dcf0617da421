//! A `[[stream]]` connection's application: its bytes to one of the stream's upstream
//! servers and back. Terminated TLS moves by splice(2) where the kernel holds the
//! records (kTLS: the plaintext never enters terminus), else through rustls; passed-through
//! TLS moves by splice between the two plain sockets, after the ClientHello terminus
//! read to choose the stream. Either ends when both directions have, or when nothing has
//! moved for the upstream's idle timeout.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Instant;

use terminus_proxy::relay;
use terminus_proxy::stream::{self, Relay, StreamConn, StreamMode};
use terminus_proxy::Upstream;
use terminus_tls::ktls::{splice_bidirectional, splice_plain};
use tokio::io::AsyncWriteExt;

use super::data_path::{Records, Secured};
use super::hello::Hello;
use crate::site::Site;

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
        let log = Log {
            site: &info.site,
            sni: info.sni.as_deref(),
            peer,
            started: Instant::now(),
        };
        let mut conn = match stream::open(&upstream, peer, info.local).await {
            Ok(conn) => conn,
            Err(e) => {
                terminus_error::log(&e, Some(&peer), "stream not opened: ");
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
        log.finish(conn, StreamMode::Terminate, how, moved);
    }
}

impl Hello {
    /// Hands the connection, ClientHello first, to `upstream` untouched.
    pub(super) async fn pass_through(self, upstream: Arc<Upstream>) {
        let Hello { accepted, read, .. } = self;
        let peer = accepted.peer;
        let log = Log {
            site: &accepted.site,
            sni: accepted.ctx.host(),
            peer,
            started: Instant::now(),
        };
        let local = accepted
            .socket
            .local_addr()
            .unwrap_or_else(|_| SocketAddr::from(([0, 0, 0, 0], 0)));
        let mut conn = match stream::open(&upstream, peer, local).await {
            Ok(conn) => conn,
            Err(e) => {
                terminus_error::log(&e, Some(&peer), "passthrough stream not opened: ");
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
        log.finish(conn, StreamMode::Passthrough, Relay::Splice, moved);
    }
}

/// What a stream's end is reported with.
struct Log<'a> {
    site: &'a Site,
    sni: Option<&'a str>,
    peer: SocketAddr,
    started: Instant,
}

impl Log<'_> {
    /// Counts the stream's bytes whichever way it ended, and writes its access log line
    /// (nginx's stream log: client, mode, bytes each way, SNI, server, time, how it ended).
    fn finish(
        &self,
        conn: StreamConn,
        mode: StreamMode,
        relay: Relay,
        (up, down, ended): (u64, u64, std::io::Result<()>),
    ) {
        let server = conn.server();
        let peer = self.peer;
        match &ended {
            Ok(()) => tracing::debug!(client = %peer, %server, up, down, "stream ended"),
            Err(e) => tracing::debug!(client = %peer, %server, up, down, "stream broken off: {e}"),
        }
        conn.finished(mode, relay, up, down);
        if let Some(log) = &self.site.access_log {
            log.stream(&crate::logs::access::StreamLine {
                client: peer,
                mode: match mode {
                    StreamMode::Terminate => "terminate",
                    StreamMode::Passthrough => "passthrough",
                },
                sni: self.sni,
                upstream: server,
                sent: down,
                received: up,
                duration: self.started.elapsed(),
                error: ended.as_ref().err().map(ToString::to_string),
            });
        }
    }
}
