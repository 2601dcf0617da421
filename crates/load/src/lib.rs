//! `terminus load`: an HTTPS load generator for sizing a TLS terminator.
//!
//! Open loop (`--rate`, requests on a fixed schedule, latency from the scheduled time, as
//! wrk2) or closed loop (`--connections`, back to back, as wrk); keep-alive, a new
//! connection and full handshake per request, or resumed sessions. Connect, TLS
//! handshake and request latency are timed separately into HDR histograms, failures are
//! counted by kind, and the generator's own CPU per request is reported so a benchmark
//! can show the client was not its bottleneck.
//!
//! - [`target`]: the URL and the loopback guard;
//! - [`tls`]: the rustls client configuration, [`tickets`] its session store;
//! - [`conn`]: one connection (connect, handshake, requests), [`http1`] its HTTP/1.1,
//!   `h3` its HTTP/3 over QUIC (`--http3`);
//! - [`driver`]: one thread's schedule and connection tasks;
//! - [`stats`], [`failure`], [`report`]: what is measured and how it is shown.

mod conn;
mod driver;
mod failure;
mod h3;
mod http1;
mod report;
mod stats;
mod target;
mod tickets;
pub mod tls;

use std::io::IsTerminal;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use terminus_engine::{BackendKind, EngineMetrics};

use crate::driver::{ThreadLoad, ThreadPlan};
use crate::report::{KxEngineReport, Report, RunInfo};
use crate::stats::Stats;
use crate::target::Target;
pub use crate::tls::{Http, TlsChoice, Trust};

/// Most connections one run may hold open (closed loop) or open at once (open loop).
pub const MAX_CONNECTIONS: usize = 50_000;
/// Highest offered rate, requests/s.
pub const MAX_RATE: f64 = 1_000_000.0;
/// Longest run.
pub const MAX_DURATION: Duration = Duration::from_secs(24 * 3600);

/// Open or closed loop.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Mode {
    /// Requests/s on a fixed schedule.
    Rate(f64),
    /// Connections sending back to back.
    Connections(usize),
}

/// A whole run, as the command line gives it.
#[derive(Debug, Clone)]
pub struct LoadOptions {
    /// The `https://` URL to request.
    pub url: String,
    /// Open loop (a rate) or closed loop (connections).
    pub mode: Mode,
    /// How long to run.
    pub duration: Duration,
    /// Client threads, each with its own runtime.
    pub threads: usize,
    /// CPUs to pin the threads to, thread i to `pin[i % len]`.
    pub pin: Vec<usize>,
    /// A new connection (and handshake) for every request.
    pub new_connection: bool,
    /// Versions, suites, groups, trust and resumption.
    pub tls: TlsChoice,
    /// Open loop: most connections at once (the rest of the requests wait, clock running).
    pub max_connections: usize,
    /// A simulated round trip before every flight that answers the server (see
    /// [`conn::Endpoint::rtt`]).
    pub rtt: Duration,
    /// Per request: connect, handshake and response must be done within it.
    pub timeout: Duration,
    /// Allow a target that is not a loopback address.
    pub allow_remote: bool,
    /// Connect to these addresses instead of resolving the URL's host (which still names
    /// the server in SNI and `Host`), as curl's `--resolve`; new connections go to each
    /// in turn.
    pub address: Vec<std::net::IpAddr>,
    /// A live progress line on stderr (only where stderr is a terminal).
    pub progress: bool,
    /// With `--connections`: one request per connection, then all idle for the
    /// duration, then one more each (see [`driver`]); stderr says `idle: N connections
    /// open` when the idle time starts.
    pub idle: bool,
}

impl Default for LoadOptions {
    fn default() -> Self {
        LoadOptions {
            url: String::new(),
            mode: Mode::Connections(1),
            duration: Duration::from_secs(10),
            threads: 1,
            pin: Vec::new(),
            new_connection: false,
            tls: TlsChoice::default(),
            max_connections: 10_000,
            rtt: Duration::ZERO,
            timeout: Duration::from_secs(10),
            allow_remote: false,
            address: Vec::new(),
            progress: true,
            idle: false,
        }
    }
}

/// Why a run could not start.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error("bad URL {url:?}: {why}")]
    /// The URL cannot be used (the URL, and why).
    Url {
        /// The URL as given.
        url: String,
        /// What is wrong with it.
        why: String,
    },
    #[error("cannot resolve {host:?}: {why}")]
    /// The host does not resolve (the host, and why).
    Resolve {
        /// The host as given.
        host: String,
        /// What the resolver said.
        why: String,
    },
    #[error("refusing to load {host} ({addr}): not a loopback address; pass --allow-remote to load a server you are responsible for")]
    /// The target is not on loopback and `--allow-remote` was not given.
    RemoteTarget {
        /// The host as given.
        host: String,
        /// The address it resolved to.
        addr: std::net::IpAddr,
    },
    #[error("{0}")]
    /// Options that contradict each other or are out of range.
    Options(String),
    #[error("TLS: {0}")]
    /// The TLS client cannot be configured.
    Tls(String),
    #[error("TLS: {0}")]
    /// The CA file the server's certificate is checked against cannot be used.
    Trust(#[source] terminus_tls::client::TrustError),
    #[error("TLS: {0}; give --cacert FILE for the server's CA (or --insecure for a benchmark against a self-signed server)")]
    /// The system's CA bundle cannot be used.
    SystemTrust(#[source] terminus_tls::client::TrustError),
    #[error("TLS: QUIC: {0}")]
    /// The TLS client cannot do QUIC (no TLS 1.3, or no suite QUIC's Initial packets use).
    Quic(#[source] quinn::crypto::rustls::NoInitialCipherSuite),
    #[error("cannot start a load thread: {0}")]
    /// A client thread could not be spawned.
    Thread(std::io::Error),
}

impl LoadOptions {
    /// What `--http3` cannot be combined with (yet).
    fn validate_http3(&self, tls: bool) -> Result<(), LoadError> {
        let bad = |what: &str| Err(LoadError::Options(format!("--http3 {what}")));
        if !tls {
            return bad("needs an https:// target");
        }
        if self.tls.resume {
            return bad("with --resume is not supported yet (QUIC resumption and 0-RTT)");
        }
        if self.tls.batch_kx {
            return bad("with --batch-kx is not supported yet");
        }
        if !self.rtt.is_zero() {
            return bad("with --rtt is not supported yet");
        }
        Ok(())
    }

    fn validate(&self) -> Result<(), LoadError> {
        let bad = |m: String| Err(LoadError::Options(m));
        match self.mode {
            Mode::Rate(r) if !(r > 0.0 && r <= MAX_RATE) => {
                return bad(format!("--rate must be above 0 and at most {MAX_RATE}"))
            }
            Mode::Connections(c) if c == 0 || c > MAX_CONNECTIONS => {
                return bad(format!("--connections must be 1 to {MAX_CONNECTIONS}"))
            }
            Mode::Connections(c) if c < self.threads => {
                return bad(format!(
                    "--connections {c} is fewer than --threads {}",
                    self.threads
                ))
            }
            _ => {}
        }
        if self.max_connections == 0 || self.max_connections > MAX_CONNECTIONS {
            return bad(format!("--max-connections must be 1 to {MAX_CONNECTIONS}"));
        }
        if self.duration.is_zero() || self.duration > MAX_DURATION {
            return bad("--duration must be above 0 and at most 24h".into());
        }
        if self.threads == 0 || self.threads > 256 {
            return bad("--threads must be 1 to 256".into());
        }
        if self.timeout.is_zero() {
            return bad("--timeout must be above 0".into());
        }
        if self.idle {
            if !matches!(self.mode, Mode::Connections(_)) {
                return bad("--idle needs --connections (how many to hold idle)".into());
            }
            if self.new_connection {
                return bad("--idle keeps its connections: not with --new-connection".into());
            }
            if self.tls.http == Http::H3 {
                return bad("--idle with --http3 is not supported yet".into());
            }
        }
        // Not available_parallelism: that counts only the CPUs this process may use now,
        // and `taskset -c 1 terminus load --pin 1` is fine.
        let cpus = terminus_sys::configured_cpus();
        if let Some(cpu) = self.pin.iter().find(|c| **c >= cpus) {
            return bad(format!(
                "--pin: CPU {cpu} does not exist (this machine has CPUs 0-{})",
                cpus - 1
            ));
        }
        Ok(())
    }
}

/// Runs the load and returns its report.
pub fn run(options: &LoadOptions) -> Result<Report, LoadError> {
    options.validate()?;
    let target = Target::parse(&options.url)?.resolve(&options.address, options.allow_remote)?;
    let client = tls::client_config(&options.tls)?;
    if options.tls.http == Http::H3 {
        options.validate_http3(target.tls)?;
    }
    let uri: hyper::Uri = format!("https://{}{}", target.authority, target.path)
        .parse()
        .map_err(|e| LoadError::Url {
            url: options.url.clone(),
            why: format!("{e}"),
        })?;
    let connections = match options.mode {
        Mode::Connections(c) => c,
        Mode::Rate(_) => options.max_connections,
    };
    let wanted = connections as u64 + 64;
    match terminus_sys::raise_open_file_limit(wanted) {
        Ok(limit) if limit >= wanted => {}
        Ok(limit) => eprintln!(
            "warning: open-file limit {limit} is below the {wanted} this load needs (raise the hard limit: ulimit -Hn)"
        ),
        Err(e) => eprintln!("warning: cannot raise the open-file limit: {e}"),
    }

    terminus_engine::warm_up_csprng();
    // `--batch-kx`: crypto_mb where this CPU runs it, else the engine computes scalar.
    let kx_engine = options
        .tls
        .batch_kx
        .then(|| Arc::new(EngineMetrics::new(BackendKind::auto())));
    let cpu_before = cpu_seconds();
    // Threads start together a little after they are all created.
    let start = Instant::now() + Duration::from_millis(20);
    let mut handles = Vec::new();
    let mut all_stats = Vec::new();
    let turns = Arc::new(conn::Turns::new(target.addrs.clone()));
    // `--idle`: the idle time starts once every connection has made its first request.
    let idle = options.idle.then(|| {
        let (start_idle, until) = tokio::sync::watch::channel(None);
        let opened = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let held = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        (
            start_idle,
            driver::Idle {
                opened,
                held,
                until,
            },
        )
    });
    for i in 0..options.threads {
        let stats = Arc::new(Mutex::new(Stats::default()));
        all_stats.push(stats.clone());
        let share =
            |total: usize| total / options.threads + usize::from(i < total % options.threads);
        let load = match options.mode {
            Mode::Rate(rate) => ThreadLoad::Open {
                rate,
                index: i,
                threads: options.threads,
                max_connections: share(options.max_connections).max(1),
            },
            Mode::Connections(c) => ThreadLoad::Closed {
                connections: share(c),
                idle: idle.as_ref().map(|(_, idle)| idle.clone()),
            },
        };
        let plan = ThreadPlan {
            endpoint: conn::Endpoint {
                addrs: turns.clone(),
                server_name: target.server_name.clone(),
                config: client.clone(),
                traffic: Arc::default(),
                h1_request: http1::request(&target.authority, &target.path, options.new_connection),
                uri: uri.clone(),
                http: options.tls.http,
                // Each thread's own: its UDP sockets belong to its runtime.
                h3: (options.tls.http == Http::H3)
                    .then(|| h3::Client::new(client.clone()))
                    .transpose()?,
                tls: target.tls,
                rtt: options.rtt,
            },
            load,
            start,
            duration: options.duration,
            timeout: options.timeout,
            new_connection: options.new_connection,
            stats,
            kx_engine: kx_engine.clone(),
        };
        let cpu = (!options.pin.is_empty()).then(|| options.pin[i % options.pin.len()]);
        let handle = std::thread::Builder::new()
            .name(format!("load-{i}"))
            .spawn(move || {
                if let Some(cpu) = cpu {
                    if let Err(e) = terminus_sys::pin_current_thread(cpu) {
                        eprintln!("warning: load thread {i} cannot pin to CPU {cpu}: {e}");
                    }
                }
                // This thread's generator, seeded from the process's before the start.
                terminus_engine::warm_up_csprng();
                driver::run(plan)
            })
            .map_err(LoadError::Thread)?;
        handles.push(handle);
    }

    let show_progress = options.progress && std::io::stderr().is_terminal();
    let mut last_tick = Instant::now();
    let mut last_ok = 0;
    while handles.iter().any(|h| !h.is_finished()) {
        std::thread::sleep(Duration::from_millis(50));
        if let Some((start_idle, state)) = &idle {
            let opened = state.opened.load(std::sync::atomic::Ordering::Relaxed);
            // A thread that ended this early failed: the others are not kept waiting.
            let all = opened >= connections || handles.iter().any(|h| h.is_finished());
            if start_idle.borrow().is_none() && all {
                let held = state.held.load(std::sync::atomic::Ordering::Relaxed);
                eprintln!("idle: {held} connections open, {} failed", opened - held);
                let _ = start_idle.send(Some(Instant::now() + options.duration));
            }
        }
        if show_progress && last_tick.elapsed() >= Duration::from_secs(1) {
            let merged = merge(&all_stats);
            let rate = (merged.ok - last_ok) as f64 / last_tick.elapsed().as_secs_f64();
            last_tick = Instant::now();
            last_ok = merged.ok;
            eprint!(
                "\r\x1b[2K[{:>5.0}s] {:>9.1} req/s, {} errors, p99 request {:.2} ms",
                start.elapsed().as_secs_f64(),
                rate,
                merged.errors_total(),
                merged.request.quantile_ms(0.99)
            );
        }
    }
    if show_progress {
        eprint!("\r\x1b[2K");
    }
    let mut finished = start;
    for h in handles {
        match h.join() {
            Ok(Ok(end)) => finished = finished.max(end),
            Ok(Err(e)) => return Err(LoadError::Thread(e)),
            Err(_) => {
                return Err(LoadError::Thread(std::io::Error::other(
                    "a load thread panicked",
                )))
            }
        }
    }
    let duration_s = finished.saturating_duration_since(start).as_secs_f64();
    let client_cpu_s = cpu_seconds() - cpu_before;
    let stats = merge(&all_stats);
    let info = RunInfo {
        url: options.url.clone(),
        mode: match options.mode {
            Mode::Rate(_) => "rate",
            Mode::Connections(_) => "connections",
        },
        target_rate: match options.mode {
            Mode::Rate(r) => Some(r),
            Mode::Connections(_) => None,
        },
        connections,
        threads: options.threads,
        new_connection: options.new_connection,
        resume: options.tls.resume,
        http: options.tls.http.name(),
    };
    let mut report = Report::new(info, &stats, duration_s, client_cpu_s);
    report.kx_engine = kx_engine.as_deref().map(KxEngineReport::new);
    Ok(report)
}

fn merge(all: &[Arc<Mutex<Stats>>]) -> Stats {
    let mut total = Stats::default();
    for s in all {
        total.merge(&s.lock().unwrap());
    }
    total
}

/// user+system CPU seconds of this process so far.
fn cpu_seconds() -> f64 {
    terminus_sys::process_cpu_time().map_or(0.0, |t| t.as_secs_f64())
}

/// Parses `--pin` lists: `1`, `0,2`, `2-3`.
pub fn parse_cpu_list(text: &str) -> Option<Vec<usize>> {
    let mut cpus = Vec::new();
    for part in text.split(',') {
        match part.split_once('-') {
            Some((a, b)) => {
                let (a, b): (usize, usize) = (a.trim().parse().ok()?, b.trim().parse().ok()?);
                if a > b || b >= 1024 {
                    return None;
                }
                cpus.extend(a..=b);
            }
            None => cpus.push(part.trim().parse().ok().filter(|c| *c < 1024)?),
        }
    }
    (!cpus.is_empty()).then_some(cpus)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_lists() {
        assert_eq!(parse_cpu_list("1"), Some(vec![1]));
        assert_eq!(parse_cpu_list("0,2"), Some(vec![0, 2]));
        assert_eq!(parse_cpu_list("2-4,7"), Some(vec![2, 3, 4, 7]));
        for bad in ["", "x", "3-1", "1,", "5000"] {
            assert_eq!(parse_cpu_list(bad), None, "{bad}");
        }
    }

    #[test]
    fn options_are_bounded() {
        let base = LoadOptions {
            url: "https://127.0.0.1:1/".into(),
            ..LoadOptions::default()
        };
        for bad in [
            LoadOptions {
                mode: Mode::Rate(0.0),
                ..base.clone()
            },
            LoadOptions {
                mode: Mode::Rate(2e6),
                ..base.clone()
            },
            LoadOptions {
                mode: Mode::Connections(0),
                ..base.clone()
            },
            LoadOptions {
                mode: Mode::Connections(MAX_CONNECTIONS + 1),
                ..base.clone()
            },
            LoadOptions {
                mode: Mode::Connections(2),
                threads: 3,
                ..base.clone()
            },
            LoadOptions {
                duration: Duration::ZERO,
                ..base.clone()
            },
            LoadOptions {
                duration: Duration::from_secs(25 * 3600),
                ..base.clone()
            },
            LoadOptions {
                max_connections: 0,
                ..base.clone()
            },
            LoadOptions {
                pin: vec![0, 1023],
                ..base.clone()
            },
        ] {
            assert!(matches!(run(&bad), Err(LoadError::Options(_))), "{bad:?}");
        }
    }

    #[test]
    fn remote_targets_are_refused_before_any_traffic() {
        let opts = LoadOptions {
            url: "https://192.0.2.1:443/".into(),
            tls: TlsChoice {
                trust: Trust::Insecure,
                ..TlsChoice::default()
            },
            ..LoadOptions::default()
        };
        assert!(matches!(run(&opts), Err(LoadError::RemoteTarget { .. })));
    }
}
