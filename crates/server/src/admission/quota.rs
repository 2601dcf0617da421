//! Tenant quotas at the ClientHello: once SNI has named the host, and with it the tenant,
//! and before the handshake asks for any crypto, the handshake is admitted against the
//! tenant's quota (`terminus_admission::tenant`), waits for it, or is refused.
//!
//! It is charged what it will probably cost: the signature of the certificate the
//! resolver will choose for this ClientHello (none when it offers a session this server
//! can resume: a ticket it issued, not merely a pre_shared_key) and the key
//! exchange of the first group the client lists that terminus has. The engine then
//! charges what each request costs, and the estimate is settled when the handshake ends.
//!
//! The quota decides before the admission bound does: a handshake it admits at once, as
//! committed capacity, is within its tenant's committed rate, and has only other such
//! handshakes ahead of it in the bound (`terminus_admission::bound`); one that waited for
//! its quota is asked about the bound after its wait, when it is about to be work.
//!
//! A resumption that rustls declines (a genuine ticket for another name or suite) signs
//! after all: [`full_after_all`] has its first signature admitted again as the full
//! handshake it turned into, by the admission bound and by `prefer_cheap`.

use std::cell::Cell;
use std::rc::Rc;
use std::sync::Arc;

use rustls::server::ClientHello;
use terminus_admission::bound::Line;
use terminus_admission::tenant::{Admission, Arrival, Hold, QuotaRefusal, TenantAccount};
use terminus_engine::cost::Operation;
use terminus_engine::{HandshakeContext, KeyAlgorithm, KxGroup};
use terminus_tls::{ClientHelloRead, SniResolver};
use tokio::time::Instant;

use super::Ticket;

/// Admits the handshake of `read` against `tenant`'s quota, after the wait the quota asks
/// for (the handshake deadline still holds: a wait that outlasts it ends in a handshake
/// timeout). `idle`: the worker has capacity to lend. `admitted`: the handshake's room in
/// admission control, set aside while it waits. The hold, and its tenant's line where it
/// was admitted within its committed rate (see [`admit_arrival`]): once admission
/// control takes it on too, [`taken_on`] charges its crypto to the hold.
pub(crate) async fn admit(
    tenant: &Arc<TenantAccount>,
    resolver: &SniResolver,
    read: &ClientHelloRead,
    (config, versions): (&rustls::ServerConfig, &[rustls::ProtocolVersion]),
    idle: bool,
    admitted: &Ticket,
) -> Result<(Hold, Option<Line>), QuotaRefusal> {
    let hello = read.client_hello();
    let sign = if read.offers_resumption(config, versions) {
        None
    } else {
        resolver.key_for(&hello)
    };
    let arrival = arrival(tenant, sign, first_kx(&hello), idle);
    admit_arrival(tenant, arrival, admitted).await
}

/// A handshake its tenant's quota admitted (`hold`) and admission control then took on:
/// counted admitted, and `ctx`'s crypto charged to the hold. One the bound refuses is
/// neither: its hold, dropped, gives the quota back.
pub(crate) fn taken_on(ctx: &HandshakeContext, hold: Hold) {
    hold.taken_on();
    ctx.charge_to(hold);
}

/// The key exchange a handshake of `hello` will probably compute: the first group the
/// client lists that terminus has.
pub(crate) fn first_kx(hello: &ClientHello<'_>) -> Operation {
    hello
        .named_groups()
        .and_then(|groups| {
            groups
                .iter()
                .find_map(|g| KxGroup::ALL.into_iter().find(|k| k.named_group() == *g))
        })
        .map_or(Operation::X25519, Operation::for_group)
}

/// What a handshake will probably cost `tenant`: the signature of `sign` (none for a
/// resumption) and the key exchange `kx`. `idle`: the worker has capacity to lend.
pub(crate) fn arrival(
    tenant: &TenantAccount,
    sign: Option<KeyAlgorithm>,
    kx: Operation,
    idle: bool,
) -> Arrival {
    Arrival {
        estimate: tenant.estimate(sign, kx),
        cheap: !matches!(sign, Some(KeyAlgorithm::Rsa { .. })),
        idle,
    }
}

/// Admits `arrival` against `tenant`'s quota, after the wait the quota asks for, its room
/// in admission control (`admitted`) set aside meanwhile; the hold to charge the
/// handshake's crypto to, and its tenant's line in admission control where the handshake
/// is within its tenant's committed rate: admitted at once, as committed capacity. One
/// that had to wait (its tenant is past its committed rate), borrowed, or has no quota
/// to be within is in no line.
pub(crate) async fn admit_arrival(
    tenant: &Arc<TenantAccount>,
    arrival: Arrival,
    admitted: &Ticket,
) -> Result<(Hold, Option<Line>), QuotaRefusal> {
    match tenant.admit(Instant::now().into_std(), arrival) {
        Admission::Now(hold) => {
            let line = hold.line();
            Ok((hold, line))
        }
        Admission::After(wait, hold) => {
            let (_waiting, _aside) = (tenant.waiting(), admitted.aside());
            tokio::time::sleep(wait).await;
            Ok((hold, None))
        }
        Admission::Refused(cause) => Err(cause),
    }
}

/// Why a handshake admitted as a resumption was refused at its first signature.
#[derive(Debug, Clone, Copy)]
pub(crate) enum TurnedFull {
    /// Beyond the admission bound.
    Overloaded,
    /// Its tenant's quota refuses expensive handshakes now.
    Quota(QuotaRefusal),
}

/// Has the first signature of `ctx`'s handshake, admitted as a resumption, admitted again
/// as the full handshake it turned into; a refusal is written to `refused` and refuses
/// the signature. `idle`: whether the worker has capacity to lend, asked then. `within`:
/// its tenant's line, where it was admitted within its committed rate.
pub(crate) fn full_after_all(
    ctx: &mut HandshakeContext,
    (admission, within): (Rc<super::Admission>, Option<Line>),
    tenant: Arc<TenantAccount>,
    refused: Rc<Cell<Option<TurnedFull>>>,
) {
    ctx.check_first_signature(move || {
        let turned = if !admission.fits_full(within) {
            Some(TurnedFull::Overloaded)
        } else {
            tenant
                .refuses_expensive(Instant::now().into_std(), admission.idle())
                .map(TurnedFull::Quota)
        };
        refused.set(turned);
        turned.is_none()
    });
}
