//! The admin listener: `GET /`, the status page ([`status`] has its figures, [`page`]
//! renders them), `GET /status.json` (the same figures, for the page's script),
//! `GET /metrics` (Prometheus), `GET /capacity` (the crypto capacity table, JSON) and
//! `GET /healthz`; plain HTTP, read-only (every other method is refused), meant for
//! loopback or a management network.

mod page;
mod status;

use std::net::TcpListener as StdListener;
use std::sync::Arc;

use bytes::Bytes;
use http_body_util::Full;
use hyper::{header, Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;
use tokio::sync::watch;

use crate::metrics::Metrics;
pub(crate) use status::Listener;
use status::Status;

fn respond(
    req: &Request<hyper::body::Incoming>,
    metrics: &Metrics,
    status: &Status,
) -> Response<Full<Bytes>> {
    let mut response = Response::builder().header(header::X_CONTENT_TYPE_OPTIONS, "nosniff");
    if req.method() != Method::GET && req.method() != Method::HEAD {
        return response
            .status(StatusCode::METHOD_NOT_ALLOWED)
            .header(header::ALLOW, "GET, HEAD")
            .header(header::CONTENT_TYPE, "text/plain")
            .body(Full::new(Bytes::from_static(
                b"the admin listener is read-only: GET or HEAD\n",
            )))
            .expect("valid response");
    }
    let (code, ctype, body) = match req.uri().path() {
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
        .body(Full::new(Bytes::from(body)))
        .expect("valid response")
}

/// Serves the admin endpoints on `listener` with `runtime` until `shutdown` turns true;
/// the status page describes `listeners`.
pub fn run(
    runtime: tokio::runtime::Runtime,
    listener: StdListener,
    metrics: Arc<Metrics>,
    listeners: Vec<Listener>,
    mut shutdown: watch::Receiver<bool>,
) -> std::io::Result<()> {
    listener.set_nonblocking(true)?;
    // Its first read of /metrics now, so that the first view has rates.
    let status = Arc::new(Status::new(metrics.clone(), listeners));
    runtime.block_on(async move {
        let listener = TcpListener::from_std(listener)?;
        loop {
            let (socket, _) = tokio::select! {
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
            let (metrics, status) = (metrics.clone(), status.clone());
            tokio::spawn(async move {
                let service = hyper::service::service_fn(move |req| {
                    let resp = respond(&req, &metrics, &status);
                    async move { Ok::<_, std::convert::Infallible>(resp) }
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(socket), service)
                    .await;
            });
        }
    })
}
