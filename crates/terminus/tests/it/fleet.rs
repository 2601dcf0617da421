//! Session tickets on one instance and across a fleet: tickets leave when the handshake
//! completes, their keys rotate by epoch (a ticket names its key; older than `keep`
//! periods it is refused, as a full handshake), and instances sharing a store resume each
//! other's sessions.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::harness::*;
use terminus_testkit::Redis;

/// One server with an ECDSA certificate, `extra` before it (`[tls]`, `[fleet]`).
fn server(dir: &TestDir, extra: &str) -> Server {
    let pair = make_cert(&dir.0, "k", KeyKind::EcdsaP256, &["localhost"]);
    dir.write("www/index.html", "hi\n");
    let conf = Config::new(dir, &pair).before(extra).write(dir);
    ServerBuilder::config(&conf).admin().start()
}

/// `openssl s_client` to `server` with `args`, stdin held open `linger` and then closed
/// without a request; its output.
fn s_client_idle(server: &Server, args: &[&str], linger: Duration) -> String {
    let out = run(Command::new("sh").arg("-c").arg(format!(
        "sleep {} | openssl s_client -connect {} -servername localhost {} 2>&1",
        linger.as_secs_f64(),
        server.addr,
        args.join(" ")
    )));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// A session from `server` saved to `sess` (TLS `version`: "-tls1_2" or "-tls1_3").
fn save_session(server: &Server, version: &str, sess: &Path) -> String {
    let _ = std::fs::remove_file(sess);
    let out = s_client_idle(
        server,
        &[version, "-sess_out", sess.to_str().unwrap()],
        Duration::from_millis(300),
    );
    assert!(sess.exists(), "no session saved: {out}");
    out
}

/// Whether `sess` resumes on `server`: "Reused" or "New".
fn resume(server: &Server, version: &str, sess: &Path) -> &'static str {
    let out = s_client_idle(
        server,
        &[version, "-sess_in", sess.to_str().unwrap()],
        Duration::ZERO,
    );
    if out.contains("\nReused,") {
        "Reused"
    } else if out.contains("\nNew,") {
        "New"
    } else {
        panic!("no handshake: {out}")
    }
}

/// The key name a saved session's ticket carries: its first 16 bytes, in hex.
fn ticket_key_name(sess: &Path) -> String {
    let out = run(Command::new("openssl")
        .args(["sess_id", "-noout", "-text", "-in", sess.to_str().unwrap()])
        .stdin(Stdio::null()));
    let text = String::from_utf8_lossy(&out.stdout);
    let line = text
        .lines()
        .find(|l| l.trim_start().starts_with("0000 - "))
        .unwrap_or_else(|| panic!("no ticket in the session: {text}"));
    line.trim_start()["0000 - ".len()..]
        .split_whitespace()
        .take(16)
        .flat_map(|b| b.split('-'))
        .take(16)
        .collect()
}

#[test]
fn tickets_leave_when_the_handshake_completes_before_any_request() {
    let dir = TestDir::new("tickets-early");
    let server = server(&dir, "");
    let out = s_client_idle(&server, &["-tls1_3"], Duration::from_millis(500));
    assert_eq!(
        out.matches("Post-Handshake New Session Ticket arrived")
            .count(),
        2,
        "two TLS 1.3 tickets without a request: {out}"
    );
}

/// Keys rotate every 2 s, two kept: a ticket resumes in its period and the next, is
/// refused after (a full handshake, no error), and tickets of later periods carry another
/// key name.
#[test]
fn a_ticket_resumes_for_keep_periods_then_gets_a_full_handshake_and_keys_rotate() {
    let dir = TestDir::new("tickets-rotate");
    let server = server(&dir, "[tls]\nticket_keys = { rotate = \"2s\", keep = 2 }\n");
    for version in ["-tls1_3", "-tls1_2"] {
        let sess = dir.path("old.pem");
        save_session(&server, version, &sess);
        let old_name = ticket_key_name(&sess);
        assert_eq!(resume(&server, version, &sess), "Reused", "{version}");
        // Two periods and a little on: the key that sealed it is gone.
        std::thread::sleep(Duration::from_millis(4200));
        let fresh = dir.path("fresh.pem");
        save_session(&server, version, &fresh);
        assert_ne!(ticket_key_name(&fresh), old_name, "{version}: a new key");
        assert_eq!(resume(&server, version, &fresh), "Reused", "{version}");
        assert_eq!(resume(&server, version, &sess), "New", "{version}: expired");
    }
    assert!(server.metric("terminus_tickets_opened_total", &[]) >= 4.0);
    assert!(server.metric("terminus_ticket_keys_made_locally_total", &[]) >= 3.0);
    assert_eq!(
        server.metric("terminus_handshake_failures_total", &[]),
        0.0,
        "an expired ticket is a full handshake, not a failure"
    );
}

#[test]
fn bad_ticket_key_settings_name_their_line() {
    let dir = TestDir::new("tickets-bad");
    for (setting, says) in [
        ("{ rotate = \"1h\", keep = 1 }", "keep is between 2 and 64"),
        ("{ rotate = \"soon\" }", "is not a duration"),
        ("{ rotate = \"1500ms\" }", "whole number of seconds"),
    ] {
        let pair = make_cert(&dir.0, "k", KeyKind::EcdsaP256, &["localhost"]);
        let conf = Config::new(&dir, &pair)
            .before(&format!("[tls]\nticket_keys = {setting}\n"))
            .write(&dir);
        let out =
            run(Command::new(terminus_bin()).args(["check", "--config", conf.to_str().unwrap()]));
        let text = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{setting}: {text}");
        assert!(
            text.contains(says) && text.contains("terminus.toml:5:"),
            "{setting}: {text}"
        );
    }
}

/// Three instances sharing `redis`, on 127.0.0.1, .2 and .3 at one port (so that
/// `terminus load --address` can spread connections over them), one worker each.
struct Fleet {
    instances: Vec<Server>,
    port: u16,
    _dir: TestDir,
}

const KEK: &str = "00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff";

impl Fleet {
    fn start(redis: &Redis, extra: &str) -> Fleet {
        Self::start_with(redis, extra, KeyKind::EcdsaP256, "")
    }

    /// [`Fleet::start`] with a `key` of another kind and `server` lines in the server.
    fn start_with(redis: &Redis, extra: &str, key: KeyKind, server: &str) -> Fleet {
        let dir = TestDir::new("fleet");
        let pair = make_cert(&dir.0, "k", key, &["localhost"]);
        dir.write("www/index.html", "hi\n");
        let key_file = dir.write("fleet.key", format!("{KEK}\n"));
        let port = free_port();
        let instances = (1..=3)
            .map(|i| {
                let conf = dir.write(
                    &format!("terminus-{i}.toml"),
                    format!(
                        "listen = [\"127.0.0.{i}:{port}\"]\nworkers = 1\n{extra}\n[fleet]\nstore = \"{}\"\nkey_file = \"{}\"\npoll = \"200ms\"\n[[server]]\nnames = [\"localhost\"]\nroot = \"{}\"\n{server}\n[[server.certificate]]\ncert = \"{}\"\nkey = \"{}\"\n",
                        redis.url(),
                        key_file.display(),
                        dir.path("www").display(),
                        pair.cert.display(),
                        pair.key.display()
                    ),
                );
                ServerBuilder::config(&conf).admin().start()
            })
            .collect();
        let fleet = Fleet {
            instances,
            port,
            _dir: dir,
        };
        fleet.wait_for_the_store();
        fleet
    }

    fn wait_for_the_store(&self) {
        eventually(
            Duration::from_secs(10),
            "every instance on the store",
            || {
                self.instances
                    .iter()
                    .all(|s| s.metric("terminus_fleet_store_up", &[]) == 1.0)
            },
        );
    }

    fn sum(&self, name: &str, labels: &[&str]) -> f64 {
        self.instances.iter().map(|s| s.metric(name, labels)).sum()
    }

    /// `terminus load` over the three in turn, new connections resuming sessions.
    fn load(&self, connections: u32, seconds: u32, tls: &str) -> serde_json::Value {
        resume_load(self.port, connections, seconds, tls)
    }
}

/// `terminus load` over 127.0.0.1, .2 and .3 at `port` in turn, new connections
/// resuming sessions.
fn resume_load(port: u16, connections: u32, seconds: u32, tls: &str) -> serde_json::Value {
    load(&[
        &format!("https://localhost:{port}/index.html"),
        "--address",
        "127.0.0.1",
        "--address",
        "127.0.0.2",
        "--address",
        "127.0.0.3",
        "-c",
        &connections.to_string(),
        "-d",
        &format!("{seconds}s"),
        "--new-connection",
        "--resume",
        "-k",
        "--tls",
        tls,
    ])
}

/// A saved session's ticket key name from instance `i`.
fn session_key_name(fleet: &Fleet, i: usize, dir: &TestDir) -> String {
    let sess = dir.path(&format!("s{i}-{}.pem", Instant::now().elapsed().as_nanos()));
    save_session(&fleet.instances[i], "-tls1_3", &sess);
    ticket_key_name(&sess)
}

#[test]
fn a_session_from_one_instance_resumes_on_the_others() {
    let _alone = exclusive();
    let Some(redis) = Redis::start() else { return };
    let fleet = Fleet::start(&redis, "");
    let dir = TestDir::new("fleet-sessions");
    for version in ["-tls1_3", "-tls1_2"] {
        let sess = dir.path("a.pem");
        save_session(&fleet.instances[0], version, &sess);
        for other in &fleet.instances[1..] {
            assert_eq!(
                resume(other, version, &sess),
                "Reused",
                "{version} on {}",
                other.addr
            );
        }
    }
    // A rustls client spread over the three: every connection but the first few resumes.
    for tls in ["1.3", "1.2"] {
        let r = fleet.load(10, 2, tls);
        let (handshakes, resumed) = (
            r["handshakes"].as_f64().unwrap(),
            r["resumed_handshakes"].as_f64().unwrap(),
        );
        assert!(r["errors"].as_object().unwrap().is_empty(), "{r:#}");
        assert!(
            resumed >= (handshakes - 10.0) * 0.99,
            "TLS {tls}: {resumed} of {handshakes} resumed across the fleet: {r:#}"
        );
    }
    for s in &fleet.instances {
        assert!(
            s.metric("terminus_tickets_opened_total", &[]) > 10.0,
            "{} opened the others' tickets",
            s.addr
        );
        assert_eq!(
            s.metric("terminus_ticket_keys_made_locally_total", &[]),
            0.0
        );
    }
}

#[test]
fn keys_in_the_store_are_wrapped_and_rotate_under_load_without_a_dip() {
    let _alone = exclusive();
    let Some(redis) = Redis::start() else { return };
    let fleet = Fleet::start(
        &redis,
        "[tls]\nticket_keys = { rotate = \"2s\", keep = 2 }\n",
    );
    let dir = TestDir::new("fleet-rotate");
    let first = session_key_name(&fleet, 0, &dir);
    // Entries are the key wrapped: 76 bytes (nonce, name and key sealed, tag) in which
    // the name tickets carry does not appear.
    let names = redis.cli(&["KEYS", "terminus:ticket-key:2:*"]);
    let entries: Vec<&str> = names.lines().collect();
    assert!(
        entries.len() >= 2,
        "the current and next epochs' keys: {names}"
    );
    for entry in &entries {
        let mut value = redis.cli_bytes(&["GET", entry]);
        assert_eq!(value.pop(), Some(b'\n'));
        assert_eq!(value.len(), 76, "{entry}");
        let hex: String = value.iter().map(|b| format!("{b:02x}")).collect();
        assert!(
            !hex.contains(&first),
            "{entry} holds the key name in the clear"
        );
        let ttl: u64 = redis.cli(&["TTL", entry]).trim().parse().unwrap();
        assert!((1..=8).contains(&ttl), "{entry} lives {ttl} s");
    }
    // Load across the fleet through three rotations: no dip in the resumed share.
    let r = fleet.load(10, 7, "1.3");
    let (handshakes, resumed) = (
        r["handshakes"].as_f64().unwrap(),
        r["resumed_handshakes"].as_f64().unwrap(),
    );
    assert!(r["errors"].as_object().unwrap().is_empty(), "{r:#}");
    assert!(
        resumed >= (handshakes - 10.0) * 0.98,
        "{resumed} of {handshakes} resumed through rotations: {r:#}"
    );
    let later = session_key_name(&fleet, 1, &dir);
    assert_ne!(later, first, "tickets name a new key after rotating");
    // Every instance sealed with the store's keys: none had to make its own.
    assert_eq!(
        fleet.sum("terminus_ticket_keys_made_locally_total", &[]),
        0.0
    );
    assert!(fleet.sum("terminus_tickets_opened_total", &["key=\"previous\""]) > 0.0);
    // The rotations in the metrics: every instance moved on three times or more (7 s at
    // 2 s a period) and seals with the same epoch, holding only the store's keys.
    for s in &fleet.instances {
        let rotations = s.metric("terminus_ticket_key_rotations_total", &[]);
        assert!(rotations >= 3.0, "{rotations} rotations in 7 s");
        let epoch = s.metric("terminus_ticket_key_epoch", &[]);
        assert!(
            (epoch - fleet.instances[0].metric("terminus_ticket_key_epoch", &[])).abs() <= 1.0,
            "epochs apart"
        );
        assert!(s.metric("terminus_ticket_keys_held", &["source=\"store\""]) >= 2.0);
        assert_eq!(
            s.metric("terminus_ticket_keys_held", &["source=\"local\""]),
            0.0
        );
    }
}

#[test]
fn with_the_store_gone_the_fleet_keeps_resuming_and_agrees_again_when_it_returns_empty() {
    let _alone = exclusive();
    let Some(mut redis) = Redis::start() else {
        return;
    };
    let fleet = Fleet::start(&redis, "");
    let dir = TestDir::new("fleet-outage");
    let before = session_key_name(&fleet, 0, &dir);
    let port = redis.port;
    let load = {
        let port = fleet.port;
        std::thread::spawn(move || resume_load(port, 10, 5, "1.3"))
    };
    // Under way, on every instance, before the store goes.
    eventually(
        Duration::from_secs(10),
        "the load on every instance",
        || {
            fleet
                .instances
                .iter()
                .all(|s| s.metric("terminus_handshakes_total", &[]) > 0.0)
        },
    );
    // Killed by its PID mid-load.
    redis.kill();
    eventually(
        Duration::from_secs(5),
        "every instance seeing the store gone",
        || {
            fleet
                .instances
                .iter()
                .all(|s| s.metric("terminus_fleet_store_up", &[]) == 0.0)
        },
    );
    // On purpose: a second of the load with the store gone.
    std::thread::sleep(Duration::from_secs(1));
    let r = load.join().unwrap();
    let (handshakes, resumed) = (
        r["handshakes"].as_f64().unwrap(),
        r["resumed_handshakes"].as_f64().unwrap(),
    );
    assert!(
        r["errors"].as_object().unwrap().is_empty(),
        "handshakes failed with the store gone: {r:#}"
    );
    assert!(
        resumed >= (handshakes - 10.0) * 0.99,
        "{resumed} of {handshakes} resumed across the fleet with the store gone: {r:#}"
    );
    assert_eq!(session_key_name(&fleet, 2, &dir), before, "the keys held");
    // Back, empty, on the same port: within a poll period or two every instance seals
    // with one new key.
    redis = Redis::start_on(port).expect("redis-server again");
    let back = Instant::now();
    fleet.wait_for_the_store();
    let names: Vec<String> = (0..3).map(|i| session_key_name(&fleet, i, &dir)).collect();
    assert!(
        names.iter().all(|n| n == &names[0]) && names[0] != before,
        "one new key for the fleet {:?} after the store came back: {names:?} (before {before})",
        back.elapsed()
    );
    drop(redis);
}

#[test]
fn check_reaches_the_store_and_names_a_key_file_that_does_not_open_its_keys() {
    let _alone = exclusive();
    let Some(redis) = Redis::start() else { return };
    let fleet = Fleet::start(&redis, "");
    drop(fleet);
    let dir = TestDir::new("fleet-check");
    let pair = make_cert(&dir.0, "k", KeyKind::EcdsaP256, &["localhost"]);
    dir.write("www/index.html", "hi\n");
    let check = |url: &str, kek: &str| {
        let key = dir.write("other.key", kek);
        let conf = Config::new(&dir, &pair)
            .before(&format!(
                "[fleet]\nstore = \"{url}\"\nkey_file = \"{}\"\n",
                key.display()
            ))
            .write(&dir);
        let out =
            run(Command::new(terminus_bin()).args(["check", "--config", conf.to_str().unwrap()]));
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let (ok, text) = check(&redis.url(), KEK);
    assert!(ok, "{text}");
    let (ok, text) = check(&redis.url(), &"ab".repeat(32));
    assert!(
        !ok && text.contains("does not open with key_file"),
        "{text}"
    );
    // A store that does not answer now: a warning (instances would start and retry).
    let (ok, text) = check(&format!("redis://127.0.0.1:{}/0", free_port()), KEK);
    assert!(
        ok && text.contains("[fleet]") && text.contains("keep trying"),
        "{text}"
    );
    let (ok, text) = check(&redis.url(), "short");
    assert!(!ok && text.contains("64 hexadecimal digits"), "{text}");
}

/// Full handshakes offered to instance `i` of `fleet` at `rate` a second for `seconds`.
fn offer(
    fleet: &Fleet,
    i: usize,
    rate: u32,
    seconds: u32,
) -> std::thread::JoinHandle<serde_json::Value> {
    let url = format!("https://localhost:{}/index.html", fleet.port);
    load_in_background(full_handshakes(
        &url,
        &format!("127.0.0.{}", i + 1),
        rate,
        seconds,
    ))
}

/// Offers `rates` (handshakes/s) to the three instances for `seconds`; returns the ACU
/// the fleet charged tenant t from `skip` seconds in to `skip + window`.
fn charged_over(fleet: &Fleet, rates: [u32; 3], seconds: u32, skip: f64, window: f64) -> f64 {
    let loads: Vec<_> = (0..3).map(|i| offer(fleet, i, rates[i], seconds)).collect();
    // The measurement's window, in time on purpose.
    std::thread::sleep(Duration::from_secs_f64(skip));
    let before = fleet.sum("terminus_tenant_acu_total", &["tenant=\"t\""]);
    std::thread::sleep(Duration::from_secs_f64(window));
    let after = fleet.sum("terminus_tenant_acu_total", &["tenant=\"t\""]);
    for l in loads {
        l.join().unwrap();
    }
    after - before
}

/// One tenant, `acu = 100` for the whole fleet, RSA-2048 handshakes (about 1.1 ACU each):
/// offered half its quota, nothing is refused; offered twice its quota split 60/30/10
/// over the three instances, the fleet charges it its quota ±5%; all the load moved to
/// one instance, that one gets most of the quota; with the store gone, the fleet stays at
/// or under the quota.
#[test]
fn a_tenants_quota_holds_for_the_whole_fleet_and_follows_its_load() {
    let _alone = exclusive();
    let Some(mut redis) = Redis::start() else {
        return;
    };
    let fleet = Fleet::start_with(
        &redis,
        "[tls]\nsession_tickets = false\nsession_cache = 0\n[[tenant]]\nname = \"t\"\ncapacity = { acu = 100 }\nover_quota = \"refuse\"\n",
        KeyKind::Rsa(2048),
        "tenant = \"t\"",
    );
    let acu = |s: &Server, what: &str| {
        s.metric(
            "terminus_tenant_handshakes_refused_total",
            &["tenant=\"t\"", what],
        )
    };
    let refused = || fleet.instances.iter().map(|s| acu(s, "")).sum::<f64>();
    // Half the quota (about 45 handshakes/s), 60/30/10: within its shares everywhere.
    let charged = charged_over(&fleet, [27, 14, 4], 4, 1.0, 2.0);
    assert!(charged > 50.0, "{charged} ACU in 2 s at half of 100 ACU/s");
    assert_eq!(refused(), 0.0, "refused under the fleet's quota");
    // Twice the quota, 60/30/10, over 10 s: held to 1,000 ACU ±5%.
    let charged = charged_over(&fleet, [109, 55, 18], 12, 1.5, 10.0);
    assert!(
        (950.0..=1050.0).contains(&charged),
        "the fleet charged {charged:.0} ACU in 10 s against a quota of 100 ACU/s"
    );
    assert!(refused() > 0.0);
    // Every instance's view of the split: three instances, shares summing to one.
    let admin = fleet.instances[0].admin.unwrap().to_string();
    let table = fleet.instances[0].admin_get("/capacity");
    let doc: serde_json::Value = serde_json::from_slice(&table.stdout).unwrap();
    assert_eq!(doc["fleet"]["instances"], 3, "{doc:#}");
    let split = doc["fleet"]["tenants"]["t"]["instances"]
        .as_array()
        .unwrap();
    let sum: f64 = split.iter().map(|i| i["share"].as_f64().unwrap()).sum();
    assert!((sum - 1.0).abs() < 0.01, "{doc:#}");
    let shown = run(Command::new(terminus_bin()).args(["capacity", "--admin", &admin]));
    let text = String::from_utf8_lossy(&shown.stdout);
    assert!(text.contains("fleet: 3 instances"), "{text}");
    // All of it to the third instance (which had a tenth): its share follows.
    let load = offer(&fleet, 2, 182, 4);
    eventually(
        Duration::from_secs(3),
        "the third instance's share following its load",
        || fleet.instances[2].metric("terminus_tenant_fleet_share", &["tenant=\"t\""]) > 0.8,
    );
    load.join().unwrap();
    // The store gone: shares held, then an even split; the fleet stays under the quota.
    redis.kill();
    let charged = charged_over(&fleet, [109, 55, 18], 8, 2.0, 5.0);
    assert!(
        charged <= 525.0,
        "with the store gone the fleet charged {charged:.0} ACU in 5 s against a quota of 100 ACU/s"
    );
}

/// Keys rotating every 2 s and the store gone for longer than they last: each instance
/// seals with keys of its own (resumption across instances suffers: a third of clients
/// come back to the instance that sealed their ticket), and no handshake fails.
#[test]
fn past_the_keys_held_an_instance_without_its_store_makes_its_own_and_fails_no_handshake() {
    let _alone = exclusive();
    let Some(mut redis) = Redis::start() else {
        return;
    };
    let fleet = Fleet::start(
        &redis,
        "[tls]\nticket_keys = { rotate = \"2s\", keep = 2 }\n",
    );
    redis.kill();
    // Past the next epoch's key, fetched a period ahead, and into one nobody shared.
    std::thread::sleep(Duration::from_secs(5));
    let r = fleet.load(10, 3, "1.3");
    assert!(
        r["errors"].as_object().unwrap().is_empty(),
        "handshakes failed past the shared keys: {r:#}"
    );
    for s in &fleet.instances {
        assert!(
            s.metric("terminus_ticket_keys_made_locally_total", &[]) > 0.0,
            "{} made no key of its own",
            s.addr
        );
        assert_eq!(s.metric("terminus_fleet_store_up", &[]), 0.0);
    }
    let share = r["resumed_handshakes"].as_f64().unwrap() / r["handshakes"].as_f64().unwrap();
    assert!(share < 0.8, "{share:.2} resumed without shared keys: {r:#}");
}

/// Entries the store holds as another type (a list where a key should be) spoil their
/// epochs' sharing, not the connection: the instances stay on the store, count the
/// entries, seal with keys of their own for those epochs and serve.
#[test]
fn an_entry_of_the_wrong_type_spoils_its_epoch_not_the_store() {
    let _alone = exclusive();
    let Some(redis) = Redis::start() else { return };
    let unix: u64 = redis
        .cli(&["TIME"])
        .lines()
        .next()
        .unwrap()
        .parse()
        .unwrap();
    for epoch in [unix / 4, unix / 4 + 1] {
        redis.cli(&["LPUSH", &format!("terminus:ticket-key:4:{epoch}"), "junk"]);
    }
    let fleet = Fleet::start(
        &redis,
        "[tls]\nticket_keys = { rotate = \"4s\", keep = 2 }\n",
    );
    for s in &fleet.instances {
        assert!(s.metric("terminus_fleet_store_unreadable_keys_total", &[]) > 0.0);
        assert!(s.metric("terminus_ticket_keys_made_locally_total", &[]) > 0.0);
    }
    let r = fleet.load(5, 1, "1.3");
    assert!(r["errors"].as_object().unwrap().is_empty(), "{r:#}");
}
