//! A QUIC connection whose handshake completed (crates/quic): its requests served over
//! HTTP/3 by the same responder as a TCP connection's, with the same site snapshot,
//! virtual host (from SNI), origin and handshake observation.

use std::rc::Rc;

use crate::app::ConnectionInfo;
use crate::worker::{OpenConnection, Worker};
use terminus_config::Listen;

/// What this worker does with QUIC handshakes on `listen` (admits them as TCP ones,
/// [`crate::admission::quic`]) and with each connection established: serves it.
pub(crate) fn hooks(worker: Rc<Worker>, listen: Listen) -> terminus_quic::Hooks {
    let listen = Rc::new(listen);
    let admit = crate::admission::quic::admit(worker.clone());
    terminus_quic::Hooks {
        on_established: Rc::new(move |established| {
            tokio::task::spawn_local(serve(worker.clone(), listen.clone(), established));
        }),
        admit,
    }
}

async fn serve(worker: Rc<Worker>, listen: Rc<Listen>, established: terminus_quic::Established) {
    let terminus_quic::Established {
        mut h3,
        remote,
        local,
        sni,
        handshake,
        early,
    } = established;
    let site = worker.shared.site.current();
    let host = site.resolver.lookup(sni.as_deref());
    // TLS 1.3 signs in every handshake but a resumption: what the engine signed with
    // tells both, as rustls's handshake kind does over TCP (quinn does not pass it on).
    let signed_with = handshake.signed_with();
    let observed = super::handshake::observe(
        &handshake,
        (
            "TLSv1.3",
            signed_with.map_or("none", |k| k.label()),
            signed_with.is_none(),
        ),
        &site.hosts[host].tenant,
        &worker,
    );
    // Counted against max_connections like a TCP connection (once its handshake is
    // observed: it completed); none left: closed with HTTP/3's "excessive load".
    let Ok(permit) = worker.shared.connection_limit.clone().try_acquire_owned() else {
        h3::quic::OpenStreams::<bytes::Bytes>::close(
            &mut h3,
            h3::error::Code::H3_EXCESSIVE_LOAD,
            b"too many connections",
        );
        return;
    };
    let mut open = OpenConnection::new(worker.clone(), permit);
    // Counted for its address as a TCP connection is, only later: once the handshake
    // has been paid for (a QUIC Initial carries no connection to refuse cheaply before
    // it; the handshake admission and the rates guard that CPU).
    if !open.count_client(remote.ip(), &site) {
        tracing::debug!(peer = %remote, "limits.connections_per_client reached: QUIC connection closed");
        h3::quic::OpenStreams::<bytes::Bytes>::close(
            &mut h3,
            h3::error::Code::H3_EXCESSIVE_LOAD,
            b"too many connections from this address",
        );
        return;
    }
    let info = ConnectionInfo {
        origin: terminus_proxy::Origin::new(remote, local, "https")
            .keeping_forwarded(listen.keeps_forwarded(remote.ip())),
        site,
        host,
        sni,
        peer: remote,
        local,
        metrics: worker.shared.metrics.clone(),
        files: worker.files.clone(),
        compression: terminus_http::compress::ConnectionMemory::new(
            &worker.compression,
            terminus_http::compress::memory::PER_CONNECTION,
        ),
        upstream_pool: worker.upstream_pool.clone(),
        handshake: observed,
        alt_svc: None,
        tls_version: "TLSv1.3",
    };
    terminus_http::h3::server::serve(
        h3,
        Rc::new(info),
        early,
        worker.shared.shutdown.clone(),
        open,
    )
    .await;
}
