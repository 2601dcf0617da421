//! The admin listener's status page (`GET /`, `GET /status.json`) against a loaded server
//! with a tenant and an upstream (one server up, one down): headless Chromium renders it
//! after its script has refreshed it from `/status.json`, and every figure the page shows
//! with its series (`data-metric`) is read back from the DOM and held to two scrapes of
//! `/metrics`, one just before the page and one just after, with the server idle
//! between them: a counter lies between the two, a gauge or ratio equals them (to the
//! places the page shows). The server-rendered first view (what a client without script
//! sees) is held to the same scrapes. The screenshot is kept as the run's artifact,
//! `target/artifacts/status-page.png`.

use std::collections::BTreeMap;
use std::io::Write as _;
use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use crate::harness::*;

/// One element of the page that carries a figure: its attributes and its text.
#[derive(Debug)]
struct Figure {
    attrs: BTreeMap<String, String>,
    text: String,
}

fn unescape(s: &str) -> String {
    s.replace("&quot;", "\"")
        .replace("&#39;", "'")
        .replace("&lt;", "<")
        .replace("&gt;", ">")
        .replace("&nbsp;", "\u{a0}")
        .replace("&amp;", "&")
}

/// The elements of `html` that carry a figure (`data-metric`, `data-rate` or
/// `data-unit`), each with its attributes and its text (such an element holds text
/// only). A small reader for the
/// markup both the server and Chromium write: attributes double-quoted.
fn figures(html: &str) -> Vec<Figure> {
    let mut out = Vec::new();
    let mut rest = html;
    while let Some(open) = rest.find('<') {
        rest = &rest[open + 1..];
        // The tag ends at the first `>` outside a quoted value.
        let mut quoted = false;
        let Some(end) = rest.char_indices().find_map(|(i, c)| match c {
            '"' => {
                quoted = !quoted;
                None
            }
            '>' if !quoted => Some(i),
            _ => None,
        }) else {
            break;
        };
        let tag = &rest[..end];
        rest = &rest[end + 1..];
        if !["data-metric=", "data-rate=", "data-unit="]
            .iter()
            .any(|a| tag.contains(a))
        {
            continue;
        }
        let mut attrs = BTreeMap::new();
        let mut a = tag;
        while let Some(eq) = a.find("=\"") {
            let name = a[..eq].rsplit(' ').next().unwrap_or("").to_owned();
            let after = &a[eq + 2..];
            let close = after.find('"').expect("a closing quote");
            attrs.insert(name, unescape(&after[..close]));
            a = &after[close + 1..];
        }
        let text = unescape(rest.split('<').next().unwrap_or(""));
        out.push(Figure { attrs, text });
    }
    out
}

/// One series of a `data-metric`: its name and its labels as `k="v"` (what
/// [`metric_sum`] matches).
fn selector(term: &str) -> (String, Vec<String>) {
    let Some((name, labels)) = term.split_once('{') else {
        return (term.to_owned(), Vec::new());
    };
    let labels = labels
        .strip_suffix('}')
        .expect("a selector's closing brace");
    let mut out = Vec::new();
    let mut rest = labels;
    while let Some(eq) = rest.find("=\"") {
        let key = rest[..eq].trim_start_matches(',');
        let value_end = rest[eq + 2..].find('"').expect("a label's closing quote");
        out.push(format!("{key}=\"{}\"", &rest[eq + 2..eq + 2 + value_end]));
        rest = &rest[eq + 2 + value_end + 1..];
    }
    (name.to_owned(), out)
}

/// Whether `/metrics` (`text`) has a sample of `name` with all of `labels`.
fn present(text: &str, name: &str, labels: &[String]) -> bool {
    text.lines().filter(|l| !l.starts_with('#')).any(|l| {
        let series = l.split_whitespace().next().unwrap_or("");
        (series == name || series.starts_with(&format!("{name}{{")))
            && labels.iter().all(|lab| series.contains(lab.as_str()))
    })
}

/// What `/metrics` (`text`) says a `data-metric` is: terms joined by ` + `, optionally
/// ` / ` a divisor; `None` where none of its terms is there or the divisor is 0.
fn value(text: &str, metric: &str) -> Option<f64> {
    let (terms, per) = match metric.split_once(" / ") {
        Some((terms, per)) => (terms, Some(per)),
        None => (metric, None),
    };
    let terms: Vec<(String, Vec<String>)> = terms.split(" + ").map(selector).collect();
    if !terms.iter().any(|(n, l)| present(text, n, l)) {
        return None;
    }
    let sum = |(name, labels): &(String, Vec<String>)| {
        let labels: Vec<&str> = labels.iter().map(String::as_str).collect();
        metric_sum(text, name, &labels)
    };
    let n: f64 = terms.iter().map(sum).sum();
    match per {
        None => Some(n),
        Some(per) => Some(sum(&selector(per)))
            .filter(|d| *d != 0.0)
            .map(|d| n / d),
    }
}

/// The figure's text read back in the series' own unit, and how far the page's rounding
/// may have moved it; `None` for a dash (nothing to show).
fn shown(f: &Figure) -> Option<(f64, f64)> {
    let unit = f.attrs["data-unit"].as_str();
    let text = f.text.trim();
    if text == "–" {
        return None;
    }
    if unit == "up" {
        return Some((if text == "up" { 1.0 } else { 0.0 }, 0.0));
    }
    assert_ne!(unit, "date", "no date expected here: {f:?}");
    let number = text.trim_end_matches('%').replace(',', "");
    let v: f64 = number
        .parse()
        .unwrap_or_else(|_| panic!("not a number: {f:?}"));
    let places = number.split_once('.').map_or(0, |(_, d)| d.len()) as i32;
    let scale = match unit {
        "ms" => 1e-3,
        "%" => 1e-2,
        _ => 1.0,
    };
    Some((v * scale, 0.5 * 10f64.powi(-places) * scale + 1e-9))
}

/// Holds every figure of `page` with a `data-metric` to the scrapes `before` and
/// `after`, and asserts those in `wanted` are among them; returns how many it checked.
fn check(what: &str, page: &str, before: &str, after: &str, wanted: &[String]) -> usize {
    let figures = figures(page);
    let mut checked = 0;
    let mut seen = Vec::new();
    for f in &figures {
        if let Some(rate) = f.attrs.get("data-rate") {
            // A per-second change: a number, never negative, or a dash before a second read.
            if let Some((v, _)) = shown(f) {
                assert!(v >= 0.0, "{what}: {rate} shows {v}");
            }
            continue;
        }
        let Some(metric) = f.attrs.get("data-metric") else {
            continue;
        };
        seen.push(metric.clone());
        if let Some(label) = f.attrs.get("data-label") {
            // Text: a label's value on the series.
            assert!(
                present(before, metric, &[format!("{label}=\"{}\"", f.text)]),
                "{what}: {metric} has no {label}={:?} in /metrics",
                f.text
            );
            checked += 1;
            continue;
        }
        let (b, a) = (value(before, metric), value(after, metric));
        match (shown(f), b, a) {
            (None, None, None) => {}
            (Some((v, tolerance)), Some(b), Some(a)) => {
                let (low, high) = (b.min(a) - tolerance, b.max(a) + tolerance);
                assert!(
                    (low..=high).contains(&v),
                    "{what}: {metric} shows {:?} ({v}), /metrics has {b} before and {a} after",
                    f.text
                );
            }
            (shown, b, a) => {
                panic!(
                    "{what}: {metric} shows {shown:?}, /metrics has {b:?} before and {a:?} after"
                )
            }
        }
        checked += 1;
    }
    for metric in wanted {
        assert!(
            seen.contains(metric),
            "{what}: the page shows no {metric}; it shows {seen:#?}"
        );
    }
    checked
}

/// The figure whose `data-metric` is `metric`: its text.
fn text_of(page: &str, metric: &str) -> String {
    figures(page)
        .into_iter()
        .find(|f| f.attrs.get("data-metric").map(String::as_str) == Some(metric))
        .unwrap_or_else(|| panic!("no {metric} on the page"))
        .text
}

/// Where the run's artifacts go: `target/artifacts` (of the build's target directory).
fn artifacts() -> PathBuf {
    let dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR"))
        .parent()
        .expect("the target directory")
        .join("artifacts");
    std::fs::create_dir_all(&dir).expect("target/artifacts");
    dir
}

#[test]
fn the_status_page_shows_what_metrics_says_in_chromium() {
    if !chromium_runs_here() {
        return;
    }
    let dir = TestDir::new("status-page");
    let app = App::start("status");
    let dead = free_port();
    let pair = make_cert(&dir.0, "k", KeyKind::EcdsaP256, &["localhost"]);
    dir.write("www/index.html", "hello\n");
    let config = Config::new(&dir, &pair)
        .before(&format!(
            r#"[[tenant]]
name = "shop"
capacity = {{ acu = 200, acu_peak = 400 }}
[[upstream]]
name = "app"
servers = ["{}", "127.0.0.1:{dead}"]
health = {{ fails = 1, interval = "60s" }}
"#,
            app.addr()
        ))
        .in_server("tenant = \"shop\"\n[[server.route]]\npath = \"/app/\"\nupstream = \"app\"");
    let server = ServerBuilder::with(&dir, &config).admin().start();
    let admin = server.admin.unwrap();
    let base = format!("https://localhost:{}", server.port());

    // The load: 300 full handshakes (new connections, one request each), then requests
    // over kept-alive connections through the upstream, where the dead server fails once
    // (a connect error) and is taken out; and a few 5xx.
    load(
        &full_handshakes(&format!("{base}/index.html"), "127.0.0.1", 100, 3)
            .iter()
            .map(String::as_str)
            .collect::<Vec<_>>(),
    );
    load(&[
        &format!("{base}/app/whoami"),
        "--address",
        "127.0.0.1",
        "--connections",
        "2",
        "-d",
        "2s",
        "-k",
    ]);
    for _ in 0..3 {
        assert_eq!(status(&server, &["--http1.1"], "/app/status?code=503"), 503);
    }
    // Idle before the page: no connection open, and no tenant's use in the last whole
    // second. That gauge is the second before the one it is read in, so it can go from 0
    // back up to what the last requests' handshakes cost when the second turns: it stays
    // 0 only from two seconds after them.
    std::thread::sleep(Duration::from_millis(2100));
    eventually(Duration::from_secs(15), "the server idle", || {
        let m = server.metrics();
        metric_sum(&m, "terminus_connections_open", &[]) == 0.0
            && metric_sum(&m, "terminus_tenant_acu_per_second", &[]) == 0.0
    });

    let before = server.metrics();
    let first_view = server.admin_get("/");
    let dom = run(crate::harness::chromium(&dir.path("profile"))
        .args(["--virtual-time-budget=5000", "--dump-dom"])
        .arg(format!("http://{admin}/")));
    let shot = artifacts().join("status-page.png");
    let _ = std::fs::remove_file(&shot);
    let screenshot = run(crate::harness::chromium(&dir.path("profile"))
        .args([
            "--hide-scrollbars",
            "--window-size=1280,1600",
            "--virtual-time-budget=5000",
        ])
        .arg(format!("--screenshot={}", shot.display()))
        .arg(format!("http://{admin}/")));
    let after = server.metrics();

    assert!(
        dom.status.success(),
        "chromium --dump-dom: {}",
        String::from_utf8_lossy(&dom.stderr)
    );
    assert!(
        screenshot.status.success() && shot.exists(),
        "chromium --screenshot: {}",
        String::from_utf8_lossy(&screenshot.stderr)
    );
    // Straight to the file descriptor, past libtest's capture: where the artifact is.
    let _ = writeln!(
        std::io::stderr().lock(),
        "status page screenshot: {}",
        shot.display()
    );
    let dom = String::from_utf8(dom.stdout).unwrap();
    let first_view = String::from_utf8(first_view.stdout).unwrap();

    // The script ran (the policy let it) and replaced the first view with /status.json's.
    let refreshes: u32 = dom
        .split("data-refreshes=\"")
        .nth(1)
        .and_then(|r| r.split('"').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("the page's script did not refresh it: {dom}"));
    assert!(refreshes >= 1);

    let app_server = |name: &str| format!("{name}{{upstream=\"app\",server=\"{}\"}}", app.addr());
    let dead_server =
        format!("terminus_upstream_up{{upstream=\"app\",server=\"127.0.0.1:{dead}\"}}");
    let wanted: Vec<String> = [
        "terminus_connections_open",
        "terminus_connections_total",
        "terminus_handshakes_total",
        "terminus_http_responses_total",
        "terminus_worker_connections_open{worker=\"0\"}",
        "terminus_worker_handshakes_total{worker=\"1\"}",
        "terminus_handshake_phase_seconds_sum{phase=\"crypto_compute\"} / terminus_handshake_phase_seconds_count{phase=\"crypto_compute\"}",
        "terminus_crypto_batched_requests_total / terminus_crypto_batches_total",
        "terminus_tenant_quota_acu{tenant=\"shop\",limit=\"committed\"}",
        "terminus_tenant_acu_per_second{tenant=\"shop\"} / terminus_tenant_quota_acu{tenant=\"shop\",limit=\"committed\"}",
        "terminus_tenant_handshakes_admitted_total{tenant=\"shop\"}",
        "terminus_upstream_failures_total{cause=\"connect_error\"}",
        "terminus_http_responses_total{code=\"5xx\",protocol=\"http/1.1\"}",
        "terminus_ticket_key_epoch",
        "terminus_crypto_requests_total",
    ]
    .iter()
    .map(|s| s.to_string())
    .chain([
        app_server("terminus_upstream_up"),
        app_server("terminus_upstream_requests_total"),
        dead_server.clone(),
    ])
    .collect();
    for (what, page) in [("Chromium's DOM", &dom), ("the first view", &first_view)] {
        let checked = check(what, page, &before, &after, &wanted);
        assert!(checked >= 60, "{what}: only {checked} figures checked");
        // The load is on it, and health and the sections without anything configured
        // read as such.
        let handshakes: f64 = text_of(page, "terminus_handshakes_total")
            .replace(',', "")
            .parse()
            .unwrap();
        assert!(handshakes >= 250.0, "{what}: {handshakes} handshakes");
        assert_eq!(text_of(page, &app_server("terminus_upstream_up")), "up");
        assert_eq!(text_of(page, &dead_server), "down");
        assert!(
            page.contains("No ACME certificates"),
            "{what}: the ACME section says it has none"
        );
    }
    assert!(
        first_view.contains("<section id=\"upstreams\">"),
        "{first_view}"
    );
}

/// What the admin listener answers for the page: its policy lets nothing run but the
/// page's own script and style, nothing is cached, and it takes no writes.
#[test]
fn the_status_page_is_read_only_and_runs_only_its_own_script() {
    let server = ServerBuilder::flags(&[]).admin().start();
    let admin = server.admin.unwrap();
    // Start-up says where the page is.
    assert!(
        server
            .stdout_lines
            .contains(&format!("status page on http://{admin}/")),
        "{:?}",
        server.stdout_lines
    );
    let head = |args: &[&str], path: &str| {
        let out = run(Command::new("curl")
            .args(["-sS", "-o", "/dev/null", "-D", "-", "--max-time", "10"])
            .args(args)
            .arg(format!("http://{admin}{path}")));
        String::from_utf8(out.stdout).unwrap()
    };
    let page = head(&[], "/");
    assert!(page.starts_with("HTTP/1.1 200"), "{page}");
    let csp = header_value(&page, "content-security-policy").unwrap();
    assert!(
        csp.starts_with("default-src 'none'; script-src 'sha256-")
            && csp.contains("connect-src 'self'")
            && !csp.contains("unsafe"),
        "{csp}"
    );
    assert_eq!(
        header_value(&page, "cache-control").as_deref(),
        Some("no-store")
    );
    assert_eq!(
        header_value(&page, "x-content-type-options").as_deref(),
        Some("nosniff")
    );
    let json = head(&[], "/status.json");
    assert!(json.contains("application/json"), "{json}");
    assert_eq!(
        header_value(&json, "cache-control").as_deref(),
        Some("no-store")
    );
    let post = head(&["-X", "POST", "--data", "x"], "/");
    assert!(post.starts_with("HTTP/1.1 405"), "{post}");
    assert_eq!(header_value(&post, "allow").as_deref(), Some("GET, HEAD"));
    // /status.json is the model both views render: its figures and the live rates (which
    // need a read a second old: the admin listener's first is made as it starts).
    std::thread::sleep(std::time::Duration::from_millis(1100));
    let doc: serde_json::Value =
        serde_json::from_slice(&server.admin_get("/status.json").stdout).unwrap();
    let ids: Vec<&str> = doc["sections"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["id"].as_str().unwrap())
        .collect();
    assert_eq!(
        ids,
        [
            "listeners",
            "connections",
            "workers",
            "handshakes",
            "phases",
            "crypto",
            "tenants",
            "upstreams",
            "fleet",
            "acme",
            "errors"
        ]
    );
    assert!(
        doc["live"]["handshakes_per_s"]["full"].is_number(),
        "{doc:#}"
    );
}

/// An upstream and a tenant whose names hold a quote and a backslash (the configuration
/// allows them): `/metrics` has each series once, the names escaped as the exposition
/// format says, no line of it anything but a terminus series, and the status page
/// (which reads `/metrics`) shows the names as written.
#[test]
fn names_with_quotes_and_backslashes_are_one_escaped_series_the_status_page_reads_back() {
    let dir = TestDir::new("status-escaped");
    let dead = free_port();
    let pair = make_cert(&dir.0, "k", KeyKind::EcdsaP256, &["localhost"]);
    dir.write("www/index.html", "hello\n");
    // TOML literal strings: the backslash is the name's own.
    let upstream = r#"a"} 1 b\"#;
    let tenant = r#"shop "one" \"#;
    let config = Config::new(&dir, &pair)
        .before(&format!(
            "[[tenant]]\nname = '{tenant}'\ncapacity = {{ acu = 200 }}\n[[upstream]]\nname = '{upstream}'\nservers = [\"127.0.0.1:{dead}\"]\n"
        ))
        .in_server(&format!(
            "tenant = '{tenant}'\n[[server.route]]\npath = \"/app/\"\nupstream = '{upstream}'"
        ));
    let server = ServerBuilder::with(&dir, &config).admin().start();
    assert_eq!(status(&server, &[], "/app/x"), 502);

    let metrics = server.metrics();
    for line in metrics.lines().filter(|l| !l.starts_with('#')) {
        assert!(line.starts_with("terminus_"), "a stray series: {line:?}");
    }
    let escaped = format!(
        "terminus_upstream_requests_total{{upstream=\"a\\\"}} 1 b\\\\\",server=\"127.0.0.1:{dead}\"}} "
    );
    let lines: Vec<&str> = metrics
        .lines()
        .filter(|l| l.starts_with("terminus_upstream_requests_total{"))
        .collect();
    assert_eq!(lines.len(), 1, "{lines:?}");
    assert!(
        lines[0].starts_with(&escaped),
        "{} is not {escaped}",
        lines[0]
    );
    assert!(
        metrics.contains(
            "terminus_tenant_quota_acu{tenant=\"shop \\\"one\\\" \\\\\",limit=\"committed\"} 200\n"
        ),
        "{metrics}"
    );

    let doc: serde_json::Value =
        serde_json::from_slice(&server.admin_get("/status.json").stdout).unwrap();
    let section = |id: &str| {
        doc["sections"]
            .as_array()
            .unwrap()
            .iter()
            .find(|s| s["id"] == id)
            .unwrap_or_else(|| panic!("no {id} in {doc:#}"))
            .clone()
    };
    let upstreams = section("upstreams");
    let rows = upstreams["rows"].as_array().unwrap();
    assert_eq!(rows.len(), 1, "{upstreams:#}");
    assert_eq!(rows[0][0]["t"], upstream, "{upstreams:#}");
    assert_eq!(
        rows[0][1]["t"],
        format!("127.0.0.1:{dead}"),
        "{upstreams:#}"
    );
    // The requests figure is the series' value, found by its (escaped) selector.
    assert_eq!(rows[0][4]["v"], 1.0, "{upstreams:#}");
    let tenants = section("tenants");
    let names: Vec<&str> = tenants["rows"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r[0]["t"].as_str().unwrap())
        .collect();
    assert!(names.contains(&tenant), "{tenants:#}");
    let committed = tenants["rows"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r[0]["t"] == tenant)
        .unwrap()[1]["v"]
        .clone();
    assert_eq!(committed, 200.0, "{tenants:#}");
}
