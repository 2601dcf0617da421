//! Keyless signing between two real terminus processes: a signer holding the keys
//! (`[signer]`, mutual TLS) and a terminator whose certificates name the signers instead
//! of key files, with curl and `openssl s_client` as clients. What is checked: the
//! handshake completes with the certificate whose key only the signer has, for RSA and
//! ECDSA and TLS 1.2 and 1.3; the signer's audit line says who asked, for which SNI;
//! a terminator without a certificate from the signer's CA is refused; a killed signer
//! is failed over at once; a signer that does not answer fails the handshake by the
//! deadline (never a hang) and the next goes to another.

use std::net::{SocketAddr, TcpListener};
use std::process::Command;
use std::time::{Duration, Instant};

use crate::harness::*;

/// The keyless set-up's files: a CA both sides trust, the signer's and the terminator's
/// certificates from it, and the site's certificates (RSA-2048, ECDSA P-256) whose keys
/// only the signer is given.
struct Pki {
    dir: TestDir,
    rsa: CertPair,
    ecdsa: CertPair,
}

fn pki(test: &str) -> Pki {
    let dir = TestDir::new(test);
    let ca = Ca::new(&dir.0, "ca", "keyless CA", 2);
    ca.issue(&dir.0, "signer", &Leaf::server("localhost"));
    let stranger = Ca::new(&dir.0, "stranger-ca", "another CA", 2);
    ca.issue(&dir.0, "terminator", &Leaf::client("terminator-1"));
    stranger.issue(&dir.0, "stranger", &Leaf::client("stranger"));
    let rsa = make_cert(&dir.0, "site-rsa", KeyKind::Rsa(2048), &["site.test"]);
    let ecdsa = make_cert(&dir.0, "site-ecdsa", KeyKind::EcdsaP256, &["site.test"]);
    Pki { dir, rsa, ecdsa }
}

/// A signer holding both site keys, its audit lines in `dir/NAME-audit.log`; with the
/// address terminators name it by (`localhost`, its certificate's name).
fn signer(pki: &Pki, name: &str) -> (Server, String) {
    signer_with(pki, name, 2)
}

/// [`signer`] with `workers` workers.
fn signer_with(pki: &Pki, name: &str, workers: usize) -> (Server, String) {
    signer_allowing(pki, name, workers, None)
}

/// [`signer_with`], with `[signer] allow = [allow]` where given.
fn signer_allowing(pki: &Pki, name: &str, workers: usize, allow: Option<&str>) -> (Server, String) {
    let d = &pki.dir;
    let allow = allow.map_or(String::new(), |net| format!("allow = [\"{net}\"]\n"));
    let conf = d.write(
        &format!("{name}.toml"),
        format!(
            r#"listen = ["127.0.0.1:0"]
workers = {workers}
[log]
access = "{audit}"
format = "json"
[signer]
listen = "127.0.0.1:0"
ca = "{ca}"
certificate = {{ cert = "{cert}", key = "{key}" }}
{allow}[[signer.key]]
file = "{rsa}"
[[signer.key]]
file = "{ecdsa}"
"#,
            audit = d.path(&format!("{name}-audit.log")).display(),
            ca = d.path("ca.pem").display(),
            cert = d.path("signer.pem").display(),
            key = d.path("signer.key").display(),
            rsa = pki.rsa.key.display(),
            ecdsa = pki.ecdsa.key.display(),
        ),
    );
    let server = ServerBuilder::config(&conf).admin().start();
    let addr: SocketAddr = server
        .stdout_lines
        .iter()
        .find_map(|l| l.strip_prefix("keyless signer on "))
        .and_then(|l| l.split(' ').next())
        .expect("the signer announces its address")
        .parse()
        .unwrap();
    (server, format!("localhost:{}", addr.port()))
}

/// A terminator serving site.test with both certificates, their keys on `signers`,
/// showing the client certificate `identity` (`terminator` or `stranger`).
fn terminator(pki: &Pki, signers: &[String], identity: &str, timeout: &str) -> Server {
    terminator_with(pki, signers, identity, timeout, 2)
}

/// [`terminator`] with `workers` workers.
fn terminator_with(
    pki: &Pki,
    signers: &[String],
    identity: &str,
    timeout: &str,
    workers: usize,
) -> Server {
    let d = &pki.dir;
    let list: Vec<String> = signers.iter().map(|s| format!("\"{s}\"")).collect();
    let key = format!(
        "{{ signer = [{}], ca = \"{}\", cert = \"{}\", key = \"{}\", timeout = \"{timeout}\" }}",
        list.join(", "),
        d.path("ca.pem").display(),
        d.path(&format!("{identity}.pem")).display(),
        d.path(&format!("{identity}.key")).display(),
    );
    let conf = d.write(
        "terminator.toml",
        format!(
            r#"listen = ["127.0.0.1:0"]
workers = {workers}
[[server]]
names = ["site.test"]
[[server.certificate]]
cert = "{rsa}"
key = {key}
[[server.certificate]]
cert = "{ecdsa}"
key = {key}
"#,
            rsa = pki.rsa.cert.display(),
            ecdsa = pki.ecdsa.cert.display(),
        ),
    );
    ServerBuilder::config(&conf).admin().start()
}

/// curl's status for https://site.test/ with the certificate verified against `ca`
/// (the site's own, self-signed), and how long it took.
fn get(server: &Server, ca: &CertPair, extra: &[&str]) -> (u16, Duration) {
    let started = Instant::now();
    let mut args = vec!["-o", "/dev/null", "-w", "%{http_code}", "--cacert"];
    args.push(ca.cert.to_str().unwrap());
    args.extend_from_slice(extra);
    let out = run(Command::new("curl")
        .args(["-sS", "--max-time", "10", "--resolve"])
        .arg(format!("site.test:{}:127.0.0.1", server.port()))
        .args(&args)
        .arg(format!("https://site.test:{}/", server.port())));
    let code = String::from_utf8_lossy(&out.stdout)
        .trim()
        .parse()
        .unwrap_or(0);
    (code, started.elapsed())
}

/// `openssl s_client` offering only `sigalgs` over `version`, the chain verified
/// against the RSA certificate; the signature type it reports must be `signed_with`.
fn rsa_handshake(terminator: &Server, pki: &Pki, version: &str, sigalgs: &str, signed_with: &str) {
    let s_client = run(Command::new("openssl")
        .args([
            "s_client",
            version,
            "-sigalgs",
            sigalgs,
            "-verify_return_error",
        ])
        .args(["-servername", "site.test", "-connect"])
        .arg(format!("127.0.0.1:{}", terminator.port()))
        .arg("-CAfile")
        .arg(&pki.rsa.cert)
        .stdin(std::process::Stdio::null()));
    let text = String::from_utf8_lossy(&s_client.stdout);
    assert!(
        text.contains("Verify return code: 0 (ok)"),
        "{text}\n{}",
        terminator.stderr()
    );
    assert!(
        text.contains(&format!("Peer signature type: {signed_with}\n")),
        "{text}"
    );
}

#[test]
fn handshakes_are_signed_by_the_signer_for_rsa_and_ecdsa_on_tls_1_2_and_1_3() {
    let pki = pki("keyless-sign");
    let (signer, addr) = signer(&pki, "signer");
    let terminator = terminator(&pki, std::slice::from_ref(&addr), "terminator", "2s");
    // RSA: a client that cannot take ECDSA (TLS 1.3 offering PSS only; TLS 1.2 with an
    // ECDHE-RSA suite only), the chain verified against the RSA certificate.
    rsa_handshake(
        &terminator,
        &pki,
        "-tls1_3",
        "rsa_pss_rsae_sha256",
        "RSA-PSS",
    );
    let (code, _) = get(
        &terminator,
        &pki.rsa,
        &[
            "--tls-max",
            "1.2",
            "--ciphers",
            "ECDHE-RSA-AES128-GCM-SHA256",
        ],
    );
    assert_eq!(code, 200, "RSA over TLS 1.2: {}", terminator.stderr());
    // RSA PKCS#1 v1.5 (TLS 1.2's rsa_pkcs1_sha256 offered alone).
    rsa_handshake(&terminator, &pki, "-tls1_2", "RSA+SHA256", "RSA");
    // ECDSA, verified against the ECDSA certificate.
    for extra in [&["--tlsv1.3"][..], &["--tls-max", "1.2"][..]] {
        let (code, _) = get(&terminator, &pki.ecdsa, extra);
        assert_eq!(code, 200, "ECDSA over {extra:?}: {}", terminator.stderr());
    }
    // The terminator signed nothing itself; the signer signed each of the five.
    assert_eq!(
        terminator.metric("terminus_crypto_requests_total", &["op=\"rsa_sign\""]),
        0.0
    );
    assert_eq!(
        terminator.metric("terminus_crypto_requests_total", &["op=\"ecdsa_sign\""]),
        0.0
    );
    assert_eq!(
        terminator.metric("terminus_keyless_signatures_total", &[]),
        5.0
    );
    assert_eq!(
        signer.metric("terminus_signer_requests_total", &["outcome=\"signed\""]),
        5.0
    );
    let read = || std::fs::read_to_string(pki.dir.path("signer-audit.log")).unwrap_or_default();
    eventually(Duration::from_secs(5), "five audit lines", || {
        read().lines().count() >= 5
    });
    let audit = read();
    for line in audit.lines() {
        let v: serde_json::Value = serde_json::from_str(line).unwrap();
        assert_eq!(v["method"], "SIGN", "{line}");
        assert_eq!(v["outcome"], "signed", "{line}");
        assert_eq!(v["terminator"], "CN=terminator-1", "{line}");
        assert_eq!(v["sni"], "site.test", "{line}");
        assert_eq!(v["tls_client"], "127.0.0.1", "{line}");
        assert!(v["key"].as_str().unwrap().starts_with("ski:"), "{line}");
    }
}

#[test]
fn a_terminator_without_a_certificate_from_the_signers_ca_is_refused() {
    let pki = pki("keyless-refused");
    let (signer, addr) = signer(&pki, "signer");
    let terminator = terminator(&pki, std::slice::from_ref(&addr), "stranger", "2s");
    let (code, took) = get(&terminator, &pki.rsa, &[]);
    assert_eq!(code, 0, "a handshake signed for a stranger");
    assert!(took < Duration::from_secs(3), "{took:?}");
    assert_eq!(signer.metric("terminus_signer_requests_total", &[]), 0.0);
    assert!(terminator.metric("terminus_keyless_failures_total", &["cause=\"connection\""]) >= 1.0);
    // The signer saw the stranger and refused it (not: the signer was down).
    eventually(Duration::from_secs(5), "the signer's refusal", || {
        signer.stderr().contains("signer: terminator") && signer.stderr().contains("refused")
    });
}

/// A killed signer (SIGKILL: its connections reset) costs no handshake: requests on
/// its connection and after go to the other signer at once.
#[test]
fn a_killed_signer_is_failed_over_at_once() {
    let pki = pki("keyless-failover");
    let (mut first, first_addr) = signer(&pki, "first");
    let (second, second_addr) = signer(&pki, "second");
    let terminator = terminator(&pki, &[first_addr, second_addr], "terminator", "2s");
    for _ in 0..4 {
        assert_eq!(get(&terminator, &pki.ecdsa, &[]).0, 200);
    }
    assert!(
        first.metric("terminus_signer_requests_total", &["outcome=\"signed\""]) > 0.0,
        "the load spreads"
    );
    first.child.kill().unwrap();
    first.child.wait().unwrap();
    for i in 0..6 {
        let (code, took) = get(&terminator, &pki.ecdsa, &[]);
        assert_eq!(
            code,
            200,
            "handshake {i} after the kill: {}",
            terminator.stderr()
        );
        assert!(took < Duration::from_secs(1), "handshake {i} took {took:?}");
    }
    assert!(second.metric("terminus_signer_requests_total", &["outcome=\"signed\""]) >= 6.0);
}

/// A signer that stops answering on a connection already made (SIGSTOP): the
/// handshake fails by the deadline (300 ms), with an alert, not a hang, and the signer
/// is marked down for timing out.
#[test]
fn a_signer_that_stops_answering_fails_the_handshake_by_the_deadline() {
    let pki = pki("keyless-deadline");
    let (signer, addr) = signer(&pki, "stopped");
    let terminator = terminator_with(&pki, &[addr], "terminator", "300ms", 1);
    assert_eq!(
        get(&terminator, &pki.ecdsa, &[]).0,
        200,
        "the connection is made"
    );
    signer.signal("STOP");
    let (code, took) = get(&terminator, &pki.ecdsa, &[]);
    signer.signal("CONT");
    assert_eq!(code, 0);
    assert!(
        took >= Duration::from_millis(250) && took < Duration::from_secs(1),
        "{took:?}"
    );
    assert_eq!(
        terminator.metric("terminus_keyless_failures_total", &["cause=\"timeout\""]),
        1.0
    );
}

/// A signer that accepts TCP and never completes TLS: a lone one fails the handshake
/// within a third of the deadline (the connection budget), never a hang; beside a
/// good signer, every handshake goes on to the good one within its deadline.
#[test]
fn a_signer_that_cannot_be_connected_to_is_failed_over_within_the_deadline() {
    let pki = pki("keyless-connect");
    let silent = TcpListener::bind("127.0.0.1:0").unwrap();
    let silent_addr = format!("localhost:{}", silent.local_addr().unwrap().port());
    let held = std::thread::spawn(move || {
        let mut kept = Vec::new();
        for conn in silent.incoming().take(8) {
            kept.push(conn);
        }
        std::thread::sleep(Duration::from_secs(30));
    });
    let (_good, good_addr) = signer(&pki, "good");
    let lone = terminator(
        &pki,
        std::slice::from_ref(&silent_addr),
        "terminator",
        "300ms",
    );
    let (code, took) = get(&lone, &pki.ecdsa, &[]);
    assert_eq!(code, 0);
    assert!(took < Duration::from_millis(300), "{took:?}");
    assert!(lone.metric("terminus_keyless_failures_total", &["cause=\"connection\""]) >= 1.0);
    drop(lone);
    let both = terminator(&pki, &[silent_addr, good_addr], "terminator", "300ms");
    let results: Vec<(u16, Duration)> = (0..8).map(|_| get(&both, &pki.ecdsa, &[])).collect();
    assert!(results.iter().all(|(code, _)| *code == 200), "{results:?}");
    assert!(
        results
            .iter()
            .all(|(_, took)| *took < Duration::from_secs(1)),
        "{results:?}"
    );
    drop(held);
}

#[test]
fn keyless_settings_are_checked_with_their_line() {
    let dir = TestDir::new("keyless-config");
    let pair = make_cert(&dir.0, "site", KeyKind::EcdsaP256, &["site.test"]);
    let cases = [
        (
            "[signer]\nlisten = \"127.0.0.1:0\"\n[[signer.key]]\nfile = \"k.pem\"\n".to_owned(),
            "[signer] needs ca",
        ),
        (
            format!(
                "[[server]]\nnames = [\"a.test\"]\n[[server.certificate]]\ncert = \"{}\"\nkey = {{ signer = \"keys:2407\" }}\n",
                pair.cert.display()
            ),
            "needs ca",
        ),
        (
            format!(
                "[[server]]\nnames = [\"a.test\"]\n[[server.certificate]]\ncert = \"{}\"\nkey = {{ signer = \"keys\", ca = \"a\", cert = \"b\", key = \"c\" }}\n",
                pair.cert.display()
            ),
            "is not host:port",
        ),
        (
            "[signer]\nlisten = \"127.0.0.1:0\"\nca = \"ca.pem\"\ncertificate = { cert = \"s.pem\", key = \"s.key\" }\nallow = [\"10.0.0.0/33\"]\n[[signer.key]]\nfile = \"k.pem\"\n".to_owned(),
            "bad.toml:5: [signer] allow network \"10.0.0.0/33\" has a prefix longer than its address's 32 bits",
        ),
        (
            "[signer]\nlisten = \"127.0.0.1:0\"\nca = \"ca.pem\"\ncertificate = { cert = \"s.pem\", key = \"s.key\" }\nallow = []\n[[signer.key]]\nfile = \"k.pem\"\n".to_owned(),
            "bad.toml:5: [signer] allow is empty",
        ),
    ];
    for (text, wanted) in cases {
        let conf = dir.write("bad.toml", &text);
        let out =
            run(Command::new(terminus_bin()).args(["check", "--config", conf.to_str().unwrap()]));
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{text} passed");
        assert!(err.contains(wanted), "{text}: {err}");
        assert!(err.contains("bad.toml:"), "no file:line in {err}");
    }
}

/// Opens `count` TCP connections to `port` on 127.0.0.1 from `sources` in turn (other
/// loopback addresses), and holds them without sending a byte.
fn idle_wave(port: u16, sources: &[std::net::Ipv4Addr], count: usize) -> Vec<std::net::TcpStream> {
    let to = SocketAddr::from(([127, 0, 0, 1], port));
    (0..count)
        .map(|i| connect_from(sources[i % sources.len()], to))
        .collect()
}

/// The signer's connections turned away, every reason together.
fn turned_away(signer: &Server) -> f64 {
    metric_sum(&signer.metrics(), "terminus_signer_refused_total", &[])
}

/// 1,100 idle connections from one address (127.0.0.2), more than a worker's 1,024
/// places for terminators, held while a terminator starts: strangers get only their
/// own small budget (8 from one address), so the terminator connects, signs, and its
/// clients get 200; the signer counts every one it turned away and says so in a line
/// or two, not one per peer.
#[test]
fn a_wave_of_idle_connections_from_one_address_leaves_room_for_a_terminator() {
    let pki = pki("keyless-wave");
    let (signer, addr) = signer_with(&pki, "signer", 1);
    let port: u16 = addr.rsplit(':').next().unwrap().parse().unwrap();
    let wave = idle_wave(port, &[[127, 0, 0, 2].into()], 1100);
    eventually(Duration::from_secs(10), "the signer sees the wave", || {
        signer.metric(
            "terminus_signer_refused_total",
            &["reason=\"address_full\""],
        ) >= 1092.0
    });
    let terminator = terminator(&pki, std::slice::from_ref(&addr), "terminator", "2s");
    for i in 0..4 {
        let (code, _) = get(&terminator, &pki.ecdsa, &[]);
        assert_eq!(
            code,
            200,
            "request {i} during the wave: {}",
            terminator.stderr()
        );
    }
    assert!(signer.metric("terminus_signer_requests_total", &["outcome=\"signed\""]) >= 4.0);
    let lines = signer
        .stderr()
        .lines()
        .filter(|l| l.contains("WARN") && l.contains("signer:"))
        .count();
    assert!(
        (1..=3).contains(&lines),
        "{lines} warnings for one wave:\n{}",
        signer.stderr()
    );
    drop(wave);
}

/// With `allow` naming the terminators' network (127.0.0.1), the wave from 127.0.0.2
/// is closed at accept, each connection before any TLS and none holding a place of the
/// strangers' budget: a terminator signs beside it; and a terminator outside `allow`
/// gets nothing signed.
#[test]
fn with_allow_a_wave_from_outside_takes_nothing_and_a_terminator_outside_is_refused() {
    let pki = pki("keyless-allow");
    let (signer, addr) = signer_allowing(&pki, "signer", 1, Some("127.0.0.1/32"));
    let port: u16 = addr.rsplit(':').next().unwrap().parse().unwrap();
    let wave = idle_wave(port, &[[127, 0, 0, 2].into()], 1100);
    eventually(Duration::from_secs(10), "the signer sees the wave", || {
        signer.metric("terminus_signer_refused_total", &["reason=\"not_allowed\""]) >= 1100.0
    });
    assert_eq!(
        signer.metric(
            "terminus_signer_refused_total",
            &["reason=\"address_full\""]
        ),
        0.0,
        "no stranger's place was taken"
    );
    let inside = terminator(&pki, std::slice::from_ref(&addr), "terminator", "2s");
    let (code, _) = get(&inside, &pki.ecdsa, &[]);
    assert_eq!(code, 200, "{}", inside.stderr());
    drop(wave);
    // A signer allowing only 127.0.0.2: the terminator on 127.0.0.1 is turned away.
    let (shut, shut_addr) = signer_allowing(&pki, "shut", 1, Some("127.0.0.2"));
    let outside = terminator(&pki, &[shut_addr], "terminator", "2s");
    let (code, _) = get(&outside, &pki.ecdsa, &[]);
    assert_ne!(code, 200, "a terminator outside allow got a signature");
    assert!(shut.metric("terminus_signer_refused_total", &["reason=\"not_allowed\""]) >= 1.0);
}

/// A scanner's connections from outside `allow` (not_allowed, one warning and the rest
/// held back) do not hold back the warning for a terminator inside it whose handshake
/// fails (a certificate from another CA): each reason has its own throttle, so the
/// operator hears of the terminator at once.
#[test]
fn a_scanners_refusals_do_not_hold_back_the_warning_for_a_terminators_failed_handshake() {
    let pki = pki("keyless-warn-by-reason");
    let (signer, addr) = signer_allowing(&pki, "signer", 1, Some("127.0.0.1/32"));
    let port: u16 = addr.rsplit(':').next().unwrap().parse().unwrap();
    // Started first: the scanner's warning is then said within seconds of the
    // terminator's failure, well inside the throttle's 10 s.
    let stranger = terminator(&pki, std::slice::from_ref(&addr), "stranger", "2s");
    let wave = idle_wave(port, &[[127, 0, 0, 2].into()], 50);
    eventually(Duration::from_secs(10), "the signer sees the wave", || {
        signer.metric("terminus_signer_refused_total", &["reason=\"not_allowed\""]) >= 50.0
    });
    let (code, _) = get(&stranger, &pki.ecdsa, &[]);
    assert_eq!(code, 0, "a handshake signed for a stranger");
    assert!(
        signer.metric(
            "terminus_signer_refused_total",
            &["reason=\"handshake_failed\""]
        ) >= 1.0,
        "{}",
        signer.metrics()
    );
    eventually(
        Duration::from_secs(5),
        "the failed handshake's warning",
        || {
            signer.stderr().lines().any(|l| {
                l.contains("WARN") && l.contains("signer: terminator") && l.contains("refused")
            })
        },
    );
    let scanner_lines = (signer.stderr().lines())
        .filter(|l| l.contains("WARN") && l.contains("not in [signer] allow"))
        .count();
    assert_eq!(scanner_lines, 1, "{}", signer.stderr());
    drop(wave);
}

/// The same wave from 100 addresses, 11 each: within every address's share, so the
/// budget for strangers fills and each newcomer closes the oldest; a terminator's
/// handshake, newer than them all, finishes, and its clients get 200.
#[test]
fn a_wave_of_idle_connections_from_many_addresses_gives_way_to_a_terminator() {
    let pki = pki("keyless-wave-spread");
    let (signer, addr) = signer_with(&pki, "signer", 1);
    let port: u16 = addr.rsplit(':').next().unwrap().parse().unwrap();
    let sources: Vec<std::net::Ipv4Addr> = (10..110).map(|i| [127, 0, 1, i].into()).collect();
    let wave = idle_wave(port, &sources, 1100);
    eventually(Duration::from_secs(10), "the signer sees the wave", || {
        turned_away(&signer) >= 1100.0 - 64.0
    });
    assert!(
        signer.metric("terminus_signer_refused_total", &["reason=\"evicted\""]) >= 200.0,
        "{}",
        signer.metrics()
    );
    let terminator = terminator(&pki, std::slice::from_ref(&addr), "terminator", "2s");
    for i in 0..4 {
        let (code, _) = get(&terminator, &pki.ecdsa, &[]);
        assert_eq!(
            code,
            200,
            "request {i} during the wave: {}",
            terminator.stderr()
        );
    }
    drop(wave);
}
