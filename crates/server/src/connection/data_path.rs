//! Stage 3: who carries the records from here on, the kernel (kTLS, with sendfile and
//! splice) or rustls in userspace, and then the application, its writes paced to its
//! tenant's SCU quota where it has one ([`super::pacing`]).

use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::rc::Rc;
use std::sync::Arc;
use std::time::Duration;

use terminus_admission::tenant::TenantAccount;
use terminus_tls::{KtlsStream, Offload, SecureStream};
use tokio::sync::watch;

use super::pacing::Paced;
use super::{Accepted, Closed, Established};
use crate::app::ConnectionInfo;
use crate::metrics::DataPath;
use crate::worker::{OpenConnection, Worker};
use terminus_config::KtlsMode;

/// The record layer of an established connection.
pub(super) enum Records {
    Kernel(KtlsStream),
    /// Boxed: this enum is moved stage to stage, and every future that holds the stream
    /// until the connection ends holds a pointer.
    Userspace(Box<SecureStream>),
}

/// Stage 3: a connection ready for its application.
pub(crate) struct Secured {
    pub(super) records: Records,
    h2: bool,
    pub(super) info: ConnectionInfo,
    /// The tenant whose SCU quota paces the application's writes, if it has one.
    paced_by: Option<Arc<TenantAccount>>,
    /// Held to the end: the connection counts as open until the application is done.
    pub(super) _open: OpenConnection,
}

impl Established {
    /// Offers the connection to the kernel as `ktls` allows, and falls back to userspace
    /// TLS where the kernel cannot take it (or refuses the connection where `ktls` is
    /// `required`).
    pub(super) async fn secure(
        self,
        ktls: KtlsMode,
        worker: &Rc<Worker>,
    ) -> Result<Secured, Closed> {
        let Established {
            accepted,
            host,
            done,
            observed,
        } = self;
        let Accepted {
            socket,
            peer,
            site,
            ctx,
            keeps_forwarded,
            http3,
            handshake_deadline,
            _open,
            ..
        } = accepted;
        let handshake_timeout = site.timeouts.handshake;
        let sni = ctx.host().map(str::to_owned);
        let tenant = &site.hosts[host].tenant;
        let paced_by = tenant.paced().then(|| tenant.clone());
        let local = socket
            .local_addr()
            .unwrap_or_else(|_| SocketAddr::from(([0, 0, 0, 0], 0)));
        let metrics = &worker.shared.metrics;
        let h2 = done.session.h2;
        let mut origin =
            terminus_proxy::Origin::new(peer, local, "https").keeping_forwarded(keeps_forwarded);
        if site.hosts[host].client_auth.is_some() {
            // rustls has verified the chain (or the policy let the client show none) in a
            // full handshake; on resumption it verified nothing and restored the chain
            // verified when the session began, which a CRL may have revoked since. Tickets
            // cannot cross a CRL change (their tag is of the CRLs' contents) and each reload
            // starts an empty session cache, but the identity told upstreams must not rest
            // on how sessions are stored: a CRL lookup per certificate, no signature.
            let chain = done.session.peer_certificates.as_deref();
            let resumed = done.session.kind == rustls::HandshakeKind::Resumed;
            if resumed
                && chain
                    .zip(site.hosts[host].revocations.as_ref())
                    .is_some_and(|(chain, revocations)| revocations.revokes(chain))
            {
                let subject = chain
                    .and_then(terminus_tls::ClientIdentity::of)
                    .map(|id| id.subject)
                    .unwrap_or_default();
                tracing::info!(%peer, subject, "a resumed session's client certificate is revoked: closed before any request");
                // The client has finished its handshake: a certificate_revoked alert
                // now would read as the server's verdict on a handshake the client
                // completed, which clients report oddly. A close_notify, and no
                // request read.
                close_notify(socket, done, metrics).await;
                // Counted and logged as the full handshake's refusal of the same
                // certificate would be.
                return Err(Closed::Handshake(terminus_tls::HandshakeError::Tls(
                    rustls::Error::InvalidCertificate(rustls::CertificateError::Revoked),
                )));
            }
            let identity = chain.and_then(terminus_tls::ClientIdentity::of);
            origin = origin.with_client_cert(identity.as_ref());
        }
        let info = ConnectionInfo {
            site,
            host,
            sni,
            peer,
            local,
            metrics: metrics.clone(),
            files: worker.files.clone(),
            compression: terminus_http::compress::ConnectionMemory::new(
                &worker.compression,
                terminus_http::compress::memory::PER_CONNECTION,
            ),
            upstream_pool: worker.upstream_pool.clone(),
            origin,
            handshake: observed,
            tls_version: super::handshake::version_label(done.session.version),
            // RFC 7838; nginx's documented `add_header Alt-Svc 'h3=":443"; ma=86400'`.
            alt_svc: http3.then(|| {
                hyper::header::HeaderValue::from_str(&format!("h3=\":{}\"; ma=86400", local.port()))
                    .expect("a valid header value")
            }),
        };
        let id = info.handshake.id;
        let secured = |records| Secured {
            records,
            h2,
            info,
            paced_by,
            _open,
        };
        let (socket, done) = if ktls == KtlsMode::Off {
            (socket, Box::new(done))
        } else {
            let traffic = metrics.traffic.clone();
            // The hand-off may wait on the client (the rest of a record it began with its
            // Finished, an answer to a KeyUpdate): within the handshake's time.
            let offered = tokio::time::timeout_at(
                handshake_deadline,
                terminus_tls::ktls::offload(&worker.shared.kernel_tls, socket, done, traffic),
            )
            .await;
            let Ok(offered) = offered else {
                return Err(Closed::HandshakeTimeout(handshake_timeout));
            };
            match offered {
                Offload::Kernel(stream) => {
                    terminus_probes::ktls(id, true, "");
                    metrics.data_path(DataPath::Kernel);
                    return Ok(secured(Records::Kernel(stream)));
                }
                Offload::Userspace { why, socket, done } => {
                    terminus_probes::ktls(id, false, why.cause().name());
                    metrics.ktls_fallback(why.cause());
                    if ktls == KtlsMode::Required {
                        metrics.ktls_refused();
                        worker.log_refusal(peer, &why);
                        // A close_notify, so the client sees an orderly close, not a reset.
                        close_notify(socket, *done, metrics).await;
                        return Err(Closed::KtlsRefused);
                    }
                    worker.log_fallback(why.cause(), peer, &why);
                    (socket, done)
                }
                Offload::Failed(e) => return Err(Closed::KtlsFailed(e)),
            }
        };
        metrics.data_path(DataPath::Userspace);
        let stream = SecureStream::after(socket, *done, metrics.traffic.clone())
            .map_err(Closed::Userspace)?;
        Ok(secured(Records::Userspace(Box::new(stream))))
    }
}

/// Ends a connection whose handshake completed with a close_notify, so the client sees
/// an orderly close, not a reset; a second at most.
async fn close_notify(
    socket: tokio::net::TcpStream,
    done: terminus_tls::Handshake,
    metrics: &crate::metrics::Metrics,
) {
    if let Ok(mut stream) = SecureStream::after(socket, done, metrics.traffic.clone()) {
        let _ = tokio::time::timeout(
            Duration::from_secs(1),
            tokio::io::AsyncWriteExt::shutdown(&mut stream),
        )
        .await;
    }
}

impl Secured {
    /// The application (HTTP) on this connection, to be run until the connection ends.
    ///
    /// Boxed, each kind of stream in its own future: the connection's future lives as
    /// long as the connection, and held inline it would be the size of the largest kind
    /// (three times what userspace HTTP/1.1 needs) for every connection.
    pub(super) fn serve(self, worker: &Worker) -> Pin<Box<dyn Future<Output = ()>>> {
        let shutdown = worker.shared.shutdown.clone();
        let Secured {
            records,
            h2,
            info,
            paced_by,
            _open: open,
        } = self;
        match (records, paced_by) {
            (Records::Kernel(stream), None) => serving(stream, h2, info, shutdown, open),
            (Records::Userspace(stream), None) => serving(stream, h2, info, shutdown, open),
            (Records::Kernel(stream), Some(tenant)) => {
                serving(Paced::new(stream, tenant), h2, info, shutdown, open)
            }
            (Records::Userspace(stream), Some(tenant)) => {
                serving(Paced::new(stream, tenant), h2, info, shutdown, open)
            }
        }
    }
}

/// HTTP on `stream`, boxed, holding `open` to its end: the connection counts as open
/// (against `max_connections`, in the metrics, for a graceful shutdown) until HTTP is
/// done with it.
fn serving<S>(
    stream: S,
    h2: bool,
    info: ConnectionInfo,
    shutdown: watch::Receiver<bool>,
    open: OpenConnection,
) -> Pin<Box<dyn Future<Output = ()>>>
where
    S: terminus_http::Transport + terminus_http::ReadReady + 'static,
{
    Box::pin(async move {
        let timeouts = info.site.timeouts.http;
        terminus_http::serve(stream, h2, info, timeouts, shutdown).await;
        drop(open);
    })
}
