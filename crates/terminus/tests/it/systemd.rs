//! systemd's notifications (sd_notify's protocol) as a service manager sees them: the
//! test holds the `NOTIFY_SOCKET` datagram socket and reads what terminus says, READY=1
//! only once the port serves, RELOADING=1 then READY=1 around a SIGHUP, STOPPING=1 on
//! SIGTERM, WATCHDOG=1 at half of `WATCHDOG_USEC`, and no more pings once a worker's
//! event loop is stalled (the test-only fault `TERMINUS_TEST_STALL_WORKER_AFTER`).

use std::os::unix::net::UnixDatagram;
use std::process::Command;
use std::time::{Duration, Instant};

use crate::harness::*;

/// The notifications arriving on `socket` within `within`, until one has `until`.
fn notifications(socket: &UnixDatagram, within: Duration, until: Option<&str>) -> Vec<String> {
    let deadline = Instant::now() + within;
    let mut out = Vec::new();
    let mut buf = [0u8; 4096];
    while let Some(left) = deadline.checked_duration_since(Instant::now()) {
        socket
            .set_read_timeout(Some(left.max(Duration::from_millis(1))))
            .unwrap();
        match socket.recv(&mut buf) {
            Ok(n) => {
                let message = String::from_utf8_lossy(&buf[..n]).into_owned();
                let done = until.is_some_and(|u| message.lines().any(|l| l == u));
                out.push(message);
                if done {
                    break;
                }
            }
            Err(_) => break,
        }
    }
    out
}

fn monotonic_usec() -> u64 {
    let out = run(Command::new("python3").args([
        "-c",
        "import time; print(time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000)",
    ]));
    String::from_utf8_lossy(&out.stdout).trim().parse().unwrap()
}

fn pings(messages: &[String]) -> usize {
    messages
        .iter()
        .filter(|m| m.lines().any(|l| l == "WATCHDOG=1"))
        .count()
}

#[test]
fn systemd_hears_ready_once_the_port_serves_reloading_then_ready_stopping_and_watchdog_pings() {
    let dir = TestDir::new("systemd");
    dir.write("www/index.html", "home\n");
    let pair = make_cert(
        dir.path("").as_path(),
        "ecdsa",
        KeyKind::EcdsaP256,
        &["localhost"],
    );
    let port = free_port();
    let conf = Config::new(&dir, &pair).listen(&format!("\"127.0.0.1:{port}\""));
    let path = dir.path("notify.sock");
    let socket = UnixDatagram::bind(&path).unwrap();
    // READY=1 is read on a thread of its own, which connects to the port the moment it
    // arrives: the port must accept then, and serve.
    let listener = std::thread::spawn(move || {
        let first = notifications(&socket, Duration::from_secs(20), Some("READY=1"));
        let accepted = std::net::TcpStream::connect(("127.0.0.1", port)).is_ok();
        (socket, first, accepted)
    });
    let mut server = ServerBuilder::with(&dir, &conf)
        .env("NOTIFY_SOCKET", path.to_str().unwrap())
        .env("WATCHDOG_USEC", "1000000")
        .start();
    let (socket, first, accepted) = listener.join().unwrap();
    assert!(
        first.last().is_some_and(|m| m.contains("READY=1")),
        "{first:?}"
    );
    assert!(accepted, "READY=1 came before the port accepted");
    assert_eq!(status(&server, &[], "/index.html"), 200);

    // The watchdog: a ping every half second (WATCHDOG_USEC's half).
    let messages = notifications(&socket, Duration::from_millis(2600), None);
    let count = pings(&messages);
    assert!(
        (4..=7).contains(&count),
        "{count} pings in 2.6 s: {messages:?}"
    );

    // A reload: RELOADING=1 with the monotonic time it began, then READY=1.
    let before = monotonic_usec();
    server.signal("HUP");
    let reload = notifications(&socket, Duration::from_secs(10), Some("READY=1"));
    let after = monotonic_usec();
    let reloading = reload
        .iter()
        .position(|m| m.lines().any(|l| l == "RELOADING=1"))
        .unwrap_or_else(|| panic!("no RELOADING=1: {reload:?}"));
    let ready = reload
        .iter()
        .position(|m| m.lines().any(|l| l == "READY=1"))
        .unwrap_or_else(|| panic!("no READY=1 after the reload: {reload:?}"));
    assert!(reloading < ready, "{reload:?}");
    let began: u64 = reload[reloading]
        .lines()
        .find_map(|l| l.strip_prefix("MONOTONIC_USEC="))
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no MONOTONIC_USEC: {reload:?}"));
    assert!(
        (before..=after).contains(&began),
        "{before} {began} {after}"
    );
    assert!(
        reload[ready].contains("STATUS=configuration reloaded"),
        "{reload:?}"
    );

    // The drain.
    server.signal("TERM");
    let stopping = notifications(&socket, Duration::from_secs(10), Some("STOPPING=1"));
    assert!(
        stopping
            .iter()
            .any(|m| m.lines().any(|l| l == "STOPPING=1")),
        "{stopping:?}"
    );
    assert!(server.wait_exit(Duration::from_secs(20)).success());
}

#[test]
fn a_stalled_worker_stops_the_watchdog_pings() {
    let dir = TestDir::new("systemd-stall");
    dir.write("www/index.html", "home\n");
    let pair = make_cert(
        dir.path("").as_path(),
        "ecdsa",
        KeyKind::EcdsaP256,
        &["localhost"],
    );
    let conf = Config::new(&dir, &pair);
    let path = dir.path("notify.sock");
    let socket = UnixDatagram::bind(&path).unwrap();
    let _server = ServerBuilder::with(&dir, &conf)
        .env("NOTIFY_SOCKET", path.to_str().unwrap())
        .env("WATCHDOG_USEC", "1000000")
        .env("TERMINUS_TEST_STALL_WORKER_AFTER", "3")
        .start();
    // Pings while every worker runs ...
    let before = notifications(&socket, Duration::from_millis(2500), None);
    assert!(pings(&before) >= 3, "{before:?}");
    // ... none once worker 0 has stalled (at 3 s) for longer than the 1.5 s a worker
    // may go without a beat.
    let _ = notifications(&socket, Duration::from_millis(2500), None);
    let after = notifications(&socket, Duration::from_secs(3), None);
    assert_eq!(pings(&after), 0, "{after:?}");
}

/// contrib/systemd/terminus.service passes `systemd-analyze verify` with its commands
/// pointing at this build (a misspelt directive or a missing binary fails it).
#[test]
fn the_systemd_unit_verifies() {
    let available = Command::new("systemd-analyze")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    if !terminus_testkit::runs_here(
        terminus_testkit::Need::SystemdAnalyze,
        available,
        "systemd-analyze is not installed",
    ) {
        return;
    }
    let dir = TestDir::new("systemd-unit");
    let repo = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let unit = std::fs::read_to_string(repo.join("contrib/systemd/terminus.service")).unwrap();
    assert!(unit.contains("Type=notify"), "{unit}");
    assert!(unit.contains("WatchdogSec="), "{unit}");
    let unit = unit.replace("/usr/bin/terminus", terminus_bin());
    let path = dir.write("terminus.service", unit);
    let out = run(Command::new("systemd-analyze").args(["verify", path.to_str().unwrap()]));
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success() && said.trim().is_empty(), "{said}");
}
