//! Per upstream server series: requests, responses by class, failures by cause, new and
//! reused connections, retries, health changes and whether it is in rotation, bytes,
//! latency. They live in a registry that outlives reloads (a server kept across a reload
//! keeps counting; one removed keeps its last values), and each family is written once
//! with every server's samples.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use terminus_metrics::{label_values, Exposition, Histograms, Labelled, Render};

use crate::stream::{Relay, StreamMode};

const LATENCY_BOUNDS: &[f64] = &[
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];

/// Why a request to a server failed (label values of `terminus_upstream_failures_total`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Failure {
    /// The connection was refused, reset or unreachable.
    ConnectError,
    /// No connection within `timeouts.connect`.
    ConnectTimeout,
    /// The TLS handshake with the server failed (its certificate, its name, no common
    /// protocol).
    Tls,
    /// The connection failed after it was established, before a whole response.
    Io,
    /// No response head within `timeouts.response_header`.
    ResponseTimeout,
    /// A body stalled longer than `timeouts.idle`.
    IdleTimeout,
    /// A response that could not be parsed or was ambiguous.
    BadResponse,
    /// The server closed the connection before the end of its response.
    Closed,
}

impl Failure {
    const ALL: [Failure; 8] = [
        Self::ConnectError,
        Self::ConnectTimeout,
        Self::Tls,
        Self::Io,
        Self::ResponseTimeout,
        Self::IdleTimeout,
        Self::BadResponse,
        Self::Closed,
    ];

    /// The label value.
    pub fn name(self) -> &'static str {
        match self {
            Self::ConnectError => "connect_error",
            Self::ConnectTimeout => "connect_timeout",
            Self::Tls => "tls_error",
            Self::Io => "io_error",
            Self::ResponseTimeout => "response_timeout",
            Self::IdleTimeout => "idle_timeout",
            Self::BadResponse => "bad_response",
            Self::Closed => "closed",
        }
    }
}

/// Which latency a histogram sample is.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Phase {
    Connect = 0,
    ResponseHeader = 1,
    Total = 2,
}

/// One upstream server's series.
#[derive(Debug)]
pub struct ServerMetrics {
    upstream: String,
    address: SocketAddr,
    requests: Labelled<1>,
    responses: Labelled<5>,
    failures: Labelled<8>,
    connections: Labelled<2>,
    retries: Labelled<2>,
    health: Labelled<2>,
    /// 1 in rotation, 0 out.
    up: Labelled<1>,
    bytes: Labelled<2>,
    active: Labelled<1>,
    idle: Labelled<1>,
    latency: Histograms<3>,
    /// Streams by (mode, relay): terminate and passthrough, each splice or userspace.
    streams: Labelled<4>,
    /// Stream bytes by (relay, direction).
    stream_bytes: Labelled<4>,
}

impl ServerMetrics {
    fn new(upstream: &str, address: SocketAddr) -> Self {
        let rest = format!("upstream=\"{upstream}\",server=\"{address}\"");
        let one = || [rest.clone()];
        ServerMetrics {
            upstream: upstream.to_owned(),
            address,
            requests: Labelled::counter(
                "terminus_upstream_requests_total",
                "Requests sent to an upstream server.",
                one(),
            ),
            responses: Labelled::counter(
                "terminus_upstream_responses_total",
                "Responses from an upstream server, by status class.",
                label_values("class", ["1xx", "2xx", "3xx", "4xx", "5xx"], &rest),
            ),
            failures: Labelled::counter(
                "terminus_upstream_failures_total",
                "Requests to an upstream server that failed, by cause.",
                label_values("cause", Failure::ALL.map(Failure::name), &rest),
            ),
            connections: Labelled::counter(
                "terminus_upstream_connections_total",
                "Connections requests went out on: opened for them, or reused from the idle pool.",
                label_values("kind", ["new", "reused"], &rest),
            ),
            retries: Labelled::counter(
                "terminus_upstream_retries_total",
                "Requests sent again: on another server after failing on this one, or on a new connection to it after a pooled one it had closed while idle (stale).",
                label_values("after", ["failure", "stale"], &rest),
            ),
            health: Labelled::counter(
                "terminus_upstream_health_changes_total",
                "Times the server was taken out of rotation or brought back.",
                label_values("to", ["down", "up"], &rest),
            ),
            up: {
                let up = Labelled::gauge(
                    "terminus_upstream_up",
                    "1 while the server is in rotation; 0 from its health (passive or active) taking it out until it is seen answering again.",
                    one(),
                );
                up.set(0, 1);
                up
            },
            bytes: Labelled::counter(
                "terminus_upstream_bytes_total",
                "Body bytes sent to and received from an upstream server.",
                label_values("direction", ["sent", "received"], &rest),
            ),
            active: Labelled::gauge(
                "terminus_upstream_active_requests",
                "Requests in progress on an upstream server.",
                one(),
            ),
            idle: Labelled::gauge(
                "terminus_upstream_idle_connections",
                "Idle connections to an upstream server kept for reuse, all workers.",
                one(),
            ),
            latency: Histograms::new(
                "terminus_upstream_latency_seconds",
                "Time to connect, to the response head (from sending the request), and to the end of the response.",
                LATENCY_BOUNDS,
                label_values("phase", ["connect", "response_header", "total"], &rest),
            ),
            streams: Labelled::counter(
                "terminus_stream_connections_total",
                "Streams ([[stream]]) carried to an upstream server, by mode and by how their bytes moved.",
                pairs(("mode", ["terminate", "passthrough"]), ("method", RELAYS), &rest),
            ),
            stream_bytes: Labelled::counter(
                "terminus_stream_bytes_total",
                "Stream bytes to the upstream server (sent) and back (received), by how they moved.",
                pairs(("method", RELAYS), ("direction", ["sent", "received"]), &rest),
            ),
        }
    }

    pub(crate) fn request(&self) {
        self.requests.inc(0);
    }

    pub(crate) fn response(&self, status: u16) {
        let class = (status / 100).clamp(1, 5) as usize - 1;
        self.responses.inc(class);
    }

    pub(crate) fn failure(&self, cause: Failure) {
        let i = Failure::ALL.iter().position(|&f| f == cause).unwrap_or(0);
        self.failures.inc(i);
    }

    pub(crate) fn connection(&self, reused: bool) {
        self.connections.inc(reused as usize);
    }

    pub(crate) fn retry(&self) {
        self.retries.inc(0);
    }

    pub(crate) fn stale_retry(&self) {
        self.retries.inc(1);
    }

    pub(crate) fn health_change(&self, up: bool) {
        self.health.inc(up as usize);
        self.up.set(0, i64::from(up));
    }

    /// A new server of this address in the upstream (at start, or a reload's): its
    /// health starts afresh, in rotation.
    pub(crate) fn in_rotation(&self) {
        self.up.set(0, 1);
    }

    pub(crate) fn sent(&self, n: u64) {
        self.bytes.add(0, n as i64);
    }

    pub(crate) fn received(&self, n: u64) {
        self.bytes.add(1, n as i64);
    }

    pub(crate) fn active(&self, delta: i64) {
        self.active.add(0, delta);
    }

    pub(crate) fn idle(&self, delta: i64) {
        self.idle.add(0, delta);
    }

    pub(crate) fn stream(&self, mode: StreamMode, relay: Relay, up: u64, down: u64) {
        let m = (mode == StreamMode::Passthrough) as usize;
        let r = (relay == Relay::Userspace) as usize;
        self.streams.inc(m * 2 + r);
        self.stream_bytes.add(r * 2, up as i64);
        self.stream_bytes.add(r * 2 + 1, down as i64);
    }

    pub(crate) fn latency(&self, phase: Phase, d: Duration) {
        self.latency.get(phase as usize).observe_duration(d);
    }
}

/// Every upstream server's series, across reloads.
#[derive(Debug, Default)]
pub struct ProxyMetrics {
    servers: Mutex<Vec<Arc<ServerMetrics>>>,
}

impl ProxyMetrics {
    /// The series of `address` in `upstream`, made on first use.
    pub fn server(&self, upstream: &str, address: SocketAddr) -> Arc<ServerMetrics> {
        let mut servers = self.servers.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(s) = servers
            .iter()
            .find(|s| s.upstream == upstream && s.address == address)
        {
            return s.clone();
        }
        let s = Arc::new(ServerMetrics::new(upstream, address));
        servers.push(s.clone());
        s
    }
}

impl Render for ProxyMetrics {
    fn render(&self, out: &mut Exposition) {
        let servers = self
            .servers
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        // Family by family: a family's samples must be together on the page.
        let families: [fn(&ServerMetrics) -> &dyn Render; 13] = [
            |s| &s.requests,
            |s| &s.responses,
            |s| &s.failures,
            |s| &s.connections,
            |s| &s.retries,
            |s| &s.health,
            |s| &s.up,
            |s| &s.bytes,
            |s| &s.active,
            |s| &s.idle,
            |s| &s.latency,
            |s| &s.streams,
            |s| &s.stream_bytes,
        ];
        for family in families {
            for s in &servers {
                family(s).render(out);
            }
        }
    }
}

/// How stream bytes move, as label values.
const RELAYS: [&str; 2] = ["splice", "userspace"];

/// Label values for two labels of two values each, the first varying slowest (the
/// series of (a, b) is at index `a * 2 + b`).
fn pairs(a: (&str, [&str; 2]), b: (&str, [&str; 2]), rest: &str) -> [String; 4] {
    std::array::from_fn(|i| {
        format!(
            "{}=\"{}\",{}=\"{}\",{rest}",
            a.0,
            a.1[i / 2],
            b.0,
            b.1[i % 2]
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn up(metrics: &ProxyMetrics) -> String {
        let mut out = Exposition::new();
        metrics.render(&mut out);
        out.into_text()
            .lines()
            .find(|l| l.starts_with("terminus_upstream_up{"))
            .expect("the series")
            .to_owned()
    }

    /// In rotation from the start, out when health takes it out, back when it comes
    /// back, and in again for a reload's new server of the same address (its health
    /// starts afresh) though the series outlives the reload.
    #[test]
    fn up_says_whether_the_server_is_in_rotation() {
        let metrics = ProxyMetrics::default();
        let address: SocketAddr = "127.0.0.1:8080".parse().unwrap();
        let server = metrics.server("app", address);
        let line = "terminus_upstream_up{upstream=\"app\",server=\"127.0.0.1:8080\"}";
        assert_eq!(up(&metrics), format!("{line} 1"));
        server.health_change(false);
        assert_eq!(up(&metrics), format!("{line} 0"));
        server.health_change(true);
        assert_eq!(up(&metrics), format!("{line} 1"));
        server.health_change(false);
        metrics.server("app", address).in_rotation();
        assert_eq!(up(&metrics), format!("{line} 1"));
    }
}
