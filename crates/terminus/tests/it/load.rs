//! `terminus load` against a spawned terminus: rates, error kinds, TLS choices, open-loop
//! latency under a stalled server, and the loopback guard. The tests run one at a time
//! (`exclusive`): most measure rates or saturate a CPU.

use std::net::TcpListener;
use std::process::Command;
use std::time::{Duration, Instant};

use crate::harness::*;

fn n(report: &serde_json::Value, key: &str) -> f64 {
    report[key]
        .as_f64()
        .unwrap_or_else(|| panic!("{key} missing in {report:#}"))
}

fn errors(report: &serde_json::Value, kind: &str) -> f64 {
    report["errors"][kind].as_f64().unwrap_or(0.0)
}

fn url(server: &Server, path: &str) -> String {
    format!("https://localhost:{}{path}", server.port())
}

#[test]
fn open_loop_rate_is_honoured_and_every_phase_is_timed() {
    let _alone = exclusive();
    let server = ServerBuilder::flags(&["--workers", "1", "--no-resumption"]).start();
    // New connection per request: every request is a full handshake.
    let r = load(&[
        &url(&server, "/"),
        "--rate",
        "200",
        "-d",
        "3s",
        "--new-connection",
        "-k",
    ]);
    assert_eq!(n(&r, "errors_total"), 0.0, "{r:#}");
    assert_eq!(n(&r, "issued"), 600.0, "{r:#}");
    assert_eq!(n(&r, "requests"), 600.0, "{r:#}");
    let rate = n(&r, "rate");
    assert!(
        (rate - 200.0).abs() <= 10.0,
        "achieved {rate} req/s for 200 offered"
    );
    assert_eq!(n(&r, "handshakes"), 600.0);
    assert_eq!(n(&r, "resumed_handshakes"), 0.0);
    for phase in ["connect", "handshake", "request"] {
        let p = &r["latency_ms"][phase];
        assert_eq!(p["count"].as_f64(), Some(600.0), "{phase}: {p}");
        let (p50, p99, max) = (
            p["p50"].as_f64().unwrap(),
            p["p99"].as_f64().unwrap(),
            p["max"].as_f64().unwrap(),
        );
        assert!(p50 > 0.0 && p50 <= p99 && p99 <= max, "{phase}: {p}");
        assert!(
            p["p90"].is_number() && p["p999"].is_number(),
            "{phase}: {p}"
        );
    }
    // A request includes its connection's handshake here.
    assert!(
        r["latency_ms"]["request"]["p50"].as_f64() >= r["latency_ms"]["handshake"]["p50"].as_f64()
    );
    assert!(n(&r, "client_cpu_s") > 0.0);

    // Keep-alive: the same rate over a handful of connections.
    let r = load(&[&url(&server, "/"), "--rate", "300", "-d", "2s", "-k"]);
    assert_eq!(n(&r, "requests"), 600.0, "{r:#}");
    assert!(n(&r, "handshakes") < 100.0, "{r:#}");
    let rate = n(&r, "rate");
    assert!(
        (rate - 300.0).abs() <= 15.0,
        "achieved {rate} req/s for 300 offered"
    );
    // And the server saw exactly what the client says it sent.
    drop(server);
}

#[test]
fn closed_loop_keeps_its_connections_busy() {
    let _alone = exclusive();
    let server = ServerBuilder::flags(&["--workers", "1"]).admin().start();
    // Two threads pinned to CPU 0 (every machine has one), two connections each.
    let r = load(&[
        &url(&server, "/"),
        "-c",
        "4",
        "-t",
        "2",
        "--pin",
        "0",
        "-d",
        "1s",
        "-k",
    ]);
    assert_eq!(n(&r, "errors_total"), 0.0, "{r:#}");
    assert_eq!(n(&r, "handshakes"), 4.0, "{r:#}");
    assert!(n(&r, "requests") > 100.0, "{r:#}");
    assert_eq!(r["mode"], "connections");
    let served = server.metric("terminus_http_responses_total", &["code=\"2xx\""]);
    assert_eq!(served, n(&r, "requests"), "server counted {served}");
}

#[test]
fn errors_are_classified_by_kind() {
    let _alone = exclusive();
    // A port nobody listens on.
    let port = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let r = load(&[
        &format!("https://127.0.0.1:{port}/"),
        "--rate",
        "20",
        "-d",
        "1s",
        "-k",
    ]);
    assert_eq!(n(&r, "requests"), 0.0);
    assert_eq!(errors(&r, "connect_refused"), 20.0, "{r:#}");
    assert_eq!(n(&r, "errors_total"), 20.0, "{r:#}");
    // Failed requests have their own latency line; the answered ones' is empty.
    assert_eq!(
        r["latency_ms"]["failed"]["count"].as_f64(),
        Some(20.0),
        "{r:#}"
    );
    assert_eq!(
        r["latency_ms"]["request"]["count"].as_f64(),
        Some(0.0),
        "{r:#}"
    );

    // A server that takes the connection and never answers: each request fails at the
    // timeout, and the failed line says how long they waited.
    let silent = TcpListener::bind("127.0.0.1:0").unwrap();
    let r = load(&[
        &format!("https://127.0.0.1:{}/", silent.local_addr().unwrap().port()),
        "--rate",
        "10",
        "-d",
        "1s",
        "--timeout",
        "500ms",
        "-k",
    ]);
    assert_eq!(errors(&r, "handshake_timeout"), 10.0, "{r:#}");
    let failed = &r["latency_ms"]["failed"];
    assert_eq!(failed["count"].as_f64(), Some(10.0), "{r:#}");
    assert!(failed["p50"].as_f64().unwrap() >= 500.0, "{failed}");
    drop(silent);

    let server = ServerBuilder::flags(&["--workers", "1"]).start();
    // 404 is an answered request, counted as an error by its status.
    let r = load(&[
        &url(&server, "/no-such-file"),
        "--rate",
        "20",
        "-d",
        "1s",
        "-k",
    ]);
    assert_eq!(errors(&r, "http_status:404"), 20.0, "{r:#}");
    assert_eq!(n(&r, "requests"), 0.0);

    // Verifying against a CA that did not issue the server's certificate: we reject it
    // with unknown_ca.
    let dir = TestDir::new("load-ca");
    // (Named differently from the server's self-signed issuer, "localhost".)
    let other = make_cert(&dir.0, "other", KeyKind::EcdsaP256, &["other-ca.test"]);
    let r = load(&[
        &url(&server, "/"),
        "--rate",
        "10",
        "-d",
        "1s",
        "--cacert",
        other.cert.to_str().unwrap(),
    ]);
    assert_eq!(errors(&r, "tls_alert_sent:unknown_ca"), 10.0, "{r:#}");
    assert_eq!(n(&r, "handshakes"), 0.0);

    // The server refusing the handshake: it has no TLS 1.2 suite we offer.
    let cfg = dir.write(
        "tls13.toml",
        "listen = [\"127.0.0.1:0\"]\n[tls]\nversions = [\"1.3\"]\n[[server]]\nnames = [\"localhost\"]\n",
    );
    let server13 = ServerBuilder::config(&cfg).start();
    let r = load(&[
        &url(&server13, "/"),
        "--rate",
        "10",
        "-d",
        "1s",
        "-k",
        "--tls",
        "1.2",
    ]);
    assert_eq!(
        errors(&r, "tls_alert_received:protocol_version"),
        10.0,
        "{r:#}"
    );
}

#[test]
fn verifies_a_chain_from_its_ca() {
    let _alone = exclusive();
    let dir = TestDir::new("load-chain");
    let ca = Ca::new(&dir.0, "ca", "terminus load test CA", 2);
    let leaf = ca.issue(&dir.0, "leaf", &Leaf::server("localhost"));
    let (ca, leaf_key, leaf) = (ca.pair.cert, leaf.key, leaf.cert);
    let s = |p: &std::path::Path| p.to_str().unwrap().to_owned();
    let server = ServerBuilder::flags(&[
        "--workers",
        "1",
        "--cert",
        &s(&leaf),
        "--key",
        &s(&leaf_key),
    ])
    .start();
    let r = load(&[
        &url(&server, "/"),
        "--rate",
        "20",
        "-d",
        "1s",
        "--cacert",
        &s(&ca),
    ]);
    assert_eq!(n(&r, "requests"), 20.0, "{r:#}");
    assert_eq!(n(&r, "errors_total"), 0.0, "{r:#}");
    // The same chain under another name fails the name check.
    let r = load(&[
        &format!("https://127.0.0.1:{}/", server.port()),
        "--rate",
        "5",
        "-d",
        "1s",
        "--cacert",
        &s(&ca),
    ]);
    assert_eq!(errors(&r, "tls_alert_sent:bad_certificate"), 5.0, "{r:#}");
}

#[test]
fn tls_choices_reach_the_server() {
    let _alone = exclusive();
    let server = ServerBuilder::flags(&["--workers", "1"]).admin().start();
    let base = url(&server, "/");
    // --sigalg picks the certificate: the server counts handshakes by key type.
    for (sigalg, key_type) in [
        ("rsa_pss_rsae_sha256", "rsa"),
        ("ecdsa_secp256r1_sha256", "ecdsa"),
    ] {
        let r = load(&[
            &base,
            "--rate",
            "20",
            "-d",
            "1s",
            "-k",
            "--new-connection",
            "--sigalg",
            sigalg,
        ]);
        assert_eq!(n(&r, "requests"), 20.0, "{r:#}");
        let label = format!("key_type=\"{key_type}\"");
        assert_eq!(
            server.metric("terminus_handshakes_total", &[&label]),
            20.0,
            "{sigalg}"
        );
    }

    // --tls, --cipher and --group show in what was negotiated.
    for (choice, negotiated) in [
        (
            &[
                "--tls",
                "1.2",
                "--cipher",
                "TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256",
                "--group",
                "secp384r1",
            ][..],
            "TLSv1.2 TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256 secp384r1",
        ),
        (
            &[
                "--cipher",
                "TLS13_AES_128_GCM_SHA256",
                "--group",
                "secp256r1",
            ][..],
            "TLSv1.3 TLS13_AES_128_GCM_SHA256 secp256r1",
        ),
    ] {
        let mut args = vec![
            base.as_str(),
            "--rate",
            "10",
            "-d",
            "1s",
            "-k",
            "--new-connection",
        ];
        args.extend_from_slice(choice);
        let r = load(&args);
        assert_eq!(r["negotiated"][negotiated].as_f64(), Some(10.0), "{r:#}");
    }

    // --resume: after the first full handshake, tickets.
    let r = load(&[
        &base,
        "--rate",
        "50",
        "-d",
        "1s",
        "-k",
        "--new-connection",
        "--resume",
    ]);
    assert_eq!(n(&r, "requests"), 50.0, "{r:#}");
    assert!(n(&r, "resumed_handshakes") >= 45.0, "{r:#}");

    // HTTP/2, keep-alive.
    let r = load(&[&base, "-c", "2", "-d", "1s", "-k", "--http2"]);
    assert_eq!(n(&r, "errors_total"), 0.0, "{r:#}");
    assert!(n(&r, "requests") > 50.0, "{r:#}");
    assert!(server.metric("terminus_http_responses_total", &[]) >= n(&r, "requests"));
}

/// With `--resume`, a connection after the first of each closed-loop slot offers a
/// ticket (99% of them at least, however many connections run at once): the resumed
/// share measures the server.
/// (rustls's own client store keeps eight TLS 1.3 tickets per server; at 100 connections
/// a fifth or more of the handshakes then went out without one.)
#[test]
fn resume_offers_a_ticket_on_99_percent_of_connections_after_the_first_100() {
    let _alone = exclusive();
    let server = ServerBuilder::flags(&["--workers", "1", "--crypto-backend", "scalar"]).start();
    for tls in ["1.3", "1.2"] {
        let r = load(&[
            &url(&server, "/"),
            "-c",
            "100",
            "-d",
            "2s",
            "-k",
            "--new-connection",
            "--resume",
            "--tls",
            tls,
        ]);
        assert_eq!(n(&r, "errors_total"), 0.0, "{r:#}");
        let (handshakes, resumed) = (n(&r, "handshakes"), n(&r, "resumed_handshakes"));
        assert!(handshakes > 1000.0, "{r:#}");
        assert!(
            resumed >= (handshakes - 100.0) * 0.99,
            "TLS {tls}: {resumed} of {handshakes} handshakes resumed: {r:#}"
        );
    }
}

#[test]
fn batch_kx_computes_the_clients_key_exchanges_in_the_engine() {
    let _alone = exclusive();
    let server = ServerBuilder::flags(&["--workers", "1", "--no-resumption"]).start();
    let backend = if terminus_engine::multibuffer::applicable() {
        "multibuffer"
    } else {
        "scalar"
    };
    for (tls, group, negotiated) in [
        ("1.3", "x25519", "X25519"),
        ("1.3", "secp256r1", "secp256r1"),
        ("1.2", "x25519", "X25519"),
        ("1.2", "secp384r1", "secp384r1"),
    ] {
        let r = load(&[
            &url(&server, "/"),
            "-c",
            "16",
            "-d",
            "1s",
            "--new-connection",
            "-k",
            "--batch-kx",
            "--tls",
            tls,
            "--group",
            group,
        ]);
        // The server checks the client's Finished, which a wrong shared secret breaks.
        assert_eq!(n(&r, "errors_total"), 0.0, "{tls} {group}: {r:#}");
        let handshakes = n(&r, "handshakes");
        assert!(handshakes >= 20.0, "{tls} {group}: {r:#}");
        let (version, count) = r["negotiated"]
            .as_object()
            .and_then(|m| m.iter().next())
            .expect("negotiated");
        assert!(
            version.starts_with(&format!("TLSv{tls} ")) && version.ends_with(negotiated),
            "{version}"
        );
        assert_eq!(count.as_f64(), Some(handshakes));
        let kx = &r["kx_engine"];
        assert_eq!(kx["backend"], backend, "{r:#}");
        // A key share and a shared secret per handshake, each through the engine.
        assert_eq!(n(kx, "requests"), 2.0 * handshakes, "{tls} {group}: {r:#}");
        assert!(
            n(kx, "batches") >= 1.0 && n(kx, "mean_batch") >= 1.0,
            "{r:#}"
        );
    }
    let r = load(&[&url(&server, "/"), "-c", "1", "-d", "200ms", "-k"]);
    assert!(
        r.get("kx_engine").is_none(),
        "no engine without --batch-kx: {r:#}"
    );
}

#[test]
fn open_loop_counts_a_stalled_server_as_latency() {
    let _alone = exclusive();
    // The server is frozen (SIGSTOP) for 700 ms in the middle of a 100 req/s run. An
    // open-loop generator keeps to its schedule: every request is still issued, and the
    // ones scheduled during the stall wait for it, so the tail latency shows the stall.
    let server = ServerBuilder::flags(&["--workers", "1"]).start();
    let target = url(&server, "/");
    let pid = server.child.id().to_string();
    // The stall's timing is the test: sleeps on purpose.
    let freezer = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(800));
        run(Command::new("kill").args(["-STOP", &pid]));
        std::thread::sleep(Duration::from_millis(700));
        run(Command::new("kill").args(["-CONT", &pid]));
    });
    let r = load(&[&target, "--rate", "100", "-d", "2500ms", "-k"]);
    freezer.join().unwrap();
    assert_eq!(n(&r, "issued"), 250.0, "{r:#}");
    assert_eq!(n(&r, "requests"), 250.0, "{r:#}");
    let req = &r["latency_ms"]["request"];
    let max = req["max"].as_f64().unwrap();
    let p90 = req["p90"].as_f64().unwrap();
    assert!(max >= 500.0, "the stall is missing from the max: {req}");
    // About 70 of 250 requests fell in the stall and waited 0-700 ms.
    assert!(p90 >= 100.0, "the stall is missing from the p90: {req}");
    assert!(req["p50"].as_f64().unwrap() < 100.0, "{req}");
}

#[test]
fn refuses_remote_targets_and_bad_arguments() {
    let _alone = exclusive();
    let started = Instant::now();
    for args in [
        vec!["https://192.0.2.1/", "--rate", "10", "-d", "1s", "-k"],
        vec!["https://[2001:db8::1]:443/", "-c", "1", "-d", "1s", "-k"],
    ] {
        let out = run(Command::new(terminus_bin()).arg("load").args(&args));
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains("not a loopback address") && err.contains("--allow-remote"),
            "{err}"
        );
    }
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "refusal must come before any load"
    );
    for (args, says) in [
        (vec!["https://localhost:1/", "-d", "1s", "-k"], "--rate"),
        (
            vec!["https://localhost:1/", "--rate", "0", "-d", "1s", "-k"],
            "--rate",
        ),
        (
            vec!["ftp://localhost:1/", "--rate", "1", "-d", "1s", "-k"],
            "https://",
        ),
        (
            vec!["https://localhost:1/", "--rate", "1", "-d", "forever", "-k"],
            "duration",
        ),
        (
            vec!["https://localhost:1/", "-c", "100000", "-d", "1s", "-k"],
            "--connections",
        ),
        (
            vec![
                "https://localhost:1/",
                "-c",
                "1",
                "-d",
                "1s",
                "-k",
                "--pin",
                "4095",
            ],
            "--pin",
        ),
        (
            vec![
                "https://localhost:1/",
                "-c",
                "1",
                "-d",
                "1s",
                "--sigalg",
                "md5",
                "-k",
            ],
            "signature algorithm",
        ),
        (
            vec![
                "https://localhost:1/",
                "-c",
                "1",
                "-d",
                "1s",
                "--cacert",
                "/nonexistent.pem",
            ],
            "/nonexistent.pem",
        ),
    ] {
        let out = run(Command::new(terminus_bin()).arg("load").args(&args));
        assert!(!out.status.success(), "{args:?} was accepted");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(says), "{args:?}: {err}");
    }
}

#[test]
fn http_targets_load_a_plain_server_for_baselines() {
    let _one = exclusive();
    let dir = TestDir::new("load-plain");
    dir.write("www/x.txt", "plain\n");
    // Python's own HTTP server: a real plain-HTTP/1.1 server.
    let mut child = Command::new("python3")
        .args([
            "-m",
            "http.server",
            "0",
            "--bind",
            "127.0.0.1",
            "--directory",
        ])
        .arg(dir.path("www"))
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let mut line = String::new();
    std::io::BufRead::read_line(
        &mut std::io::BufReader::new(child.stdout.take().unwrap()),
        &mut line,
    )
    .unwrap();
    let port = line
        .split_whitespace()
        .nth(5)
        .and_then(|p| p.parse::<u16>().ok())
        .unwrap_or_else(|| panic!("{line:?}"));
    let report = load(&[
        &format!("http://127.0.0.1:{port}/x.txt"),
        "--rate",
        "50",
        "-d",
        "1s",
    ]);
    let _ = child.kill();
    let _ = child.wait();
    assert!(n(&report, "requests") >= 40.0, "{report:#}");
    assert_eq!(n(&report, "errors_total"), 0.0, "{report:#}");
}

#[test]
fn a_simulated_round_trip_delays_each_answer_and_stays_out_of_the_times() {
    let _alone = exclusive();
    let server = ServerBuilder::flags(&["--workers", "1", "--no-resumption"]).start();
    // TLS 1.3: the Finished and request answer the server's flight (one round trip per
    // request); TLS 1.2 also waits one before its key exchange (two).
    for (tls, round_trips) in [("1.3", 1.0), ("1.2", 2.0)] {
        let r = load(&[
            &url(&server, "/"),
            "-c",
            "1",
            "-d",
            "1s",
            "--new-connection",
            "-k",
            "--tls",
            tls,
            "--rtt",
            "100ms",
        ]);
        assert_eq!(n(&r, "errors_total"), 0.0, "{r:#}");
        let requests = n(&r, "requests");
        let most = 10.0 / round_trips;
        assert!(
            requests <= most + 1.0 && requests >= most / 2.0,
            "TLS {tls}: {requests} requests in a second with {round_trips} round trips of 100 ms each: {r:#}"
        );
        for phase in ["handshake", "request"] {
            let p50 = r["latency_ms"][phase]["p50"].as_f64().unwrap();
            assert!(
                p50 < 50.0,
                "TLS {tls}: {phase} p50 {p50} ms counts the waits: {r:#}"
            );
        }
    }
}
