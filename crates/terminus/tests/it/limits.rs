//! Per-client limits with real clients: `rate` (nginx's `limit_req ... nodelay`) under
//! `terminus load` at three times a client's rate while curl from another loopback
//! address is untouched, 429 with Retry-After, a header's key and a route's own rate; a
//! flood of spoofed addresses through the PROXY protocol held at `limits.rate_keys`; and
//! `limits.connections_per_client` (nginx's `limit_conn`) closing the one too many before
//! its handshake, by the PROXY header's address where the listener takes one.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::process::Command;

use crate::harness::*;

fn certificate(dir: &TestDir) -> CertPair {
    make_cert(
        dir.path("").as_path(),
        "ecdsa",
        KeyKind::EcdsaP256,
        &["localhost"],
    )
}

/// curl's status and response head for `path` from `source`, with `extra`.
fn head_from(server: &Server, source: &str, extra: &[&str], path: &str) -> (u16, String) {
    let mut args = vec!["--interface", source, "--http1.1"];
    args.extend_from_slice(extra);
    let (code, head, _) = headers(server, &args, path);
    (code, head)
}

#[test]
fn a_client_at_three_times_its_rate_gets_the_rate_and_another_is_untouched() {
    let _alone = exclusive();
    let dir = TestDir::new("limits-rate");
    dir.write("www/index.html", "home\n");
    dir.write("www/slow/page.txt", "slow\n");
    dir.write("www/health", "ok\n");
    let conf = Config::new(&dir, &certificate(&dir)).in_server(&format!(
        r#"rate = {{ requests = 10, per = "1s", burst = 5 }}
[[server.route]]
path = "/slow/"
root = "{www}"
rate = {{ requests = 1, per = "1m", key = "header:X-Api-Key" }}
[[server.route]]
path = "/health"
root = "{www}"
rate = "off""#,
        www = dir.path("www").display()
    ));
    let server = ServerBuilder::with(&dir, &conf).admin().start();

    // 127.0.0.1 at 30/s for 4 s, a new connection each time: its requests land on both
    // workers (SO_REUSEPORT spreads connections by port), which count them together.
    let seconds = 4.0;
    let flood = load_in_background(
        [
            &server.url("/index.html"),
            "--address",
            "127.0.0.1",
            "--rate",
            "30",
            "-d",
            "4s",
            "--new-connection",
            "-k",
        ]
        .map(str::to_owned)
        .to_vec(),
    );
    // Meanwhile 127.0.0.2 at 4/s, under its own rate: every answer a 200.
    let mut other = Vec::new();
    for _ in 0..12 {
        other.push(status(
            &server,
            &["--interface", "127.0.0.2"],
            "/index.html",
        ));
        std::thread::sleep(std::time::Duration::from_millis(250));
    }
    let report = flood.join().unwrap();
    assert!(other.iter().all(|&s| s == 200), "127.0.0.2: {other:?}");
    let passed = report["requests"].as_f64().unwrap();
    let refused = report["errors"]["http_status:429"].as_f64().unwrap_or(0.0);
    // rate * duration + burst, within 10%: the duration the load measured (a stalled
    // generator that catches up stretches it past the 4 s asked for).
    let took = report["duration_s"]
        .as_f64()
        .unwrap_or(seconds)
        .max(seconds);
    let expected = 10.0 * took + 5.0;
    println!("127.0.0.1 at 30/s for {seconds} s: {passed} passed, {refused} refused (expected {expected}); 127.0.0.2: {other:?}");
    assert!(
        (passed - expected).abs() <= expected * 0.1,
        "{passed} passed, {expected} expected: {report:#}"
    );
    assert!(refused >= 60.0, "{refused} refused: {report:#}");
    assert_eq!(
        report["errors_total"].as_f64(),
        Some(refused),
        "only 429s: {report:#}"
    );
    assert_eq!(
        server.metric("terminus_limited_requests_total", &[]),
        refused
    );
    for worker in ["worker=\"0\"", "worker=\"1\""] {
        let took = server.metric("terminus_worker_handshakes_total", &[worker]);
        assert!(took >= 20.0, "{worker} took {took} of the connections");
    }

    // A route's own rate, counted by a header: the second request within the minute is
    // refused with the time until the next (whole seconds, rounded up)...
    let key = |k: &str| format!("X-Api-Key: {k}");
    let (code, _) = head_from(&server, "127.0.0.3", &["-H", &key("a")], "/slow/page.txt");
    assert_eq!(code, 200);
    let (code, head) = head_from(&server, "127.0.0.3", &["-H", &key("a")], "/slow/page.txt");
    assert_eq!(code, 429, "{head}");
    let retry: u64 = header_value(&head, "retry-after")
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no Retry-After: {head}"));
    assert!((58..=60).contains(&retry), "Retry-After {retry}");
    // ...while another key from the same address has its own.
    let (code, _) = head_from(&server, "127.0.0.3", &["-H", &key("b")], "/slow/page.txt");
    assert_eq!(code, 200);
    // 127.0.0.4 spends the server's rate (20 requests on one connection, far faster than
    // 10/s: some refused) ...
    let url = server.url("/index.html");
    let mut spend = curl_command(&server, "localhost");
    spend.args(["--interface", "127.0.0.4", "-w", "%{http_code}\n"]);
    for _ in 0..20 {
        spend.args(["-o", "/dev/null", &url]);
    }
    let spent = spend.output().unwrap();
    let codes = String::from_utf8_lossy(&spent.stdout).into_owned();
    assert!(codes.lines().any(|c| c == "429"), "none refused: {codes}");
    // ... and still gets the routes whose rates replace the server's: "off" (the health
    // check) and the header-keyed one.
    for _ in 0..3 {
        assert_eq!(
            status(&server, &["--interface", "127.0.0.4"], "/health"),
            200
        );
    }
    let (code, _) = head_from(&server, "127.0.0.4", &["-H", &key("c")], "/slow/page.txt");
    assert_eq!(code, 200);
}

/// A PROXY v1 header naming `client` as the source, on a new connection to `port`.
fn proxied(port: u16, client: &str) -> TcpStream {
    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    write!(s, "PROXY TCP4 {client} 127.0.0.1 4321 {port}\r\n").unwrap();
    s
}

/// Whether the server closed `s` (reset or EOF) within `within`, having sent nothing.
fn closed_unanswered(s: &mut TcpStream, within: std::time::Duration) -> bool {
    s.set_read_timeout(Some(within)).unwrap();
    let mut buf = [0u8; 64];
    match s.read(&mut buf) {
        Ok(0) => true,
        Ok(n) => panic!("the server answered {n} bytes"),
        Err(e) => matches!(
            e.kind(),
            std::io::ErrorKind::ConnectionReset | std::io::ErrorKind::ConnectionAborted
        ),
    }
}

#[test]
fn connections_per_client_closes_the_one_too_many_before_its_handshake() {
    let dir = TestDir::new("limits-connections");
    dir.write("www/index.html", "home\n");
    // One worker: connections are counted in the order they came.
    let conf = Config::new(&dir, &certificate(&dir))
        .workers(1)
        .listen(r#"{ address = "127.0.0.1:0", proxy_protocol = true, trusted = ["127.0.0.1/32"] }"#)
        .before("[limits]\nconnections_per_client = 3");
    let server = ServerBuilder::with(&dir, &conf).admin().start();
    let port = server.port();
    let short = std::time::Duration::from_millis(700);

    // Directly from 127.0.0.2 (not a trusted balancer: its own address counts): three
    // connections held open, unread...
    let held: Vec<TcpStream> = (0..3)
        .map(|_| connect_from("127.0.0.2", port).unwrap())
        .collect();
    eventually(std::time::Duration::from_secs(5), "three counted", || {
        server.metric("terminus_connections_open", &[]) >= 3.0
    });
    // ...so a fourth from there is closed before its handshake, curl's too,
    let handshakes = server.metric("terminus_handshakes_total", &[]);
    // (Reset so soon that connect() may see it.)
    let fourth = connect_from("127.0.0.2", port);
    assert!(
        fourth.map_or_else(
            |e| e.kind() == std::io::ErrorKind::ConnectionReset,
            |mut s| closed_unanswered(&mut s, short)
        ),
        "the fourth closed"
    );
    assert_eq!(
        status(&server, &["--interface", "127.0.0.2"], "/index.html"),
        0,
        "curl's connection closed"
    );
    // while another address gets in.
    assert_eq!(
        status(&server, &["--interface", "127.0.0.3"], "/index.html"),
        200
    );
    assert_eq!(
        server.metric("terminus_handshakes_total", &[]),
        handshakes + 1.0,
        "no handshake for the refused"
    );
    assert_eq!(
        server.metric("terminus_limited_connections_total", &[]),
        2.0
    );
    // Closed: room again.
    drop(held);
    eventually(
        std::time::Duration::from_secs(5),
        "the three closed",
        || server.metric("terminus_connection_clients", &[]) == 0.0,
    );
    assert_eq!(
        status(&server, &["--interface", "127.0.0.2"], "/index.html"),
        200
    );

    // Behind the balancer (127.0.0.1), the PROXY header's address counts.
    let spoofed: Vec<TcpStream> = (0..3).map(|_| proxied(port, "203.0.113.5")).collect();
    eventually(
        std::time::Duration::from_secs(5),
        "three more counted",
        || server.metric("terminus_connection_clients", &[]) >= 1.0,
    );
    // (Their headers read in the order they came, within moments.)
    std::thread::sleep(std::time::Duration::from_millis(300));
    let mut fourth = proxied(port, "203.0.113.5");
    assert!(closed_unanswered(&mut fourth, short), "the fourth from .5");
    let mut other = proxied(port, "203.0.113.6");
    assert!(
        !closed_unanswered(&mut other, short),
        "another client behind the same balancer is left to its handshake"
    );
    assert_eq!(
        server.metric("terminus_limited_connections_total", &[]),
        3.0
    );
    drop(spoofed);
}

/// A connection to the server's `port` from `source` (a loopback address of its own).
/// An error: reset as it was established (a connection the server refused at once).
fn connect_from(source: &str, port: u16) -> std::io::Result<TcpStream> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_io()
        .build()
        .unwrap();
    let s = rt.block_on(async {
        let socket = tokio::net::TcpSocket::new_v4().unwrap();
        socket
            .bind(SocketAddr::new(source.parse().unwrap(), 0))
            .unwrap();
        let to = SocketAddr::from(([127, 0, 0, 1], port));
        socket.connect(to).await?.into_std()
    })?;
    s.set_nonblocking(false)?;
    Ok(s)
}

#[test]
fn a_flood_of_spoofed_addresses_keeps_the_rate_table_at_its_bound() {
    let _alone = exclusive();
    let dir = TestDir::new("limits-flood");
    dir.write("www/index.html", "home\n");
    let conf = Config::new(&dir, &certificate(&dir))
        .listen(r#"{ address = "127.0.0.1:0", proxy_protocol = true, trusted = ["127.0.0.1/32"] }"#)
        .before("[limits]\nrate_keys = 256")
        // An hour per request: the heavy client still owes the most however long the
        // flood takes on a busy machine.
        .in_server(r#"rate = { requests = 1, per = "1h", burst = 2 }"#);
    let server = ServerBuilder::with(&dir, &conf).admin().start();
    assert_eq!(server.metric("terminus_rate_keys_max", &[]), 256.0);
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/upstream/pp_flood.py");
    let flood = |n: usize, first: &str, same: bool| -> serde_json::Value {
        let out = run(Command::new("python3")
            .arg(&script)
            .args([
                &server.port().to_string(),
                &n.to_string(),
                first,
                "/index.html",
            ])
            .args(same.then_some("same")));
        assert!(out.status.success(), "{out:?}");
        serde_json::from_slice(&out.stdout).unwrap()
    };
    // One client spends its burst: three pass, the fourth is refused.
    let heavy = flood(4, "198.51.100.7", true);
    assert_eq!(heavy["200"], 3, "{heavy}");
    assert_eq!(heavy["429"], 1, "{heavy}");
    // 5,000 others, one request each: every one passes (each its own client), and the
    // table never holds more than its bound.
    let spread = flood(5000, "10.0.0.1", false);
    assert_eq!(spread["200"], 5000, "{spread}");
    let held = server.metric("terminus_rate_keys", &[]);
    println!(
        "5,000 spoofed clients: {spread}; table {held} of 256; {} forgiven",
        server.metric("terminus_rate_keys_forgiven_total", &[])
    );
    assert_eq!(held, 256.0, "full, and no fuller");
    assert!(server.metric("terminus_rate_keys_forgiven_total", &[]) > 0.0);
    // The client that owed most is the one the table kept.
    let again = flood(1, "198.51.100.7", true);
    assert_eq!(again["429"], 1, "{again}");
}
