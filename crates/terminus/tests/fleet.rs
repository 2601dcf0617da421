//! Session tickets on one instance and across a fleet: tickets leave when the handshake
//! completes, their keys rotate by epoch (a ticket names its key; older than `keep`
//! periods it is refused, as a full handshake), and instances sharing a store resume each
//! other's sessions.

mod common;

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use common::*;

/// One server with an ECDSA certificate, `extra` before it (`[tls]`, `[fleet]`).
fn server(dir: &TestDir, extra: &str) -> Server {
    let pair = make_cert(&dir.0, "k", KeyKind::EcdsaP256, &["localhost"]);
    dir.write("www/index.html", "hi\n");
    let conf = config(dir, &pair, extra);
    Server::start_with(
        &["--config", conf.to_str().unwrap(), "--admin", "127.0.0.1:0"],
        false,
    )
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
        let conf = config(&dir, &pair, &format!("[tls]\nticket_keys = {setting}\n"));
        let out =
            run(Command::new(terminus_bin()).args(["check", "--config", conf.to_str().unwrap()]));
        let text = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{setting}: {text}");
        assert!(
            text.contains(says) && text.contains(":5"),
            "{setting}: {text}"
        );
    }
}
