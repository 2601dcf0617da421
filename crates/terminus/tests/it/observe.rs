//! Handshake observability against a real server and real clients: the always-on phase
//! histograms add up, agree with the engine's own timing, carry their labels, and reach
//! the access log.

use std::process::Command;

use crate::harness::*;

/// One label set's histograms, read from `/metrics`.
struct Set {
    labels: String,
    count: f64,
    total: f64,
    phases: Vec<(String, f64, f64)>,
    first_response: f64,
}

const PHASES: [&str; 9] = [
    "hello_wait",
    "hello_read",
    "admission",
    "to_crypto",
    "crypto_queue",
    "crypto_compute",
    "remote_sign",
    "server",
    "client",
];

/// Every label set of `terminus_handshake_duration_seconds` in `text`.
fn sets(text: &str) -> Vec<Set> {
    let prefix = "terminus_handshake_duration_seconds_count{";
    text.lines()
        .filter_map(|l| l.strip_prefix(prefix))
        .map(|rest| {
            let labels = rest.split('}').next().unwrap().to_owned();
            let of = |name: &str, extra: &str| {
                let series = format!("{name}{{{extra}{labels}}} ");
                text.lines()
                    .find_map(|l| l.strip_prefix(&series))
                    .unwrap_or_else(|| panic!("no {series} in\n{text}"))
                    .parse::<f64>()
                    .unwrap()
            };
            Set {
                count: of("terminus_handshake_duration_seconds_count", ""),
                total: of("terminus_handshake_duration_seconds_sum", ""),
                phases: PHASES
                    .iter()
                    .map(|p| {
                        let phase = format!("phase=\"{p}\",");
                        (
                            p.to_string(),
                            of("terminus_handshake_phase_seconds_count", &phase),
                            of("terminus_handshake_phase_seconds_sum", &phase),
                        )
                    })
                    .collect(),
                first_response: of("terminus_handshake_to_first_response_seconds_count", ""),
                labels,
            }
        })
        .collect()
}

#[test]
fn handshake_phases_add_up_and_agree_with_the_engine() {
    let _alone = exclusive();
    let dir = TestDir::new("observe");
    let log = dir.path("access.log");
    let conf = dir.write(
        "t.toml",
        format!(
            "listen = [\"127.0.0.1:0\"]\nworkers = 1\n[admin]\nlisten = \"127.0.0.1:0\"\n[log]\naccess = \"{}\"\n[[server]]\nnames = [\"localhost\"]\n",
            log.display()
        ),
    );
    let server = ServerBuilder::config(&conf).start();
    // Full TLS 1.3 (ECDSA: the client offers it first), full TLS 1.2 with RSA, resumed
    // TLS 1.3: 100 handshakes each, one request on each connection.
    load(&[
        &server.url("/"),
        "--new-connection",
        "-k",
        "-d",
        "1s",
        "--rate",
        "100",
    ]);
    load(&[
        &server.url("/"),
        "--new-connection",
        "-k",
        "-d",
        "1s",
        "--rate",
        "100",
        "--tls",
        "1.2",
        "--sigalg",
        "rsa_pss_rsae_sha256",
    ]);
    load(&[
        &server.url("/"),
        "--new-connection",
        "-k",
        "-d",
        "1s",
        "--rate",
        "100",
        "--resume",
    ]);
    let text = server.metrics();
    let sets = sets(&text);
    let labels: Vec<&str> = sets.iter().map(|s| s.labels.as_str()).collect();
    for wanted in [
        "version=\"TLSv1.3\",key_type=\"ecdsa\",mode=\"full\",tenant=\"default\"",
        "version=\"TLSv1.2\",key_type=\"rsa\",mode=\"full\",tenant=\"default\"",
        "version=\"TLSv1.3\",key_type=\"none\",mode=\"resumed\",tenant=\"default\"",
    ] {
        assert!(labels.contains(&wanted), "{wanted} not in {labels:#?}");
    }
    let handshakes = metric_sum(&text, "terminus_handshakes_total", &[]);
    assert_eq!(sets.iter().map(|s| s.count).sum::<f64>(), handshakes);
    assert!(handshakes >= 300.0, "{handshakes} handshakes");
    let mut crypto = 0.0;
    for set in &sets {
        for (phase, count, _) in &set.phases {
            assert_eq!(*count, set.count, "{phase} of {}", set.labels);
        }
        // Sums are kept in whole µs, each observation rounded down: the eight phases can
        // lose up to 8 µs per handshake against the total, and never gain.
        let phases: f64 = set.phases.iter().map(|(_, _, sum)| sum).sum();
        let lost = set.total - phases;
        assert!(
            (-1e-9..=8e-6 * set.count + 1e-9).contains(&lost),
            "{}: phases sum to {phases} s, total {} s over {} handshakes",
            set.labels,
            set.total,
            set.count
        );
        // Every client waited for its response, one per connection.
        assert_eq!(set.first_response, set.count, "{}", set.labels);
        crypto += set
            .phases
            .iter()
            .filter(|(p, _, _)| p.starts_with("crypto_"))
            .map(|(_, _, sum)| sum)
            .sum::<f64>();
    }
    // The engine times each request itself, submit to answer: the handshakes' crypto
    // phases are the same intervals, cut by the same clock.
    let engine = metric_sum(&text, "terminus_crypto_latency_seconds_sum", &[]);
    let requests = metric_sum(&text, "terminus_crypto_requests_total", &[]);
    assert!(
        (engine - crypto).abs() <= 2e-6 * requests + 1e-9,
        "engine {engine} s for {requests} requests, handshakes' crypto phases {crypto} s"
    );
    assert!(crypto > 0.0);
    // The access log carries each connection's handshake time and crypto queue wait.
    let log = log_when(&log, |t| t.lines().count() as f64 >= handshakes);
    let times: Vec<f64> = log
        .lines()
        .map(|l| {
            let field = l.split(" handshake_time=").nth(1).expect(l);
            assert!(l.contains(" crypto_wait="), "{l}");
            field.split(' ').next().unwrap().parse().unwrap()
        })
        .collect();
    assert_eq!(times.len() as f64, handshakes, "{log}");
    assert!(times.iter().all(|&t| t > 0.0 && t < 1.0), "{times:?}");
}

/// Whether bpftrace runs here; why not, when it does not.
fn bpftrace_runs() -> Result<(), String> {
    match Command::new("bpftrace")
        .args(["-e", "BEGIN { exit(); }"])
        .output()
    {
        Ok(out) if out.status.success() => Ok(()),
        Ok(out) => Err(format!(
            "bpftrace cannot load a program here ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        )),
        Err(e) => Err(format!("bpftrace is not installed: {e}")),
    }
}

/// A contrib/bpftrace script attached to every running terminus binary, its stdout
/// collected until it is interrupted.
struct Tracer {
    child: std::process::Child,
    out: std::sync::mpsc::Receiver<String>,
}

impl Tracer {
    /// Starts `script` and returns once its probes are attached.
    fn attach(script: &str) -> Tracer {
        let scripts = terminus_testkit::repo().join("contrib/bpftrace");
        let mut child = Command::new("bpftrace")
            .arg("-I")
            .arg(&scripts)
            .arg(scripts.join(script))
            .arg(terminus_bin())
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("spawn bpftrace");
        let (tx, out) = std::sync::mpsc::channel();
        let stdout = child.stdout.take().unwrap();
        std::thread::spawn(move || {
            use std::io::BufRead;
            for line in std::io::BufReader::new(stdout)
                .lines()
                .map_while(Result::ok)
            {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
        loop {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            match out.recv_timeout(left) {
                Ok(line) if line.starts_with("Attaching") => break,
                Ok(_) => {}
                Err(_) => panic!("{script} did not attach within 60 s"),
            }
        }
        Tracer { child, out }
    }

    /// Interrupts the script (it prints its maps) and returns what it printed. The
    /// interrupt is sent again every 2 s until bpftrace exits (30 s at most): CI saw it
    /// sleep on in epoll_wait after one SIGINT, and exit at a second one.
    fn finish(mut self) -> Vec<String> {
        use std::time::{Duration, Instant};
        let pid = self.child.id().to_string();
        let deadline = Instant::now() + Duration::from_secs(30);
        'interrupt: loop {
            run(Command::new("kill").args(["-INT", &pid]));
            let again = Instant::now() + Duration::from_secs(2);
            while Instant::now() < again {
                if self.child.try_wait().ok().flatten().is_some() {
                    break 'interrupt;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            assert!(Instant::now() < deadline, "bpftrace did not exit on SIGINT");
        }
        // Everything it printed, to the end of its output.
        let mut lines = Vec::new();
        while let Ok(line) = self.out.recv_timeout(Duration::from_secs(5)) {
            lines.push(line);
        }
        lines
    }
}

/// `@name[key]: n` lines of a bpftrace map.
fn map_count(lines: &[String], name: &str, key: &str) -> f64 {
    let prefix = format!("@{name}[{key}]: ");
    lines
        .iter()
        .find_map(|l| l.strip_prefix(&prefix))
        .map_or(0.0, |n| n.trim().parse().unwrap())
}

#[test]
fn the_bpftrace_scripts_count_what_the_server_counts() {
    if let Err(why) = bpftrace_runs() {
        if !terminus_testkit::runs_here(terminus_testkit::Need::Bpftrace, false, why) {
            return;
        }
    }
    let _alone = exclusive();
    let server = ServerBuilder::flags(&["--workers", "1"]).admin().start();
    let latency = Tracer::attach("terminus-ssllatency.bt");
    let snoop = Tracer::attach("terminus-sslsnoop.bt");
    load(&[
        &server.url("/"),
        "--new-connection",
        "-k",
        "-d",
        "1s",
        "--rate",
        "100",
    ]);
    load(&[
        &server.url("/"),
        "--new-connection",
        "-k",
        "-d",
        "1s",
        "--rate",
        "50",
        "--resume",
        "--tls",
        "1.2",
    ]);
    let text = server.metrics();
    let latency = latency.finish();
    let snoop = snoop.finish();
    let handshakes = metric_sum(&text, "terminus_handshakes_total", &[]);
    assert!(handshakes >= 150.0, "{handshakes} handshakes");
    assert_eq!(
        map_count(&latency, "handshakes", "ok"),
        handshakes,
        "{latency:#?}"
    );
    for op in ["x25519", "ecdsa_sign"] {
        let label = format!("op=\"{op}\"");
        let batches = metric_sum(&text, "terminus_crypto_batches_total", &[&label]);
        assert!(batches > 0.0, "no {op} batches");
        assert_eq!(map_count(&latency, "batches", op), batches, "{latency:#?}");
    }
    // One line per handshake, with its phases: resumed TLS 1.2 computes nothing.
    let lines: Vec<&String> = snoop.iter().filter(|l| l.contains(" ok ")).collect();
    assert_eq!(lines.len() as f64, handshakes, "{snoop:#?}");
    let resumed = lines.iter().filter(|l| l.contains(" resumed ")).count();
    assert!(resumed >= 40, "{resumed} resumed of {}", lines.len());
}

/// QUIC handshakes fire the same probes as TCP's: the scripts count as many finished
/// handshakes as the server (`terminus_quic_handshakes_total`), one snoop line each,
/// TLS 1.3 with the key that signed.
#[test]
fn quic_handshakes_reach_the_bpftrace_scripts_as_tcp_ones() {
    if let Err(why) = bpftrace_runs() {
        if !terminus_testkit::runs_here(terminus_testkit::Need::Bpftrace, false, why) {
            return;
        }
    }
    let _alone = exclusive();
    let dir = TestDir::new("observe-quic");
    let config = H3Config {
        key: KeyKind::EcdsaP256,
        backend: "auto",
        http3: "",
        in_server: "",
        more: "",
        workers: 1,
    };
    let (server, port) = h3_server_on(&dir, "127.0.0.1", config);
    let latency = Tracer::attach("terminus-ssllatency.bt");
    let snoop = Tracer::attach("terminus-sslsnoop.bt");
    load(&[
        &format!("https://localhost:{port}/index.html"),
        "--http3",
        "--new-connection",
        "-k",
        "-d",
        "1s",
        "--rate",
        "50",
    ]);
    let handshakes = server.metric("terminus_quic_handshakes_total", &[]);
    let latency = latency.finish();
    let snoop = snoop.finish();
    assert!(handshakes >= 40.0, "{handshakes} QUIC handshakes");
    assert_eq!(
        map_count(&latency, "handshakes", "ok"),
        handshakes,
        "{latency:#?}"
    );
    let lines: Vec<&String> = snoop.iter().filter(|l| l.contains(" ok ")).collect();
    assert_eq!(lines.len() as f64, handshakes, "{snoop:#?}");
    assert!(
        lines
            .iter()
            .all(|l| l.contains("TLSv1.3") && l.contains("ecdsa")),
        "{snoop:#?}"
    );
}

#[test]
fn top_shows_a_loaded_server_once_as_json_and_as_text() {
    let _alone = exclusive();
    // Pinned to scalar (one request a batch, asserted below) on every CPU.
    let server = ServerBuilder::flags(&[]).one_scalar_worker().start();
    let admin = server.admin.unwrap().to_string();
    let url = format!("https://localhost:{}/", server.port());
    // 4 s of 100 full handshakes/s; top's second begins once the load is under way.
    let mut load = Command::new(terminus_bin())
        .args([
            "load",
            &url,
            "--new-connection",
            "-k",
            "-d",
            "4s",
            "--rate",
            "100",
        ])
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap();
    eventually(
        std::time::Duration::from_secs(10),
        "the load under way",
        || server.metric("terminus_handshakes_total", &[]) > 0.0,
    );
    let top = |extra: &[&str]| {
        let out = run(Command::new(terminus_bin())
            .args(["top", "--admin", &admin, "--once", "--interval", "1.5"])
            .args(extra));
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap()
    };
    let json: serde_json::Value = serde_json::from_str(&top(&["--json"])).unwrap();
    let text = top(&[]);
    assert!(load.wait().unwrap().success());
    let full = json["handshakes_per_s"]["full"].as_f64().unwrap();
    assert!((70.0..=130.0).contains(&full), "{json:#}");
    assert_eq!(json["handshakes_per_s"]["resumed"].as_f64(), Some(0.0));
    assert_eq!(json["backend"].as_str(), Some("scalar"), "{json:#}");
    // Every phase has a p50; their shares of the time add up to all of it.
    let phases = json["phases"].as_object().unwrap();
    assert_eq!(phases.len(), 9, "{json:#}");
    let share: f64 = phases.values().map(|p| p["share"].as_f64().unwrap()).sum();
    assert!(
        (share - 1.0).abs() < 0.01,
        "shares sum to {share}: {json:#}"
    );
    assert!(phases["crypto_compute"]["p50_ms"].as_f64().unwrap() > 0.0);
    let p50 = json["handshake"]["p50_ms"].as_f64().unwrap();
    let p99 = json["handshake"]["p99_ms"].as_f64().unwrap();
    assert!(0.0 < p50 && p50 <= p99, "{json:#}");
    // Scalar: one request per batch.
    assert_eq!(json["crypto"]["x25519"]["batch_fill"].as_f64(), Some(1.0));
    let worker = &json["workers"]["0"];
    let handshakes = worker["handshakes_per_s"].as_f64().unwrap();
    assert!((handshakes - full).abs() <= 0.1 * full + 2.0, "{json:#}");
    let busy = worker["cpu_busy"].as_f64().unwrap();
    assert!(busy > 0.0 && busy < 1.0, "{json:#}");
    // Not a terminal: plain text, no escape codes.
    assert!(!text.contains('\x1b'), "{text:?}");
    for wanted in ["handshakes/s  full", "crypto_compute", "x25519", "worker"] {
        assert!(text.contains(wanted), "{wanted} not in\n{text}");
    }
}

#[test]
fn top_names_an_admin_listener_it_cannot_read() {
    let out = run(Command::new(terminus_bin()).args(["top", "--admin", "127.0.0.1:1", "--once"]));
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("admin listener 127.0.0.1:1"), "{err}");
}

#[test]
fn a_clients_round_trip_lands_in_the_client_phase() {
    let _alone = exclusive();
    let server = ServerBuilder::flags(&["--workers", "1"]).admin().start();
    // The client's Finished and its request leave 30 ms after the server's flight they
    // answer: a round trip the server waits out once, in the handshake.
    load(&[
        &server.url("/"),
        "--new-connection",
        "-k",
        "-d",
        "1s",
        "--rate",
        "20",
        "--rtt",
        "30ms",
    ]);
    let text = server.metrics();
    let sets = sets(&text);
    assert_eq!(sets.len(), 1, "{}", sets.len());
    let set = &sets[0];
    let mean = |phase: &str| {
        let (_, count, sum) = set.phases.iter().find(|(p, _, _)| p == phase).unwrap();
        sum / count
    };
    let client = mean("client");
    assert!((0.030..0.060).contains(&client), "client phase {client} s");
    // Everything else is loopback and a few hundred µs of work.
    let rest = set.total / set.count - client;
    assert!(rest < 0.010, "{rest} s outside the client phase");
    let first = metric_sum(
        &text,
        "terminus_handshake_to_first_response_seconds_sum",
        &[],
    ) / set.first_response;
    // The request came with the Finished: the response follows the handshake at once.
    assert!(first < 0.010, "to first response {first} s");
}
