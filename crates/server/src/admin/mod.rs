//! The admin listener: `GET /`, the status page ([`status`] has its figures, [`page`]
//! renders them), `GET /status.json` (the same figures, for the page's script),
//! `GET /metrics` (Prometheus), `GET /capacity` (the crypto capacity table, JSON) and
//! `GET /healthz`; plain HTTP on terminus's own HTTP/1.1 server, with the site's request
//! and keep-alive deadlines and a cap on connections, read-only (every other method is
//! refused), meant for loopback or a management network.

mod page;
mod status;

use std::cell::RefCell;
use std::collections::HashMap;
use std::net::{IpAddr, TcpListener as StdListener};
use std::rc::Rc;
use std::sync::Arc;

use bytes::Bytes;
use hyper::{header, Method, Request, Response, StatusCode, Version};
use terminus_http::body::{Body, RequestBody};
use terminus_http::h1::RawHead;
use terminus_http::{Responder, Timeouts};
use tokio::net::TcpListener;
use tokio::sync::watch;

use crate::metrics::Metrics;
pub(crate) use status::Listener;
use status::Status;

/// The most connections the admin listener holds at once: scrapers and a few browsers.
/// Past it a connection is closed at accept, so that whoever reaches the port cannot
/// spend the process's descriptors (its TLS listeners need them).
const MAX_CONNECTIONS: usize = 64;

/// The most of them one address holds (IPv6 counted by /64, as client limits are): one
/// host holding idle or half-sent connections cannot leave another's scraper no room.
const PER_ADDRESS: usize = 8;

/// The admin listener's connections, all and by address.
#[derive(Default)]
struct Places {
    open: usize,
    by_address: HashMap<IpAddr, usize>,
}

/// A connection's place under [`MAX_CONNECTIONS`] and [`PER_ADDRESS`], given back
/// however its task ends.
struct Place(Rc<RefCell<Places>>, IpAddr);

impl Place {
    /// A place for a connection from `peer`, if there is room for it.
    fn take(places: &Rc<RefCell<Places>>, peer: IpAddr) -> Option<Place> {
        let address = terminus_admission::clients::counted_address(peer);
        let mut p = places.borrow_mut();
        let held = p.by_address.get(&address).copied().unwrap_or(0);
        if p.open >= MAX_CONNECTIONS || held >= PER_ADDRESS {
            return None;
        }
        p.open += 1;
        p.by_address.insert(address, held + 1);
        Some(Place(places.clone(), address))
    }
}

impl Drop for Place {
    fn drop(&mut self) {
        let mut p = self.0.borrow_mut();
        p.open -= 1;
        if let Some(held) = p.by_address.get_mut(&self.1) {
            *held -= 1;
            if *held == 0 {
                p.by_address.remove(&self.1);
            }
        }
    }
}

/// What answers the admin listener's requests.
struct Admin {
    metrics: Arc<Metrics>,
    status: Arc<Status>,
}

impl Responder for Admin {
    async fn respond(&self, req: Request<RequestBody>, _head: Option<RawHead>) -> Response<Body> {
        let mut resp = respond(req.method(), req.uri().path(), &self.metrics, &self.status);
        self.server_token().sign(&mut resp);
        resp
    }

    /// The admin listener's answers are not the site's traffic: not counted.
    fn record(&self, _: &Method, _: &str, _: Version, _: &Response<Body>) {}

    /// The admin listener is no `[[server]]`'s: terminus's own token.
    fn server_token(&self) -> &terminus_http::ServerToken {
        &terminus_http::TERMINUS
    }
}

fn respond(method: &Method, path: &str, metrics: &Metrics, status: &Status) -> Response<Body> {
    let mut response = Response::builder().header(header::X_CONTENT_TYPE_OPTIONS, "nosniff");
    if method != Method::GET && method != Method::HEAD {
        return response
            .status(StatusCode::METHOD_NOT_ALLOWED)
            .header(header::ALLOW, "GET, HEAD")
            .header(header::CONTENT_TYPE, "text/plain")
            .body(Body::bytes(Bytes::from_static(
                b"the admin listener is read-only: GET or HEAD\n",
            )))
            .expect("valid response");
    }
    let (code, ctype, body) = match path {
        "/" => {
            response = response
                .header(
                    header::CONTENT_SECURITY_POLICY,
                    page::content_security_policy(),
                )
                .header(header::CACHE_CONTROL, "no-store")
                .header(header::REFERRER_POLICY, "no-referrer");
            (StatusCode::OK, "text/html; charset=utf-8", status.html())
        }
        "/status.json" => {
            response = response.header(header::CACHE_CONTROL, "no-store");
            (StatusCode::OK, "application/json", status.json())
        }
        "/metrics" => (
            StatusCode::OK,
            "text/plain; version=0.0.4",
            metrics.render(),
        ),
        "/capacity" => (StatusCode::OK, "application/json", metrics.capacity()),
        "/healthz" => (StatusCode::OK, "text/plain", "ok\n".to_owned()),
        _ => (
            StatusCode::NOT_FOUND,
            "text/plain",
            "not found: try /, /status.json, /metrics, /capacity or /healthz\n".to_owned(),
        ),
    };
    response
        .status(code)
        .header(header::CONTENT_TYPE, ctype)
        .header(header::CONTENT_LENGTH, body.len())
        .body(Body::bytes(Bytes::from(body)))
        .expect("valid response")
}

/// Serves the admin endpoints on `listener` with `runtime` until `shutdown` turns true,
/// on terminus's own HTTP/1.1 server with the site's `timeouts` (a request head's
/// deadline, keep-alive) and at most [`MAX_CONNECTIONS`] at once, [`PER_ADDRESS`] from
/// one address; the status page
/// describes `listeners`.
pub fn run(
    runtime: tokio::runtime::Runtime,
    listener: StdListener,
    metrics: Arc<Metrics>,
    listeners: Vec<Listener>,
    timeouts: Timeouts,
    mut shutdown: watch::Receiver<bool>,
) -> std::io::Result<()> {
    listener.set_nonblocking(true)?;
    // Its first read of /metrics now, so that the first view has rates.
    let status = Arc::new(Status::new(metrics.clone(), listeners));
    let admin = Rc::new(Admin { metrics, status });
    let places = Rc::new(RefCell::new(Places::default()));
    let local = tokio::task::LocalSet::new();
    runtime.block_on(local.run_until(async move {
        let listener = TcpListener::from_std(listener)?;
        loop {
            let (socket, peer) = tokio::select! {
                r = listener.accept() => match r {
                    Ok(x) => x,
                    Err(e) => {
                        tracing::debug!("admin accept failed: {e}");
                        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                        continue;
                    }
                },
                _ = shutdown.wait_for(|&s| s) => return Ok(()),
            };
            let Some(place) = Place::take(&places, peer.ip()) else {
                tracing::debug!(
                    "admin listener: {MAX_CONNECTIONS} connections open, or {PER_ADDRESS} from {}; {peer} closed",
                    peer.ip()
                );
                continue;
            };
            let (admin, shutdown) = (admin.clone(), shutdown.clone());
            tokio::task::spawn_local(async move {
                let _place = place;
                terminus_http::serve_plain(socket, &*admin, timeouts, shutdown).await;
            });
        }
    }))
}
