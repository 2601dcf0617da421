//! Tenant crypto quotas against real traffic: `terminus load` drives two virtual hosts of
//! different tenants through one worker, and the server's own accounting
//! (`terminus_tenant_*`, `GET /capacity`) must show each held to its quota: a flooding
//! tenant to its peak, a tenant within its quota untouched. Exact accounting and the
//! meters' arithmetic are unit-tested in `terminus_admission` (tenant, meter).

use std::process::Command;
use std::thread;

use crate::harness::*;

/// Two hosts on one RSA-2048 certificate: a.test is tenant "a", b.test tenant "b".
fn two_tenants(dir: &TestDir, a: &str, b: &str) -> std::path::PathBuf {
    two_tenants_on(dir, "\"127.0.0.1:0\"", a, b)
}

/// [`two_tenants`] on the listener `listen` (a TOML value).
fn two_tenants_on(dir: &TestDir, listen: &str, a: &str, b: &str) -> std::path::PathBuf {
    let pair = make_cert(&dir.0, "rsa", KeyKind::Rsa(2048), &["a.test", "b.test"]);
    dir.write("www/index.html", "ok");
    let server = |name: &str| {
        format!(
            "[[server]]\nnames = [\"{name}.test\"]\ntenant = \"{name}\"\nroot = \"{}\"\n[[server.certificate]]\ncert = \"{}\"\nkey = \"{}\"\n",
            dir.path("www").display(),
            pair.cert.display(),
            pair.key.display()
        )
    };
    dir.write(
        "terminus.toml",
        format!(
            "listen = [{listen}]\nworkers = 1\n[crypto]\nbackend = \"scalar\"\n[[tenant]]\nname = \"a\"\n{a}\n[[tenant]]\nname = \"b\"\n{b}\n{}{}",
            server("a"),
            server("b")
        ),
    )
}

/// Full handshakes to `host` at `rate` per second for `seconds`, one request each.
fn handshakes_to(
    server: &Server,
    host: &str,
    rate: u32,
    seconds: u32,
) -> thread::JoinHandle<serde_json::Value> {
    let url = format!("https://{host}:{}/index.html", server.port());
    load_in_background(full_handshakes(&url, "127.0.0.1", rate, seconds))
}

fn acu(server: &Server, tenant: &str, class: &str) -> f64 {
    server.metric(
        "terminus_tenant_acu_total",
        &[
            &format!("tenant=\"{tenant}\""),
            &format!("class=\"{class}\""),
        ],
    )
}

/// Tenant a (`acu_peak = 30`), flooding for 10 s with full RSA-2048 handshakes whose
/// client report is `a`, was held to its peak: by the server's accounting, by the
/// handshakes the client had answered at the costs the server measured (a handshake let
/// through unpaid shows there), and with some of its flood refused. The `/capacity`
/// document.
fn held_to_its_peak(server: &Server, a: &serde_json::Value) -> serde_json::Value {
    let a_acu = acu(server, "a", "committed") + acu(server, "a", "borrowed");
    assert!(
        (270.0..=330.0).contains(&a_acu),
        "tenant a used {a_acu:.0} ACU in 10 s; its peak is 30 ACU/s: {a:#}"
    );
    let table = server.admin_get("/capacity");
    let doc: serde_json::Value = serde_json::from_slice(&table.stdout).unwrap();
    let cost = |op: &str| doc["acu_cost"][op]["acu"].as_f64().unwrap();
    let answered = a["requests"].as_f64().unwrap() * (cost("rsa2048") + cost("x25519"));
    assert!(
        (270.0..=330.0).contains(&answered),
        "tenant a's answered handshakes cost {answered:.0} ACU in 10 s; its peak is 30 ACU/s: {a:#}"
    );
    let a_refused = server.metric(
        "terminus_tenant_handshakes_refused_total",
        &["tenant=\"a\""],
    );
    assert!(a_refused > 0.0, "nothing of a's flood was refused: {a:#}");
    doc
}

#[test]
fn a_tenant_at_three_times_its_quota_is_held_to_its_peak_and_one_within_its_quota_is_untouched() {
    let _alone = exclusive();
    let dir = TestDir::new("tenants-peak");
    let conf = two_tenants(
        &dir,
        "capacity = { acu = 20, acu_peak = 30 }",
        "capacity = { acu = 40 }",
    );
    let server = ServerBuilder::config(&conf)
        .args(&["--no-resumption"])
        .admin()
        .start();
    // An RSA-2048 TLS 1.3 handshake is about 1.1 ACU (a signature, an X25519 exchange):
    // a at 90 ACU/s, three times its peak; b at 20 ACU/s, half its quota.
    let a = handshakes_to(&server, "a.test", 80, 10);
    let b = handshakes_to(&server, "b.test", 18, 10);
    let (a, b) = (a.join().unwrap(), b.join().unwrap());
    let doc = held_to_its_peak(&server, &a);
    let admin = server.admin.unwrap().to_string();
    assert!(
        acu(&server, "a", "borrowed") > 0.0,
        "an idle worker lends a its capacity up to the peak"
    );
    for (kind, _) in a["errors"].as_object().unwrap() {
        assert_eq!(
            kind, "tls_alert_received:internal_error",
            "a's refusals are alerts: {a:#}"
        );
    }
    assert_eq!(
        server.metric(
            "terminus_tenant_handshakes_refused_total",
            &["tenant=\"b\""]
        ),
        0.0
    );
    assert!(
        b["errors"].as_object().unwrap().is_empty(),
        "tenant b, within its quota, had errors: {b:#}"
    );
    assert_eq!(b["requests"].as_f64(), Some(180.0), "{b:#}");
    assert_eq!(acu(&server, "b", "borrowed"), 0.0);

    // The capacity table: both tenants, their quotas and what they used.
    assert_eq!(doc["acu"]["allocated"].as_f64(), Some(60.0), "{doc:#}");
    assert!(doc["acu"]["total"].as_f64().unwrap() > 60.0, "{doc:#}");
    let tenants = doc["tenants"].as_array().unwrap();
    let t = |name: &str| {
        tenants
            .iter()
            .find(|t| t["name"] == name)
            .unwrap_or_else(|| panic!("no tenant {name}: {doc:#}"))
    };
    assert_eq!(t("a")["quota"]["acu_peak"].as_f64(), Some(30.0));
    assert_eq!(t("b")["quota"]["over_quota"], "queue");
    assert!(t("a")["handshakes_refused"]["queue_full"].as_u64().unwrap() > 0);
    let shown = run(Command::new(terminus_bin()).args(["capacity", "--admin", &admin]));
    let text = String::from_utf8_lossy(&shown.stdout);
    assert!(shown.status.success(), "{text}");
    let row = |name: &str| {
        text.lines()
            .find(|l| l.split_whitespace().next() == Some(name))
            .unwrap_or_else(|| panic!("no row for {name}:\n{text}"))
            .split_whitespace()
            .map(str::to_owned)
            .collect::<Vec<_>>()
    };
    assert_eq!(&row("a")[1..3], ["20", "30"], "{text}");
    assert_eq!(row("b")[1], "40", "{text}");
}

/// A tenant flooding at about three times its quota (800 RSA-2048 handshakes/s, some
/// 880 ACU/s, against a peak of 300 ACU/s) has handshakes sleeping on its quota, up to
/// `max_wait` of them: at 300 ACU/s and 1 s, about 270, many times what the 50 ms
/// admission bound holds on any CPU. They are no work ahead of anyone while they sleep:
/// another tenant's connections must not be reset at accept for them (counted as
/// admitted work, they get most of b's connections reset).
#[test]
fn a_tenant_flooding_at_three_times_its_quota_takes_no_admission_room_from_another_at_a_50ms_bound()
{
    let _alone = exclusive();
    let dir = TestDir::new("tenants-room");
    let conf = two_tenants(
        &dir,
        "capacity = { acu = 300 }\nmax_wait = \"1s\"",
        "capacity = { acu = 100 }",
    );
    let text = std::fs::read_to_string(&conf).unwrap();
    std::fs::write(&conf, text + "[limits]\nhandshake_queue = \"50ms\"\n").unwrap();
    let server = ServerBuilder::config(&conf)
        .args(&["--no-resumption"])
        .admin()
        .start();
    let a = handshakes_to(&server, "a.test", 800, 4);
    let b = handshakes_to(&server, "b.test", 20, 4);
    let (a, b) = (a.join().unwrap(), b.join().unwrap());
    assert!(
        b["errors"].as_object().unwrap().is_empty(),
        "tenant b, at a fifth of its quota, had errors beside a's flood: {b:#}"
    );
    assert!(
        server.metric(
            "terminus_tenant_handshakes_refused_total",
            &["tenant=\"a\""]
        ) > 0.0,
        "a's flood was not held to its quota: {a:#}"
    );
    assert_eq!(b["requests"].as_f64(), Some(80.0), "{b:#}");
}

/// The quota is asked before the admission bound: a handshake its tenant's quota admits
/// and the bound then refuses after its ClientHello is not counted admitted
/// (`terminus_tenant_handshakes_admitted_total`, `GET /capacity`'s `handshakes_admitted`).
/// A flood within a's quota against a 5 ms bound has many refused after their
/// ClientHello; every handshake counted admitted completed or failed.
#[test]
fn handshakes_the_bound_refuses_after_the_quota_are_not_counted_admitted() {
    let _alone = exclusive();
    let dir = TestDir::new("tenants-admitted");
    let conf = two_tenants(
        &dir,
        "capacity = { acu = 100000 }",
        "capacity = { acu = 10 }",
    );
    let text = std::fs::read_to_string(&conf).unwrap();
    std::fs::write(&conf, text + "[limits]\nhandshake_queue = \"5ms\"\n").unwrap();
    let server = ServerBuilder::config(&conf)
        .args(&["--no-resumption"])
        .admin()
        .start();
    let a = handshakes_to(&server, "a.test", 3000, 1).join().unwrap();
    let at_hello = server.metric(
        "terminus_handshakes_refused_total",
        &["cause=\"overload_at_hello\""],
    );
    assert!(at_hello > 0.0, "none refused after its ClientHello: {a:#}");
    let admitted = server.metric(
        "terminus_tenant_handshakes_admitted_total",
        &["tenant=\"a\""],
    );
    let ended = server.metric("terminus_handshakes_total", &[])
        + server.metric("terminus_handshake_failures_total", &[]);
    assert!(
        admitted <= ended,
        "{admitted} handshakes counted admitted, {ended} completed or failed ({at_hello} refused after their ClientHello): {a:#}"
    );
    let table = server.admin_get("/capacity");
    let doc: serde_json::Value = serde_json::from_slice(&table.stdout).unwrap();
    let tenant_a = doc["tenants"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["name"] == "a")
        .unwrap();
    assert_eq!(
        tenant_a["handshakes_admitted"]["committed"].as_f64(),
        Some(admitted),
        "{doc:#}"
    );
}

#[test]
fn a_busy_worker_lends_nothing_beyond_committed_quotas() {
    let _alone = exclusive();
    let dir = TestDir::new("tenants-busy");
    let conf = two_tenants(
        &dir,
        "capacity = { acu = 10, acu_peak = 200 }",
        "capacity = { acu = 100000 }",
    );
    let server = ServerBuilder::config(&conf)
        .args(&["--no-resumption"])
        .admin()
        .start();
    // Idle: a borrows most of what it asks for (about 66 ACU/s).
    handshakes_to(&server, "a.test", 60, 4).join().unwrap();
    let idle = acu(&server, "a", "borrowed");
    assert!(idle > 150.0, "{idle:.0} ACU borrowed in 4 s while idle");
    // b keeps the worker busy (closed loop, 64 connections of full RSA handshakes, more
    // than it computes on any CPU: it never sleeps): a gets its 10 ACU/s and nothing more.
    let url = format!("https://b.test:{}/index.html", server.port());
    let busy = load_in_background(
        [
            &url,
            "--address",
            "127.0.0.1",
            "-c",
            "64",
            "-d",
            "6s",
            "--new-connection",
            "-k",
            "--tls",
            "1.3",
        ]
        .map(str::to_owned)
        .to_vec(),
    );
    // On purpose: b's flood well under way (the worker saturated, its queue full)
    // before a is measured; a count of handshakes would not say when that is.
    thread::sleep(std::time::Duration::from_millis(1500));
    let before = acu(&server, "a", "borrowed");
    handshakes_to(&server, "a.test", 60, 4).join().unwrap();
    let lent = acu(&server, "a", "borrowed") - before;
    busy.join().unwrap();
    assert_eq!(
        lent, 0.0,
        "{lent:.0} ACU lent to a in 4 s while b kept the worker busy, {idle:.0} while idle"
    );
}

/// A client that sends no SNI has its handshake made for, and charged to, the default
/// server (a.test, the first): it cannot then have tenant b's server answer by naming it
/// in Host. Its requests there are misdirected, and b is charged nothing.
#[test]
fn a_handshake_charged_to_one_tenant_cannot_reach_another_tenants_server() {
    let dir = TestDir::new("tenants-host");
    let conf = two_tenants(
        &dir,
        "capacity = { acu = 1000 }",
        "capacity = { acu = 1000 }",
    );
    let server = ServerBuilder::config(&conf)
        .args(&["--no-resumption"])
        .admin()
        .start();
    let ops = |tenant: &str| {
        metric_sum(
            &server.metrics(),
            "terminus_tenant_crypto_ops_total",
            &[&format!("tenant=\"{tenant}\"")],
        )
    };
    for version in ["--http1.1", "--http2"] {
        let out = run(Command::new("curl")
            .args(["-sk", version, "-o", "/dev/null", "-w", "%{http_code}"])
            .args(["-H", "Host: b.test"])
            .arg(format!("https://127.0.0.1:{}/index.html", server.port())));
        assert_eq!(String::from_utf8_lossy(&out.stdout), "421", "{version}");
    }
    assert!(
        ops("a") >= 4.0,
        "the no-SNI handshakes were a's: {}",
        ops("a")
    );
    assert_eq!(ops("b"), 0.0, "b paid for handshakes it did not serve");
    // With its own SNI, b's server answers, and b pays.
    let out = curl_host(
        &server,
        "b.test",
        &["-o", "/dev/null", "-w", "%{http_code}"],
        "/index.html",
    );
    assert_eq!(String::from_utf8_lossy(&out.stdout), "200");
    assert!(ops("b") >= 2.0);
}

/// `prefer_cheap` lets resumptions through beyond the quota and refuses RSA handshakes.
/// A session ticket another server issued (junk to this one) resumes nothing: the
/// handshake signs with RSA, and is refused as one, as often as a client that offers
/// nothing. Admitted as a resumption, every one would get its full RSA handshake.
#[test]
fn fake_resumptions_are_refused_like_the_full_handshakes_they_are() {
    let _alone = exclusive();
    let dir = TestDir::new("tenants-fake-psk");
    let conf = two_tenants(
        &dir,
        "capacity = { acu = 2 }\nover_quota = \"prefer_cheap\"",
        "capacity = { acu = 100 }",
    );
    let issuer = ServerBuilder::config(&conf).start();
    let server = ServerBuilder::config(&conf).admin().start();
    let fake = replay::Client::with_session_of(&issuer, "a.test");
    refused_as_expensive_as_often_as_plain(&server, &fake, "foreign tickets");
}

/// A genuine ticket that rustls declines resumes nothing either: this server's own
/// ticket for b.test, offered for a.test (RFC 6066: another name is a full handshake). It
/// is admitted as the resumption it looks like, and its first signature is admitted again
/// as the full handshake it turned into: under `prefer_cheap` beyond the quota, refused
/// as expensive, as often as a client that offers nothing.
#[test]
fn a_genuine_ticket_rustls_declines_is_refused_at_its_signature_like_a_full_handshake() {
    let _alone = exclusive();
    let dir = TestDir::new("tenants-declined-ticket");
    // Beyond the quota a resumption (no signature: a few hundredths of an ACU) waits a
    // few ms for it; an RSA handshake (~1.1 ACU) is refused.
    let conf = two_tenants(
        &dir,
        "capacity = { acu = 20 }\nover_quota = \"prefer_cheap\"\nmax_wait = \"1s\"",
        "capacity = { acu = 1000 }",
    );
    // Resumption on (ServerBuilder::config({0}).args(&["--no-resumption"]).admin().start() turns it off).
    let server = ServerBuilder::config(&conf).admin().start();
    let declined = replay::Client::with_session_of(&server, "b.test");
    refused_as_expensive_as_often_as_plain(&server, &declined, "b's ticket for a.test");
}

/// 60 handshakes for a.test (tenant a, `prefer_cheap` beyond its quota, RSA) offering
/// what `client` offers, and 60 offering nothing: none resumes, `client`'s are refused
/// about as often as the plain ones (most of those), and every refusal is counted as
/// the tenant's `expensive` one, and as a quota refusal, not as a failed handshake.
fn refused_as_expensive_as_often_as_plain(server: &Server, client: &replay::Client, what: &str) {
    let tally = |client: &replay::Client| {
        let mut refused = 0;
        for _ in 0..60 {
            let outcome = client.handshake(server, "a.test");
            assert_ne!(outcome, replay::Outcome::Resumed, "{what} resumed");
            refused += (outcome == replay::Outcome::Refused) as u32;
        }
        refused
    };
    let (plain, offered) = (tally(&replay::Client::plain()), tally(client));
    assert!(plain >= 40, "{plain} of 60 plain RSA handshakes refused");
    assert!(
        offered + 5 >= plain,
        "{offered} of 60 handshakes offering {what} refused, {plain} of 60 plain"
    );
    let expensive = server.metric(
        "terminus_tenant_handshakes_refused_total",
        &["tenant=\"a\"", "cause=\"expensive\""],
    );
    assert_eq!(expensive, f64::from(plain + offered), "{what}");
    assert_eq!(
        server.metric(
            "terminus_handshakes_refused_total",
            &["cause=\"tenant_quota\""]
        ),
        expensive,
        "{what}: counted as quota refusals, not as failed handshakes"
    );
}

#[test]
fn bad_quotas_name_their_line() {
    let dir = TestDir::new("tenants-config");
    let cases = [
        (
            "capacity = { acu = 100, acu_peak = 50 }",
            "acu_peak = 50 is below acu = 100",
        ),
        (
            "capacity = { acu = -1 }",
            "capacity acu = -1 must be a positive number",
        ),
        (
            "capacity = { acu = 10 }\nover_quota = \"drop\"",
            "over_quota = \"drop\" is not an action",
        ),
        ("capacity = { acu = 10, acus = 5 }", "unknown field `acus`"),
        (
            "capacity = { acu = 10 }\nmax_wait = \"1h\"",
            "max_wait = \"1h\" is not below the handshake timeout (10s)",
        ),
    ];
    for (a, message) in cases {
        let conf = two_tenants(&dir, a, "capacity = { acu = 10 }");
        let out = run(Command::new(terminus_bin())
            .args(["check", "--config"])
            .arg(&conf));
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{a}: accepted");
        // Tenant a's capacity is on line 7, its over_quota on line 8.
        assert!(
            err.contains("terminus.toml:7") || err.contains("terminus.toml:8"),
            "{a}: no line in {err}"
        );
        assert!(err.contains(message), "{a}: {err}");
    }
    let conf = two_tenants(&dir, "capacity = { acu = 10 }", "capacity = { acu = 10 }");
    let text = std::fs::read_to_string(&conf)
        .unwrap()
        .replace("tenant = \"b\"", "tenant = \"c\"");
    let conf = dir.write("terminus.toml", text);
    let out = run(Command::new(terminus_bin())
        .args(["check", "--config"])
        .arg(&conf));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("no [[tenant]] is named \"c\""), "{err}");
}

#[test]
fn check_warns_when_the_tenants_are_promised_more_than_the_machine_has() {
    let dir = TestDir::new("tenants-check");
    let conf = two_tenants(
        &dir,
        "capacity = { acu = 1000000 }",
        "capacity = { acu = 10 }",
    );
    let out = run(Command::new(terminus_bin())
        .args(["check", "--config"])
        .arg(&conf));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(
        err.contains("warning") && err.contains("1000010 ACU/s, is more than this machine has"),
        "{err}"
    );
    let conf = two_tenants(&dir, "capacity = { acu = 10 }", "capacity = { acu = 10 }");
    let out = run(Command::new(terminus_bin())
        .args(["check", "--config"])
        .arg(&conf));
    assert!(!String::from_utf8_lossy(&out.stderr).contains("warning"));
}

#[test]
fn a_tenants_bulk_quota_paces_its_downloads_and_no_one_elses() {
    let _alone = exclusive();
    let dir = TestDir::new("tenants-scu");
    // 8 Mbps: a megabyte a second.
    let conf = two_tenants(
        &dir,
        "capacity = { acu = 100, scu = 8 }",
        "capacity = { acu = 100 }",
    );
    dir.write("www/big.bin", vec![b'x'; 3_000_000]);
    let server = ServerBuilder::config(&conf)
        .args(&["--no-resumption"])
        .admin()
        .start();
    let fetch = |host: &str| {
        let started = std::time::Instant::now();
        let out = curl_host(
            &server,
            host,
            &["-o", "/dev/null", "-w", "%{size_download}"],
            "/big.bin",
        );
        assert!(out.status.success(), "{out:?}");
        assert_eq!(String::from_utf8_lossy(&out.stdout), "3000000");
        started.elapsed().as_secs_f64()
    };
    let unpaced = fetch("b.test");
    let paced = fetch("a.test");
    // 3 MB at 1 MB/s, less the meter's tenth of a second of burst.
    assert!(
        (2.5..=4.5).contains(&paced),
        "3 MB took {paced:.2} s at 8 Mbps"
    );
    assert!(
        unpaced < 1.0,
        "3 MB took {unpaced:.2} s without a bulk quota"
    );
    let sent = server.metric("terminus_tenant_bulk_bytes_total", &["tenant=\"a\""]);
    assert!(sent >= 3_000_000.0, "{sent} bytes counted");
    assert!(server.metric("terminus_tenant_paced_writes_total", &["tenant=\"a\""]) > 0.0);
    assert_eq!(
        server.metric("terminus_tenant_bulk_bytes_total", &["tenant=\"b\""]),
        0.0,
        "b has no bulk quota: not wrapped, not counted"
    );
}

/// Tenant quotas hold over HTTP/3 as over TCP: QUIC handshakes are admitted against their
/// tenant's quota at their ClientHello (the QUIC certificate resolver asks from inside
/// the crypto bridge) and their crypto is charged to it. A tenant offering three times
/// its peak over QUIC is held to its peak; one within its quota is untouched.
#[test]
fn quic_handshakes_are_held_to_their_tenant_s_quota_as_tcp_ones() {
    let _alone = exclusive();
    let dir = TestDir::new("tenants-quic");
    let conf = two_tenants_on(
        &dir,
        "{ address = \"127.0.0.1:0\", http3 = true }",
        "capacity = { acu = 20, acu_peak = 30 }",
        "capacity = { acu = 40 }",
    );
    let server = ServerBuilder::config(&conf)
        .args(&["--no-resumption"])
        .admin()
        .start();
    let quic_load = |host: &str, rate: u32| {
        let url = format!("https://{host}:{}/index.html", server.port());
        let mut args = full_handshakes(&url, "127.0.0.1", rate, 10);
        args.push("--http3".into());
        load_in_background(args)
    };
    // As over TCP: a at about 90 ACU/s, three times its peak; b at 20, half its quota.
    let a = quic_load("a.test", 80);
    let b = quic_load("b.test", 18);
    let (a, b) = (a.join().unwrap(), b.join().unwrap());
    assert_eq!(a["http"], "HTTP/3");
    held_to_its_peak(&server, &a);
    assert!(a["errors_total"].as_f64().unwrap() > 0.0, "{a:#}");
    assert_eq!(
        server.metric(
            "terminus_tenant_handshakes_refused_total",
            &["tenant=\"b\""]
        ),
        0.0
    );
    assert_eq!(b["errors_total"].as_f64(), Some(0.0), "{b:#}");
    assert_eq!(b["requests"].as_f64(), Some(180.0), "{b:#}");
    assert_eq!(
        server.metric("terminus_quic_handshakes_total", &[]),
        a["requests"].as_f64().unwrap() + 180.0
    );
}
