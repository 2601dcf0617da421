//! terminus's application, what answers requests whatever their HTTP version (the
//! protocols are `terminus-http`'s): a request's host and path are settled
//! ([`terminus_http::target`]),
//! it goes to the virtual host its handshake was made for (SNI's, or the default server's
//! without SNI), then to that host's route for the path. A request naming another
//! configured server is misdirected (421): a connection reaches only the server whose
//! certificate it checked and whose tenant paid for its handshake; one that names no host
//! is given the server's ([`ConnectionInfo::default_host`]). Every response is signed
//! with its server's `Server` token, counted and logged here.

use std::borrow::Cow;
use std::cell::RefCell;
use std::net::SocketAddr;
use std::rc::Rc;
use std::sync::Arc;

use hyper::header;
use hyper::{Method, Request, Response, StatusCode, Version};

use terminus_http::body::{Body, RequestBody};
use terminus_http::{files, Http2Trouble, Responder};

use crate::logs::throttled::Throttled;
use crate::metrics::Metrics;
use crate::site::Site;

pub mod error_pages;
pub mod limits;
pub mod redirect;
pub mod route;

/// What answering a connection's requests needs, fixed for the connection.
pub struct ConnectionInfo {
    pub site: Arc<Site>,
    pub sni: Option<String>,
    /// The virtual host the handshake was made for (SNI's, else the default), fixed for
    /// the connection.
    pub host: usize,
    pub peer: SocketAddr,
    /// The address the client connected to.
    pub local: SocketAddr,
    pub metrics: Arc<Metrics>,
    /// The worker's open-file cache.
    pub files: Rc<files::FileCache>,
    /// What this connection's responses' encoders may hold (within its worker's).
    pub compression: Rc<terminus_http::compress::ConnectionMemory>,
    /// The worker's idle upstream connections.
    pub upstream_pool: Rc<terminus_proxy::Pool>,
    /// Who the connection's requests come from, as proxied requests tell upstreams.
    pub origin: terminus_proxy::Origin,
    /// The connection's handshake: its phases, and when it ended.
    pub handshake: terminus_observe::Observed,
    /// What every response says of HTTP/3 on this port (`Alt-Svc`), where the listener
    /// serves it.
    pub alt_svc: Option<hyper::header::HeaderValue>,
    /// The TLS version agreed ("TLSv1.3", "TLSv1.2"), for the access log.
    pub tls_version: &'static str,
}

/// A worker says at most this often that a request naming no host found no name to go
/// with (a client can send such requests at will).
const NO_HOST_EVERY: std::time::Duration = std::time::Duration::from_secs(60);

thread_local! {
    static NO_HOST_SAID: RefCell<Throttled> = const { RefCell::new(Throttled::new(NO_HOST_EVERY)) };
}

impl ConnectionInfo {
    /// The host a request that names none is given (HTTP/1.0 without `Host`, HTTP/2 or
    /// HTTP/3 without `:authority` or `host`), so that an upstream is told one, as RFC
    /// 9112 section 3.2 requires, the same whatever the client's HTTP version: the name
    /// the client's SNI sent, where it is this server's (one of its names, or one under
    /// its wildcards: the host the client meant, which a wildcard cannot say), else the
    /// server's first exact name (as nginx's `$host` falls back on `server_name`). A
    /// wildcard is never sent: a server of wildcards alone, reached without an SNI of
    /// its own (none, or another name it answers as the default server), has no name to
    /// give (None).
    pub(crate) fn default_host(&self) -> Option<Cow<'_, str>> {
        let from_sni = self
            .sni
            .as_deref()
            .filter(|sni| self.site.resolver.find(sni) == Some(self.host))
            .map(|sni| sni.trim_end_matches('.').to_ascii_lowercase())
            // A host name's characters only: SNI under a wildcard is the client's text.
            .filter(|name| {
                !name.is_empty()
                    && name
                        .bytes()
                        .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'.' || b == b'_')
            });
        match from_sni {
            Some(name) => Some(Cow::Owned(name)),
            None => self.site.hosts[self.host]
                .first_exact_name()
                .map(Cow::Borrowed),
        }
    }

    /// A request named no host and [`Self::default_host`] found none: it goes on as it
    /// came, without one (an HTTP/1.1 upstream then has none either). Said, throttled.
    fn no_default_host(&self) {
        let Some(more) = NO_HOST_SAID.with(|said| said.borrow_mut().now_with_held()) else {
            return;
        };
        tracing::warn!(
            client = %self.peer,
            sni = self.sni.as_deref().unwrap_or("-"),
            "a request naming no host (HTTP/1.0 without Host, or HTTP/2 or HTTP/3 without :authority) reached server {:?}, whose names are all wildcards, without SNI naming one of its hosts: it goes on without a Host, as it came{more}; give the server an exact name in `names` to send instead",
            self.site.hosts[self.host].names,
        );
    }

    /// Answers `req` with an error page, its small body read away first.
    async fn refuse(&self, req: Request<RequestBody>, status: StatusCode) -> Response<Body> {
        let within = self.site.timeouts.http.request_header;
        terminus_http::refuse(req, status, within, self.server_token()).await
    }
}

impl ConnectionInfo {
    /// The answer to `req` from its route (or the refusal before one), compressed as the
    /// route says; and whether the route intercepts its upstream's errors.
    async fn answer(
        &self,
        mut req: Request<RequestBody>,
        head: Option<terminus_http::h1::RawHead>,
    ) -> (Response<Body>, bool) {
        let host = &self.site.hosts[self.host];
        let named = match terminus_http::target::settle_host(&mut req)
            .and_then(|name| terminus_http::target::settle_path(&mut req).map(|()| name))
        {
            Ok(name) => name,
            Err(status) => return (self.refuse(req, status).await, false),
        };
        if named.is_none() {
            // No host named: the request is its handshake's server's, and says so from
            // here on, so that routes and upstreams see one host whatever the version.
            match self.default_host() {
                Some(name) => {
                    if let Ok(value) = header::HeaderValue::from_str(&name) {
                        req.headers_mut().insert(header::HOST, value);
                    }
                }
                None => self.no_default_host(),
            }
        }
        // Host (or :authority) naming another configured server: that server's
        // certificate was not shown and its tenant did not pay (RFC 9110 section
        // 15.5.20). An unknown name is the handshake's server's to answer. (With one
        // server there is no other: no look-up.)
        if self.site.hosts.len() > 1
            && named
                .as_ref()
                .and_then(|name| self.site.resolver.find(name.host()))
                .is_some_and(|i| i != self.host)
        {
            return (
                self.refuse(req, StatusCode::MISDIRECTED_REQUEST).await,
                false,
            );
        }
        let chosen = host.routes.choose(req.uri().path());
        // The route's own rules, else its server's (nginx's location and server); asked
        // before a missing route's 404, so that a refused client cannot map the routes.
        let access = chosen
            .and_then(|e| e.access.as_ref())
            .unwrap_or(&host.access);
        let allowed = access.allows(self.peer.ip());
        // Then the route's rate, else its server's (none for a route's "off"): counted
        // only for a client the rules let in, and before any route answers (a missing
        // route's 404 too: a scanner is limited as any client is).
        let rate = match chosen.and_then(|e| e.rate.as_ref()) {
            Some(own) => own.as_ref(),
            None => host.rate.as_ref(),
        };
        let limited = match rate {
            Some(rule) if allowed => rule.check(&self.site.clients, &req, self.peer.ip()),
            _ => None,
        };
        // What compressing the answer needs of the request, which the route takes.
        let method = req.method().clone();
        let compression = chosen.and_then(|e| e.compression.as_ref()).map(|c| {
            let accept = terminus_http::compress::accept_encoding(req.headers());
            (c, accept)
        });
        let intercept = chosen.is_some_and(|e| {
            matches!(
                e.route,
                route::Route::Proxy {
                    intercept_errors: true,
                    ..
                }
            )
        });
        let mut resp = match (chosen, limited) {
            _ if !allowed => self.refuse(req, StatusCode::FORBIDDEN).await,
            // 429 (RFC 6585, as Caddy's rate_limit), where nginx's default is 503: the
            // client, not the server, is to blame, and Retry-After says when to return.
            (_, Some(wait)) => limits::with_retry_after(
                self.refuse(req, StatusCode::TOO_MANY_REQUESTS).await,
                wait,
            ),
            (Some(entry), None) => entry.route.respond(req, head, self).await,
            (None, None) => self.refuse(req, StatusCode::NOT_FOUND).await,
        };
        if let Some((compression, accept)) = compression {
            resp = compression.apply(resp, &method, accept.as_ref(), &self.compression);
        }
        (resp, intercept)
    }
}

impl Responder for ConnectionInfo {
    async fn respond(
        &self,
        req: Request<RequestBody>,
        head: Option<terminus_http::h1::RawHead>,
    ) -> Response<Body> {
        // For the access log's duration only: the clock read, and the extension (its map
        // and entry: allocations), are not a request's cost without an access log.
        let started = self
            .site
            .access_log
            .is_some()
            .then(|| crate::logs::access::Started(std::time::Instant::now()));
        let host = &self.site.hosts[self.host];
        let method = req.method().clone();
        let (mut resp, intercept) = self.answer(req, head).await;
        if !host.error_pages.is_empty() {
            resp = host.error_pages.apply(resp, &method, intercept);
        }
        // Every answer, errors too (nginx `add_header ... always`); a header the answer
        // already has (an upstream's own) wins.
        for (name, value) in &host.headers {
            // Vary lists fields: the server's are added to those the answer varies by.
            if name == header::VARY {
                terminus_http::vary_by(&mut resp, value);
            } else {
                terminus_http::add_unless_present(&mut resp, name, value);
            }
        }
        // Whatever made the answer (a file, a page, an upstream, whose own is replaced).
        host.token.sign(&mut resp);
        if let Some(alt_svc) = &self.alt_svc {
            terminus_http::add_unless_present(&mut resp, &header::ALT_SVC, alt_svc);
        }
        if let Some(started) = started {
            resp.extensions_mut().insert(started);
        }
        resp
    }

    fn record(&self, method: &Method, target: &str, version: Version, resp: &Response<Body>) {
        self.metrics.response(resp.status().as_u16(), version);
        self.handshake.responded();
        let len = terminus_http::field(resp, &header::CONTENT_LENGTH)
            .and_then(|v| std::str::from_utf8(v).ok());
        terminus_probes::response(self.handshake.id, resp.status().as_u16(), || {
            len.and_then(|l| l.parse().ok()).unwrap_or(-1)
        });
        if let Some(log) = &self.site.access_log {
            let took = &self.handshake.breakdown;
            log.request(&crate::logs::access::RequestLine {
                client: self.peer,
                method: method.as_str(),
                path: target,
                version,
                status: resp.status().as_u16(),
                bytes: len.and_then(|l| l.parse().ok()),
                duration: resp
                    .extensions()
                    .get::<crate::logs::access::Started>()
                    .map(|s| s.0.elapsed()),
                tls: Some(crate::logs::access::Tls {
                    sni: self.sni.as_deref(),
                    version: self.tls_version,
                    tenant: self.site.hosts[self.host].tenant.name(),
                    client_verify: self.origin.client_verify(),
                    handshake: took.total,
                    crypto_wait: took.get(terminus_observe::Phase::CryptoQueue),
                }),
                upstream: resp.extensions().get::<terminus_http::Upstreamed>(),
            });
        }
    }

    fn http2_trouble(&self, trouble: Http2Trouble) {
        self.metrics.http2_trouble(trouble);
    }

    /// The handshake's server's: a connection reaches only that server.
    fn server_token(&self) -> &terminus_http::ServerToken {
        &self.site.hosts[self.host].token
    }
}
