//! Handshake observability against a real server and real clients: the always-on phase
//! histograms add up, agree with the engine's own timing, carry their labels, and reach
//! the access log.

mod common;

use std::process::Command;

use common::*;

/// One label set's histograms, read from `/metrics`.
struct Set {
    labels: String,
    count: f64,
    total: f64,
    phases: Vec<(String, f64, f64)>,
    first_response: f64,
}

const PHASES: [&str; 8] = [
    "hello_wait",
    "hello_read",
    "admission",
    "to_crypto",
    "crypto_queue",
    "crypto_compute",
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

fn load(server: &Server, args: &[&str]) {
    let url = format!("https://localhost:{}/", server.port());
    let out = run(Command::new(terminus_bin())
        .args(["load", &url, "--new-connection", "-k", "-d", "1s"])
        .args(args));
    assert!(
        out.status.success(),
        "terminus load {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
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
    let server = Server::start_with(&["--config", conf.to_str().unwrap()], false);
    // Full TLS 1.3 (ECDSA: the client offers it first), full TLS 1.2 with RSA, resumed
    // TLS 1.3: 100 handshakes each, one request on each connection.
    load(&server, &["--rate", "100"]);
    load(
        &server,
        &[
            "--rate",
            "100",
            "--tls",
            "1.2",
            "--sigalg",
            "rsa_pss_rsae_sha256",
        ],
    );
    load(&server, &["--rate", "100", "--resume"]);
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
    let log = std::fs::read_to_string(&log).unwrap();
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
