//! Stage 2: the TLS handshake, its crypto in the worker's engine.

use std::rc::Rc;

use rustls::{AlertDescription, ServerConnection};
use terminus_tls::handshake;
use tokio::time::timeout_at;

use super::{Accepted, Closed, Hello, Route};
use crate::admission::{quota, Ticket};
use crate::metrics::HandshakeLabels;
use crate::worker::Worker;

/// Stage 2: the handshake is complete; the record layer is not chosen yet.
pub(crate) struct Established {
    pub(super) accepted: Accepted,
    pub(super) host: usize,
    pub(super) conn: ServerConnection,
    /// The head of a record received after the handshake, not yet given to rustls.
    pub(super) pending: Vec<u8>,
}

impl Hello {
    /// Completes the handshake with the site's TLS configuration, by the deadline set
    /// at accept.
    /// `admitted`: the connection's room in admission control, kept until the handshake
    /// ends, however it ends.
    pub(super) async fn handshake(
        self,
        admitted: Ticket,
        worker: &Rc<Worker>,
    ) -> Result<Established, Closed> {
        let Hello {
            mut accepted,
            read,
            host,
            route,
        } = self;
        let config = match route {
            Route::Stream(_) => accepted.site.stream_tls.clone(),
            _ => accepted.site.tls.clone(),
        };
        let metrics = &worker.shared.metrics;
        read.refuse_downgrade(
            &accepted.socket,
            &accepted.site.tls_versions,
            &metrics.traffic,
        )
        .await
        .map_err(Closed::Handshake)?;
        let Some(admitted) = worker
            .admission
            .at_hello(admitted, read.offers_resumption())
        else {
            read.refuse(
                &accepted.socket,
                AlertDescription::InternalError,
                &metrics.traffic,
            )
            .await;
            return Err(Closed::Overloaded);
        };
        let tenant = &accepted.site.hosts[host].tenant;
        if let Err(cause) = quota::admit(
            &mut accepted.ctx,
            tenant,
            &accepted.site.resolver,
            &read,
            worker.admission.idle(),
            &admitted,
        )
        .await
        {
            worker.admission.turned_away(admitted);
            read.refuse(
                &accepted.socket,
                AlertDescription::InternalError,
                &metrics.traffic,
            )
            .await;
            return Err(Closed::OverQuota(tenant.clone(), cause));
        }
        let done = timeout_at(
            accepted.handshake_deadline,
            handshake(
                &accepted.socket,
                read,
                config,
                &worker.engine,
                &accepted.ctx,
                &metrics.traffic,
            ),
        )
        .await
        .map_err(|_| Closed::HandshakeTimeout(accepted.site.timeouts.handshake))?
        .map_err(Closed::Handshake)?;
        let conn = done.conn;
        let timeline = accepted.ctx.timeline();
        metrics.handshake_completed(
            HandshakeLabels {
                version: version_label(&conn),
                cipher_suite: conn
                    .negotiated_cipher_suite()
                    .and_then(|s| s.suite().as_str())
                    .unwrap_or("unknown"),
                key_type: accepted.ctx.signed_with().map_or("none", |k| k.label()),
            },
            timeline
                .finished
                .unwrap_or_else(std::time::Instant::now)
                .duration_since(timeline.accepted),
        );
        drop(timeline);
        Ok(Established {
            accepted,
            host,
            conn,
            pending: done.pending,
        })
    }
}

fn version_label(conn: &ServerConnection) -> &'static str {
    match conn.protocol_version() {
        Some(rustls::ProtocolVersion::TLSv1_3) => "TLSv1.3",
        Some(rustls::ProtocolVersion::TLSv1_2) => "TLSv1.2",
        _ => "other",
    }
}
