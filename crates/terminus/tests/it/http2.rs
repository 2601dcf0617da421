//! HTTP/2 attacks against the running server, over TLS, each by a Python attacker
//! (`attackers/h2_attacks.py`, frames built with hyperframe) while curl keeps fetching
//! over h2 on other connections: each attack gets the answer its defence gives (the error
//! code, the refusals), every curl request is served, and the server's memory stays
//! bounded. The codec's own tests (terminus-http's h2) check each limit exactly; these check
//! that the server, end to end, holds under them.

use std::path::Path;
use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::harness::{
    make_cert, python_imports, status, Config, KeyKind, Server, ServerBuilder, TestDir,
};

/// HTTP/2 error codes (RFC 9113 section 7).
const NO_ERROR: u64 = 0x0;
const PROTOCOL_ERROR: &str = "1";
const REFUSED_STREAM: &str = "7";
const ENHANCE_YOUR_CALM: u64 = 0xb;

fn server(dir: &TestDir) -> Server {
    std::fs::create_dir_all(dir.path("www")).unwrap();
    dir.write("www/index.html", "hello\n");
    dir.write("www/big", vec![b'b'; 1 << 20]);
    start(dir, "[timeouts]\nkeepalive = \"2s\"")
}

/// terminus on one worker serving `dir/www` with an admin listener; `extra` goes before
/// the server block.
fn start(dir: &TestDir, extra: &str) -> Server {
    let pair = make_cert(&dir.0, "k", KeyKind::EcdsaP256, &["localhost"]);
    ServerBuilder::with(dir, &Config::new(dir, &pair).workers(1).before(extra))
        .admin()
        .start()
}

fn attack(server: &Server, dir: &TestDir, mode: &str) -> serde_json::Value {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/attackers/h2_attacks.py");
    let out = Command::new("timeout")
        .args(["60", "python3"])
        .arg(script)
        .args([mode, &server.port().to_string()])
        .arg(dir.path("k.pem"))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{mode}: {}\n{}",
        String::from_utf8_lossy(&out.stderr),
        server.stderr()
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

fn resets(report: &serde_json::Value, code: &str) -> u64 {
    report["resets"][code].as_u64().unwrap_or(0)
}

/// Each attack, with what it must get, while another client is served throughout.
#[test]
fn each_http2_attack_gets_its_answer_and_others_are_served() {
    if !python_imports("h2, hpack, hyperframe", "python3 -m pip install h2") {
        return;
    }
    let dir = TestDir::new("h2-attacks");
    let server = server(&dir);
    assert_eq!(status(&server, &["--http2"], "/"), 200);
    let rss_before = server.memory_kib("VmRSS");
    // Another client, fetching over h2 on its own connections for the whole run.
    let stop = Arc::new(AtomicBool::new(false));
    let (served, failed) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let bystander = {
        let (stop, served, failed) = (stop.clone(), served.clone(), failed.clone());
        let port = server.port();
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                let out = Command::new("curl")
                    .args([
                        "-sk",
                        "--http2",
                        "--max-time",
                        "10",
                        "-o",
                        "/dev/null",
                        "-w",
                        "%{http_code}",
                    ])
                    .arg(format!("https://127.0.0.1:{port}/"))
                    .output()
                    .unwrap();
                match &out.stdout[..] {
                    b"200" => served.fetch_add(1, Ordering::Relaxed),
                    _ => failed.fetch_add(1, Ordering::Relaxed),
                };
                std::thread::sleep(Duration::from_millis(50));
            }
        })
    };
    let mut peak = rss_before;
    let mut check = |mode: &str, ok: &dyn Fn(&serde_json::Value) -> bool| {
        let report = attack(&server, &dir, mode);
        println!("{mode}: {report}");
        assert!(ok(&report), "{mode}: {report}\n{}", server.stderr());
        peak = peak.max(server.memory_kib("VmRSS"));
    };
    // CVE-2023-44487: streams cancelled before their answers are glitches; past the
    // limit, ENHANCE_YOUR_CALM.
    check("rapid_reset", &|r| r["goaway"] == ENHANCE_YOUR_CALM);
    // CVE-2024-27316 and kin: a field block past twice the header list limit, or empty
    // CONTINUATION frames past the glitch limit.
    check("continuation_flood", &|r| r["goaway"] == ENHANCE_YOUR_CALM);
    check("empty_continuation", &|r| r["goaway"] == ENHANCE_YOUR_CALM);
    // A field list past twice the limit by references to one large entry.
    check("hpack_bomb", &|r| {
        r["goaway"] == ENHANCE_YOUR_CALM && r["responses"].as_u64() >= Some(1)
    });
    // Frames the server answers, never read: it stops reading once its answers back up.
    check("settings_flood", &|r| r["blocked"] == true);
    check("ping_flood", &|r| r["blocked"] == true);
    // CVE-2019-9518: empty DATA frames are glitches.
    check("empty_data", &|r| r["goaway"] == ENHANCE_YOUR_CALM);
    // PRIORITY frames cost a parse each and nothing kept: the connection still serves.
    // (It may idle out after its answer: GOAWAY NO_ERROR, keepalive being 2 s.)
    check("priority_flood", &|r| {
        (r["goaway"].is_null() || r["goaway"] == NO_ERROR)
            && r["resets"].as_object().is_some_and(|m| m.is_empty())
            && r["responses"].as_u64() >= Some(1)
    });
    // A stream the client never opens its window for: nothing moves for keepalive (2 s),
    // GOAWAY; nothing again, closed.
    check("zero_window", &|r| {
        r["closed"] == true && r["goaway"] == NO_ERROR && r["seconds"].as_f64() < Some(15.0)
    });
    // Past 128 open streams, REFUSED_STREAM.
    check("stream_exhaustion", &|r| resets(r, REFUSED_STREAM) == 72);
    // DATA past the content-length: the stream alone is reset.
    check("data_beyond_length", &|r| {
        resets(r, PROTOCOL_ERROR) == 1
            && (r["goaway"].is_null() || r["goaway"] == NO_ERROR)
            && r["responses"].as_u64() >= Some(1)
    });
    stop.store(true, Ordering::Relaxed);
    bystander.join().unwrap();
    let (served, failed) = (
        served.load(Ordering::Relaxed),
        failed.load(Ordering::Relaxed),
    );
    println!("bystander: {served} served, {failed} failed; RSS {rss_before} KiB before, {peak} KiB at most");
    assert_eq!(failed, 0, "the other client was refused during the attacks");
    assert!(
        served >= 20,
        "the other client was served only {served} times"
    );
    assert!(
        peak < rss_before + 64 * 1024,
        "the server grew from {rss_before} KiB to {peak} KiB"
    );
    assert_eq!(status(&server, &["--http2"], "/"), 200);
    // Each defence at work is counted.
    let metrics = server.metrics();
    let trouble = |cause: &str| {
        crate::harness::metric_sum(
            &metrics,
            "terminus_http2_trouble_total",
            &[&format!("cause=\"{cause}\"")],
        )
    };
    println!(
        "{}",
        metrics
            .lines()
            .filter(|l| l.starts_with("terminus_http2_trouble_total"))
            .collect::<Vec<_>>()
            .join("\n")
    );
    assert!(trouble("goaway_enhance_your_calm") >= 5.0);
    assert_eq!(trouble("stream_refused"), 72.0);
    assert!(trouble("stream_reset") >= 1.0);
    assert!(trouble("client_reset") >= 100.0, "the rapid resets");
}

/// Headless Chromium loads a page of 50 images over h2 through terminus: every image is
/// answered 200 over HTTP/2 (the access log), on the one connection the page came by
/// (one client port in the log), and the screenshot shows each image where it goes
/// (`browser/grid.py` reads its pixels).
#[test]
fn chromium_loads_a_page_of_50_images_over_one_h2_connection() {
    if !crate::harness::chromium_runs_here() {
        return;
    }
    let dir = TestDir::new("h2-chromium");
    let grid = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/browser/grid.py");
    let made = Command::new("python3")
        .arg(&grid)
        .arg("make")
        .arg(dir.path("www"))
        .status()
        .unwrap();
    assert!(made.success());
    let log = format!("[log]\naccess = \"{}\"", dir.path("access.log").display());
    let server = start(&dir, &log);
    let shot = dir.path("shot.png");
    let out = crate::harness::run(
        crate::harness::chromium(&dir.path("profile"))
            .args(["--hide-scrollbars", "--window-size=600,400"])
            .arg(format!("--screenshot={}", shot.display()))
            .arg(format!("https://localhost:{}/grid.html", server.port())),
    );
    assert!(
        out.status.success() && shot.exists(),
        "chromium: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let checked = crate::harness::run(Command::new("python3").arg(&grid).arg("check").arg(&shot));
    assert!(
        checked.status.success(),
        "the screenshot: {}",
        String::from_utf8_lossy(&checked.stdout)
    );
    // Log lines are written as answers end: give the last a moment to land.
    let mut log = String::new();
    for _ in 0..100 {
        log = std::fs::read_to_string(dir.path("access.log")).unwrap_or_default();
        if log.matches(".png HTTP/2.0\" 200").count() >= 50 {
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    for i in 0..50 {
        assert!(
            log.contains(&format!("\"GET /img/{i}.png HTTP/2.0\" 200")),
            "image {i} not answered 200 over h2: {log}"
        );
    }
    assert!(log.contains("\"GET /grid.html HTTP/2.0\" 200"), "{log}");
    // Each line starts with the client's address and port: one port, one connection.
    // (Chromium may open a spare connection besides, which carries nothing.)
    let peers: std::collections::BTreeSet<&str> = log
        .lines()
        .filter(|l| l.contains("/grid.html ") || l.contains("/img/"))
        .filter_map(|l| l.split_whitespace().next())
        .collect();
    assert_eq!(
        peers.len(),
        1,
        "the page and its images came on one connection: {log}"
    );
}

/// Files across frame and window boundaries (16 KiB frames, 64 KiB windows) and one
/// past every window, written with their sizes in their names.
const SIZES: [usize; 8] = [0, 1, 16_383, 16_384, 16_385, 65_535, 65_536, 1 << 20];

fn sized_files(dir: &TestDir) -> Vec<(String, Vec<u8>)> {
    SIZES
        .iter()
        .map(|&n| {
            let body: Vec<u8> = (0..n).map(|i| (i * 31 % 251) as u8).collect();
            let name = format!("f{n}.bin");
            dir.write(&format!("www/{name}"), &body);
            (name, body)
        })
        .collect()
}

const GO_H2_CLIENT: &str = r#"package main

import (
	"crypto/sha256"
	"crypto/tls"
	"encoding/hex"
	"fmt"
	"io"
	"net/http"
	"os"
	"sync"
)

func main() {
	base := os.Args[1]
	transport := &http.Transport{
		TLSClientConfig:   &tls.Config{InsecureSkipVerify: true, ServerName: "localhost"},
		ForceAttemptHTTP2: true,
	}
	client := &http.Client{Transport: transport}
	paths := os.Args[2:]
	lines := make([]string, len(paths))
	var wg sync.WaitGroup
	for i, path := range paths {
		wg.Add(1)
		go func(i int, path string) {
			defer wg.Done()
			resp, err := client.Get(base + path)
			if err != nil {
				lines[i] = fmt.Sprintf("%s error %v", path, err)
				return
			}
			h := sha256.New()
			n, err := io.Copy(h, resp.Body)
			resp.Body.Close()
			if err != nil {
				lines[i] = fmt.Sprintf("%s error %v", path, err)
				return
			}
			lines[i] = fmt.Sprintf("%s %d %d %s %s", path, resp.StatusCode, n, hex.EncodeToString(h.Sum(nil)), resp.Proto)
		}(i, path)
	}
	wg.Wait()
	for _, l := range lines {
		fmt.Println(l)
	}
}
"#;

/// Real clients each their own way: Go's net/http (every file at once, multiplexed on
/// one connection), nghttp (the same files on one connection, checked by size) and
/// h2load (2,000 requests, 20 in flight on each of 4 connections).
#[test]
fn go_nghttp_and_h2load_are_served_over_h2() {
    let dir = TestDir::new("h2-clients");
    let files = sized_files(&dir);
    let server = server(&dir);
    let base = format!("https://127.0.0.1:{}", server.port());
    let go = Command::new("go").arg("version").output();
    if terminus_testkit::runs_here(
        terminus_testkit::Need::Go,
        go.as_ref().is_ok_and(|o| o.status.success()),
        "no Go toolchain (`go`) on the PATH",
    ) {
        let program = dir.write("client/main.go", GO_H2_CLIENT);
        let out = crate::harness::run(
            Command::new("go")
                .arg("run")
                .arg(&program)
                .arg(&base)
                .args(files.iter().map(|(n, _)| format!("/{n}")))
                .current_dir(dir.path("client"))
                .env("GOFLAGS", "-mod=mod")
                .env("GOTOOLCHAIN", "local")
                .env("GOPROXY", "off"),
        );
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "{stdout}{}",
            String::from_utf8_lossy(&out.stderr)
        );
        for ((name, body), line) in files.iter().zip(stdout.lines()) {
            let want = format!(
                "/{name} 200 {} {} HTTP/2.0",
                body.len(),
                crate::harness::openssl_sha256(body)
            );
            assert_eq!(line, want);
        }
    }
    let nghttp = Command::new("nghttp").arg("--version").output();
    if !terminus_testkit::runs_here(
        terminus_testkit::Need::Nghttp2,
        nghttp.as_ref().is_ok_and(|o| o.status.success()),
        "no nghttp/h2load (apt install nghttp2-client)",
    ) {
        return;
    }
    let out = crate::harness::run(
        Command::new("nghttp")
            .args(["-n", "-s"])
            .args(files.iter().map(|(n, _)| format!("{base}/{n}"))),
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // nghttp -s: one line per response, with its status (its sizes are rounded; Go's
    // client checked every byte above).
    for (name, _) in &files {
        let line = stdout
            .lines()
            .find(|l| l.ends_with(&format!(" /{name}")))
            .unwrap_or_else(|| panic!("nghttp: no line for {name}: {stdout}"));
        assert!(
            line.split_whitespace().any(|w| w == "200"),
            "nghttp {name}: {line}"
        );
    }
    let out = crate::harness::run(Command::new("h2load").args([
        "-n",
        "2000",
        "-c",
        "4",
        "-m",
        "20",
        &format!("{base}/f16385.bin"),
    ]));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.contains("2000 succeeded, 0 failed, 0 errored"),
        "h2load: {stdout}"
    );
}
