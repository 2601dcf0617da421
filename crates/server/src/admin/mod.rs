//! The admin listener: `GET /`, the status page ([`status`] has its figures, [`page`]
//! renders them), `GET /status.json` (the same figures, for the page's script),
//! `GET /metrics` (Prometheus), `GET /capacity` (the crypto capacity table, JSON) and
//! `GET /healthz`; plain HTTP on terminus's own HTTP/1.1 server, with the site's request
//! and keep-alive deadlines and a cap on connections, read-only (every other method is
//! refused), meant for loopback or a management network.
//!
//! Whoever reaches the port may open connections, so they are held in admission's
//! budget for peers not known ([`Unauthenticated`], as the signer's strangers are):
//! 64 at once, so that the TLS listeners keep the process's descriptors; 8 from one
//! address (IPv6 by its /64), so that one host cannot take them; and when all 64 are
//! taken a newcomer takes the place of the oldest connection of the address holding the
//! most, so that hosts holding idle or half-sent connections together (8 addresses of 8)
//! cannot leave another's scraper no room either. Who is turned away is counted in
//! `terminus_admin_refused_total{reason}` and warned, once per 10 s for each reason.

mod page;
mod status;

use std::cell::RefCell;
use std::collections::HashMap;
use std::net::{SocketAddr, TcpListener as StdListener};
use std::rc::Rc;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use hyper::{header, Method, Request, Response, StatusCode, Version};
use terminus_admission::unauthenticated::{Admit, Ticket, Unauthenticated};
use terminus_http::body::{Body, RequestBody};
use terminus_http::h1::RawHead;
use terminus_http::{Responder, Timeouts};
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::AbortHandle;

use crate::logs::throttled::ByReason;
use crate::metrics::Metrics;
pub(crate) use status::Listener;
use status::Status;

/// The most connections the admin listener holds at once: scrapers and a few browsers.
const MAX_CONNECTIONS: usize = 64;

/// The most of them one address holds (IPv6 counted by /64, as client limits are).
const PER_ADDRESS: usize = 8;

/// At most one warning per reason per this long; `terminus_admin_refused_total` counts
/// every connection turned away.
const WARN_EVERY: Duration = Duration::from_secs(10);

/// Why the admin listener closed a connection (`terminus_admin_refused_total`'s
/// `reason`).
#[derive(Debug, Clone, Copy)]
pub(crate) enum Refusal {
    /// Its address held [`PER_ADDRESS`] connections: closed at accept.
    AddressFull,
    /// It was the oldest of the address holding the most, and a newcomer found all
    /// [`MAX_CONNECTIONS`] taken.
    Evicted,
}

impl Refusal {
    /// The `reason` labels, in the variants' order.
    pub(crate) const NAMES: [&'static str; 2] = ["address_full", "evicted"];
}

/// The admin listener's connections: their places in the budget, each one's task (to
/// close the one a newcomer evicts), and the warnings about those turned away.
struct Connections {
    places: RefCell<Unauthenticated>,
    tasks: RefCell<HashMap<Ticket, AbortHandle>>,
    warnings: RefCell<ByReason<{ Refusal::NAMES.len() }>>,
    metrics: Arc<Metrics>,
}

impl Connections {
    fn new(metrics: Arc<Metrics>) -> Rc<Self> {
        Rc::new(Connections {
            places: RefCell::new(Unauthenticated::new(MAX_CONNECTIONS, PER_ADDRESS)),
            tasks: RefCell::default(),
            warnings: RefCell::new(ByReason::new(WARN_EVERY, "terminus_admin_refused_total")),
            metrics,
        })
    }

    /// A place for a connection from `peer`, the oldest of the fullest address closed
    /// for it where all are taken; None: its address holds its share.
    fn admit(self: &Rc<Self>, peer: SocketAddr) -> Option<Place> {
        let admitted = self.places.borrow_mut().admit(peer.ip());
        let (ticket, evict) = match admitted {
            Admit::Yes { ticket, evict } => (ticket, evict),
            Admit::AddressFull => {
                self.refuse(Refusal::AddressFull, || {
                    format!("admin listener: {peer} closed at accept: its address holds {PER_ADDRESS} connections")
                });
                return None;
            }
        };
        if let Some(old) = evict {
            // Its task's future is dropped later, on this thread: no borrow is held then.
            let task = self.tasks.borrow_mut().remove(&old);
            if let Some(task) = task {
                task.abort();
            }
            self.refuse(Refusal::Evicted, || {
                format!("admin listener: {MAX_CONNECTIONS} connections open: the oldest of the address holding the most closed for {peer}")
            });
        }
        Some(Place {
            connections: self.clone(),
            ticket,
        })
    }

    /// Counts a connection closed, and says so (throttled by reason).
    fn refuse(&self, why: Refusal, line: impl FnOnce() -> String) {
        self.metrics.admin_refused(why);
        self.warnings.borrow_mut().warn(why as usize, line);
    }
}

/// A connection's place, given back however its task ends (aborted too).
struct Place {
    connections: Rc<Connections>,
    ticket: Ticket,
}

impl Drop for Place {
    fn drop(&mut self) {
        self.connections.places.borrow_mut().done(self.ticket);
        self.connections.tasks.borrow_mut().remove(&self.ticket);
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
/// deadline, keep-alive) and its connections held as the module's doc says; the status
/// page describes `listeners`.
pub fn run(
    runtime: tokio::runtime::Runtime,
    listener: StdListener,
    metrics: Arc<Metrics>,
    listeners: Vec<Listener>,
    timeouts: Timeouts,
    mut shutdown: watch::Receiver<bool>,
) -> std::io::Result<()> {
    listener.set_nonblocking(true)?;
    let connections = Connections::new(metrics.clone());
    // Its first read of /metrics now, so that the first view has rates.
    let status = Arc::new(Status::new(metrics.clone(), listeners));
    let admin = Rc::new(Admin { metrics, status });
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
            let Some(place) = connections.admit(peer) else {
                continue;
            };
            let ticket = place.ticket;
            let (admin, shutdown) = (admin.clone(), shutdown.clone());
            let task = tokio::task::spawn_local(async move {
                let _place = place;
                terminus_http::serve_plain(socket, &*admin, timeouts, shutdown).await;
            });
            connections
                .tasks
                .borrow_mut()
                .insert(ticket, task.abort_handle());
        }
    }))
}
