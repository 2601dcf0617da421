//! Admission control (`limits.handshake_queue`) against a real flood: `terminus load`
//! offers one worker far more full handshakes than it computes. The worker must turn the
//! excess away quickly (a reset at accept, or an internal_error alert after the
//! ClientHello where a resumption could be let in), complete every handshake it admits,
//! and go on serving afterwards. How
//! fast and how much is bench/overload's to measure.

use std::process::Command;

use crate::harness::*;

/// How many offered handshakes a second a flood at `rate` is.
enum Rate {
    /// So many a second.
    Fixed(u32),
    /// This many times what the worker completes, measured first (closed loop, 1 s): a
    /// CPU-independent overload.
    TimesCapacity(f64),
}

/// A worker with a 20 ms admission bound, sessions not resumable, offered `rate` full
/// handshakes per second for 2 s; the server and the load report.
fn flood(name: &str, rate: Rate) -> (TestDir, Server, serde_json::Value) {
    let dir = TestDir::new(name);
    let pair = make_cert(&dir.0, "rsa", KeyKind::Rsa(2048), &["localhost"]);
    dir.write("www/index.html", "ok");
    let conf = Config::new(&dir, &pair)
        .before("[limits]\nhandshake_queue = \"20ms\"\n")
        .write(&dir);
    let server = ServerBuilder::config(&conf)
        .args(&["--no-resumption"])
        .one_scalar_worker()
        .start();
    let rate = match rate {
        Rate::Fixed(rate) => rate,
        Rate::TimesCapacity(times) => {
            let r = load(&[
                &server.url("/index.html"),
                "-c",
                "32",
                "-d",
                "1s",
                "--new-connection",
                "-k",
                "--tls",
                "1.3",
            ]);
            let per_s = r["requests"].as_f64().unwrap() / r["duration_s"].as_f64().unwrap();
            (per_s * times) as u32
        }
    };
    let report = load(&[
        &server.url("/index.html"),
        "--rate",
        &rate.to_string(),
        "-d",
        "2s",
        "--new-connection",
        "-k",
        "--tls",
        "1.3",
        "--timeout",
        "5s",
    ]);
    (dir, server, report)
}

#[test]
fn a_flood_beyond_capacity_has_nine_refusals_in_ten_within_the_bound_and_the_admitted_complete() {
    let _alone = exclusive();
    let (_dir, server, r) = flood("overload", Rate::Fixed(8000));
    let refused = server.metric("terminus_handshakes_refused_total", &[]);
    assert!(
        refused > 0.0,
        "nothing refused at 8,000 handshakes/s: {r:#}"
    );
    let ok = r["requests"].as_f64().unwrap();
    assert!(ok > 0.0, "the worker admitted nothing: {r:#}");
    // Quickly: nine refusals in ten reach the client within the 20 ms bound itself
    // (p90 about 1.5 ms on Zen 4 scalar, p95 1.6-1.8 ms, p99 2-7.5 ms). Not p95 or p99:
    // latency counts from the scheduled send time, and the server's core is shared, so a
    // time the worker is off its core puts every refusal due then past the bound: at
    // 8,000 offered a second, 100 ms off-core is 6% of this run's refusals. CI saw it
    // twice: p99 42 ms (p90 1.44 ms), then p95 58 ms (p90 5.7 ms), where the server
    // completed 7% fewer handshakes than it does here (3,948 against 4,217-4,253) at the
    // same handshake p50 (9.7 ms): it was off its core for about 140 ms, not slower.
    // A server that refused late moves p90 too (5 ms asleep per reset at accept: p95 8.8 s).
    let failed = &r["latency_ms"]["failed"];
    assert!(failed["count"].as_f64().unwrap() > 0.0, "{r:#}");
    let p90 = failed["p90"].as_f64().unwrap();
    assert!(
        p90 < 20.0,
        "refusals took {p90} ms at p90, beyond the 20 ms bound: {r:#}"
    );
    // Every failure is a refusal the client was told of at once; none waited it out.
    for (kind, count) in r["errors"].as_object().unwrap() {
        assert!(
            [
                "tls_alert_received:internal_error",
                "closed",
                "connect_reset"
            ]
            .contains(&kind.as_str()),
            "{count} requests failed as {kind}: {r:#}"
        );
    }
    assert_eq!(
        server.metric("terminus_handshake_failures_total", &[]),
        0.0,
        "an admitted handshake failed"
    );
    assert_eq!(
        status(&server, &[], "/index.html"),
        200,
        "serving after the flood"
    );
}

/// With no session resumable, nothing beyond the bound is worth reading: the excess is
/// reset at accept, not refused after its ClientHello (later, behind the worker's other
/// work, and at more cost). The rate is 1.5 times what the worker completes, measured on
/// this CPU (a fixed 3,000/s was beyond a scalar worker on Zen 3 but not on Zen 4), so
/// that it refuses too few per second for the worker to stop reading on cost grounds
/// alone. A few are refused after their hello when the measured cost per handshake rises
/// while they are in flight.
#[test]
fn without_resumption_the_excess_over_capacity_is_reset_at_accept() {
    let _alone = exclusive();
    let (_dir, server, r) = flood("overload-resets", Rate::TimesCapacity(1.5));
    let refused = server.metric("terminus_handshakes_refused_total", &[]);
    assert!(
        refused > 0.0,
        "nothing refused at 1.5 times the worker's capacity: {r:#}"
    );
    let at_hello = server.metric(
        "terminus_handshakes_refused_total",
        &["cause=\"overload_at_hello\""],
    );
    assert!(
        at_hello <= refused * 0.05,
        "{at_hello} of {refused} refusals came after a ClientHello with resumption off: {r:#}"
    );
}

/// Admission weighs a handshake by what handshakes cost, not by what the worker spent on
/// requests over established connections. After 3 s of HTTP/2 keep-alive traffic on 50
/// connections, the next 50 connections' RSA handshakes are all admitted (charged with
/// the keep-alive work, 100-150 of them were reset or refused: bench/report's keep-alive
/// section showed it, and so did this sequence); so is a burst of 50 new handshakes in the
/// middle of such traffic. The default bound (1 s) holds all of them many times over.
#[test]
fn keep_alive_work_does_not_make_admission_refuse_handshakes() {
    let _alone = exclusive();
    let dir = TestDir::new("overload-keepalive");
    let pair = make_cert(&dir.0, "rsa", KeyKind::Rsa(2048), &["localhost"]);
    dir.write("www/1k.bin", vec![b'x'; 1024]);
    let conf = Config::new(&dir, &pair).write(&dir);
    let server = ServerBuilder::config(&conf).one_scalar_worker().start();
    let keep_alive = |h2: bool| {
        let url = server.url("/1k.bin");
        let mut args = vec![url.as_str(), "-k", "-c", "50", "-d", "3s", "--tls", "1.3"];
        if h2 {
            args.push("--http2");
        }
        load(&args)
    };
    let h1 = keep_alive(false);
    let h2 = keep_alive(true);
    // Just was: the next connections' handshakes.
    let after = keep_alive(false);
    // Still is: a burst in the middle of HTTP/2 keep-alive traffic.
    let (busy, during) = std::thread::scope(|s| {
        let traffic = s.spawn(|| keep_alive(true));
        // On purpose: the burst lands in the middle of the 3 s of keep-alive traffic.
        std::thread::sleep(std::time::Duration::from_millis(1500));
        let busy = load(&[
            &server.url("/1k.bin"),
            "-k",
            "--new-connection",
            "--rate",
            "500",
            "-d",
            "100ms",
        ]);
        (busy, traffic.join().unwrap())
    });
    assert_eq!(busy["requests"].as_f64(), Some(50.0), "{busy:#}");
    for (when, r) in [
        ("HTTP/1.1", &h1),
        ("HTTP/2", &h2),
        ("after HTTP/2 keep-alive", &after),
        ("a burst during HTTP/2 keep-alive", &busy),
        ("HTTP/2 beside the burst", &during),
    ] {
        assert!(r["requests"].as_f64().unwrap() > 0.0, "{when}: {r:#}");
        assert!(r["errors"].as_object().unwrap().is_empty(), "{when}: {r:#}");
    }
    assert_eq!(server.metric("terminus_handshakes_refused_total", &[]), 0.0);
}

#[test]
fn a_bad_handshake_queue_names_the_line() {
    let dir = TestDir::new("overload-config");
    let pair = make_cert(&dir.0, "k", KeyKind::EcdsaP256, &["localhost"]);
    let conf = Config::new(&dir, &pair)
        .before("[limits]\nhandshake_queue = \"soon\"\n")
        .write(&dir);
    let out = run(Command::new(terminus_bin())
        .args(["check", "--config"])
        .arg(&conf));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        err.contains("terminus.toml:5")
            && err.contains("handshake_queue = \"soon\" is not a duration"),
        "{err}"
    );
}
