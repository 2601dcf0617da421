//! The responder of a plain-HTTP listener (`plain = "redirect"`): ACME HTTP-01
//! challenges first, then every request sent to the same host and path over HTTPS.
//!
//! The redirect is a 308 (RFC 9110 section 15.4.9), Caddy's choice: unlike nginx's
//! common `return 301`, it keeps the method and body, so a POST to `http://` arrives
//! as a POST. Any valid Host is redirected (nginx's `https://$host$request_uri`); the
//! HTTPS port is the first TLS listener's, left out when it is 443. An HTTP/1.0 request
//! without Host goes to the default server's first exact name, as nginx's `$host` falls
//! back on the server's name; a default server of wildcards alone has no name to send it
//! to (a wildcard is no host): 400.
//!
//! Each answer carries the `Server` field (and its page the last line) of the server its
//! Host names; one that names none configured, or none at all, and what the connection
//! refuses before reading a Host, the default server's.

use std::net::SocketAddr;
use std::sync::Arc;

use hyper::header::{self, HeaderValue};
use hyper::{Method, Request, Response, StatusCode, Version};

use crate::metrics::Metrics;
use crate::site::Site;
use terminus_http::body::{Body, RequestBody};
use terminus_http::{error_response, Responder, ServerToken};

/// Where ACME's HTTP-01 validation asks (RFC 8555 section 8.3).
const CHALLENGE_PREFIX: &str = "/.well-known/acme-challenge/";

/// What answering one plain connection's requests needs.
pub(crate) struct Redirect {
    pub(crate) site: Arc<Site>,
    pub(crate) peer: SocketAddr,
    /// The HTTPS port to send clients to; `None` for 443.
    pub(crate) https_port: Option<u16>,
    pub(crate) challenges: Arc<terminus_acme::Challenges>,
    pub(crate) metrics: Arc<Metrics>,
}

impl Redirect {
    async fn refuse(
        &self,
        req: Request<RequestBody>,
        status: StatusCode,
        token: &ServerToken,
    ) -> Response<Body> {
        let within = self.site.timeouts.http.request_header;
        terminus_http::refuse(req, status, within, token).await
    }

    /// The answer to `req`, from `token`'s server.
    async fn answer(
        &self,
        req: Request<RequestBody>,
        host: Result<Option<hyper::http::uri::Authority>, StatusCode>,
        token: &ServerToken,
    ) -> Response<Body> {
        if let Some(challenge) = req.uri().path().strip_prefix(CHALLENGE_PREFIX) {
            if let Some(answer) = self.challenges.http01(challenge) {
                let len = answer.len();
                let body = if req.method() == Method::HEAD {
                    Body::Empty
                } else {
                    Body::bytes(answer)
                };
                return Response::builder()
                    .header(header::CONTENT_TYPE, "application/octet-stream")
                    .header(header::CONTENT_LENGTH, len)
                    .body(body)
                    .expect("valid response");
            }
        }
        // `OPTIONS *` names no resource to send anywhere.
        if !req.uri().path().starts_with('/') {
            return self.refuse(req, StatusCode::BAD_REQUEST, token).await;
        }
        let default_name = || self.site.hosts[self.site.resolver.lookup(None)].first_exact_name();
        let host = match &host {
            Ok(Some(host)) => host.host(),
            Ok(None) => match default_name() {
                Some(name) => name,
                None => return self.refuse(req, StatusCode::BAD_REQUEST, token).await,
            },
            Err(_) => return self.refuse(req, StatusCode::BAD_REQUEST, token).await,
        };
        let target = req.uri().path_and_query().map_or("/", |p| p.as_str());
        let location = match self.https_port {
            None => format!("https://{host}{target}"),
            Some(port) => format!("https://{host}:{port}{target}"),
        };
        let Ok(location) = HeaderValue::try_from(location) else {
            return self.refuse(req, StatusCode::BAD_REQUEST, token).await;
        };
        let method = req.method().clone();
        let mut resp = error_response(StatusCode::PERMANENT_REDIRECT, &method, token);
        resp.headers_mut().insert(header::LOCATION, location);
        // The body is not wanted: the client follows (or not) either way.
        req.into_body()
            .discard(
                terminus_http::DISCARD_LIMIT,
                self.site.timeouts.http.request_header,
            )
            .await;
        resp
    }

    /// The token of the server `host` names: the default server's for one configured
    /// nowhere, or none.
    fn token_for(&self, host: Option<&hyper::http::uri::Authority>) -> &ServerToken {
        let i = self.site.resolver.lookup(host.map(|h| h.host()));
        &self.site.hosts[i].token
    }
}

impl Responder for Redirect {
    async fn respond(
        &self,
        mut req: Request<RequestBody>,
        _head: Option<terminus_http::h1::RawHead>,
    ) -> Response<Body> {
        let host = terminus_http::target::settle_host(&mut req);
        let token = self.token_for(host.as_ref().ok().and_then(Option::as_ref));
        let mut resp = self.answer(req, host, token).await;
        token.sign(&mut resp);
        resp
    }

    /// No SNI and no Host yet: the default server's.
    fn server_token(&self) -> &ServerToken {
        self.token_for(None)
    }

    fn record(&self, method: &Method, target: &str, version: Version, resp: &Response<Body>) {
        self.metrics.response(resp.status().as_u16(), version);
        if let Some(log) = &self.site.access_log {
            log.request(&crate::logs::access::RequestLine {
                client: self.peer,
                method: method.as_str(),
                path: target,
                version,
                status: resp.status().as_u16(),
                bytes: resp
                    .headers()
                    .get(header::CONTENT_LENGTH)
                    .and_then(|v| v.to_str().ok()?.parse().ok()),
                // Answered at once, from the head alone.
                duration: None,
                tls: None,
                upstream: None,
            });
        }
    }
}
