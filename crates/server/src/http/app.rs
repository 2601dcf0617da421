//! terminus's own responder: a request goes to the virtual host SNI chose (or, without
//! SNI, its Host header names), then to that host's route for the path. Every response
//! is counted and logged here.

use std::net::SocketAddr;
use std::rc::Rc;
use std::sync::Arc;

use hyper::header;
use hyper::{Method, Request, Response, StatusCode, Version};

use super::body::{Body, RequestBody};
use super::{error_response, files, Responder};
use crate::metrics::Metrics;
use crate::site::Site;

/// What answering a connection's requests needs, fixed for the connection.
pub struct ConnectionInfo {
    pub site: Arc<Site>,
    pub sni: Option<String>,
    /// The virtual host SNI chose, fixed for the connection; without SNI each request's
    /// Host header chooses.
    pub sni_host: Option<usize>,
    pub peer: SocketAddr,
    /// The address the client connected to.
    pub local: SocketAddr,
    pub metrics: Arc<Metrics>,
    /// The worker's open-file cache.
    pub files: Rc<files::FileCache>,
    /// The worker's idle upstream connections.
    pub upstream_pool: Rc<terminus_proxy::Pool>,
    /// Who the connection's requests come from, as proxied requests tell upstreams.
    pub origin: terminus_proxy::Origin,
    /// The connection's handshake: its phases, and when it ended.
    pub handshake: terminus_observe::Observed,
}

impl Responder for ConnectionInfo {
    async fn respond(&self, req: Request<RequestBody>) -> Response<Body> {
        let index = self.sni_host.unwrap_or_else(|| {
            let host = req
                .headers()
                .get(header::HOST)
                .and_then(|h| h.to_str().ok())
                .or(req.uri().host())
                .map(|h| h.rsplit_once(':').map_or(h, |(name, _)| name));
            self.site.resolver.lookup(host)
        });
        let host = &self.site.hosts[index];
        let mut resp = match host.routes.choose(req.uri().path()) {
            Some(route) => route.respond(req, self).await,
            None => {
                let method = req.method().clone();
                let within = self.site.timeouts.request_header;
                req.into_body().discard(super::DISCARD_LIMIT, within).await;
                error_response(StatusCode::NOT_FOUND, &method)
            }
        };
        // Every answer, errors too (nginx `add_header ... always`); a header the answer
        // already has (an upstream's own) wins.
        for (name, value) in &host.headers {
            resp.headers_mut()
                .entry(name)
                .or_insert_with(|| value.clone());
        }
        resp
    }

    fn record(&self, method: &Method, target: &str, version: Version, resp: &Response<Body>) {
        self.metrics.response(resp.status().as_u16());
        self.handshake.responded();
        let len = resp
            .headers()
            .get(header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok());
        terminus_probes::response(self.handshake.id, resp.status().as_u16(), || {
            len.and_then(|l| l.parse().ok()).unwrap_or(-1)
        });
        if let Some(log) = &self.site.access_log {
            let len = len.unwrap_or("-");
            // Proxied: which server answered, its status and header time (nginx's
            // $upstream_addr, $upstream_status, $upstream_header_time).
            let upstream = resp
                .extensions()
                .get::<terminus_proxy::Upstreamed>()
                .map_or(String::new(), |u| {
                    format!(
                        " upstream={} upstream_status={} upstream_time={:.3}",
                        u.server,
                        u.status,
                        u.header_time.as_secs_f64()
                    )
                });
            // The connection's handshake, on each of its requests (Tengine's
            // $ssl_handshake_time): its total and its crypto requests' queue wait.
            let took = &self.handshake.breakdown;
            log.write(format_args!(
                "{} \"{} {} {:?}\" {} {} \"{}\"{upstream} handshake_time={:.4} crypto_wait={:.4}",
                self.peer,
                method,
                target,
                version,
                resp.status().as_u16(),
                len,
                self.sni.as_deref().unwrap_or("-"),
                took.total.as_secs_f64(),
                took.get(terminus_observe::Phase::CryptoQueue).as_secs_f64(),
            ));
        }
    }
}
