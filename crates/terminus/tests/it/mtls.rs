//! Client certificates (mutual TLS) per server, with CAs and client certificates made by
//! the harness's CA (rcgen) and CRLs by `openssl ca`, curl and openssl s_client as
//! clients and Python's http.server (tests/upstream/app.py `/headers`) as the upstream
//! that reports what it was told.

use std::process::{Command, Output, Stdio};
use std::time::Duration;

use crate::harness::*;

/// A client certificate for `name` (O=Tests, CN, and a SPIFFE URI) signed by `ca`,
/// as `dir/NAME.pem` and `dir/NAME.key`.
fn client(dir: &TestDir, name: &str, ca: &Ca) {
    let leaf = Leaf {
        organization: Some("Tests".into()),
        uris: vec![format!("spiffe://tests/{name}")],
        ..Leaf::client(name)
    };
    ca.issue(&dir.0, name, &leaf);
}

/// `openssl ca`'s bookkeeping for CRLs of the `clients` CA.
fn ca_config(dir: &TestDir) -> std::path::PathBuf {
    dir.write("index.txt", "");
    dir.write("crlnumber", "01\n");
    dir.write(
        "ca.cnf",
        format!(
            "[ca]\ndefault_ca = clients\n[clients]\ndatabase = {}\ncrlnumber = {}\ndefault_md = sha256\ndefault_crl_days = 2\n",
            dir.path("index.txt").display(),
            dir.path("crlnumber").display()
        ),
    )
}

/// Writes the clients CA's CRL (after revoking `revoke`, if given).
fn crl(dir: &TestDir, revoke: Option<&str>) {
    let path = |name: &str| dir.path(name).to_str().unwrap().to_owned();
    let ca = |extra: &[String]| {
        let mut args = vec![
            "ca".to_owned(),
            "-config".to_owned(),
            path("ca.cnf"),
            "-keyfile".to_owned(),
            path("clients.key"),
            "-cert".to_owned(),
            path("clients.pem"),
        ];
        args.extend_from_slice(extra);
        openssl(&args.iter().map(String::as_str).collect::<Vec<_>>());
    };
    if let Some(name) = revoke {
        ca(&["-revoke".to_owned(), path(&format!("{name}.pem"))]);
    }
    ca(&["-gencrl".to_owned(), "-out".to_owned(), path("crl.pem")]);
}

struct Setup {
    dir: TestDir,
    server: Server,
    _app: App,
}

/// req.test requires a certificate from the clients CA (its CRL checked), opt.test
/// asks for one (upstream told by XFCC), plain.test asks for none; all proxy to app.py.
fn setup(test: &str) -> Setup {
    let dir = TestDir::new(test);
    let clients = Ca::new(&dir.0, "clients", "clients", 2);
    let other = Ca::new(&dir.0, "other", "other", 2);
    for (name, by) in [("alice", &clients), ("bob", &clients), ("mallory", &other)] {
        client(&dir, name, by);
    }
    ca_config(&dir);
    crl(&dir, None);
    let app = App::start("a");
    let server_block = |name: &str, auth: &str, upstream: &str| {
        format!("[[server]]\nnames = [\"{name}\"]\n{auth}\n[[server.route]]\npath = \"/\"\nupstream = \"{upstream}\"\n")
    };
    let ca = dir.path("clients.pem");
    let conf = dir.write(
        "terminus.toml",
        format!(
            "listen = [\"127.0.0.1:0\"]\nworkers = 1\n[timeouts]\nkeepalive = \"2s\"\n[log]\naccess = \"{log}\"\n[[upstream]]\nname = \"app\"\nservers = [\"{a}\"]\n[[upstream]]\nname = \"app-xfcc\"\nservers = [\"{a}\"]\nclient_cert = \"xfcc\"\n{}{}{}",
            server_block(
                "req.test",
                &format!("client_auth = {{ mode = \"required\", ca = \"{}\", crl = [\"{}\"] }}", ca.display(), dir.path("crl.pem").display()),
                "app"
            ),
            server_block(
                "opt.test",
                &format!("client_auth = {{ mode = \"optional\", ca = \"{}\" }}", ca.display()),
                "app-xfcc"
            ),
            server_block("plain.test", "", "app"),
            log = dir.path("access.log").display(),
            a = app.addr(),
        ),
    );
    let server = ServerBuilder::config(&conf).start();
    Setup {
        dir,
        server,
        _app: app,
    }
}

impl Setup {
    /// curl to `host`'s /headers (SNI and Host `host`), as `who` (a client certificate)
    /// or anonymous, with `extra` arguments.
    fn curl(&self, host: &str, who: Option<&str>, extra: &[&str]) -> Output {
        let port = self.server.port();
        let mut cmd = curl_command(&self.server, host);
        if let Some(who) = who {
            cmd.args([
                "--cert",
                self.dir.path(&format!("{who}.pem")).to_str().unwrap(),
            ]);
            cmd.args([
                "--key",
                self.dir.path(&format!("{who}.key")).to_str().unwrap(),
            ]);
        }
        cmd.args(extra)
            .arg(format!("https://{host}:{port}/app/headers"));
        run(&mut cmd)
    }

    /// The headers the upstream saw, by (lower-case) name.
    fn seen(&self, out: &Output) -> Vec<(String, String)> {
        assert!(out.status.success(), "{out:?}");
        let doc: serde_json::Value = serde_json::from_slice(&out.stdout)
            .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&out.stdout)));
        doc["headers"]
            .as_array()
            .unwrap()
            .iter()
            .map(|h| {
                (
                    h[0].as_str().unwrap().to_owned(),
                    h[1].as_str().unwrap().to_owned(),
                )
            })
            .collect()
    }

    /// openssl s_client to `host` as `who`, reading or writing a session (`-sess_in` or
    /// `-sess_out` and a file): a GET of /app/headers sent, read to the end. Its output
    /// (the session summary, `New,` or `Reused,`, then any response).
    fn s_client(&self, host: &str, who: &str, session: (&str, &std::path::Path)) -> String {
        use std::io::Write;
        let file = |ext: &str| self.dir.path(&format!("{who}.{ext}"));
        let mut child = Command::new("openssl")
            .args([
                "s_client",
                "-connect",
                &format!("127.0.0.1:{}", self.server.port()),
            ])
            .args(["-servername", host, "-tls1_3", "-ign_eof"])
            .args(["-cert", file("pem").to_str().unwrap()])
            .args(["-key", file("key").to_str().unwrap()])
            .args([session.0, session.1.to_str().unwrap()])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let request =
            format!("GET /app/headers HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n");
        // The server may have refused the handshake before the request is written.
        let _ = child.stdin.take().unwrap().write_all(request.as_bytes());
        let out = child.wait_with_output().unwrap();
        String::from_utf8_lossy(&out.stdout).into_owned()
    }
}

fn header<'a>(headers: &'a [(String, String)], name: &str) -> Option<&'a str> {
    headers
        .iter()
        .find(|(n, _)| n == name)
        .map(|(_, v)| v.as_str())
}

/// The leaf certificate's DER, base64, as RFC 9440 writes it (`:...:`).
fn rfc9440(dir: &TestDir, who: &str) -> String {
    let der = openssl(&[
        "x509",
        "-in",
        dir.path(&format!("{who}.pem")).to_str().unwrap(),
        "-outform",
        "DER",
    ])
    .stdout;
    let b64 = openssl_b64(&der);
    format!(":{b64}:")
}

fn openssl_b64(bytes: &[u8]) -> String {
    let mut child = Command::new("openssl")
        .args(["base64", "-A"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    use std::io::Write;
    child.stdin.take().unwrap().write_all(bytes).unwrap();
    String::from_utf8(child.wait_with_output().unwrap().stdout).unwrap()
}

fn refused(out: &Output, alert: &str) {
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.to_lowercase().contains(alert),
        "expected a refusal with {alert:?}: {out:?}"
    );
}

#[test]
fn a_required_server_serves_a_verified_client_and_tells_the_upstream_who_it_is() {
    let s = setup("mtls-required");
    // Without a certificate: refused with TLS 1.3's certificate_required alert.
    refused(&s.curl("req.test", None, &[]), "certificate required");
    // With one: served, and the upstream gets the certificate (RFC 9440) and SUCCESS,
    // never the client's own copies of those fields.
    let seen = s.seen(&s.curl(
        "req.test",
        Some("alice"),
        &[
            "-H",
            "Client-Cert: :Zm9yZ2Vk:",
            "-H",
            "X-Client-Verify: SUCCESS-FORGED",
        ],
    ));
    assert_eq!(
        header(&seen, "client-cert"),
        Some(rfc9440(&s.dir, "alice").as_str())
    );
    assert_eq!(header(&seen, "x-client-verify"), Some("SUCCESS"));
    assert_eq!(seen.iter().filter(|(n, _)| n == "client-cert").count(), 1);
    // A client of another CA: refused (unknown_ca).
    refused(&s.curl("req.test", Some("mallory"), &[]), "unknown ca");
    // The access log says who.
    let log = log_when(&s.dir.path("access.log"), |t| t.contains("CN=alice"));
    assert!(
        log.lines()
            .any(|l| l.contains("client_verify=SUCCESS") && l.contains("CN=alice")),
        "{log}"
    );
}

/// A client revoked by a CRL a reload brought (a new file at the same path) is refused:
/// in a full handshake (certificate_revoked), and with a session from before the reload
/// too, since rustls verifies nothing on resumption: the ticket no longer opens (its tag
/// is of the CRL's contents, which changed), and a resumed session's chain is checked
/// against the CRLs in force anyway.
#[test]
fn a_revoked_client_is_refused_also_once_a_reload_brings_the_new_crl() {
    let s = setup("mtls-crl");
    assert!(s.curl("req.test", Some("bob"), &[]).status.success());
    let sess = s.dir.path("bob.sess");
    let served = |out: &str| out.contains("HTTP/1.1 200");
    let verified = |out: &str| out.contains("\"x-client-verify\", \"SUCCESS\"");
    let first = s.s_client("req.test", "bob", ("-sess_out", &sess));
    assert!(first.contains("New,") && verified(&first), "{first}");
    // The session resumes while the CRL is the same: what follows is the CRL's doing.
    let again = s.s_client("req.test", "bob", ("-sess_in", &sess));
    assert!(again.contains("Reused,") && verified(&again), "{again}");

    crl(&s.dir, Some("bob"));
    s.server.signal("HUP");
    eventually(Duration::from_secs(10), "the new CRL in force", || {
        !s.curl("req.test", Some("bob"), &[]).status.success()
    });
    refused(&s.curl("req.test", Some("bob"), &[]), "certificate revoked");
    assert!(s.curl("req.test", Some("alice"), &[]).status.success());

    // bob's session from before the reload: no request served under it.
    let after = s.s_client("req.test", "bob", ("-sess_in", &sess));
    assert!(
        !served(&after) && !verified(&after),
        "a revoked client served: {after}"
    );
    // Nor resumed at all: a ticket issued under the old CRL does not open under the new.
    assert!(
        !after.contains("Reused,"),
        "resumed across a new CRL: {after}"
    );
}

#[test]
fn an_optional_server_forwards_none_without_a_certificate_and_xfcc_with_one() {
    let s = setup("mtls-optional");
    let seen = s.seen(&s.curl(
        "opt.test",
        None,
        &[
            "-H",
            "X-Forwarded-Client-Cert: Hash=forged;Subject=\"CN=root\"",
        ],
    ));
    assert_eq!(header(&seen, "x-client-verify"), Some("NONE"));
    assert_eq!(header(&seen, "x-forwarded-client-cert"), None, "{seen:?}");
    let seen = s.seen(&s.curl("opt.test", Some("alice"), &[]));
    let xfcc = header(&seen, "x-forwarded-client-cert").unwrap_or_default();
    assert!(
        xfcc.starts_with("Hash=")
            && xfcc.contains("CN=alice")
            && xfcc.contains("URI=spiffe://tests/alice"),
        "{xfcc}"
    );
    assert_eq!(header(&seen, "client-cert"), None, "XFCC only: {seen:?}");
    // A certificate shown must still verify.
    refused(&s.curl("opt.test", Some("mallory"), &[]), "unknown ca");
}

#[test]
fn identity_fields_sent_by_a_client_never_reach_an_upstream_of_a_server_without_client_auth() {
    let s = setup("mtls-spoof");
    let seen = s.seen(&s.curl(
        "plain.test",
        None,
        &[
            "-H",
            "Client-Cert: :Zm9yZ2Vk:",
            "-H",
            "Client-Cert-Chain: :Zm9yZ2Vk:",
            "-H",
            "X-Forwarded-Client-Cert: Hash=forged",
            "-H",
            "X-Client-Verify: SUCCESS",
            "-H",
            "x_client_verify: SUCCESS",
            "-H",
            "X-Client_Verify: SUCCESS",
            "-H",
            "client_cert: :Zm9yZ2Vk:",
            "-H",
            "Client_Cert_Chain: :Zm9yZ2Vk:",
            "-H",
            "x_forwarded_client_cert: Hash=forged",
            "-H",
            "X-Any_Underscored: kept?",
        ],
    ));
    // Under every spelling: CGI, WSGI and PHP read `x_client_verify` and
    // `x-client-verify` as the same HTTP_X_CLIENT_VERIFY. Names with an underscore do
    // not pass at all (nginx's `underscores_in_headers off`).
    for name in [
        "client-cert",
        "client-cert-chain",
        "x-forwarded-client-cert",
        "x-client-verify",
    ] {
        let spelled = |n: &str| n.replace('_', "-") == name;
        assert!(!seen.iter().any(|(n, _)| spelled(n)), "{name}: {seen:?}");
    }
    assert!(!seen.iter().any(|(n, _)| n.contains('_')), "{seen:?}");
}

#[test]
fn a_request_for_a_server_of_another_client_auth_policy_is_misdirected() {
    let s = setup("mtls-421");
    // alice's handshake was for opt.test (optional); Host names req.test (required).
    let out = s.curl(
        "opt.test",
        Some("alice"),
        &[
            "-o",
            "/dev/null",
            "-w",
            "%{http_code}",
            "-H",
            "Host: req.test",
        ],
    );
    assert_eq!(String::from_utf8_lossy(&out.stdout), "421");
    // And the other way: a handshake that showed no certificate cannot reach req.test.
    let out = s.curl(
        "plain.test",
        None,
        &[
            "-o",
            "/dev/null",
            "-w",
            "%{http_code}",
            "-H",
            "Host: req.test",
        ],
    );
    assert_eq!(String::from_utf8_lossy(&out.stdout), "421");
}

/// A session from a server that asked for no certificate resumes there, but not once a
/// reload has made that server require one: the ticket names the policy it was issued
/// under (rustls restores the client's certificate from a ticket and verifies nothing
/// on resumption, so without the tag the client would be in without a certificate).
/// Another server's name never resumes it either (rustls checks SNI).
#[test]
fn a_session_does_not_resume_under_another_client_auth_policy_even_for_the_same_name() {
    let s = setup("mtls-tickets");
    let port = s.server.port().to_string();
    let sess = s.dir.path("plain.sess");
    let connect = |name: &str, extra: &[&str]| -> String {
        let out = run(Command::new("openssl")
            .args([
                "s_client",
                "-connect",
                &format!("127.0.0.1:{port}"),
                "-servername",
                name,
            ])
            .args(["-tls1_3", "-ign_eof"])
            .args(extra)
            .stdin(Stdio::null()));
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let first = connect("plain.test", &["-sess_out", sess.to_str().unwrap()]);
    assert!(first.contains("New,"), "{first}");
    let again = connect("plain.test", &["-sess_in", sess.to_str().unwrap()]);
    assert!(
        again.contains("Reused,"),
        "the same policy resumes: {again}"
    );
    let other = connect("req.test", &["-sess_in", sess.to_str().unwrap()]);
    assert!(!other.contains("Reused,"), "{other}");
    // plain.test now requires a certificate; the ticket (keys kept across reloads) must
    // not let a client without one in.
    let conf = s.dir.path("terminus.toml");
    let text = std::fs::read_to_string(&conf).unwrap().replace(
        "names = [\"plain.test\"]\n",
        &format!(
            "names = [\"plain.test\"]\nclient_auth = {{ mode = \"required\", ca = \"{}\" }}\n",
            s.dir.path("clients.pem").display()
        ),
    );
    std::fs::write(&conf, text).unwrap();
    s.server.signal("HUP");
    eventually(Duration::from_secs(10), "the reload in force", || {
        !s.curl("plain.test", None, &[]).status.success()
    });
    let after = connect("plain.test", &["-sess_in", sess.to_str().unwrap()]);
    assert!(
        !after.contains("Reused,"),
        "resumed under a policy requiring certificates: {after}"
    );
}

#[test]
fn client_auth_settings_that_cannot_work_are_refused_at_their_line() {
    let dir = TestDir::new("mtls-config");
    for (text, says) in [
        ("[[server]]\nnames = [\"a.test\"]\nclient_auth = { mode = \"sometimes\", ca = \"x.pem\" }\n", "not a mode"),
        ("[[server]]\nnames = [\"a.test\"]\nclient_auth = { mode = \"required\" }\n", "needs ca"),
        ("[[server]]\nnames = [\"a.test\"]\nclient_auth = { ca = \"missing.pem\" }\n", "missing.pem"),
    ] {
        let conf = dir.write("bad.toml", text);
        let out = run(Command::new(terminus_bin()).args(["check", "--config", conf.to_str().unwrap()]));
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success() && err.contains(says) && err.contains("bad.toml:"), "{text}\n{err}");
    }
}
