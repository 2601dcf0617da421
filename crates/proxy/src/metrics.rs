//! Per upstream server series: requests, responses by class, failures by cause, new and
//! reused connections, retries, health changes and whether it is in rotation, bytes,
//! latency. They live in a registry that outlives reloads (a server kept across a reload
//! keeps counting; one a reload removes is forgotten, its series gone from `/metrics`),
//! and each family is written once with every server's samples. The registry keeps each
//! server's health beside its series, for the same reason: a reload that keeps a server
//! (same upstream name, same address) keeps it out of rotation if it was out, and its
//! `terminus_upstream_up` says so.

use std::collections::{BTreeMap, HashSet};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use terminus_metrics::{label_values, Exposition, Histograms, Labelled, Labels, Render};

use crate::health::Health;
use crate::stream::{Relay, StreamMode};
use crate::upstream::Upstream;

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
        let rest = Labels::NONE
            .with("upstream", upstream)
            .with("server", address);
        let one = || [rest.clone()];
        ServerMetrics {
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

/// A server's series and its health.
type Entry = (Arc<ServerMetrics>, Arc<Health>);

/// Every configured upstream server's series and health, across reloads: by upstream
/// name and address, in that order on `/metrics`. Asked when a configuration is built
/// (each server takes its entry once, then holds it), not per request.
#[derive(Debug, Default)]
pub struct ProxyMetrics {
    servers: Mutex<BTreeMap<(String, SocketAddr), Entry>>,
}

impl ProxyMetrics {
    /// The series of `address` in `upstream`, and its health, made on first use (in
    /// rotation) and kept from then on.
    pub(crate) fn server(&self, upstream: &str, address: SocketAddr) -> Entry {
        let mut servers = self.servers.lock().unwrap_or_else(|p| p.into_inner());
        servers
            .entry((upstream.to_owned(), address))
            .or_insert_with(|| {
                (
                    Arc::new(ServerMetrics::new(upstream, address)),
                    Arc::new(Health::default()),
                )
            })
            .clone()
    }

    /// Keeps the servers of `live` (the configuration in force) and forgets the rest:
    /// those a reload removed, and those a reload that failed had made. A forgotten
    /// server's series leave `/metrics` (a server that was out of rotation does not say
    /// `terminus_upstream_up 0` for ever), and its health is forgotten: configured again
    /// later, it starts in rotation, its counters from 0. Requests still going to it
    /// over the old configuration count in series no one reads.
    pub fn retain(&self, live: &[Arc<Upstream>]) {
        let configured: HashSet<(&str, SocketAddr)> = live
            .iter()
            .flat_map(|u| u.servers.iter().map(|s| (u.name(), s.spec.address)))
            .collect();
        self.servers
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .retain(|(upstream, address), _| configured.contains(&(upstream.as_str(), *address)));
    }
}

impl Render for ProxyMetrics {
    fn render(&self, out: &mut Exposition) {
        let servers = self
            .servers
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .values()
            .map(|(s, _)| s.clone())
            .collect::<Vec<_>>();
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
fn pairs(a: (&str, [&str; 2]), b: (&str, [&str; 2]), rest: &Labels) -> [Labels; 4] {
    std::array::from_fn(|i| Labels::of([(a.0, a.1[i / 2]), (b.0, b.1[i % 2])]).and(rest))
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::health::{now_ms, Change};
    use crate::spec::{self, ServerSpec};
    use crate::upstream::Server;

    fn up(metrics: &ProxyMetrics, upstream: &str) -> String {
        let mut out = Exposition::new();
        metrics.render(&mut out);
        let start = format!("terminus_upstream_up{{upstream=\"{upstream}\",");
        out.into_text()
            .lines()
            .find(|l| l.starts_with(&start))
            .expect("the series")
            .rsplit(' ')
            .next()
            .unwrap()
            .to_owned()
    }

    fn spec() -> ServerSpec {
        ServerSpec {
            address: "127.0.0.1:8080".parse().unwrap(),
            host: None,
            weight: 1,
            backup: false,
        }
    }

    /// In rotation from the start, out when health takes it out, back when it comes
    /// back.
    #[test]
    fn up_says_whether_the_server_is_in_rotation() {
        let metrics = ProxyMetrics::default();
        let (server, _) = metrics.server("app", spec().address);
        assert_eq!(up(&metrics, "app"), "1");
        server.health_change(false);
        assert_eq!(up(&metrics, "app"), "0");
        server.health_change(true);
        assert_eq!(up(&metrics, "app"), "1");
    }

    /// A reload's server of the same upstream and address is the running one: out of
    /// rotation if it was, its series saying so; a server of another upstream at that
    /// address is another server.
    #[test]
    fn a_reload_keeps_a_servers_health_and_up() {
        let metrics = ProxyMetrics::default();
        let passive = spec::Health {
            fails: 1,
            interval: Duration::from_secs(60),
            check: None,
        };
        let server = Server::new(spec(), "app", None, &metrics);
        assert_eq!(server.health.failed(&passive), Change::WentDown);
        server.metrics.health_change(false);
        let reloaded = Server::new(spec(), "app", None, &metrics);
        assert!(!reloaded.health.is_up(now_ms()));
        assert_eq!(up(&metrics, "app"), "0");
        let other = Server::new(spec(), "other", None, &metrics);
        assert!(other.health.is_up(now_ms()));
        assert_eq!(up(&metrics, "other"), "1");
    }

    /// An upstream `name` of servers at `ports` on 127.0.0.1, its series in `metrics`.
    fn upstream(name: &str, ports: &[u16], metrics: &ProxyMetrics) -> Arc<Upstream> {
        let servers = ports
            .iter()
            .map(|port| ServerSpec {
                address: SocketAddr::from(([127, 0, 0, 1], *port)),
                ..spec()
            })
            .collect();
        let spec = spec::UpstreamSpec {
            name: name.to_owned(),
            servers,
            balance: spec::Balance::RoundRobin,
            protocol: spec::Protocol::Http1,
            keepalive: spec::Keepalive::default(),
            timeouts: spec::Timeouts::default(),
            health: spec::Health::default(),
            proxy_protocol: None,
            tls: None,
            upgrades: Vec::new(),
            client_cert: spec::ClientCertHeader::default(),
            retry_non_idempotent: false,
        };
        Arc::new(Upstream::new(spec, metrics))
    }

    /// A reload that removes a server (or a whole upstream) forgets it: its series leave
    /// the page; the servers it keeps keep their health and series.
    #[test]
    fn a_reload_forgets_the_servers_it_removed_and_keeps_the_others() {
        let metrics = ProxyMetrics::default();
        let before = [
            upstream("app", &[1, 2], &metrics),
            upstream("old", &[3], &metrics),
        ];
        let passive = spec::Health {
            fails: 1,
            interval: Duration::from_secs(60),
            check: None,
        };
        for server in &before[0].servers {
            assert_eq!(server.health.failed(&passive), Change::WentDown);
            server.metrics.health_change(false);
        }
        let after = [upstream("app", &[2], &metrics)];
        metrics.retain(&after);
        let mut out = Exposition::new();
        metrics.render(&mut out);
        let text = out.into_text();
        let ups: Vec<&str> = text
            .lines()
            .filter(|l| l.starts_with("terminus_upstream_up{"))
            .collect();
        assert_eq!(
            ups,
            ["terminus_upstream_up{upstream=\"app\",server=\"127.0.0.1:2\"} 0"],
            "{text}"
        );
        assert!(!after[0].servers[0].health.is_up(now_ms()));
        // Configured again, a forgotten server starts afresh, in rotation.
        let again = [upstream("app", &[1, 2], &metrics)];
        assert!(again[0].servers[0].health.is_up(now_ms()));
        assert!(!again[0].servers[1].health.is_up(now_ms()));
    }

    /// A server active checks took out, in a reload whose upstream has no checks any
    /// more: nothing would bring it back, so it is back at once.
    #[test]
    fn a_reload_without_checks_forgets_what_they_found() {
        let metrics = ProxyMetrics::default();
        let check = spec::Check {
            path: "/".into(),
            timeout: Duration::from_secs(1),
            passes: 1,
        };
        let checked = spec::Health {
            fails: 1,
            interval: Duration::from_secs(1),
            check: Some(check.clone()),
        };
        let server = Server::new(spec(), "app", Some(&check), &metrics);
        assert_eq!(
            server.health.probed(false, &checked, &check),
            Change::WentDown
        );
        server.metrics.health_change(false);
        let still = Server::new(spec(), "app", Some(&check), &metrics);
        assert!(!still.health.is_up(now_ms() + 3_600_000));
        let unchecked = Server::new(spec(), "app", None, &metrics);
        assert!(unchecked.health.is_up(now_ms()));
        assert_eq!(up(&metrics, "app"), "1");
    }
}
