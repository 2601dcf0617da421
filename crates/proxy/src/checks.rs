//! Active health checks: every `health.interval`, a `GET health.path` over a new
//! connection to each server of an upstream, all at once; a 2xx or 3xx within
//! `health.timeout` passes. Results go to the servers' shared [`crate::health`] state. The
//! server runs one checker per upstream for the whole process, on a thread of its own; a
//! checker ends when its upstream is gone (replaced by a reload and no longer used).

use std::io;
use std::net::SocketAddr;
use std::sync::Weak;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::upstream::Upstream;

/// Checks `upstream`'s servers until it is dropped; returns at once if it has no checks.
pub async fn run(upstream: Weak<Upstream>) {
    loop {
        let Some(up) = upstream.upgrade() else { return };
        let Some(check) = up.spec.health.check.clone() else {
            return;
        };
        let probes = up.servers.iter().map(|s| {
            let address = s.spec.address;
            let path = check.path.clone();
            async move { probe(address, &path, check.timeout).await }
        });
        let results = futures_util::future::join_all(probes).await;
        for (i, result) in results.into_iter().enumerate() {
            up.probed(i, result);
        }
        let interval = up.spec.health.interval;
        drop(up);
        tokio::time::sleep(interval).await;
    }
}

/// One probe: `Ok` with the status, or why it failed.
async fn probe(address: SocketAddr, path: &str, within: Duration) -> Result<u16, String> {
    let attempt = async {
        let mut stream = TcpStream::connect(address).await?;
        let request = format!(
            "GET {path} HTTP/1.1\r\nHost: {address}\r\nUser-Agent: terminus-health-check\r\nConnection: close\r\n\r\n"
        );
        stream.write_all(request.as_bytes()).await?;
        let mut buf = Vec::with_capacity(1024);
        loop {
            if let Some(resp) = terminus_h1::parse_response(&mut buf)
                .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e.0))?
            {
                return io::Result::Ok(resp.status().as_u16());
            }
            if buf.len() > terminus_h1::MAX_HEAD || stream.read_buf(&mut buf).await? == 0 {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    "no response head",
                ));
            }
        }
    };
    match tokio::time::timeout(within, attempt).await {
        Err(_) => Err(format!("no answer within {within:?}")),
        Ok(Err(e)) => Err(e.to_string()),
        Ok(Ok(status)) if (200..400).contains(&status) => Ok(status),
        Ok(Ok(status)) => Err(format!("status {status}")),
    }
}
