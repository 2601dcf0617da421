//! Where the status page's figures come from, and which it shows: `GET /status.json`
//! and the first view of `GET /` ([`super::page`] renders both), the running server at
//! a glance, as HAProxy's stats page: headline figures, then listeners, connections,
//! workers, handshakes and their phases, the crypto engine, tenants, upstreams, the
//! fleet, ACME certificates and errors by cause.
//!
//! Every figure is read from the exposition `/metrics` serves, rendered and parsed back
//! (`terminus_observe::scrape`), so the page shows no number `/metrics` does not have:
//! each names the series it shows (`data-metric`: summed over the label sets its labels
//! match, or a sum or ratio of such), and the page's test holds every one to a scrape.
//! Rates are the change between two such reads, with `terminus top`'s arithmetic
//! (`terminus_observe::rates`). What `/metrics` has no series for is the configuration's
//! (the listeners) or the fleet's view of its peers (their names).

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use terminus_metrics::Labels;
use terminus_observe::rates::{Latency, Rates};
use terminus_observe::scrape::Scrape;
use terminus_observe::Phase;

use super::page::{self, date, uptime, Cell, Fact, Page, Section, Tile, Unit};
use crate::metrics::Metrics;

/// A listener as the page shows it: from the configuration, which `/metrics` does not
/// describe.
#[derive(Debug, Clone)]
pub(crate) struct Listener {
    /// The bound address (the port chosen, for port 0).
    pub(crate) address: String,
    /// What it serves: `https`, `https + h3`, or `http (redirect)`.
    pub(crate) serves: &'static str,
    /// Its kTLS mode.
    pub(crate) ktls: &'static str,
    /// Whether connections from its trusted networks begin with a PROXY header.
    pub(crate) proxy_protocol: bool,
}

impl Listener {
    /// The listeners of `config`, bound at `addrs` (in `config.listen`'s order).
    pub(crate) fn all(
        addrs: &[std::net::SocketAddr],
        config: &terminus_config::Config,
    ) -> Vec<Listener> {
        addrs
            .iter()
            .zip(&config.listen)
            .map(|(addr, l)| Listener {
                address: addr.to_string(),
                serves: match (l.plain.is_some(), l.http3) {
                    (true, _) => "http (redirect)",
                    (false, true) => "https + h3",
                    (false, false) => "https",
                },
                ktls: if l.plain.is_some() {
                    "-"
                } else {
                    l.ktls.name()
                },
                proxy_protocol: l.proxy_protocol.is_some(),
            })
            .collect()
    }
}

/// How many reads of `/metrics` are kept for rates.
const KEPT: usize = 8;
/// A rate is taken against the newest read at least this old.
const MIN_INTERVAL: Duration = Duration::from_secs(1);

/// The status page's source: the metrics, what the configuration says of the listeners,
/// and the last reads of `/metrics`.
///
/// A rate needs two reads. The server keeps its last few (a read is the exposition
/// rendered and parsed, what a Prometheus scrape costs) and takes each rate against the
/// newest one at least a second old, rather than leaving the browser to difference
/// counters: the first, server-rendered view has rates already (against the read made
/// when the admin listener started, or the last viewer's); a phase's p50 and p99 over the
/// interval come from its histogram's buckets, which the page would otherwise have to
/// carry whole; and the arithmetic is `terminus top`'s, written once. Every viewer's
/// reads serve every other's.
pub(crate) struct Status {
    metrics: Arc<Metrics>,
    listeners: Vec<Listener>,
    started: SystemTime,
    reads: Mutex<VecDeque<(Instant, Arc<Scrape>)>>,
}

impl Status {
    /// The page for `metrics`, with its first read made now.
    pub(crate) fn new(metrics: Arc<Metrics>, listeners: Vec<Listener>) -> Self {
        let status = Status {
            metrics,
            listeners,
            started: SystemTime::now(),
            reads: Mutex::default(),
        };
        status.read();
        status
    }

    /// `/metrics` now, and the read to take rates against with its age.
    fn read(&self) -> (Arc<Scrape>, Option<(Duration, Arc<Scrape>)>) {
        let now = Instant::now();
        let scrape = Arc::new(Scrape::parse(&self.metrics.render()));
        let mut reads = self.reads.lock().unwrap_or_else(|p| p.into_inner());
        // Against a read at least MIN_INTERVAL old, else none (the figures show "-"): a
        // rate over a few milliseconds is noise, and a single event would read as a
        // thousand a second.
        let base = reads
            .iter()
            .rev()
            .find(|(at, _)| now.duration_since(*at) >= MIN_INTERVAL)
            .map(|(at, s)| (now.duration_since(*at), s.clone()));
        // Kept only once the newest kept is MIN_INTERVAL old: a client polling ten
        // times a second must not leave every viewer's base a tenth of a second old.
        let spaced = reads
            .back()
            .is_none_or(|(at, _)| now.duration_since(*at) >= MIN_INTERVAL);
        if spaced {
            reads.push_back((now, scrape.clone()));
            while reads.len() > KEPT {
                reads.pop_front();
            }
        }
        (scrape, base)
    }

    fn page(&self) -> Page {
        let (now, base) = self.read();
        let unix = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0.0, |d| d.as_secs_f64());
        let facts = Facts {
            unix,
            up: self.started.elapsed().unwrap_or_default(),
            instance: terminus_fleet::instance_id(),
            listeners: &self.listeners,
            peers: self.metrics.fleet_instances(),
        };
        let base = base.map(|(age, s)| (age.as_secs_f64(), s));
        build(&now, base.as_ref().map(|(age, s)| (*age, &**s)), &facts)
    }

    /// `GET /status.json`.
    pub(crate) fn json(&self) -> String {
        let mut text = serde_json::to_string(&self.page()).expect("JSON of plain values");
        text.push('\n');
        text
    }

    /// `GET /`: the page with its first view.
    pub(crate) fn html(&self) -> String {
        page::document(&self.page())
    }
}

/// What the page shows besides the metrics.
struct Facts<'a> {
    /// Now, Unix seconds.
    unix: f64,
    /// Since the admin listener started (with the server).
    up: Duration,
    instance: String,
    listeners: &'a [Listener],
    /// The fleet's instances this one has seen report on tenants' quotas.
    peers: Option<Vec<String>>,
}

/// A series and the labels its samples must have: `/metrics`'s figure is the sum over
/// the label sets that match.
#[derive(Debug, Clone)]
struct Series {
    name: &'static str,
    labels: Vec<(&'static str, String)>,
}

fn series(name: &'static str) -> Series {
    Series {
        name,
        labels: Vec::new(),
    }
}

impl Series {
    fn with(mut self, label: &'static str, value: impl Into<String>) -> Self {
        self.labels.push((label, value.into()));
        self
    }

    fn filter(&self) -> Vec<(&str, &str)> {
        self.labels.iter().map(|(k, v)| (*k, v.as_str())).collect()
    }

    fn present(&self, s: &Scrape) -> bool {
        !s.label_sets(self.name, &[], &self.filter()).is_empty()
    }

    fn sum(&self, s: &Scrape) -> f64 {
        s.sum(self.name, &self.filter())
    }

    /// As Prometheus writes a selector: `name{label="value",...}`, values escaped as
    /// `/metrics` has them.
    fn text(&self) -> String {
        if self.labels.is_empty() {
            return self.name.to_owned();
        }
        let labels = (self.labels.iter()).fold(Labels::NONE, |l, (k, v)| l.with(k, v));
        format!("{}{{{}}}", self.name, labels.as_str())
    }
}

/// A figure from `/metrics`: a sum of series, or one series over another.
#[derive(Debug, Clone)]
struct Expr {
    terms: Vec<Series>,
    per: Option<Series>,
}

impl From<Series> for Expr {
    fn from(s: Series) -> Self {
        Expr {
            terms: vec![s],
            per: None,
        }
    }
}

fn ratio(a: Series, b: Series) -> Expr {
    Expr {
        terms: vec![a],
        per: Some(b),
    }
}

impl Expr {
    /// Its value in `s`: `None` where none of its series is on the page, or the divisor
    /// is 0.
    fn eval(&self, s: &Scrape) -> Option<f64> {
        if !self.terms.iter().any(|t| t.present(s)) {
            return None;
        }
        let n: f64 = self.terms.iter().map(|t| t.sum(s)).sum();
        match &self.per {
            None => Some(n),
            Some(d) => Some(d.sum(s)).filter(|d| *d != 0.0).map(|d| n / d),
        }
    }

    /// `data-metric`: the terms joined by ` + `, then ` / ` and the divisor.
    fn text(&self) -> String {
        let mut out = self
            .terms
            .iter()
            .map(Series::text)
            .collect::<Vec<_>>()
            .join(" + ");
        if let Some(d) = &self.per {
            out.push_str(" / ");
            out.push_str(&d.text());
        }
        out
    }
}

/// The two reads a page is built from.
struct Reads<'a> {
    now: &'a Scrape,
    /// The earlier read and its age in seconds.
    base: Option<(f64, &'a Scrape)>,
}

impl Reads<'_> {
    /// `e` as `/metrics` has it now.
    fn fig(&self, e: impl Into<Expr>, unit: Unit) -> Cell {
        let e = e.into();
        let v = e.eval(self.now);
        Cell {
            t: unit.format(v),
            v,
            u: Some(unit.name()),
            m: Some(e.text()),
            ..Cell::default()
        }
    }

    /// The per-second change of `e` since the earlier read.
    fn rate(&self, e: impl Into<Expr>) -> Cell {
        let e = e.into();
        let v = self.base.map(|(seconds, base)| {
            let (now, then) = (e.eval(self.now), e.eval(base));
            ((now.unwrap_or(0.0) - then.unwrap_or(0.0)) / seconds.max(1e-3)).max(0.0)
        });
        Cell {
            t: Unit::PerSecond.format(v),
            v,
            u: Some(Unit::PerSecond.name()),
            r: Some(e.text()),
            ..Cell::default()
        }
    }

    /// The values of `labels` on `name`'s samples, sorted as numbers where they are.
    fn rows(&self, name: &str, labels: &[&str]) -> Vec<Vec<String>> {
        let mut sets = self.now.label_sets(name, labels, &[]);
        // Numbers first, in their order, then the rest as text: a total order (a mixed
        // comparison is not, and sort_by may panic on one).
        sets.sort_by(|a, b| {
            let number = |v: &[String]| v.first().and_then(|x| x.parse::<u64>().ok());
            match (number(a), number(b)) {
                (Some(x), Some(y)) => x.cmp(&y).then_with(|| a.cmp(b)),
                (Some(_), None) => std::cmp::Ordering::Less,
                (None, Some(_)) => std::cmp::Ordering::Greater,
                (None, None) => a.cmp(b),
            }
        });
        sets
    }
}

/// What counts as an error, by cause: (what, its series, the label naming the cause).
fn errors() -> Vec<(&'static str, Series, Option<&'static str>)> {
    vec![
        (
            "handshake failed",
            series("terminus_handshake_failures_total"),
            Some("reason"),
        ),
        (
            "handshake refused",
            series("terminus_handshakes_refused_total"),
            Some("cause"),
        ),
        (
            "accept failed",
            series("terminus_accept_errors_total"),
            None,
        ),
        (
            "kTLS required, refused",
            series("terminus_ktls_refused_total"),
            None,
        ),
        (
            "crypto operation failed",
            series("terminus_crypto_errors_total"),
            Some("op"),
        ),
        (
            "5xx answered",
            series("terminus_http_responses_total").with("code", "5xx"),
            Some("protocol"),
        ),
        (
            "HTTP/2 trouble",
            series("terminus_http2_trouble_total"),
            Some("cause"),
        ),
        (
            "request over its rate (429)",
            series("terminus_limited_requests_total"),
            None,
        ),
        (
            "connection over its client's limit",
            series("terminus_limited_connections_total"),
            None,
        ),
        (
            "QUIC handshake failed",
            series("terminus_quic_handshake_failures_total"),
            None,
        ),
        (
            "upstream request failed",
            series("terminus_upstream_failures_total"),
            Some("cause"),
        ),
        (
            "fleet store error",
            series("terminus_fleet_store_errors_total"),
            None,
        ),
        (
            "ACME order failed",
            series("terminus_acme_orders_total").with("result", "failed"),
            None,
        ),
    ]
}

/// The page from `now` and, for rates, an earlier read.
fn build(now: &Scrape, base: Option<(f64, &Scrape)>, facts: &Facts<'_>) -> Page {
    let reads = Reads { now, base };
    let backend = now
        .label_sets("terminus_crypto_requests_total", &["backend"], &[])
        .into_iter()
        .flatten()
        .next()
        .unwrap_or_else(|| "?".to_owned());
    let rates =
        base.map(|(seconds, earlier)| Rates::between((0.0, earlier), (seconds, now), &backend));
    let all_errors = Expr {
        terms: errors().into_iter().map(|(_, s, _)| s).collect(),
        per: None,
    };
    let fill = ratio(
        series("terminus_crypto_batched_requests_total"),
        series("terminus_crypto_batches_total"),
    );
    let errors_now = reads.rate(all_errors.clone());
    let errors_class = if errors_now.v.unwrap_or(0.0) > 0.0 {
        "bad"
    } else {
        "ok"
    };
    let tiles = vec![
        Tile {
            label: "connections open",
            cell: reads.fig(series("terminus_connections_open"), Unit::Count),
            sub: vec![Fact {
                label: "accepted".into(),
                cell: reads.fig(series("terminus_connections_total"), Unit::Count),
            }],
        },
        Tile {
            label: "handshakes/s",
            cell: reads.rate(series("terminus_handshakes_total")),
            sub: vec![
                Fact {
                    label: "completed".into(),
                    cell: reads.fig(series("terminus_handshakes_total"), Unit::Count),
                },
                Fact {
                    label: "resumed/s".into(),
                    cell: Cell::derived(
                        rates.as_ref().map(|r| r.resumed),
                        Unit::PerSecond,
                        "terminus_handshake_duration_seconds_count{mode=\"resumed\"}",
                    ),
                },
            ],
        },
        Tile {
            label: "requests/s",
            cell: reads.rate(series("terminus_http_responses_total")),
            sub: vec![Fact {
                label: "answered".into(),
                cell: reads.fig(series("terminus_http_responses_total"), Unit::Count),
            }],
        },
        Tile {
            label: "crypto backend",
            cell: Cell {
                m: Some("terminus_crypto_requests_total".into()),
                l: Some("backend"),
                ..Cell::text(backend.clone())
            },
            sub: vec![
                Fact {
                    label: "per batch".into(),
                    cell: reads.fig(fill.clone(), Unit::Fill),
                },
                Fact {
                    label: "now".into(),
                    cell: Cell::derived(
                        rates.as_ref().and_then(Rates::fill),
                        Unit::Fill,
                        fill.text(),
                    ),
                },
            ],
        },
        Tile {
            label: "errors/s",
            cell: errors_now.class(errors_class),
            sub: vec![Fact {
                label: "since start".into(),
                cell: reads.fig(all_errors, Unit::Count),
            }],
        },
    ];
    let page_facts = vec![
        Fact {
            label: "terminus".into(),
            cell: Cell::text(env!("CARGO_PKG_VERSION")),
        },
        // 1 for a process started as such, one more for each `terminus upgrade`.
        Fact {
            label: "generation".into(),
            cell: reads.fig(series("terminus_process_generation"), Unit::Count),
        },
        Fact {
            label: "instance".into(),
            cell: Cell::text(facts.instance.clone()),
        },
        Fact {
            label: "up".into(),
            cell: Cell::text(uptime(facts.up)),
        },
        Fact {
            label: "read at".into(),
            cell: Cell::text(date(facts.unix as i64, true)),
        },
        Fact {
            label: "rates over".into(),
            cell: Cell::text(base.map_or("–".to_owned(), |(s, _)| format!("{s:.1} s"))),
        },
    ];
    let sections = vec![
        listeners(facts.listeners),
        connections(&reads),
        workers(&reads, rates.as_ref()),
        handshakes(&reads),
        phases(&reads, rates.as_ref()),
        crypto(&reads, rates.as_ref(), &backend),
        tenants(&reads),
        upstreams(&reads),
        fleet(&reads, facts.peers.as_deref()),
        acme(&reads, facts.unix),
        errors_by_cause(&reads),
    ];
    Page {
        time: facts.unix,
        interval_s: base.map(|(s, _)| s),
        facts: page_facts,
        tiles,
        sections,
        live: rates.as_ref().map(Rates::json),
    }
}

fn section(id: &'static str, title: &'static str, cols: Vec<&'static str>, empty: &str) -> Section {
    Section {
        id,
        title,
        note: None,
        cols,
        rows: Vec::new(),
        empty: empty.to_owned(),
        facts: Vec::new(),
    }
}

fn listeners(listeners: &[Listener]) -> Section {
    let mut s = section(
        "listeners",
        "Listeners",
        vec!["address", "serves", "kTLS", "PROXY header"],
        "No listeners.",
    );
    s.rows = listeners
        .iter()
        .map(|l| {
            vec![
                Cell::text(l.address.clone()),
                Cell::text(l.serves),
                Cell::text(l.ktls),
                Cell::text(if l.proxy_protocol {
                    "trusted networks"
                } else {
                    "no"
                }),
            ]
        })
        .collect();
    s
}

fn connections(r: &Reads<'_>) -> Section {
    let mut s = section(
        "connections",
        "Connections",
        vec!["", "now or in all", "per s"],
        "",
    );
    let row =
        |what: &str, e: Series| vec![Cell::text(what), r.fig(e.clone(), Unit::Count), r.rate(e)];
    let path = |p: &str| series("terminus_connections_by_data_path_total").with("path", p);
    s.rows = vec![
        vec![
            Cell::text("open"),
            r.fig(series("terminus_connections_open"), Unit::Count),
            Cell::text(""),
        ],
        // `terminus upgrade`: the process this one replaced, until it has drained.
        vec![
            Cell::text("open in the process replaced (draining)"),
            r.fig(
                series("terminus_upgrade_predecessor_connections"),
                Unit::Count,
            ),
            Cell::text(""),
        ],
        vec![
            Cell::text("addresses counted for connections_per_client"),
            r.fig(series("terminus_connection_clients"), Unit::Count),
            Cell::text(""),
        ],
        row("accepted", series("terminus_connections_total")),
        row("on kernel TLS", path("ktls")),
        row("on userspace TLS", path("userspace")),
        row(
            "left by kTLS (fallbacks)",
            series("terminus_ktls_fallbacks_total"),
        ),
        row("QUIC", series("terminus_quic_connections_total")),
        row("bytes received", series("terminus_bytes_received_total")),
        row("bytes sent", series("terminus_bytes_sent_total")),
    ];
    s
}

fn workers(r: &Reads<'_>, rates: Option<&Rates>) -> Section {
    let mut s = section(
        "workers",
        "Workers",
        vec![
            "worker",
            "connections open",
            "handshakes",
            "per s",
            "CPU busy",
            "CPU s",
        ],
        "No workers.",
    );
    s.rows = r
        .rows("terminus_worker_connections_open", &["worker"])
        .into_iter()
        .flatten()
        .map(|w| {
            let of = |name| series(name).with("worker", w.clone());
            let busy = rates.and_then(|x| x.workers.get(&w)).and_then(|x| x.busy);
            vec![
                Cell::text(w.clone()),
                r.fig(of("terminus_worker_connections_open"), Unit::Count),
                r.fig(of("terminus_worker_handshakes_total"), Unit::Count),
                r.rate(of("terminus_worker_handshakes_total")),
                Cell::derived(
                    busy,
                    Unit::Percent,
                    of("terminus_worker_cpu_seconds_total").text(),
                ),
                r.fig(of("terminus_worker_cpu_seconds_total"), Unit::Decimal),
            ]
        })
        .collect();
    s
}

fn handshakes(r: &Reads<'_>) -> Section {
    let mut s = section(
        "handshakes",
        "Handshakes",
        vec!["version", "cipher suite", "key", "completed", "per s"],
        "No handshake completed yet.",
    );
    s.rows = r
        .rows(
            "terminus_handshakes_total",
            &["version", "cipher_suite", "key_type"],
        )
        .into_iter()
        .map(|l| {
            let e = series("terminus_handshakes_total")
                .with("version", l[0].clone())
                .with("cipher_suite", l[1].clone())
                .with("key_type", l[2].clone());
            vec![
                Cell::text(l[0].clone()),
                Cell::text(l[1].clone()),
                Cell::text(l[2].clone()),
                r.fig(e.clone(), Unit::Count),
                r.rate(e),
            ]
        })
        .collect();
    s
}

fn phases(r: &Reads<'_>, rates: Option<&Rates>) -> Section {
    let mut s = section(
        "phases",
        "Handshake phases",
        vec![
            "phase",
            "p50 ms",
            "p99 ms",
            "mean ms",
            "share",
            "mean since start ms",
        ],
        "",
    );
    s.note = Some("p50, p99, mean and share over the last interval".to_owned());
    const PHASE: &str = "terminus_handshake_phase_seconds";
    // The mean since start: the histogram's sum over its count, as /metrics has them.
    let mean = |sum: &'static str, count: &'static str, phase: Option<&str>| {
        let (mut sum, mut count) = (series(sum), series(count));
        if let Some(phase) = phase {
            sum = sum.with("phase", phase);
            count = count.with("phase", phase);
        }
        r.fig(ratio(sum, count), Unit::Ms)
    };
    // `share`: None for the rows that are not a part of the handshake.
    let row =
        |name: &str, l: Option<Latency>, share: Option<Option<f64>>, of: String, since: Cell| {
            vec![
                Cell::text(name),
                Cell::derived(l.and_then(|l| l.p50), Unit::Ms, of.clone()),
                Cell::derived(l.and_then(|l| l.p99), Unit::Ms, of.clone()),
                Cell::derived(l.and_then(|l| l.mean), Unit::Ms, of.clone()),
                match share {
                    Some(share) => Cell::derived(share, Unit::Percent, of),
                    None => Cell::text(""),
                },
                since,
            ]
        };
    for (i, phase) in Phase::ALL.iter().enumerate() {
        let live = rates.map(|x| x.phases[i]);
        s.rows.push(row(
            phase.name(),
            live.map(|(_, l, _)| l),
            Some(live.map(|(_, _, share)| share)),
            format!("{PHASE}{{phase=\"{}\"}}", phase.name()),
            mean(
                "terminus_handshake_phase_seconds_sum",
                "terminus_handshake_phase_seconds_count",
                Some(phase.name()),
            ),
        ));
    }
    s.rows.push(row(
        "whole handshake",
        rates.map(|x| x.total),
        None,
        "terminus_handshake_duration_seconds".to_owned(),
        mean(
            "terminus_handshake_duration_seconds_sum",
            "terminus_handshake_duration_seconds_count",
            None,
        ),
    ));
    s.rows.push(row(
        "to first response",
        rates.map(|x| x.first_response),
        None,
        "terminus_handshake_to_first_response_seconds".to_owned(),
        mean(
            "terminus_handshake_to_first_response_seconds_sum",
            "terminus_handshake_to_first_response_seconds_count",
            None,
        ),
    ));
    s
}

fn crypto(r: &Reads<'_>, rates: Option<&Rates>, backend: &str) -> Section {
    let mut s = section(
        "crypto",
        "Crypto engine",
        vec![
            "operation",
            "requests",
            "per s",
            "batches",
            "per batch",
            "per batch now",
            "queued",
            "crossover",
        ],
        "No crypto operations.",
    );
    s.note = Some(format!("backend {backend}"));
    s.rows = r
        .rows("terminus_crypto_requests_total", &["op"])
        .into_iter()
        .flatten()
        .map(|op| {
            let of = |name| series(name).with("op", op.clone());
            let fill = ratio(
                of("terminus_crypto_batched_requests_total"),
                of("terminus_crypto_batches_total"),
            );
            let now = rates.and_then(|x| x.crypto.get(&op)).and_then(|c| c.fill());
            vec![
                Cell::text(op.clone()),
                r.fig(of("terminus_crypto_requests_total"), Unit::Count),
                r.rate(of("terminus_crypto_requests_total")),
                r.fig(of("terminus_crypto_batches_total"), Unit::Count),
                r.fig(fill.clone(), Unit::Fill),
                Cell::derived(now, Unit::Fill, fill.text()),
                r.fig(of("terminus_crypto_queue_depth"), Unit::Count),
                r.fig(of("terminus_crypto_crossover"), Unit::Number),
            ]
        })
        .collect();
    s
}

fn tenants(r: &Reads<'_>) -> Section {
    let mut s = section(
        "tenants",
        "Tenants",
        vec![
            "tenant",
            "committed ACU/s",
            "peak ACU/s",
            "used ACU/s",
            "of committed",
            "admitted",
            "refused",
            "waiting",
        ],
        "No tenants configured.",
    );
    s.rows = r
        .rows("terminus_tenant_acu_per_second", &["tenant"])
        .into_iter()
        .flatten()
        .map(|t| {
            let of = |name| series(name).with("tenant", t.clone());
            let quota = |limit| of("terminus_tenant_quota_acu").with("limit", limit);
            let used = r.fig(
                ratio(of("terminus_tenant_acu_per_second"), quota("committed")),
                Unit::Percent,
            );
            let over = used.v.is_some_and(|u| u > 1.0);
            vec![
                Cell::text(t.clone()),
                r.fig(quota("committed"), Unit::Decimal),
                r.fig(quota("peak"), Unit::Decimal),
                r.fig(of("terminus_tenant_acu_per_second"), Unit::Decimal),
                if over { used.class("bad") } else { used },
                r.fig(of("terminus_tenant_handshakes_admitted_total"), Unit::Count),
                r.fig(of("terminus_tenant_handshakes_refused_total"), Unit::Count),
                r.fig(of("terminus_tenant_quota_waiting"), Unit::Count),
            ]
        })
        .collect();
    // The servers without a tenant are accounted as one, not limited.
    let default = terminus_config::DEFAULT_TENANT;
    let named = s.rows.iter().any(|row| row[0].t != default);
    if s.rows.iter().any(|row| row[0].t == default) {
        s.note = Some(if named {
            format!("{default:?}: the servers without a tenant, accounted, not limited")
        } else {
            format!("no [[tenant]] configured: {default:?} is every server, accounted, not limited")
        });
    }
    s
}

fn upstreams(r: &Reads<'_>) -> Section {
    let mut s = section(
        "upstreams",
        "Upstreams",
        vec![
            "upstream",
            "server",
            "health",
            "active",
            "requests",
            "per s",
            "5xx",
            "failures",
            "idle conns",
        ],
        "No upstreams configured.",
    );
    s.rows = r
        .rows("terminus_upstream_requests_total", &["upstream", "server"])
        .into_iter()
        .map(|l| {
            let of = |name| {
                series(name)
                    .with("upstream", l[0].clone())
                    .with("server", l[1].clone())
            };
            let health = r.fig(of("terminus_upstream_up"), Unit::Health);
            let class = if health.v == Some(0.0) { "down" } else { "up" };
            vec![
                Cell::text(l[0].clone()),
                Cell::text(l[1].clone()),
                health.class(class),
                r.fig(of("terminus_upstream_active_requests"), Unit::Count),
                r.fig(of("terminus_upstream_requests_total"), Unit::Count),
                r.rate(of("terminus_upstream_requests_total")),
                r.fig(
                    of("terminus_upstream_responses_total").with("class", "5xx"),
                    Unit::Count,
                ),
                r.fig(of("terminus_upstream_failures_total"), Unit::Count),
                r.fig(of("terminus_upstream_idle_connections"), Unit::Count),
            ]
        })
        .collect();
    s
}

fn fleet(r: &Reads<'_>, peers: Option<&[String]>) -> Section {
    let mut s = section(
        "fleet",
        "Fleet and ticket keys",
        vec!["", "now or in all", "per s"],
        "",
    );
    let store = r.now.has("terminus_fleet_store_up");
    s.note = Some(if store {
        "a [fleet] store shares ticket keys and quotas".to_owned()
    } else {
        "no [fleet]: this instance's ticket keys are its own".to_owned()
    });
    let row = |what: &str, e: Series, unit| vec![Cell::text(what), r.fig(e, unit), Cell::text("")];
    s.rows.push(row(
        "ticket key epoch",
        series("terminus_ticket_key_epoch"),
        Unit::Number,
    ));
    for source in r
        .rows("terminus_ticket_keys_held", &["source"])
        .into_iter()
        .flatten()
    {
        let label = format!("ticket keys held ({source})");
        s.rows.push(row(
            &label,
            series("terminus_ticket_keys_held").with("source", source),
            Unit::Count,
        ));
    }
    s.rows.push(row(
        "key rotations",
        series("terminus_ticket_key_rotations_total"),
        Unit::Count,
    ));
    s.rows.push(vec![
        Cell::text("tickets sealed"),
        r.fig(series("terminus_tickets_sealed_total"), Unit::Count),
        r.rate(series("terminus_tickets_sealed_total")),
    ]);
    if store {
        let up = r.fig(series("terminus_fleet_store_up"), Unit::Health);
        let class = if up.v == Some(0.0) { "down" } else { "up" };
        s.rows
            .push(vec![Cell::text("store"), up.class(class), Cell::text("")]);
        s.rows.push(row(
            "instances sharing quotas",
            series("terminus_fleet_instances"),
            Unit::Count,
        ));
    }
    if let Some(peers) = peers {
        s.facts.push(Fact {
            label: "peers".into(),
            cell: Cell::text(if peers.is_empty() {
                "none seen yet".to_owned()
            } else {
                peers.join(", ")
            }),
        });
    }
    s
}

fn acme(r: &Reads<'_>, unix: f64) -> Section {
    const EXPIRY: &str = "terminus_acme_certificate_expiry_seconds";
    const NEXT: &str = "terminus_acme_next_renewal_seconds";
    let mut s = section(
        "acme",
        "ACME certificates",
        vec!["name", "key", "expires", "next order", "in days"],
        "No ACME certificates (no server has certificates = \"acme\").",
    );
    let mut certs = r.rows(EXPIRY, &["name", "key"]);
    for c in r.rows(NEXT, &["name", "key"]) {
        if !certs.contains(&c) {
            certs.push(c);
        }
    }
    s.rows = certs
        .into_iter()
        .map(|l| {
            let of = |name| {
                series(name)
                    .with("name", l[0].clone())
                    .with("key", l[1].clone())
            };
            let next = r.fig(of(NEXT), Unit::Date);
            let days = next.v.map(|at| (at - unix) / 86_400.0);
            let soon = days.is_some_and(|d| d < 7.0);
            let days = Cell::derived(days, Unit::Decimal, of(NEXT).text());
            vec![
                Cell::text(l[0].clone()),
                Cell::text(l[1].clone()),
                r.fig(of(EXPIRY), Unit::Date),
                next,
                if soon { days.class("bad") } else { days },
            ]
        })
        .collect();
    if r.now.has("terminus_acme_orders_total") {
        for result in ["issued", "failed"] {
            s.facts.push(Fact {
                label: format!("orders {result}"),
                cell: r.fig(
                    series("terminus_acme_orders_total").with("result", result),
                    Unit::Count,
                ),
            });
        }
    }
    s
}

fn errors_by_cause(r: &Reads<'_>) -> Section {
    let mut s = section(
        "errors",
        "Errors by cause",
        vec!["what", "cause", "since start", "per s"],
        "No errors since start.",
    );
    for (what, e, label) in errors() {
        let causes: Vec<(String, Series)> = match label {
            None => vec![(String::new(), e)],
            Some(label) => r
                .rows(e.name, &[label])
                .into_iter()
                .flatten()
                .map(|cause| (cause.clone(), e.clone().with(label, cause)))
                .collect(),
        };
        for (cause, e) in causes {
            let total = r.fig(e.clone(), Unit::Count);
            if total.v.unwrap_or(0.0) > 0.0 {
                s.rows
                    .push(vec![Cell::text(what), Cell::text(cause), total, r.rate(e)]);
            }
        }
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW: &str = r#"terminus_connections_open 3
terminus_connections_total 1234567
terminus_handshakes_total{version="TLSv1.3",cipher_suite="TLS13_AES_128_GCM_SHA256",key_type="ecdsa"} 40
terminus_http_responses_total{code="2xx",protocol="h2"} 90
terminus_http_responses_total{code="5xx",protocol="h2"} 2
terminus_crypto_requests_total{op="x25519",backend="scalar"} 40
terminus_crypto_batches_total{op="x25519",backend="scalar"} 20
terminus_crypto_batched_requests_total{op="x25519",backend="scalar"} 40
terminus_worker_connections_open{worker="10"} 1
terminus_worker_connections_open{worker="2"} 2
terminus_upstream_requests_total{upstream="<script>alert(\"x\")</script>",server="127.0.0.1:1"} 7
terminus_upstream_up{upstream="<script>alert(\"x\")</script>",server="127.0.0.1:1"} 0
terminus_acme_next_renewal_seconds{name="a.test",key="ecdsa"} 1767225600
"#;

    fn facts(listeners: &[Listener]) -> Facts<'_> {
        Facts {
            unix: 1_767_225_600.0 - 86_400.0 * 3.0,
            up: Duration::from_secs(3725),
            instance: "host:1:abc".into(),
            listeners,
            peers: None,
        }
    }

    fn cells(p: &Page) -> Vec<&Cell> {
        let mut all: Vec<&Cell> = p.facts.iter().map(|f| &f.cell).collect();
        for t in &p.tiles {
            all.push(&t.cell);
            all.extend(t.sub.iter().map(|f| &f.cell));
        }
        for s in &p.sections {
            all.extend(s.rows.iter().flatten());
            all.extend(s.facts.iter().map(|f| &f.cell));
        }
        all
    }

    fn find<'a>(p: &'a Page, metric: &str) -> &'a Cell {
        cells(p)
            .into_iter()
            .find(|c| c.m.as_deref() == Some(metric))
            .unwrap_or_else(|| panic!("no {metric} on the page"))
    }

    #[test]
    fn figures_are_the_metrics_sums_and_ratios_formatted() {
        let now = Scrape::parse(NOW);
        let p = build(&now, None, &facts(&[]));
        assert_eq!(find(&p, "terminus_connections_total").t, "1,234,567");
        assert_eq!(find(&p, "terminus_http_responses_total").t, "92");
        let fill = find(
            &p,
            "terminus_crypto_batched_requests_total{op=\"x25519\"} / terminus_crypto_batches_total{op=\"x25519\"}",
        );
        assert_eq!((fill.t.as_str(), fill.u), ("2.00", Some("x")));
        // Absent: a dash, not 0 (scalar has no crossover).
        assert_eq!(find(&p, "terminus_crypto_crossover{op=\"x25519\"}").t, "–");
        // The errors: 5xx counted, by protocol.
        let errors = p.sections.iter().find(|s| s.id == "errors").unwrap();
        assert_eq!(errors.rows.len(), 1);
        assert_eq!(errors.rows[0][1].t, "h2");
        assert_eq!(errors.rows[0][2].t, "2");
        // Workers in numeric order.
        let workers = p.sections.iter().find(|s| s.id == "workers").unwrap();
        let order: Vec<&str> = workers.rows.iter().map(|r| r[0].t.as_str()).collect();
        assert_eq!(order, ["2", "10"]);
        // Without an earlier read, no rates.
        assert_eq!(p.tiles[1].cell.t, "–");
        assert!(p.live.is_none());
        // Sections with nothing configured say so.
        let tenants = p.sections.iter().find(|s| s.id == "tenants").unwrap();
        assert!(tenants.rows.is_empty());
        assert!(page::document(&p).contains("<p class=\"empty\">No tenants configured.</p>"));
    }

    #[test]
    fn rates_are_against_the_earlier_read() {
        let now = Scrape::parse(NOW);
        let before = Scrape::parse(&NOW.replace("} 90\n", "} 70\n"));
        let p = build(&now, Some((2.0, &before)), &facts(&[]));
        let requests = &p.tiles[2].cell;
        assert_eq!(requests.r.as_deref(), Some("terminus_http_responses_total"));
        assert_eq!(requests.t, "10.0");
        assert_eq!(p.interval_s, Some(2.0));
        assert_eq!(p.live.as_ref().unwrap()["requests_per_s"], 10.0);
    }

    /// Strings from the configuration or a client (upstream names, SNI, label values)
    /// reach HTML only escaped, in text and in attributes; the JSON carries them intact
    /// (the script places them as text).
    #[test]
    fn strings_are_escaped_in_html_and_intact_in_json() {
        let listeners = [Listener {
            address: "127.0.0.1:1\"><img src=x onerror=alert(1)>".into(),
            serves: "https",
            ktls: "auto",
            proxy_protocol: false,
        }];
        let now = Scrape::parse(NOW);
        let p = build(&now, None, &facts(&listeners));
        let page = page::document(&p);
        // The page's own script, and no other.
        assert_eq!(page.matches("<script>").count(), 1, "{page}");
        assert!(!page.contains("<img"), "{page}");
        assert!(page.contains("&lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt;"));
        // In an attribute: the selector's own quotes escaped, for HTML, on top of
        // Prometheus's backslashes.
        assert!(page.contains(
            "data-metric=\"terminus_upstream_up{upstream=&quot;&lt;script&gt;alert(\\&quot;x\\&quot;)&lt;/script&gt;&quot;,server=&quot;127.0.0.1:1&quot;}\""
        ));
        let json: serde_json::Value = serde_json::to_value(&p).unwrap();
        let upstreams = json["sections"]
            .as_array()
            .unwrap()
            .iter()
            .find(|s| s["id"] == "upstreams")
            .unwrap();
        assert_eq!(
            upstreams["rows"][0][0]["t"],
            "<script>alert(\"x\")</script>"
        );
        assert_eq!(upstreams["rows"][0][2]["t"], "down");
        assert_eq!(upstreams["rows"][0][2]["k"], "down");
    }

    #[test]
    fn acme_renewals_show_their_dates_and_days() {
        let now = Scrape::parse(NOW);
        let p = build(&now, None, &facts(&[]));
        let acme = p.sections.iter().find(|s| s.id == "acme").unwrap();
        assert_eq!(acme.rows.len(), 1);
        assert_eq!(acme.rows[0][3].t, "2026-01-01 00:00 UTC");
        assert_eq!(acme.rows[0][4].t, "3.00");
        assert_eq!(acme.rows[0][4].k, Some("bad"), "within a week");
        assert_eq!(acme.rows[0][2].t, "–", "no expiry read yet");
    }
}
