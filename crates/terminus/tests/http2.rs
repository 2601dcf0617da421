//! HTTP/2 attacks against the running server, over TLS, each by a Python attacker
//! (`attackers/h2_attacks.py`, frames built with hyperframe) while curl keeps fetching
//! over h2 on other connections: each attack gets the answer its defence gives (the error
//! code, the refusals), every curl request is served, and the server's memory stays
//! bounded. The codec's own tests (terminus-h2) check each limit exactly; these check
//! that the server, end to end, holds under them.

mod common;

use std::path::Path;
use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::{make_cert, python_imports, status, KeyKind, Server, TestDir};

/// HTTP/2 error codes (RFC 9113 section 7).
const NO_ERROR: u64 = 0x0;
const PROTOCOL_ERROR: &str = "1";
const REFUSED_STREAM: &str = "7";
const ENHANCE_YOUR_CALM: u64 = 0xb;

fn server(dir: &TestDir) -> Server {
    let pair = make_cert(&dir.0, "k", KeyKind::EcdsaP256, &["localhost"]);
    std::fs::create_dir_all(dir.path("www")).unwrap();
    dir.write("www/index.html", "hello\n");
    dir.write("www/big", vec![b'b'; 1 << 20]);
    let conf = dir.write(
        "terminus.toml",
        format!(
            r#"
listen = ["127.0.0.1:0"]
workers = 1
[timeouts]
keepalive = "2s"
[[server]]
names = ["localhost"]
root = "{www}"
[[server.certificate]]
cert = "{cert}"
key = "{key}"
"#,
            www = dir.path("www").display(),
            cert = pair.cert.display(),
            key = pair.key.display()
        ),
    );
    Server::start_with(
        &["--config", conf.to_str().unwrap(), "--admin", "127.0.0.1:0"],
        false,
    )
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

fn rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches(" kB").trim().parse().ok())
        .unwrap()
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
    let rss_before = rss_kib(server.pid());
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
        peak = peak.max(rss_kib(server.pid()));
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
        common::metric_sum(
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
