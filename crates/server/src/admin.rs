//! The admin listener: `GET /metrics` (Prometheus), `GET /capacity` (the crypto
//! capacity table, JSON) and `GET /healthz`, plain HTTP, meant for loopback or a
//! management network.

use std::net::TcpListener as StdListener;
use std::sync::Arc;

use bytes::Bytes;
use http_body_util::Full;
use hyper::{header, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;
use tokio::sync::watch;

use crate::metrics::Metrics;

fn respond(req: &Request<hyper::body::Incoming>, metrics: &Metrics) -> Response<Full<Bytes>> {
    let (status, ctype, body) = match req.uri().path() {
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
            "not found: try /metrics, /capacity or /healthz\n".to_owned(),
        ),
    };
    Response::builder()
        .status(status)
        .header(header::CONTENT_TYPE, ctype)
        .body(Full::new(Bytes::from(body)))
        .expect("valid response")
}

/// Serves the admin endpoints on `listener` with `runtime` until `shutdown` turns true.
pub fn run(
    runtime: tokio::runtime::Runtime,
    listener: StdListener,
    metrics: Arc<Metrics>,
    mut shutdown: watch::Receiver<bool>,
) -> std::io::Result<()> {
    listener.set_nonblocking(true)?;
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
            let metrics = metrics.clone();
            tokio::spawn(async move {
                let service = hyper::service::service_fn(move |req| {
                    let resp = respond(&req, &metrics);
                    async move { Ok::<_, std::convert::Infallible>(resp) }
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(socket), service)
                    .await;
            });
        }
    })
}
