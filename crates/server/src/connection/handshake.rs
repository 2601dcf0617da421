//! Stage 2: the TLS handshake, its crypto in the worker's engine.

use std::cell::Cell;
use std::rc::Rc;

use rustls::{AlertDescription, HandshakeKind};
use terminus_admission::tenant::TenantAccount;
use terminus_observe::{Breakdown, HandshakeLabels as ObservedLabels, Observed};
use terminus_probes::HandshakeRecord;
use terminus_tls::handshake;
use tokio::time::timeout_at;

use super::{Accepted, Closed, Hello, Route};
use crate::admission::quota::{self, TurnedFull};
use crate::admission::Ticket;
use crate::metrics::HandshakeLabels;
use crate::worker::Worker;

/// Stage 2: the handshake is complete; the record layer is not chosen yet.
pub(crate) struct Established {
    pub(super) accepted: Accepted,
    pub(super) host: usize,
    /// What the handshake settled, and the keys the record layer goes on with.
    pub(super) done: terminus_tls::Handshake,
    /// Its phases, for the access log and the first response.
    pub(super) observed: Observed,
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
            Route::AcmeChallenge(config) => config,
            _ => accepted.site.hosts[host].tls.clone(),
        };
        let metrics = &worker.shared.metrics;
        read.refuse_downgrade(
            &accepted.socket,
            &accepted.site.tls_versions,
            &metrics.traffic,
        )
        .await
        .map_err(Closed::Handshake)?;
        let resumption = read.offers_resumption(&config, &accepted.site.tls_versions);
        let tenant = &accepted.site.hosts[host].tenant;
        // The quota first: whether the handshake is within its tenant's committed rate
        // decides what is ahead of it in the admission bound, asked once it is about to
        // be work (after a wait for the quota, if any). The quota's wait counts against
        // the handshake deadline like the rest.
        let deadline = accepted.handshake_deadline;
        let admitted_by_quota = timeout_at(
            deadline,
            quota::admit(
                tenant,
                &accepted.site.resolver,
                &read,
                (&config, &accepted.site.tls_versions),
                worker.admission.idle(),
                &admitted,
            ),
        )
        .await;
        let Ok(admitted_by_quota) = admitted_by_quota else {
            worker.admission.turned_away(admitted);
            return Err(Closed::HandshakeTimeout(accepted.site.timeouts.handshake));
        };
        let (hold, within) = match admitted_by_quota {
            Ok(admitted) => admitted,
            Err(cause) => {
                worker.admission.turned_away(admitted);
                read.refuse(
                    &accepted.socket,
                    AlertDescription::InternalError,
                    &metrics.traffic,
                )
                .await;
                return Err(Closed::OverQuota(tenant.clone(), cause));
            }
        };
        // Refused here, the quota it was charged is given back with the hold.
        let Some(admitted) = worker.admission.at_hello(admitted, resumption, within) else {
            read.refuse(
                &accepted.socket,
                AlertDescription::InternalError,
                &metrics.traffic,
            )
            .await;
            return Err(Closed::Overloaded);
        };
        quota::taken_on(&accepted.ctx, hold);
        let turned_full = Rc::new(Cell::new(None));
        if resumption {
            quota::full_after_all(
                &mut accepted.ctx,
                (worker.admission.clone(), within),
                tenant.clone(),
                turned_full.clone(),
            );
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
        .map_err(|_| Closed::HandshakeTimeout(accepted.site.timeouts.handshake))?;
        let done = match (done, turned_full.get()) {
            // rustls has sent its alert for the refused signature.
            (Err(_), Some(refusal)) => {
                worker.admission.turned_away(admitted);
                return Err(match refusal {
                    TurnedFull::Overloaded => Closed::Overloaded,
                    TurnedFull::Quota(cause) => Closed::OverQuota(tenant.clone(), cause),
                });
            }
            (done, _) => done.map_err(Closed::Handshake)?,
        };
        let session = &done.session;
        let version = version_label(session.version);
        let key_type = accepted.ctx.signed_with().map_or("none", |k| k.label());
        metrics.handshake_completed(HandshakeLabels {
            version,
            cipher_suite: session.suite.suite().as_str().unwrap_or("unknown"),
            key_type,
        });
        worker.series.handshake_completed();
        let resumed = session.kind == HandshakeKind::Resumed;
        let observed = observe(&accepted.ctx, (version, key_type, resumed), tenant, worker);
        Ok(Established {
            accepted,
            host,
            done,
            observed,
        })
    }
}

/// Records a completed handshake's phases (`ctx`'s timeline), and tells an attached
/// tracer: TCP's and QUIC's alike.
pub(crate) fn observe(
    ctx: &terminus_engine::HandshakeContext,
    (version, key_type, resumed): (&'static str, &'static str, bool),
    tenant: &TenantAccount,
    worker: &Worker,
) -> Observed {
    let timeline = ctx.timeline();
    let ended = timeline.finished.unwrap_or_else(std::time::Instant::now);
    // The driver notes the end before returning, so there is always a breakdown.
    let breakdown = Breakdown::of(&timeline).unwrap_or(Breakdown {
        total: ended.saturating_duration_since(timeline.accepted),
        phases: Default::default(),
    });
    drop(timeline);
    let labels = ObservedLabels {
        version,
        key_type,
        resumed,
        tenant: tenant.shared_name(),
    };
    let id = ctx.id();
    terminus_probes::handshake_end(id, true, || HandshakeRecord {
        total_ns: breakdown.total.as_nanos() as u64,
        phases_ns: breakdown.phases.map(|d| d.as_nanos() as u64),
        resumed: resumed as u64,
        version: HandshakeRecord::text(version),
        key_type: HandshakeRecord::text(key_type),
        result: HandshakeRecord::text("ok"),
        tenant: HandshakeRecord::text(tenant.name()),
    });
    let set = worker.shared.metrics.phases.handshake(labels, &breakdown);
    Observed::new(id, ended, breakdown, set)
}

pub(super) fn version_label(version: rustls::ProtocolVersion) -> &'static str {
    match version {
        rustls::ProtocolVersion::TLSv1_3 => "TLSv1.3",
        rustls::ProtocolVersion::TLSv1_2 => "TLSv1.2",
        _ => "other",
    }
}
