//! A connection's life as a pipeline of typed stages, each consuming the one before:
//!
//! ```text
//! Accepted --hello()--> Hello --handshake()--> Established --secure()--> Secured --serve()
//!  TCP, site,          ClientHello read,      rustls done,            kernel TLS or   (HTTP)
//!  context, deadline   host, tenant, route    timeline finished       userspace records
//!                        |                                                 `--relay()
//!                        `--pass_through() (a passthrough [[stream]])          ([[stream]])
//! ```
//!
//! A stage that cannot go on returns [`Closed`], which says why once, in the metrics and
//! the log. The [`HandshakeContext`](terminus_engine::HandshakeContext) made at accept
//! travels through the stages: the engine charges every crypto request to it and writes
//! its timeline.

mod data_path;
mod handshake;
mod hello;
mod pacing;
mod plain;
mod proxy_header;
pub(crate) mod quic;
mod stream;

use std::net::SocketAddr;
use std::rc::Rc;
use std::sync::Arc;
use std::time::Duration;

use terminus_admission::tenant::{QuotaRefusal, TenantAccount};
use terminus_engine::HandshakeContext;
use terminus_probes::HandshakeRecord;
use terminus_tls::HandshakeError;
use tokio::net::TcpStream;
use tokio::time::Instant;

use crate::admission::{Refusal, Ticket};
use crate::metrics::HandshakeFailure;
use crate::site::Site;
use crate::worker::{OpenConnection, Worker};
use terminus_config::Listen;

use handshake::Established;
use hello::{Hello, Route};

/// Serves one accepted connection to its end.
pub(crate) async fn run(
    socket: TcpStream,
    peer: SocketAddr,
    open: OpenConnection,
    admitted: Ticket,
    listen: &Listen,
    worker: Rc<Worker>,
) {
    if listen.plain.is_some() {
        // Boxed: plain HTTP's state, held inline, would size every TLS connection too.
        return Box::pin(plain::run(socket, peer, open, admitted, listen, worker)).await;
    }
    // Up to the end of the handshake the connection's CPU is handshake work, which
    // admission control weighs handshakes by; what it does after is not.
    let ready = {
        // On the heap, and only while it lasts: the handshake's state is larger than
        // what an idle connection holds afterwards, and this future's size is the
        // largest of its states for the connection's whole life.
        let handshake = Box::pin(handshake_stages(
            socket, peer, open, admitted, listen, &worker,
        ));
        worker.admission.metered(handshake).await
    };
    // This future lives as long as the connection, at the size of its largest state:
    // what comes after the handshake is boxed, each way at its own size.
    match ready {
        Some(Ready::Serve(secured)) => secured.serve(&worker).await,
        Some(Ready::Relay(secured, upstream)) => Box::pin(secured.relay(upstream)).await,
        Some(Ready::PassThrough(hello, upstream)) => {
            Box::pin((*hello).pass_through(upstream)).await
        }
        None => {}
    }
}

/// Where a connection goes once its handshake stages are over.
enum Ready {
    /// HTTP, served here.
    Serve(data_path::Secured),
    /// A terminated `[[stream]]`'s bytes, to its upstream.
    Relay(data_path::Secured, Arc<terminus_proxy::Upstream>),
    /// A passed-through `[[stream]]`: no handshake here. (Boxed: a hello holds the
    /// ClientHello's records, and this way is the rare one.)
    PassThrough(Box<Hello>, Arc<terminus_proxy::Upstream>),
}

/// The PROXY header, the ClientHello, the handshake and the record layer: `None` when the
/// connection ended there (counted and logged).
async fn handshake_stages(
    socket: TcpStream,
    peer: SocketAddr,
    mut open: OpenConnection,
    admitted: Ticket,
    listen: &Listen,
    worker: &Rc<Worker>,
) -> Option<Ready> {
    let peer = client_address(&socket, peer, listen, worker).await?;
    if !open.count_client(peer.ip(), &worker.shared.site.current()) {
        admitted.cancel();
        too_many_connections(&socket, peer);
        return None;
    }
    let keeps_forwarded = listen.keeps_forwarded(peer.ip());
    let accepted = Accepted::new(socket, peer, open, keeps_forwarded, listen.http3, worker);
    let started = (accepted.ctx.id(), accepted.ctx.timeline().accepted);
    let hello = match accepted.hello(worker).await {
        Ok(hello) => hello,
        Err(closed) => return closed.record(worker, peer, started),
    };
    let route = match hello.route.clone() {
        Route::Passthrough(upstream) => {
            // No handshake here: no handshake work for admission control to count.
            admitted.cancel();
            return Some(Ready::PassThrough(Box::new(hello), upstream));
        }
        route => route,
    };
    let challenge = matches!(route, Route::AcmeChallenge(_));
    let served = async {
        let established = hello.handshake(admitted, worker).await?;
        if challenge {
            // The CA has seen the certificate: nothing more is said on this connection.
            return Err(Closed::ChallengeAnswered);
        }
        established.secure(listen.ktls, worker).await
    };
    match (served.await, route) {
        (Ok(secured), Route::Stream(upstream)) => Some(Ready::Relay(secured, upstream)),
        (Ok(secured), _) => Some(Ready::Serve(secured)),
        (Err(closed), _) => closed.record(worker, peer, started),
    }
}

/// The client's address: the connection's peer, or where `listen` takes PROXY headers,
/// the one its header names. `None`: the header was bad (logged) and the connection is
/// to be closed.
async fn client_address(
    socket: &TcpStream,
    peer: SocketAddr,
    listen: &Listen,
    worker: &Worker,
) -> Option<SocketAddr> {
    let Some(trusted) = &listen.proxy_protocol else {
        return Some(peer);
    };
    let deadline = Instant::now() + worker.shared.site.current().timeouts.handshake;
    match proxy_header::read(socket, peer, trusted, deadline).await {
        Ok(client) => Some(client),
        Err(e) => {
            tracing::debug!(%peer, "PROXY protocol header: {e}; connection closed");
            None
        }
    }
}

/// A connection beyond its client address's `limits.connections_per_client`: reset
/// before anything is read of it (no FIN exchange, no TIME_WAIT), as nginx's
/// `limit_conn` closes one.
fn too_many_connections(socket: &TcpStream, peer: SocketAddr) {
    let _ = socket2::SockRef::from(socket).set_linger(Some(Duration::ZERO));
    tracing::debug!(%peer, "limits.connections_per_client reached: connection closed");
}

/// Stage 0: a TCP connection just accepted, counted open until it is dropped.
pub(crate) struct Accepted {
    socket: TcpStream,
    peer: SocketAddr,
    /// The configuration the connection keeps for its lifetime, reloads notwithstanding.
    site: Arc<Site>,
    ctx: HandshakeContext,
    /// The ClientHello and the handshake must both be done by then.
    handshake_deadline: Instant,
    /// The client's own X-Forwarded-For and Forwarded go upstream (see `forwarded_from`).
    keeps_forwarded: bool,
    /// The listener serves HTTP/3 too: responses say so (Alt-Svc).
    http3: bool,
    _open: OpenConnection,
}

impl Accepted {
    fn new(
        socket: TcpStream,
        peer: SocketAddr,
        open: OpenConnection,
        keeps_forwarded: bool,
        http3: bool,
        worker: &Worker,
    ) -> Self {
        let _ = socket.set_nodelay(true);
        let site = worker.shared.site.current();
        let now = Instant::now();
        let ctx = HandshakeContext::new(now.into_std()).with_client(peer.ip());
        terminus_probes::handshake_start(ctx.id());
        Self {
            socket,
            peer,
            handshake_deadline: now + site.timeouts.handshake,
            keeps_forwarded,
            http3,
            site,
            ctx,
            _open: open,
        }
    }
}

/// Why a connection ended before reaching its application.
pub(crate) enum Closed {
    Handshake(HandshakeError),
    HandshakeTimeout(Duration),
    /// `ktls = "required"` and the kernel could not take the connection (logged).
    KtlsRefused,
    /// The kernel took part of the connection and failed: it cannot go on either way.
    KtlsFailed(terminus_tls::ktls::OffloadError),
    /// The userspace record layer could not be built.
    Userspace(std::io::Error),
    /// Admission control refused the handshake (the worker is overloaded).
    Overloaded,
    /// The tenant's quota refused the handshake (counted by the tenant).
    OverQuota(Arc<TenantAccount>, QuotaRefusal),
    /// An ACME TLS-ALPN-01 validation's handshake is done: it is closed, as RFC 8737 asks.
    ChallengeAnswered,
}

impl Closed {
    /// Counts and logs why the connection closed, and tells an attached tracer how a
    /// handshake that `started` (its id, when) ended. Nothing is left to do with it.
    fn record(
        self,
        worker: &Worker,
        peer: SocketAddr,
        started: (u64, std::time::Instant),
    ) -> Option<Ready> {
        let metrics = &worker.shared.metrics;
        if let Some(result) = self.handshake_result() {
            terminus_probes::handshake_end(started.0, false, || HandshakeRecord {
                total_ns: started.1.elapsed().as_nanos() as u64,
                result: HandshakeRecord::text(result),
                ..Default::default()
            });
        }
        match self {
            Closed::Handshake(e) => {
                metrics.handshake_failed(HandshakeFailure::of(&e));
                terminus_error::log(&e, Some(&peer), "");
            }
            Closed::HandshakeTimeout(after) => {
                metrics.handshake_failed(HandshakeFailure::Timeout);
                tracing::debug!(%peer, "handshake timed out after {after:?}");
            }
            Closed::KtlsRefused => {}
            Closed::KtlsFailed(e) => {
                metrics.ktls_fallback(e.cause());
                tracing::warn!(%peer, "kernel TLS hand-off failed, connection closed: {e}");
            }
            Closed::Userspace(e) => tracing::debug!(%peer, "{e}"),
            Closed::Overloaded => metrics.handshake_refused(Refusal::AtHello),
            Closed::OverQuota(tenant, cause) => {
                metrics.handshake_refused(Refusal::Quota);
                tracing::debug!(%peer, tenant = tenant.name(), "handshake refused: {}", cause.name());
            }
            Closed::ChallengeAnswered => {
                tracing::debug!(%peer, "acme: tls-alpn-01 challenge certificate shown");
            }
        }
        None
    }

    /// Why the handshake failed; `None` when it completed (the connection closed after).
    fn handshake_result(&self) -> Option<&'static str> {
        match self {
            Closed::Handshake(e) => Some(HandshakeFailure::of(e).name()),
            Closed::HandshakeTimeout(_) => Some(HandshakeFailure::Timeout.name()),
            Closed::Overloaded => Some(Refusal::AtHello.name()),
            Closed::OverQuota(..) => Some(Refusal::Quota.name()),
            Closed::KtlsRefused
            | Closed::KtlsFailed(_)
            | Closed::Userspace(_)
            | Closed::ChallengeAnswered => None,
        }
    }
}
