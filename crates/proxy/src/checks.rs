//! Active health checks: every `health.interval`, a `GET health.path` over a new
//! connection to each server of an upstream, all at once, made as requests are (TLS
//! and the upstream's protocol, HTTP/1.1 or HTTP/2); a 2xx or 3xx within
//! `health.timeout` passes. Results go to the servers' shared [`crate::health`] state. The
//! server runs one checker per upstream for the whole process, on a thread of its own; a
//! checker ends when its upstream is gone (replaced by a reload and no longer used).

use std::io;
use std::sync::Weak;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Empty;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::connect::{connect, Stream};
use crate::spec::{Protocol, ServerSpec, UpstreamSpec};
use crate::upstream::Upstream;

/// Checks `upstream`'s servers until it is dropped; returns at once if it has no checks.
pub async fn run(upstream: Weak<Upstream>) {
    loop {
        let Some(up) = upstream.upgrade() else { return };
        let Some(check) = up.spec.health.check.clone() else {
            return;
        };
        let probes = up
            .servers
            .iter()
            .map(|s| probe(&up.spec, &s.spec, &check.path, check.timeout));
        let results: Vec<_> = futures_util::future::join_all(probes).await;
        for (i, result) in results.into_iter().enumerate() {
            up.probed(i, result);
        }
        let interval = up.spec.health.interval;
        drop(up);
        tokio::time::sleep(interval).await;
    }
}

/// One probe: `Ok` with the status, or why it failed.
async fn probe(
    upstream: &UpstreamSpec,
    server: &ServerSpec,
    path: &str,
    within: Duration,
) -> Result<u16, String> {
    let attempt = async {
        let (stream, _) = connect(server, upstream.tls.as_ref(), within)
            .await
            .map_err(|f| f.detail)?;
        let host = match &upstream.tls {
            Some(tls) => tls.name_for(server).to_str().into_owned(),
            None => server.address.to_string(),
        };
        match upstream.protocol {
            Protocol::Http1 => http1_probe(stream, path, &host)
                .await
                .map_err(|e| e.to_string()),
            Protocol::H2 | Protocol::H2c => {
                h2_probe(stream, path, &host, upstream.tls.is_some()).await
            }
        }
    };
    match tokio::time::timeout(within, attempt).await {
        Err(_) => Err(format!("no answer within {within:?}")),
        Ok(Err(e)) => Err(e),
        Ok(Ok(status)) if (200..400).contains(&status) => Ok(status),
        Ok(Ok(status)) => Err(format!("status {status}")),
    }
}

async fn http1_probe(mut stream: Stream, path: &str, host: &str) -> io::Result<u16> {
    let request = format!(
        "GET {path} HTTP/1.1\r\nHost: {host}\r\nUser-Agent: terminus-health-check\r\nConnection: close\r\n\r\n"
    );
    stream.write_all(request.as_bytes()).await?;
    stream.flush().await?;
    let mut buf = Vec::with_capacity(1024);
    loop {
        if let Some(resp) = terminus_http::h1::parse_response(&mut buf)
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e.0))?
        {
            return Ok(resp.status().as_u16());
        }
        if buf.len() > terminus_http::h1::MAX_HEAD || stream.read_buf(&mut buf).await? == 0 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "no response head",
            ));
        }
    }
}

async fn h2_probe(stream: Stream, path: &str, host: &str, tls: bool) -> Result<u16, String> {
    let (mut send, conn) = crate::h2::handshake::<Empty<Bytes>>(stream)
        .await
        .map_err(|e| format!("h2 handshake: {e}"))?;
    let driven = tokio::task::spawn_local(conn);
    let uri = format!("{}://{host}{path}", if tls { "https" } else { "http" });
    let req = hyper::Request::get(uri)
        .header(hyper::header::USER_AGENT, "terminus-health-check")
        .body(Empty::new())
        .map_err(|e| e.to_string())?;
    let status = send.send_request(req).await.map(|r| r.status().as_u16());
    driven.abort();
    status.map_err(|e| format!("h2 request: {e}"))
}
