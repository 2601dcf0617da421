//! A request's way through the proxy: its head rewritten for the upstream, a server
//! chosen, a connection taken from the pool or opened, the exchange run, and on failure
//! one retry on another server where the request is safe to repeat (or the first server
//! cannot have seen it), with its body whole. A pooled connection the server had closed
//! while idle is not held against it: the request goes again on a new connection where
//! that is safe. Every failure ends as the status an nginx operator expects (502, 503,
//! 504) with the upstream, the server and the cause, in the log and the metrics.

use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::rc::Rc;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Instant;

use bytes::Bytes;
use hyper::body::{Body, Frame, SizeHint};
use hyper::header::{self, HeaderValue};
use hyper::{Method, Request, Response, StatusCode};

use crate::balance::hash;
use crate::connect::connect;
use crate::error::{ProxyError, ProxyErrorKind};
use crate::headers::{
    add_client_cert, add_forwarding, clean_trailers, remove_hop_by_hop, remove_underscored, Origin,
};
use crate::health::now_ms;
use crate::http1::head::{
    authority_host, declared, origin_form, write_request_head, Declared, Outgoing,
};
use crate::http1::{BodyFraming, Exchange, Failed, Stale};
use crate::metrics::{Failure, Phase};
use crate::pool::{Conn, Key, Pool};
use crate::replay::Replayable;
use crate::spec::{Balance, HashKey, Protocol};
use crate::upstream::{InProgress, Upstream};
use crate::websocket::{connect_kind, Connect, Opening};
use terminus_http::h1::{has_token, RawHead};
use tokio::io::AsyncWriteExt;

/// What every attempt at a request shares, whichever server and protocol it goes to.
pub(crate) struct Attempt {
    pub(crate) timeouts: crate::spec::Timeouts,
    pub(crate) started: Instant,
    /// The client said it takes trailers (`TE: trailers`): HTTP/2 upstreams are told so.
    pub(crate) trailers: bool,
}

/// Sends `req` to `upstream` on behalf of the client `origin` describes, and returns the
/// response to stream back. `pool` is the calling worker's. `head` is the request's head
/// as an HTTP/1.1 client sent it, where it has one: to an HTTP/1.1 upstream the request
/// goes from those bytes, and the response's head comes back as bytes too
/// ([`terminus_http::h1::PassedFields`]).
pub async fn forward<B>(
    upstream: &Arc<Upstream>,
    pool: &Rc<Pool>,
    req: Request<B>,
    head: Option<RawHead>,
    origin: &Origin,
) -> Result<Response<terminus_http::Body>, ProxyError>
where
    B: Body<Data = Bytes, Error = io::Error> + Unpin + 'static,
{
    let attempt = Attempt {
        timeouts: upstream.spec.timeouts,
        started: Instant::now(),
        trailers: has_token(req.headers(), header::TE, "trailers"),
    };
    let (mut parts, body) = req.into_parts();
    let body = Cleaned(body);
    let error = |kind, status, server: Option<usize>, detail: String| ProxyError {
        kind,
        status,
        upstream: upstream.spec.name.clone(),
        server: server.map(|i| upstream.servers[i].spec.address),
        detail,
    };
    let key = hash_key(&upstream.spec.balance, &parts, origin);
    let framing = body_framing(&body);
    let http1 = upstream.spec.protocol == Protocol::Http1;
    // An HTTP/1.1 upgrade to an HTTP/1.1 upstream keeps the Upgrade tokens the upstream
    // allows (WebSocket); any other (h2c) goes as a plain request. An h2 client's
    // WebSocket (extended CONNECT) becomes the same upgrade.
    let mut upgrade = (http1
        && parts.version == hyper::Version::HTTP_11
        && has_token(&parts.headers, header::CONNECTION, "upgrade"))
    .then(|| allowed_upgrades(&parts.headers, &upstream.spec.upgrades))
    .flatten();
    let opening = match connect_kind(&parts) {
        Connect::No => None,
        // `websocket` is always among an upstream's upgrades.
        Connect::WebSocket if http1 => {
            upgrade = Some(HeaderValue::from_static("websocket"));
            Some(Opening::rewrite(&mut parts))
        }
        Connect::WebSocket => {
            let cause = "a WebSocket over HTTP/2 goes only to an http1 upstream";
            let kind = ProxyErrorKind::WebSocketUpstream;
            return Err(error(kind, StatusCode::NOT_IMPLEMENTED, None, cause.into()));
        }
        Connect::Refused(status) => {
            let kind = ProxyErrorKind::NotAWebSocket;
            return Err(error(kind, status, None, "CONNECT for no WebSocket".into()));
        }
    };
    // An HTTP/1.1 client's head goes to an HTTP/1.1 upstream from its bytes, and the
    // answer's comes back the same way; otherwise the map is edited.
    let raw = head.filter(|_| http1);
    let pass_head = raw.is_some();
    // HTTP/1.1 heads are the same bytes for every attempt: encoded once.
    let head = match raw {
        Some(raw) => {
            let mut head = Vec::with_capacity(raw.as_bytes().len() + 256);
            let outgoing = Outgoing {
                parts: &parts,
                origin,
                client_cert: upstream.spec.client_cert,
                framing,
                upgrade: upgrade.as_ref(),
            };
            write_request_head(&mut head, &raw, &outgoing);
            head
        }
        None => {
            upstream_headers(&mut parts, origin, framing);
            add_client_cert(&mut parts.headers, origin, upstream.spec.client_cert);
            if let Some(to) = &upgrade {
                parts.headers.insert(header::UPGRADE, to.clone());
                parts
                    .headers
                    .insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
            }
            match upstream.spec.protocol {
                Protocol::Http1 => http1_head(&parts),
                Protocol::H2 | Protocol::H2c => Vec::new(),
            }
        }
    };

    let mut body = Some(match upstream.spec.protocol {
        Protocol::Http1 => Replayable::new(body),
        Protocol::H2 | Protocol::H2c => Replayable::passing(body),
    });
    let mut excluded = None;
    let mut retried = false;
    // After a stale pooled connection: the next attempt opens a new one.
    let mut fresh = false;
    loop {
        let Some(i) = upstream
            .balancer
            .choose(&upstream.servers, key, excluded, now_ms())
        else {
            return Err(match excluded {
                Some(i) => error(
                    ProxyErrorKind::NoOtherServer,
                    StatusCode::BAD_GATEWAY,
                    Some(i),
                    "no other server to retry on".into(),
                ),
                None => error(
                    ProxyErrorKind::NoServerUp,
                    StatusCode::SERVICE_UNAVAILABLE,
                    None,
                    "no server is up".into(),
                ),
            });
        };
        let server = &upstream.servers[i];
        server.metrics.request();
        let progress = InProgress::new(upstream.clone(), i);
        let body_now = body.take().expect("body");
        let outcome = match upstream.spec.protocol {
            Protocol::Http1 => {
                let exchange = Exchange {
                    head: &head,
                    method: &parts.method,
                    framing,
                    timeouts: attempt.timeouts,
                    keepalive: upstream.spec.keepalive,
                    pool,
                    pool_key: Key {
                        upstream: upstream.id,
                        server: server.spec.address,
                        client: upstream.spec.proxy_protocol.map(|_| origin.client),
                    },
                    started: attempt.started,
                    upgrade: upgrade.as_ref(),
                    pass_head,
                };
                let proxy_header = upstream
                    .spec
                    .proxy_protocol
                    .map(|v| crate::proxy_protocol::encode(v, origin.client, origin.local));
                http1_attempt(exchange, pool, proxy_header, body_now, progress, fresh).await
            }
            Protocol::H2 | Protocol::H2c => {
                crate::h2::send(&pool.h2, &parts, body_now, progress, &attempt).await
            }
        };
        let failed = match (outcome, &opening) {
            (Ok(resp), None) => return Ok(resp),
            (Ok(resp), Some(opening)) => {
                return opening.answer(resp).map_err(|cause| {
                    let kind = ProxyErrorKind::BadUpgrade;
                    error(kind, StatusCode::BAD_GATEWAY, Some(i), cause.into())
                });
            }
            (Err(failed), _) => failed,
        };
        body = failed.body;
        if let Some(stale) = failed.stale {
            // The server closed an idle connection as we reused it: not its fault. Again,
            // on a new connection (the other pooled ones have been idle as long), if it
            // cannot have seen the request or the request is safe to repeat.
            let again = match stale {
                Stale::Unsent => true,
                Stale::Unanswered => repeatable(&upstream.spec, &parts.method),
            };
            if again && body.is_some() && !fresh {
                fresh = true;
                server.metrics.stale_retry();
                continue;
            }
            // Counted, but not against its health: a keep-alive race is no sign of a
            // server in trouble.
            if let Some(failure) = failed.failure {
                server.metrics.failure(failure);
            }
            log_failure(upstream, server.spec.address, &failed.detail);
            let detail = format!("{} on a reused connection, not sent again", failed.detail);
            let kind = ProxyErrorKind::StaleReused;
            return Err(error(kind, StatusCode::BAD_GATEWAY, Some(i), detail));
        }
        let Some(failure) = failed.failure else {
            // The client's body failed: nobody is waiting for this answer.
            let kind = ProxyErrorKind::ClientBody;
            return Err(error(kind, StatusCode::BAD_REQUEST, Some(i), failed.detail));
        };
        upstream.failed(i, failure);
        log_failure(upstream, server.spec.address, &failed.detail);
        // A failed connect saw nothing: any request goes to another server. Otherwise the
        // server may have acted on it: only a request that is safe to repeat, with its
        // body whole (never sent, or held), goes (nginx's default proxy_next_upstream:
        // error, not timeouts, not non-idempotent methods).
        let connect = matches!(
            failure,
            Failure::ConnectError | Failure::ConnectTimeout | Failure::Tls
        );
        let repeatable = body.is_some()
            && (connect
                || repeatable(&upstream.spec, &parts.method)
                    && !matches!(failure, Failure::ResponseTimeout | Failure::IdleTimeout));
        if repeatable && !retried {
            retried = true;
            excluded = Some(i);
            server.metrics.retry();
            continue;
        }
        let kind = ProxyErrorKind::Failed(failure);
        return Err(error(kind, status_of(failure), Some(i), failed.detail));
    }
}

/// One HTTP/1.1 attempt: a pooled connection or a new one, then the exchange.
async fn http1_attempt<B>(
    exchange: Exchange<'_>,
    pool: &Pool,
    proxy_header: Option<Vec<u8>>,
    body: Replayable<B>,
    progress: InProgress,
    fresh: bool,
) -> Result<Response<terminus_http::Body>, Failed<Replayable<B>>>
where
    B: Body<Data = Bytes, Error = io::Error> + 'static,
{
    let server = progress.server();
    let tls = progress.upstream.spec.tls.as_ref();
    let pooled = (!fresh).then(|| pool.take(exchange.pool_key)).flatten();
    let (conn, reused) = match pooled {
        Some(conn) => (conn, true),
        None => match connect(&server.spec, tls, exchange.timeouts.connect).await {
            Ok((stream, took)) => {
                server.metrics.latency(Phase::Connect, took);
                let mut conn = Conn::new(stream);
                // The PROXY header goes first, once per connection.
                if let Some(header) = proxy_header {
                    if let Err(e) = conn.write.write_all(&header).await {
                        return Err(Failed {
                            failure: Some(Failure::Io),
                            detail: format!("writing the PROXY header: {e}"),
                            body: Some(body),
                            stale: None,
                        });
                    }
                }
                (conn, false)
            }
            Err(failed) => {
                return Err(Failed {
                    failure: Some(failed.failure),
                    detail: failed.detail,
                    body: Some(body),
                    stale: None,
                })
            }
        },
    };
    server.metrics.connection(reused);
    exchange.run(conn, reused, body, progress).await
}

fn log_failure(upstream: &Upstream, server: SocketAddr, cause: &str) {
    tracing::warn!(upstream = %upstream.spec.name, %server, "upstream request failed: {cause}");
}

/// The status a failure gives the client, as nginx: timeouts 504, anything else 502.
fn status_of(failure: Failure) -> StatusCode {
    match failure {
        Failure::ConnectTimeout | Failure::ResponseTimeout | Failure::IdleTimeout => {
            StatusCode::GATEWAY_TIMEOUT
        }
        _ => StatusCode::BAD_GATEWAY,
    }
}

/// A request a server may get twice without harm: an idempotent method (RFC 9110 section
/// 9.2.2), or any where the upstream's operator said so (`retry_non_idempotent`). Never
/// on the client's word: an `Idempotency-Key` field (a draft, which Go's client honours
/// for its own retries) says nothing of whether the application checks it, and a proxy
/// that trusted it would let any client make a POST run twice.
fn repeatable(spec: &crate::UpstreamSpec, method: &Method) -> bool {
    spec.retry_non_idempotent || is_idempotent(method)
}

fn is_idempotent(method: &Method) -> bool {
    matches!(
        *method,
        Method::GET | Method::HEAD | Method::OPTIONS | Method::TRACE | Method::PUT | Method::DELETE
    )
}

/// The client's request body as the server gets it: trailers cleaned as the head is
/// ([`clean_trailers`]), data untouched, and its size and end as the client's body tells
/// them, so that a body of known length goes with `Content-Length` (and the pump holds it
/// to that length) rather than chunked.
struct Cleaned<B>(B);

impl<B> Body for Cleaned<B>
where
    B: Body<Data = Bytes, Error = io::Error> + Unpin,
{
    type Data = Bytes;
    type Error = io::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, io::Error>>> {
        Pin::new(&mut self.0).poll_frame(cx).map(|frame| {
            frame.map(|frame| {
                frame.map(|frame| match frame.into_trailers() {
                    Ok(mut trailers) => {
                        clean_trailers(&mut trailers);
                        Frame::trailers(trailers)
                    }
                    Err(frame) => frame,
                })
            })
        })
    }

    fn is_end_stream(&self) -> bool {
        self.0.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.0.size_hint()
    }
}

/// How the request body goes to the server: by its length when known, chunked when not,
/// not at all when there is none.
fn body_framing<B: Body>(body: &B) -> BodyFraming {
    if body.is_end_stream() {
        BodyFraming::None
    } else if let Some(n) = body.size_hint().exact() {
        BodyFraming::Length(n)
    } else {
        BodyFraming::Chunked
    }
}

/// The request's fields as the server gets them: hop-by-hop fields out, fields whose name
/// has an underscore out (nginx's `underscores_in_headers off`: CGI-style servers read
/// `x_client_verify` as `X-Client-Verify`, so such a field could pass as one the proxy
/// sets), forwarding fields in, `Host` kept (from `:authority` for an HTTP/2 client), and
/// the body's framing declared.
pub(crate) fn upstream_headers(
    parts: &mut hyper::http::request::Parts,
    origin: &Origin,
    framing: BodyFraming,
) {
    let headers = &mut parts.headers;
    remove_hop_by_hop(headers);
    remove_underscored(headers);
    if !headers.contains_key(header::HOST) {
        if let Some(v) = authority_host(&parts.uri) {
            headers.insert(header::HOST, v);
        }
    }
    add_forwarding(headers, origin);
    headers.remove(header::CONTENT_LENGTH);
    match declared(framing, &parts.method) {
        Some(Declared::Length(n)) => {
            headers.insert(header::CONTENT_LENGTH, HeaderValue::from(n));
        }
        Some(Declared::Chunked) => {
            headers.insert(
                header::TRANSFER_ENCODING,
                HeaderValue::from_static("chunked"),
            );
        }
        None => {}
    }
}

/// The HTTP/1.1 request head: origin-form target and the fields as prepared.
pub(crate) fn http1_head(parts: &hyper::http::request::Parts) -> Vec<u8> {
    let target = origin_form(&parts.uri);
    let mut head = Vec::with_capacity(512);
    terminus_http::h1::encode_request_head(&mut head, &parts.method, target, &parts.headers);
    head
}

/// The client's `Upgrade` tokens that `allowed` names (by protocol name, any version),
/// as one field; `None` when none is.
fn allowed_upgrades(headers: &hyper::HeaderMap, allowed: &[String]) -> Option<HeaderValue> {
    let kept: Vec<&str> = terminus_http::h1::tokens(headers, header::UPGRADE)
        .filter(|t| {
            let name = t.split('/').next().unwrap_or(t);
            allowed.iter().any(|a| a.eq_ignore_ascii_case(name))
        })
        .collect();
    (!kept.is_empty())
        .then(|| HeaderValue::from_str(&kept.join(", ")).ok())
        .flatten()
}

fn hash_key(
    balance: &Balance,
    parts: &hyper::http::request::Parts,
    origin: &Origin,
) -> Option<u64> {
    let Balance::Hash(key) = balance else {
        return None;
    };
    match key {
        HashKey::ClientIp => Some(hash(&origin.client.ip())),
        HashKey::Uri => Some(hash(&parts.uri.path_and_query().map(|p| p.as_str()))),
        HashKey::Header(name) => parts
            .headers
            .get(name.as_str())
            .map(|v| hash(&v.as_bytes())),
    }
}
