//! Stage 1: the ClientHello, and what it decides.
//!
//! The server block (virtual host) and the tenant are resolved from SNI here, before the
//! handshake, so that every crypto request of the handshake is charged to its tenant and
//! so that a route other than terminating TLS and serving HTTP here (a `[[stream]]`,
//! terminated or passed through) can be chosen.

use std::rc::Rc;
use std::sync::Arc;

use terminus_proxy::stream::StreamMode;
use terminus_proxy::Upstream;
use terminus_tls::{read_client_hello, ClientHelloRead, HandshakeError};
use tokio::time::timeout_at;

use super::{Accepted, Closed};
use crate::worker::Worker;

/// What to do with a connection once its ClientHello is known.
#[derive(Debug, Clone)]
pub(crate) enum Route {
    /// Complete the handshake here and serve HTTP.
    Terminate,
    /// Complete the handshake here and carry the plaintext to the upstream (a
    /// `[[stream]]` in terminate mode).
    Stream(Arc<Upstream>),
    /// Carry the client's bytes to the upstream untouched, the ClientHello first (a
    /// `[[stream]]` in passthrough mode).
    Passthrough(Arc<Upstream>),
    /// An ACME CA validating TLS-ALPN-01 (ALPN `acme-tls/1` alone, an order waiting on
    /// the name): the handshake shows the challenge certificate of this configuration,
    /// and the connection closes after it (RFC 8737 section 3).
    AcmeChallenge(Arc<rustls::ServerConfig>),
}

/// Stage 1: the ClientHello has been read; nothing has been answered yet.
pub(crate) struct Hello {
    pub(super) accepted: Accepted,
    pub(super) read: ClientHelloRead,
    /// The virtual host SNI chose (the default one without SNI).
    pub(super) host: usize,
    pub(crate) route: Route,
}

/// The TLS-ALPN-01 answer for this ClientHello: only when it offers `acme-tls/1`, and
/// nothing else (RFC 8737 section 3: the validating client offers that protocol alone),
/// and an order is waiting on its SNI.
fn acme_challenge(
    read: &ClientHelloRead,
    sni: Option<&str>,
    worker: &Worker,
) -> Option<Arc<rustls::ServerConfig>> {
    let mut alpn = read.client_hello().alpn()?;
    if alpn.next()? != terminus_acme::challenges::ACME_TLS_ALPN || alpn.next().is_some() {
        return None;
    }
    worker.shared.challenges.tls_alpn01(sni?)
}

impl Accepted {
    /// Reads the ClientHello and resolves host, tenant and route from it.
    pub(super) async fn hello(mut self, worker: &Rc<Worker>) -> Result<Hello, Closed> {
        let counters = &worker.shared.metrics.traffic;
        let read = match timeout_at(
            self.handshake_deadline,
            read_client_hello(&self.socket, &worker.engine, counters),
        )
        .await
        {
            Ok(Err(HandshakeError::PlainText)) => {
                // No SNI, no Host: the default server's token.
                let token = &self.site.hosts[self.site.resolver.lookup(None)].token;
                terminus_http::plain_http_refused(&mut self.socket, self.handshake_deadline, token)
                    .await;
                return Err(Closed::Handshake(HandshakeError::PlainText));
            }
            Ok(read) => read.map_err(Closed::Handshake)?,
            Err(_) => return Err(Closed::HandshakeTimeout(self.site.timeouts.handshake)),
        };
        let sni = read.client_hello().server_name().map(Arc::<str>::from);
        let host = self.site.resolver.lookup(sni.as_deref());
        let route = match (
            &self.site.hosts[host].stream,
            acme_challenge(&read, sni.as_deref(), worker),
        ) {
            (_, Some(challenge)) => Route::AcmeChallenge(challenge),
            (None, None) => Route::Terminate,
            (Some((upstream, StreamMode::Terminate)), None) => Route::Stream(upstream.clone()),
            (Some((upstream, StreamMode::Passthrough)), None) => {
                Route::Passthrough(upstream.clone())
            }
        };
        self.ctx.hello(sni, read.first_byte());
        Ok(Hello {
            accepted: self,
            read,
            host,
            route,
        })
    }
}
