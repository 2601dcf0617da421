//! QUIC handshakes in admission control and tenant quotas, as TCP ones: admitted against
//! their tenant's quota (after its wait, or refused), then taken on within the worker's
//! bound (refused beyond it), and their crypto charged to the tenant.
//!
//! A QUIC ClientHello arrives inside encrypted Initial packets, often two of them (a
//! post-quantum key share): terminus does not read it before rustls does, as it does a
//! TCP one. The site's certificate resolver for QUIC ([`crate::site::LiveCertificates`]),
//! which rustls calls once it has the whole ClientHello and before any crypto, asks this
//! worker's admission from inside the crypto bridge ([`QuicHello`]); the connection's
//! driver (`terminus_quic`) waits for the answer, and a refusal fails the handshake with
//! an alert. A resumption is not told apart there (rustls has not looked at the ticket
//! yet): it is estimated as a full handshake, and charged what it costs.
//!
//! The worker's measured cost per handshake stays TCP's: a QUIC handshake's time is not
//! metered ([`super::Admission::metered`] wraps TCP connections), so it is not counted as
//! a handshake done either.

use std::any::Any;
use std::rc::Rc;
use std::sync::Arc;
use std::time::Duration;

use terminus_admission::tenant::TenantAccount;
use terminus_engine::cost::Operation;
use terminus_engine::KeyAlgorithm;

use super::{quota, Refusal, Ticket};
use crate::worker::Worker;

/// What the QUIC certificate resolver asks at a ClientHello: whose handshake it is and
/// what it will probably cost.
pub(crate) struct QuicHello {
    pub(crate) tenant: Arc<TenantAccount>,
    /// The certificate's key the resolver chose.
    pub(crate) sign: Option<KeyAlgorithm>,
    pub(crate) kx: Operation,
}

/// This worker's admission of QUIC handshakes.
pub(crate) fn admit(worker: Rc<Worker>) -> terminus_quic::Admit {
    Rc::new(move |question| Box::pin(admit_hello(worker.clone(), question)))
}

async fn admit_hello(worker: Rc<Worker>, question: Box<dyn Any>) -> terminus_quic::Admission {
    let refused = terminus_quic::Admission {
        admitted: false,
        payer: None,
        hold: None,
    };
    let Ok(hello) = question.downcast::<QuicHello>() else {
        // Nothing else asks; were something to, it is not let through unadmitted.
        tracing::warn!("a QUIC handshake asked something other than its admission: refused");
        return refused;
    };
    let admission = &worker.admission;
    let metrics = &worker.shared.metrics;
    // Its ClientHello is read: taken on as a full handshake, within the bound, its
    // tenant's quota asked first (as over TCP: whether the handshake is within its
    // tenant's committed rate decides what is ahead of it). Either refusal is one after
    // the ClientHello, with an alert (nothing QUIC is reset unread, as a TCP connection
    // refused at accept is).
    let quotas = || hello.tenant.quota().is_some();
    let Some(ticket) = admission.at_accept(|| Duration::ZERO, || false, quotas) else {
        metrics.handshake_refused(Refusal::AtHello);
        return refused;
    };
    let arrival = quota::arrival(&hello.tenant, hello.sign, hello.kx, admission.idle());
    // The quota's wait counts against the handshake deadline, as over TCP.
    let deadline = worker.shared.site.current().timeouts.handshake;
    let admitted = tokio::time::timeout(
        deadline,
        quota::admit_arrival(&hello.tenant, arrival, &ticket),
    )
    .await;
    let Ok(admitted) = admitted else {
        admission.turned_away(ticket);
        return refused;
    };
    match admitted {
        Ok((hold, within)) => match admission.at_hello(ticket, false, within) {
            Some(ticket) => {
                hold.taken_on();
                terminus_quic::Admission {
                    admitted: true,
                    payer: Some(Box::new(hold)),
                    hold: Some(Box::new(Unmetered(Some(ticket)))),
                }
            }
            // The hold, dropped, gives the quota back.
            None => {
                metrics.handshake_refused(Refusal::AtHello);
                refused
            }
        },
        Err(cause) => {
            admission.turned_away(ticket);
            metrics.handshake_refused(Refusal::Quota);
            tracing::debug!(
                tenant = hello.tenant.name(),
                "QUIC handshake refused: {}",
                cause.name()
            );
            refused
        }
    }
}

/// A QUIC handshake's room in admission, given back when it ends without counting as a
/// handshake done (its time was not measured).
struct Unmetered(Option<Ticket>);

impl Drop for Unmetered {
    fn drop(&mut self) {
        if let Some(ticket) = self.0.take() {
            ticket.cancel();
        }
    }
}
