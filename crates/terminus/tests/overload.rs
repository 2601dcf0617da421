//! Admission control (`limits.handshake_queue`) against a real flood: `terminus load`
//! offers one worker far more full handshakes than it computes. The worker must turn the
//! excess away quickly (a reset at accept, or an internal_error alert after the
//! ClientHello), complete every handshake it admits, and go on serving afterwards. How
//! fast and how much is bench/overload's to measure.

mod common;

use std::process::Command;

use common::*;

#[test]
fn a_flood_beyond_capacity_is_refused_quickly_and_the_admitted_complete() {
    let _alone = exclusive();
    let dir = TestDir::new("overload");
    let pair = make_cert(&dir.0, "rsa", KeyKind::Rsa(2048), &["localhost"]);
    dir.write("www/index.html", "ok");
    let conf = config(&dir, &pair, "[limits]\nhandshake_queue = \"20ms\"\n");
    let server = Server::start_with(
        &[
            "--config",
            conf.to_str().unwrap(),
            "--workers",
            "1",
            "--crypto-backend",
            "scalar",
            "--no-resumption",
            "--admin",
            "127.0.0.1:0",
        ],
        false,
    );
    let out = run(Command::new(terminus_bin()).args([
        "load",
        &server.url("/index.html"),
        "--rate",
        "8000",
        "-d",
        "2s",
        "--new-connection",
        "-k",
        "--tls",
        "1.3",
        "--timeout",
        "5s",
        "--json",
    ]));
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let r: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let refused = server.metric("terminus_handshakes_refused_total", &[]);
    assert!(
        refused > 0.0,
        "nothing refused at 8,000 handshakes/s: {r:#}"
    );
    let ok = r["requests"].as_f64().unwrap();
    assert!(ok > 0.0, "the worker admitted nothing: {r:#}");
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

#[test]
fn a_bad_handshake_queue_names_the_line() {
    let dir = TestDir::new("overload-config");
    let pair = make_cert(&dir.0, "k", KeyKind::EcdsaP256, &["localhost"]);
    let conf = config(&dir, &pair, "[limits]\nhandshake_queue = \"soon\"\n");
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
