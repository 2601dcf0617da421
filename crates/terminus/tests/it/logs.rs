//! The log files as an operator rotates them: logrotate's rename then SIGUSR1 under load
//! (every request's line in exactly one file, counted against the requests a client
//! sent), the JSON access log read by Python's json with every field present, and the
//! error log (`log.error`) reopened by the same signal.

use std::collections::BTreeSet;
use std::process::Command;
use std::time::Duration;

use crate::harness::*;

/// Fields every JSON access log line carries (null where they do not apply).
const FIELDS: &[&str] = &[
    "time",
    "client",
    "method",
    "path",
    "status",
    "bytes",
    "duration",
    "sni",
    "tls_version",
    "upstream",
    "upstream_status",
    "upstream_time",
    "tenant",
];

/// Sends `threads` x `each` requests over HTTP/1.1 keep-alive, each with a path of its
/// own (`/index.html?r=<thread>-<i>`), and prints how many got a 200.
const CLIENT: &str = r#"
import http.client, ssl, sys, threading
port, threads, each = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
ctx = ssl._create_unverified_context()
ok = [0] * threads
def run(t):
    conn = http.client.HTTPSConnection("localhost", port, context=ctx)
    for i in range(each):
        conn.request("GET", f"/index.html?r={t}-{i}")
        resp = conn.getresponse()
        resp.read()
        ok[t] += resp.status == 200
    conn.close()
ts = [threading.Thread(target=run, args=(t,)) for t in range(threads)]
for t in ts: t.start()
for t in ts: t.join()
print(sum(ok))
"#;

#[test]
fn rotating_logs_under_load_loses_and_repeats_no_line() {
    let dir = TestDir::new("logs-rotate");
    dir.write("www/index.html", "hello\n");
    let pair = make_cert(dir.root(), "ecdsa", KeyKind::EcdsaP256, &["localhost"]);
    let access = dir.path("access.log");
    let error = dir.path("error.log");
    let conf = Config::new(&dir, &pair).before(&format!(
        "[log]\naccess = \"{}\"\nformat = \"json\"\nerror = \"{}\"",
        access.display(),
        error.display()
    ));
    let server = ServerBuilder::with(&dir, &conf).admin().start();
    let (threads, each) = (4usize, 1500usize);
    let client = {
        let port = server.port().to_string();
        std::thread::spawn(move || {
            run(Command::new("python3").args([
                "-c",
                CLIENT,
                &port,
                &threads.to_string(),
                &each.to_string(),
            ]))
        })
    };
    // Rotated twice while the load runs, as logrotate does: rename, then the signal.
    let lines = |s: &Server| s.metric("terminus_log_lines_total", &["log=\"access\""]);
    for rotation in 1..=2 {
        let before = lines(&server);
        eventually(
            Duration::from_secs(30),
            "lines written between rotations",
            || lines(&server) > before + 1000.0,
        );
        for log in [&access, &error] {
            let rotated = format!("{}.{rotation}", log.display());
            std::fs::rename(log, rotated).unwrap();
        }
        server.signal("USR1");
    }
    let out = client.join().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let sent = threads * each;
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        sent.to_string()
    );
    eventually(Duration::from_secs(10), "every line written", || {
        lines(&server) >= sent as f64
    });
    assert_eq!(
        server.metric("terminus_log_lines_dropped_total", &["log=\"access\""]),
        0.0
    );

    // Every file parsed by Python's json; each request's path once, across the files.
    let files: Vec<String> = [".2", ".1", ""]
        .iter()
        .map(|s| format!("{}{s}", access.display()))
        .collect();
    let checked = run(Command::new("python3")
        .args([
            "-c",
            r#"
import json, sys
fields = sys.argv[1].split(",")
paths, per_file = [], []
for name in sys.argv[2:]:
    n = 0
    for line in open(name):
        entry = json.loads(line)
        missing = [f for f in fields if f not in entry]
        assert not missing, (missing, line)
        assert entry["status"] == 200 and entry["bytes"] == 6, line
        assert entry["method"] == "GET" and entry["tls_version"] in ("TLSv1.3", "TLSv1.2"), line
        assert entry["tenant"] and entry["sni"] == "localhost", line
        assert entry["upstream"] is None and isinstance(entry["duration"], float), line
        paths.append(entry["path"])
        n += 1
    per_file.append(n)
print(json.dumps({"paths": paths, "per_file": per_file}))
"#,
            &FIELDS.join(","),
        ])
        .args(&files));
    assert!(
        checked.status.success(),
        "{}",
        String::from_utf8_lossy(&checked.stderr)
    );
    let report: serde_json::Value = serde_json::from_slice(&checked.stdout).unwrap();
    let per_file: Vec<u64> = report["per_file"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n.as_u64().unwrap())
        .collect();
    assert!(
        per_file.iter().all(|&n| n > 0),
        "each rotation split the lines: {per_file:?}"
    );
    let paths: Vec<&str> = report["paths"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p.as_str().unwrap())
        .collect();
    assert_eq!(paths.len(), sent, "lines {per_file:?} for {sent} requests");
    let unique: BTreeSet<&str> = paths.iter().copied().collect();
    let expected: BTreeSet<String> = (0..threads)
        .flat_map(|t| (0..each).map(move |i| format!("/index.html?r={t}-{i}")))
        .collect();
    assert_eq!(
        unique,
        expected.iter().map(String::as_str).collect(),
        "no line lost or doubled"
    );

    // The error log was reopened too: a reload's lines are in the new file.
    server.signal("HUP");
    eventually(
        Duration::from_secs(10),
        "the reload in the new error log",
        || std::fs::read_to_string(&error).is_ok_and(|t| t.contains("reload")),
    );
    let rotated = std::fs::read_to_string(dir.path("error.log.1")).unwrap();
    assert!(
        rotated.contains("terminus started"),
        "the first error log has the start: {rotated}"
    );
    assert!(
        !server.stderr().contains("terminus started"),
        "the error log, not standard error"
    );
}

#[test]
fn a_stalled_log_file_drops_and_counts_lines_and_never_holds_up_requests() {
    let dir = TestDir::new("logs-stall");
    dir.write("www/index.html", "hello\n");
    let pair = make_cert(dir.root(), "ecdsa", KeyKind::EcdsaP256, &["localhost"]);
    // The access log is a FIFO nobody reads: once the pipe's 64 KiB are full, the log's
    // thread blocks in write(2) as on a disk that stopped answering.
    let fifo = dir.path("access.log");
    assert!(run(Command::new("mkfifo").arg(&fifo)).status.success());
    let reader = {
        use std::os::unix::fs::OpenOptionsExt;
        std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NONBLOCK)
            .open(&fifo)
            .unwrap()
    };
    let conf = Config::new(&dir, &pair).before(&format!("[log]\naccess = \"{}\"", fifo.display()));
    let server = ServerBuilder::with(&dir, &conf).admin().start();
    let report = load(&[
        &server.url("/index.html"),
        "--connections",
        "8",
        "--duration",
        "6s",
        "-k",
    ]);
    let answered = report["requests"].as_u64().unwrap();
    assert_eq!(report["errors_total"], 0, "{report:#}");
    // The queue (16,384 lines) and the pipe are far less than 6 s of requests: had a
    // full queue held the workers, the load would have stalled at about that many.
    assert!(answered > 20_000, "{report:#}");
    let dropped = server.metric("terminus_log_lines_dropped_total", &["log=\"access\""]);
    let written = server.metric("terminus_log_lines_total", &["log=\"access\""]);
    assert!(dropped > 0.0, "dropped {dropped}, written {written}");
    let responses = server.metric("terminus_http_responses_total", &[]);
    assert!(
        written + dropped <= responses && responses >= answered as f64,
        "written {written} + dropped {dropped}, {responses} responses, {answered} answered"
    );
    // Still serving while the log is stalled.
    assert_eq!(status(&server, &[], "/index.html"), 200);
    drop(reader);
}

/// `terminus check` looks at the access log without creating it (a check run as root
/// must not leave a root-owned file the service cannot write), and refuses a log whose
/// folder does not exist.
#[test]
fn check_creates_no_log_file_and_refuses_a_missing_folder() {
    let dir = TestDir::new("logs-check");
    dir.write("www/index.html", "hello\n");
    let pair = make_cert(dir.root(), "ecdsa", KeyKind::EcdsaP256, &["localhost"]);
    let access = dir.path("access.log");
    let conf = Config::new(&dir, &pair)
        .before(&format!("[log]\naccess = \"{}\"", access.display()))
        .write(&dir);
    let out = run(Command::new(terminus_bin()).args(["check", "--config", conf.to_str().unwrap()]));
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!access.exists(), "check created the access log");
    let missing = dir.path("no/such/folder/access.log");
    let conf = Config::new(&dir, &pair)
        .before(&format!("[log]\naccess = \"{}\"", missing.display()))
        .write(&dir);
    let out = run(Command::new(terminus_bin()).args(["check", "--config", conf.to_str().unwrap()]));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("access log"), "{err}");
    // The error log too: serve would fail to start on it.
    let conf = Config::new(&dir, &pair)
        .before(&format!("[log]\nerror = \"{}\"", missing.display()))
        .write(&dir);
    let out = run(Command::new(terminus_bin()).args(["check", "--config", conf.to_str().unwrap()]));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("error log"), "{err}");
}

/// A reload that names another access log closes the old one once its connections are
/// gone: the next rotation does not bring the old file back.
#[test]
fn a_log_a_reload_left_is_not_created_again_by_a_rotation() {
    let dir = TestDir::new("logs-reload");
    dir.write("www/index.html", "hello\n");
    let pair = make_cert(dir.root(), "ecdsa", KeyKind::EcdsaP256, &["localhost"]);
    let (first, second) = (dir.path("first.log"), dir.path("second.log"));
    let config = |log: &std::path::Path| {
        Config::new(&dir, &pair)
            .before(&format!("[log]\naccess = \"{}\"", log.display()))
            .write(&dir)
    };
    // Started without an access log; each reload names one.
    let server = ServerBuilder::with(&dir, &Config::new(&dir, &pair)).start();
    config(&first);
    server.signal("HUP");
    let mut seen = String::new();
    eventually(Duration::from_secs(10), "a request in first.log", || {
        status(&server, &[], "/index.html");
        seen = std::fs::read_to_string(&first).unwrap_or_default();
        !seen.is_empty()
    });
    config(&second);
    server.signal("HUP");
    eventually(Duration::from_secs(10), "a request in second.log", || {
        status(&server, &[], "/index.html");
        std::fs::metadata(&second).is_ok_and(|m| m.len() > 0)
    });
    std::fs::rename(&first, dir.path("first.log.1")).unwrap();
    std::fs::rename(&second, dir.path("second.log.1")).unwrap();
    server.signal("USR1");
    eventually(Duration::from_secs(10), "second.log reopened", || {
        second.exists()
    });
    status(&server, &[], "/index.html");
    std::thread::sleep(Duration::from_millis(200));
    assert!(!first.exists(), "first.log came back after the rotation");
}
