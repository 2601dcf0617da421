//! Certificates from ACME, against Pebble (the ACME test CA, its validation on) and
//! pebble-challtestsrv (its DNS, answering 127.0.0.1 for every name): issuance over
//! HTTP-01 and TLS-ALPN-01, both key types checked with curl and openssl against
//! Pebble's root; a restart with valid certificates orders nothing; a short-lived
//! certificate renews while open connections carry on; with the CA gone the renewal
//! backs off and the old certificate is served. Pebble refuses 5% of nonces (its
//! default), so every run also goes through instant-acme's bad-nonce retries. The plain
//! listener and the 400 for plain HTTP on a TLS port, and the `[acme]` config errors,
//! need no CA.

use std::net::UdpSocket;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant, SystemTime};

use crate::harness::*;
use terminus_testkit::Redis;
use terminus_testkit::{repo, runs_here, Need};

const PEBBLE: &str = "github.com/letsencrypt/pebble/v2";
const PEBBLE_VERSION: &str = "v2.10.1";

/// `name` where `.ci/run` installs it (`target/tools`), else in Go's bin directory.
fn go_tool(name: &str) -> Option<PathBuf> {
    let local = repo().join("target/tools").join(name);
    if local.exists() {
        return Some(local);
    }
    let gopath = Command::new("go").args(["env", "GOPATH"]).output().ok()?;
    let bin = PathBuf::from(String::from_utf8_lossy(&gopath.stdout).trim())
        .join("bin")
        .join(name);
    bin.exists().then_some(bin)
}

/// Pebble's own test certificates (its HTTPS listener's, and the root that signs it),
/// from the module `go install` brought into Go's module cache.
fn pebble_certs() -> Option<PathBuf> {
    let out = Command::new("go")
        .args(["env", "GOMODCACHE"])
        .output()
        .ok()?;
    let dir = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim())
        .join(format!("{PEBBLE}@{PEBBLE_VERSION}"))
        .join("test/certs");
    dir.join("pebble.minica.pem").exists().then_some(dir)
}

/// Whether a DNS server at 127.0.0.1:`port` answers a query (for a.test's A record).
fn dns_answers(port: u16) -> bool {
    let socket = UdpSocket::bind("127.0.0.1:0").unwrap();
    socket
        .set_read_timeout(Some(Duration::from_millis(200)))
        .unwrap();
    // Header: id, recursion desired, one question; then a.test, type A, class IN.
    let query = [
        0x12, 0x34, 0x01, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 1, b'a', 4, b't',
        b'e', b's', b't', 0, 0x00, 0x01, 0x00, 0x01,
    ];
    if socket.send_to(&query, ("127.0.0.1", port)).is_err() {
        return false;
    }
    let mut answer = [0u8; 512];
    matches!(socket.recv_from(&mut answer), Ok((n, _)) if n >= 12 && answer[..2] == [0x12, 0x34])
}

/// Starts pebble-challtestsrv's DNS (UDP and TCP) on a free port and waits until it
/// answers: Pebble resolves every name it validates there (over TCP too), and a
/// validation before the DNS server listens fails with "connection refused". A server
/// that exits (its port, free on UDP and TCP when chosen, taken meanwhile by another
/// test) or does not answer within 10 s is stopped and started again on another port,
/// three times at most: CI saw one not answer within 10 s once.
fn start_challtestsrv(challtestsrv: &Path) -> (Child, u16) {
    for _ in 0..3 {
        let dns_port = loop {
            let udp = UdpSocket::bind("127.0.0.1:0").unwrap();
            let port = udp.local_addr().unwrap().port();
            if std::net::TcpListener::bind(("127.0.0.1", port)).is_ok() {
                break port;
            }
        };
        let mut dns = Command::new(challtestsrv)
            .args([
                "-defaultIPv4",
                "127.0.0.1",
                "-defaultIPv6",
                "",
                "-dnsserver",
                &format!("127.0.0.1:{dns_port}"),
                "-http01",
                "",
                "-https01",
                "",
                "-tlsalpn01",
                "",
                "-doh",
                "",
                "-management",
                &format!("127.0.0.1:{}", free_port()),
            ])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("pebble-challtestsrv");
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if dns_answers(dns_port)
                && std::net::TcpStream::connect(("127.0.0.1", dns_port)).is_ok()
            {
                return (dns, dns_port);
            }
            if dns.try_wait().ok().flatten().is_some() {
                break;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = dns.kill();
        let _ = dns.wait();
    }
    panic!("pebble-challtestsrv's DNS did not answer on three ports in turn");
}

/// A Pebble CA with its DNS, stopped (by PID) when dropped.
struct Pebble {
    pebble: Option<Child>,
    dns: Child,
    dir: TestDir,
    acme_port: u16,
    mgmt_port: u16,
    certs: PathBuf,
    binary: PathBuf,
}

impl Pebble {
    /// Pebble validating HTTP-01 on `http_port` and TLS-ALPN-01 on `tls_port` (where
    /// terminus listens), issuing 90-day certificates, and `shortlived` ones of
    /// `short_secs` to orders that ask for that profile. `None` (a visible skip) where
    /// Pebble is not installed.
    fn start(http_port: u16, tls_port: u16, short_secs: Option<u64>) -> Option<Pebble> {
        let tools = (
            go_tool("pebble"),
            go_tool("pebble-challtestsrv"),
            pebble_certs(),
        );
        let (Some(binary), Some(challtestsrv), Some(certs)) = tools else {
            runs_here(
                Need::Pebble,
                false,
                "pebble, pebble-challtestsrv or Pebble's test certificates are not installed (go install github.com/letsencrypt/pebble/v2/cmd/pebble@v2.10.1)",
            );
            return None;
        };
        let dir = TestDir::new("pebble");
        let (dns, dns_port) = start_challtestsrv(&challtestsrv);
        let profiles = match short_secs {
            None => {
                r#""default": {"description": "90 days", "validityPeriod": 7776000}"#.to_owned()
            }
            Some(secs) => format!(
                r#""default": {{"description": "90 days", "validityPeriod": 7776000}}, "shortlived": {{"description": "short", "validityPeriod": {secs}}}"#
            ),
        };
        let (acme_port, mgmt_port) = (free_port(), free_port());
        dir.write(
            "pebble.json",
            format!(
                r#"{{"pebble": {{"listenAddress": "127.0.0.1:{acme_port}", "managementListenAddress": "127.0.0.1:{mgmt_port}",
 "certificate": "{c}/localhost/cert.pem", "privateKey": "{c}/localhost/key.pem",
 "httpPort": {http_port}, "tlsPort": {tls_port}, "ocspResponderURL": "", "externalAccountBindingRequired": false,
 "retryAfter": {{"authz": 1, "order": 1}}, "keyAlgorithm": "ecdsa", "profiles": {{{profiles}}}}}}}"#,
                c = certs.display()
            ),
        );
        let mut pebble = Pebble {
            pebble: None,
            dns,
            dir,
            acme_port,
            mgmt_port,
            certs,
            binary,
        };
        pebble.run(dns_port);
        Some(pebble)
    }

    fn run(&mut self, dns_port: u16) {
        let child = Command::new(&self.binary)
            .args(["-config", self.dir.path("pebble.json").to_str().unwrap()])
            .args(["-dnsserver", &format!("127.0.0.1:{dns_port}")])
            // Validation at once, not after Pebble's random sleep of up to 15 s.
            .env("PEBBLE_VA_NOSLEEP", "1")
            // Pebble refuses 5% of nonces by default (badNonce) to exercise clients'
            // retries; an order that meets one backs off for half a minute, which these
            // tests would read as a failure of what they test.
            .env("PEBBLE_WFE_NONCEREJECT", "0")
            .stdout(std::fs::File::create(self.dir.path("pebble.log")).unwrap())
            .stderr(Stdio::null())
            .spawn()
            .expect("pebble");
        self.pebble = Some(child);
        let dir = self.directory();
        let minica = self.minica();
        eventually(Duration::from_secs(20), "Pebble's directory", || {
            Command::new("curl")
                .args([
                    "-sf",
                    "--cacert",
                    minica.to_str().unwrap(),
                    &dir,
                    "-o",
                    "/dev/null",
                ])
                .status()
                .is_ok_and(|s| s.success())
        });
    }

    fn directory(&self) -> String {
        format!("https://localhost:{}/dir", self.acme_port)
    }

    /// The root that signs Pebble's own HTTPS certificate (not the certificates it issues).
    fn minica(&self) -> PathBuf {
        self.certs.join("pebble.minica.pem")
    }

    /// The root of the certificates Pebble issues (made at its start), written to a file.
    fn issuing_root(&self, dir: &TestDir) -> PathBuf {
        let out = run(Command::new("curl").args([
            "-sf",
            "--cacert",
            self.minica().to_str().unwrap(),
            &format!("https://localhost:{}/roots/0", self.mgmt_port),
        ]));
        assert!(out.status.success(), "{out:?}");
        dir.write("pebble-root.pem", out.stdout)
    }

    /// Stops the CA (by its PID), leaving its DNS up.
    fn stop(&mut self) {
        if let Some(mut child) = self.pebble.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for Pebble {
    fn drop(&mut self) {
        self.stop();
        let _ = self.dns.kill();
        let _ = self.dns.wait();
    }
}

/// A terminus site with `[acme]` from `pebble`: one server, a.test and www.a.test,
/// serving `www/`, on a TLS listener at `tls_port` and, with `http_port`, a plain one.
fn acme_site(
    dir: &TestDir,
    pebble: &Pebble,
    tls_port: u16,
    http_port: Option<u16>,
    extra: &str,
) -> PathBuf {
    acme_site_on(dir, pebble, "127.0.0.1", tls_port, http_port, extra)
}

/// [`acme_site`] on address `ip`, its configuration `terminus-<ip>.toml` and its state
/// `state-<ip>` where `ip` is not 127.0.0.1.
fn acme_site_on(
    dir: &TestDir,
    pebble: &Pebble,
    ip: &str,
    tls_port: u16,
    http_port: Option<u16>,
    extra: &str,
) -> PathBuf {
    dir.write("www/index.html", "served over ACME's certificate\n");
    let listen = match http_port {
        Some(p) => {
            format!("[\"{ip}:{tls_port}\", {{ address = \"{ip}:{p}\", plain = \"redirect\" }}]")
        }
        None => format!("[\"{ip}:{tls_port}\"]"),
    };
    let (conf, state) = match ip {
        "127.0.0.1" => ("terminus.toml".to_owned(), "state".to_owned()),
        _ => (format!("terminus-{ip}.toml"), format!("state-{ip}")),
    };
    dir.write(
        &conf,
        format!(
            "listen = {listen}\nworkers = 1\n[acme]\ndirectory = \"{}\"\nca = \"{}\"\nstate_dir = \"{}\"\ncontact = [\"mailto:ops@a.test\"]\n{extra}\n[[server]]\nnames = [\"a.test\", \"www.a.test\"]\ncertificates = \"acme\"\nroot = \"{}\"\n",
            pebble.directory(),
            pebble.minica().display(),
            dir.path(&state).display(),
            dir.path("www").display(),
        ),
    )
}

/// `[fleet]` lines for `redis`, its key file written in `dir`, reading the store every
/// `poll`.
fn fleet_settings(dir: &TestDir, redis: &Redis, poll: &str) -> String {
    let key_file = dir.write(
        "fleet.key",
        "00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff\n",
    );
    format!(
        "[fleet]\nstore = \"{}\"\nkey_file = \"{}\"\npoll = \"{poll}\"\n",
        redis.url(),
        key_file.display()
    )
}

fn orders(server: &Server, result: &str) -> f64 {
    server.metric(
        "terminus_acme_orders_total",
        &[&format!("result=\"{result}\"")],
    )
}

/// Waits for `n` certificates issued, failing at once on a failed order.
fn issued(server: &Server, n: f64) {
    eventually(Duration::from_secs(90), "the certificates issued", || {
        assert_eq!(
            orders(server, "failed"),
            0.0,
            "an order failed: {}",
            server.stderr()
        );
        orders(server, "issued") >= n
    });
    // The reload that puts it live follows the order.
    std::thread::sleep(Duration::from_millis(300));
}

/// What `openssl s_client` sees at `port` for `name` when it offers only `sigalgs`,
/// verifying against `root`: (verified, the leaf's serial, the whole output).
fn served(port: u16, name: &str, sigalgs: &str, root: &Path) -> (bool, String, String) {
    served_on("127.0.0.1", port, name, sigalgs, root)
}

/// [`served`] at `ip`.
fn served_on(
    ip: &str,
    port: u16,
    name: &str,
    sigalgs: &str,
    root: &Path,
) -> (bool, String, String) {
    let out = run(Command::new("openssl")
        .args([
            "s_client",
            "-connect",
            &format!("{ip}:{port}"),
            "-servername",
            name,
            "-sigalgs",
            sigalgs,
            "-CAfile",
            root.to_str().unwrap(),
            "-verify_hostname",
            name,
            "-showcerts",
        ])
        .stdin(Stdio::null()));
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let verified = text.contains("Verify return code: 0 (ok)");
    let leaf = text
        .split("-----BEGIN CERTIFICATE-----")
        .nth(1)
        .and_then(|s| s.split("-----END CERTIFICATE-----").next())
        .map(|b| format!("-----BEGIN CERTIFICATE-----{b}-----END CERTIFICATE-----\n"))
        .unwrap_or_default();
    let mut x509 = Command::new("openssl")
        .args(["x509", "-noout", "-serial"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    use std::io::Write;
    x509.stdin
        .take()
        .unwrap()
        .write_all(leaf.as_bytes())
        .unwrap();
    let serial = String::from_utf8_lossy(&x509.wait_with_output().unwrap().stdout)
        .trim()
        .to_owned();
    (verified, serial, text)
}

fn curl_verified(port: u16, name: &str, root: &Path) -> std::process::Output {
    run(Command::new("curl").args([
        "-sS",
        "--cacert",
        root.to_str().unwrap(),
        "--resolve",
        &format!("{name}:{port}:127.0.0.1"),
        &format!("https://{name}:{port}/index.html"),
    ]))
}

#[cfg(unix)]
fn mode(path: &Path) -> u32 {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(path).unwrap().permissions().mode() & 0o777
}

#[test]
fn http01_issues_an_rsa_and_an_ecdsa_certificate_served_and_kept_0600() {
    let _alone = exclusive();
    let (tls_port, http_port) = (free_port(), free_port());
    let Some(pebble) = Pebble::start(http_port, tls_port, None) else {
        return;
    };
    let dir = TestDir::new("acme-http01");
    let conf = acme_site(&dir, &pebble, tls_port, Some(http_port), "");
    let server = ServerBuilder::config(&conf).admin().start();
    // Before the orders complete, the self-signed pair serves (and says so).
    eventually(
        Duration::from_secs(5),
        "the self-signed pair logged",
        || {
            server
                .stderr()
                .contains("no certificate from the CA yet; the self-signed ones are served")
        },
    );
    issued(&server, 2.0);
    let root = pebble.issuing_root(&dir);
    let out = curl_verified(tls_port, "a.test", &root);
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "served over ACME's certificate\n",
        "{out:?}"
    );
    for (sigalgs, key) in [
        ("RSA-PSS+SHA256", "rsa2048"),
        ("ECDSA+SHA256", "ecdsa-p256"),
    ] {
        let (verified, serial, text) = served(tls_port, "www.a.test", sigalgs, &root);
        assert!(verified && !serial.is_empty(), "{key}: {text}");
        let file = dir.path(&format!("state/certificates/a.test/{key}.pem"));
        assert_eq!(mode(&file), 0o600, "{}", file.display());
        let expiry = server.metric(
            "terminus_acme_certificate_expiry_seconds",
            &["name=\"a.test\"", &format!("key=\"{key}\"")],
        );
        let now = SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .unwrap()
            .as_secs_f64();
        assert!(expiry > now + 80.0 * 86_400.0, "{key} expires at {expiry}");
    }
    let accounts: Vec<_> = std::fs::read_dir(dir.path("state/accounts"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    assert_eq!(accounts.len(), 1, "{accounts:?}");
    assert_eq!(mode(&accounts[0]), 0o600);
}

#[test]
fn tls_alpn01_issues_with_no_plain_listener_and_a_restart_with_valid_certificates_orders_nothing() {
    let _alone = exclusive();
    let tls_port = free_port();
    // Pebble's HTTP-01 port is closed: only TLS-ALPN-01 can prove the names.
    let Some(pebble) = Pebble::start(free_port(), tls_port, None) else {
        return;
    };
    let dir = TestDir::new("acme-alpn");
    let conf = acme_site(&dir, &pebble, tls_port, None, "");
    let mut server = ServerBuilder::config(&conf).admin().start();
    issued(&server, 2.0);
    let root = pebble.issuing_root(&dir);
    let before: Vec<String> = ["RSA-PSS+SHA256", "ECDSA+SHA256"]
        .iter()
        .map(|s| {
            let (verified, serial, text) = served(tls_port, "a.test", s, &root);
            assert!(verified && !serial.is_empty(), "{text}");
            serial
        })
        .collect();
    assert_ne!(before[0], before[1], "an RSA and an ECDSA certificate");
    // No order waits now: a handshake offering acme-tls/1 alone gets no challenge
    // certificate (nor the site's: the site speaks no acme-tls/1, so rustls refuses with
    // no_application_protocol before any certificate).
    let out = run(Command::new("openssl")
        .args([
            "s_client",
            "-connect",
            &format!("127.0.0.1:{tls_port}"),
            "-servername",
            "a.test",
            "-alpn",
            "acme-tls/1",
            "-CAfile",
            root.to_str().unwrap(),
        ])
        .stdin(Stdio::null()));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(!text.contains("BEGIN CERTIFICATE"), "{text}");
    server.signal("TERM");
    server.wait_exit(Duration::from_secs(10));
    drop(server);
    // Orders as Pebble counts them (new-order requests), across the restart.
    let new_orders = || {
        std::fs::read_to_string(pebble.dir.path("pebble.log"))
            .unwrap()
            .matches("POST /order-plz")
            .count()
    };
    let placed = new_orders();
    assert!(placed >= 2, "Pebble's log counts the orders: {placed}");
    let server = ServerBuilder::config(&conf).admin().start();
    // A sleep on purpose: an order that is never placed can only be watched for, here
    // 3 s (orders start at once after a start that needs them).
    std::thread::sleep(Duration::from_secs(3));
    assert_eq!(
        (
            new_orders(),
            orders(&server, "issued"),
            orders(&server, "failed")
        ),
        (placed, 0.0, 0.0),
        "a restart with valid certificates placed an order"
    );
    let after: Vec<String> = ["RSA-PSS+SHA256", "ECDSA+SHA256"]
        .iter()
        .map(|s| served(tls_port, "a.test", s, &root).1)
        .collect();
    assert_eq!(after, before, "the stored certificates are served again");
    let next = server.metric(
        "terminus_acme_next_renewal_seconds",
        &["name=\"a.test\"", "key=\"rsa2048\""],
    );
    let now = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64();
    assert!(
        next > now + 86_400.0,
        "the next renewal is scheduled: {next}"
    );
}

/// A keep-alive HTTPS connection held open by Python's ssl: one request, then another
/// when told (a line on stdin); prints each status.
const HELD_CONNECTION: &str = r#"
import socket, ssl, sys
port, name, root = int(sys.argv[1]), sys.argv[2], sys.argv[3]
ctx = ssl.create_default_context(cafile=root)
conn = ctx.wrap_socket(socket.create_connection(("127.0.0.1", port)), server_hostname=name)
f = conn.makefile("rb")
def ask():
    conn.sendall(b"GET /index.html HTTP/1.1\r\nHost: " + name.encode() + b"\r\n\r\n")
    status = f.readline().split()[1].decode()
    length = 0
    while True:
        line = f.readline()
        if line in (b"\r\n", b""):
            break
        if line.lower().startswith(b"content-length:"):
            length = int(line.split(b":")[1])
    f.read(length)
    print(status, flush=True)
ask()
sys.stdin.readline()
ask()
"#;

#[test]
fn a_short_lived_certificate_renews_seen_by_new_connections_while_an_open_one_carries_on() {
    let _alone = exclusive();
    let tls_port = free_port();
    let Some(pebble) = Pebble::start(free_port(), tls_port, Some(30)) else {
        return;
    };
    let dir = TestDir::new("acme-renew");
    let conf = acme_site(&dir, &pebble, tls_port, None, "profile = \"shortlived\"");
    let server = ServerBuilder::config(&conf).admin().start();
    issued(&server, 2.0);
    let root = pebble.issuing_root(&dir);
    let (verified, first, text) = served(tls_port, "a.test", "ECDSA+SHA256", &root);
    assert!(verified, "{text}");
    let mut held = Command::new("python3")
        .args(["-c", HELD_CONNECTION, &tls_port.to_string(), "a.test"])
        .arg(&root)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = std::io::BufRead::lines(std::io::BufReader::new(held.stdout.take().unwrap()));
    assert_eq!(lines.next().unwrap().unwrap(), "200");
    // A 30-second certificate renews within its life (Pebble's ARI window is all of
    // it): new connections see the new serial.
    let mut renewed = String::new();
    eventually(
        Duration::from_secs(60),
        "the ECDSA certificate renewed",
        || {
            renewed = served(tls_port, "a.test", "ECDSA+SHA256", &root).1;
            !renewed.is_empty() && renewed != first
        },
    );
    assert!(orders(&server, "issued") >= 3.0);
    // The connection made on the old certificate is still served.
    use std::io::Write;
    held.stdin.as_mut().unwrap().write_all(b"go\n").unwrap();
    assert_eq!(
        lines.next().unwrap().unwrap(),
        "200",
        "the old connection after renewal"
    );
    held.wait().unwrap();
    let out = curl_verified(tls_port, "a.test", &root);
    assert!(out.status.success(), "{out:?}");
}

#[test]
fn with_the_ca_gone_renewal_backs_off_and_the_current_certificate_is_still_served() {
    let _alone = exclusive();
    let tls_port = free_port();
    let Some(mut pebble) = Pebble::start(free_port(), tls_port, Some(40)) else {
        return;
    };
    let dir = TestDir::new("acme-ca-gone");
    let conf = acme_site(&dir, &pebble, tls_port, None, "profile = \"shortlived\"");
    let server = ServerBuilder::config(&conf).admin().start();
    issued(&server, 2.0);
    let root = pebble.issuing_root(&dir);
    let (_, serial, _) = served(tls_port, "a.test", "ECDSA+SHA256", &root);
    let issued_before = orders(&server, "issued");
    // Stopped by its PID; the renewal comes due within the 40 s certificate's life.
    pebble.stop();
    eventually(Duration::from_secs(60), "a renewal failing", || {
        orders(&server, "failed") >= 1.0
    });
    let failed_at = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64();
    // The first retry is drawn from 30-60 s (a minute, jittered into its upper half),
    // for whichever certificate failed; the other one either waits its turn or failed
    // too.
    let next: Vec<f64> = ["rsa2048", "ecdsa-p256"]
        .iter()
        .map(|k| {
            server.metric(
                "terminus_acme_next_renewal_seconds",
                &["name=\"a.test\"", &format!("key=\"{k}\"")],
            )
        })
        .collect();
    assert!(
        next.iter().any(|&n| n >= failed_at + 25.0),
        "a retry is scheduled half a minute or more away: {next:?} at {failed_at}"
    );
    assert_eq!(orders(&server, "issued"), issued_before);
    let (verified, now_served, text) = served(tls_port, "a.test", "ECDSA+SHA256", &root);
    assert!(
        verified,
        "the current certificate, still valid, is served: {text}"
    );
    assert_eq!(now_served, serial);
    assert!(
        server.stderr().contains("trying again in"),
        "the failure is logged with its retry: {}",
        server.stderr()
    );
}

#[test]
fn plain_http_to_a_tls_port_gets_a_400_page_and_a_plain_listener_redirects_with_308() {
    let dir = TestDir::new("plain-listener");
    let (tls_port, http_port) = (free_port(), free_port());
    dir.write(
        "terminus.toml",
        format!(
            "listen = [\"127.0.0.1:{tls_port}\", {{ address = \"127.0.0.1:{http_port}\", plain = \"redirect\" }}]\nworkers = 1\n"
        ),
    );
    let server = ServerBuilder::config(&dir.path("terminus.toml"))
        .admin()
        .start();
    assert_eq!(server.port(), tls_port);
    let out = run(Command::new("curl").args([
        "-sS",
        "-i",
        &format!("http://127.0.0.1:{tls_port}/index.html"),
    ]));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.starts_with("HTTP/1.1 400")
            && text.contains("The plain HTTP request was sent to HTTPS port"),
        "{out:?}"
    );
    eventually(
        Duration::from_secs(5),
        "the plain-HTTP failure counted",
        || {
            server.metric(
                "terminus_handshake_failures_total",
                &["reason=\"plain_http\""],
            ) == 1.0
        },
    );
    // Redirected to the same host and target over HTTPS, the method kept (308).
    for (method, target) in [("GET", "/a/b?c=1"), ("POST", "/form")] {
        let out = run(Command::new("curl").args([
            "-sS",
            "-o",
            "/dev/null",
            "-X",
            method,
            "-w",
            "%{http_code} %{redirect_url}",
            "-H",
            "Host: www.example.test",
            &format!("http://127.0.0.1:{http_port}{target}"),
        ]));
        assert_eq!(
            String::from_utf8_lossy(&out.stdout),
            format!("308 https://www.example.test:{tls_port}{target}"),
            "{method} {target}"
        );
    }
    // No Host (HTTP/1.0): the default server's name, as nginx's $host.
    let out = run(Command::new("curl").args([
        "-sS",
        "-o",
        "/dev/null",
        "-w",
        "%{http_code} %{redirect_url}",
        "--http1.0",
        "-H",
        "Host:",
        &format!("http://127.0.0.1:{http_port}/"),
    ]));
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        format!("308 https://localhost:{tls_port}/")
    );
    // An unknown challenge token is not answered: it is redirected like any path.
    let out = run(Command::new("curl").args([
        "-sS",
        "-o",
        "/dev/null",
        "-w",
        "%{http_code}",
        "-H",
        "Host: a.test",
        &format!("http://127.0.0.1:{http_port}/.well-known/acme-challenge/nope"),
    ]));
    assert_eq!(String::from_utf8_lossy(&out.stdout), "308");
}

/// A fleet of two (127.0.0.1 and 127.0.0.2 at one port, one Redis), Pebble validating
/// HTTP-01 at 127.0.0.1 only. The instance at .2 starts first and orders both
/// certificates under the server's lock; the CA's validation reaches the instance at .1,
/// which answers from the store; .1 then takes both certificates from the store without
/// an order of its own, and the two serve the same serials. The store holds them sealed.
#[test]
fn a_fleet_orders_each_certificate_once_answers_the_ca_on_any_instance_and_serves_it_everywhere() {
    let _alone = exclusive();
    let Some(redis) = Redis::start() else {
        return;
    };
    let (tls_port, http_port) = (free_port(), free_port());
    let Some(pebble) = Pebble::start(http_port, tls_port, None) else {
        return;
    };
    let dir = TestDir::new("acme-fleet");
    let fleet = fleet_settings(&dir, &redis, "2s");
    let orderer = ServerBuilder::config(&acme_site_on(
        &dir,
        &pebble,
        "127.0.0.2",
        tls_port,
        Some(http_port),
        &fleet,
    ))
    .admin()
    .start();
    // Ordering: the lock is held and the answers are in the store; the CA is told two
    // polls (4 s) later, by when the instance at .1 answers them too.
    eventually(Duration::from_secs(30), "the .2 instance ordering", || {
        redis
            .cli(&["EXISTS", "terminus:acme:lock:order:a.test"])
            .trim()
            == "1"
            && redis.cli(&["HLEN", "terminus:acme:challenges"]).trim() != "0"
    });
    let answerer = ServerBuilder::config(&acme_site_on(
        &dir,
        &pebble,
        "127.0.0.1",
        tls_port,
        Some(http_port),
        &fleet,
    ))
    .admin()
    .start();
    issued(&orderer, 2.0);
    eventually(
        Duration::from_secs(30),
        "both taken by .1 from the store",
        || answerer.metric("terminus_acme_fleet_certificates_total", &["way=\"taken\""]) >= 2.0,
    );
    assert_eq!(
        orders(&answerer, "issued") + orders(&answerer, "failed"),
        0.0,
        "{}",
        answerer.stderr()
    );
    assert_eq!(
        orderer.metric("terminus_acme_fleet_certificates_total", &["way=\"given\""]),
        2.0
    );
    std::thread::sleep(Duration::from_millis(300));
    let root = pebble.issuing_root(&dir);
    for sigalgs in ["RSA-PSS+SHA256", "ECDSA+SHA256"] {
        let (ok1, serial1, text1) = served_on("127.0.0.1", tls_port, "a.test", sigalgs, &root);
        let (ok2, serial2, text2) = served_on("127.0.0.2", tls_port, "a.test", sigalgs, &root);
        assert!(ok1 && ok2, "{text1}\n{text2}");
        assert!(
            !serial1.is_empty() && serial1 == serial2,
            "{serial1} vs {serial2}"
        );
    }
    for entry in [
        "terminus:acme:cert:a.test:rsa2048",
        "terminus:acme:cert:a.test:ecdsa-p256",
    ] {
        let sealed = redis.cli_bytes(&["GET", entry]);
        assert!(sealed.len() > 500, "{entry}: {} bytes", sealed.len());
        assert!(
            !sealed.windows(11).any(|w| w == b"PRIVATE KEY")
                && !sealed.windows(5).any(|w| w == b"-----"),
            "{entry} is kept in the clear"
        );
    }
    // One account for the fleet, made by the orderer and taken by the other.
    let account = |state: &str| {
        let dir = dir.path(&format!("{state}/accounts"));
        std::fs::read_dir(&dir).map_or(0, |d| d.count())
    };
    assert_eq!((account("state-127.0.0.2"), account("state")), (1, 0));
    // The answers were withdrawn.
    assert_eq!(redis.cli(&["HLEN", "terminus:acme:challenges"]).trim(), "0");
}

/// `terminus check` reaches the CA: Pebble's directory answers (with ARI); a profile
/// it does not offer is refused by name; a CA that does not answer is a warning.
#[test]
fn terminus_check_reaches_the_ca_refuses_a_profile_it_does_not_offer_and_warns_when_it_is_down() {
    let tls_port = free_port();
    let Some(pebble) = Pebble::start(free_port(), tls_port, None) else {
        return;
    };
    let dir = TestDir::new("acme-check");
    let check = |conf: &Path| {
        let out =
            run(Command::new(terminus_bin()).args(["check", "--config", conf.to_str().unwrap()]));
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        (out.status.success(), text)
    };
    let (ok, text) = check(&acme_site(&dir, &pebble, tls_port, None, ""));
    assert!(ok, "{text}");
    assert!(
        text.contains("answers as an ACME directory with renewal information (ARI)"),
        "{text}"
    );
    let (ok, text) = check(&acme_site(
        &dir,
        &pebble,
        tls_port,
        None,
        "profile = \"nosuch\"",
    ));
    assert!(!ok, "{text}");
    assert!(
        text.contains("profile = \"nosuch\", but") && text.contains("offers default"),
        "{text}"
    );
    let conf = acme_site(&dir, &pebble, tls_port, None, "");
    let closed = free_port();
    let text = std::fs::read_to_string(&conf).unwrap().replace(
        &pebble.directory(),
        &format!("https://localhost:{closed}/dir"),
    );
    let (ok, text) = check(&dir.write("down.toml", text));
    assert!(ok, "{text}");
    assert!(
        text.contains("warning")
            && text.contains("servers would start with self-signed certificates"),
        "{text}"
    );
}

/// A CA that answers 429 with a Retry-After of three hours is left alone that long, not
/// the first backoff's minute (instant-acme does not read a 429's Retry-After; terminus's
/// client does).
#[test]
fn a_rate_limited_ca_is_left_alone_as_long_as_its_retry_after_asks() {
    let Some(certs) = pebble_certs() else {
        runs_here(
            Need::Pebble,
            false,
            "Pebble's test certificates are not installed (go install github.com/letsencrypt/pebble/v2/cmd/pebble@v2.10.1)",
        );
        return;
    };
    let dir = TestDir::new("acme-429");
    let script = dir.write(
        "ca.py",
        r#"import http.server, ssl, sys
class Limited(http.server.BaseHTTPRequestHandler):
    def answer(self):
        body = b'{"type": "urn:ietf:params:acme:error:rateLimited", "detail": "too many requests"}'
        self.send_response(429)
        self.send_header("Retry-After", "10800")
        self.send_header("Content-Type", "application/problem+json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    do_GET = do_HEAD = do_POST = answer
    def log_message(self, *args):
        pass
server = http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), Limited)
context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
context.load_cert_chain(sys.argv[2], sys.argv[3])
server.socket = context.wrap_socket(server.socket, server_side=True)
server.serve_forever()
"#,
    );
    let port = free_port();
    let mut ca = Command::new("python3")
        .arg(&script)
        .arg(port.to_string())
        .arg(certs.join("localhost/cert.pem"))
        .arg(certs.join("localhost/key.pem"))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("python3");
    eventually(Duration::from_secs(10), "the limited CA listening", || {
        std::net::TcpStream::connect(("127.0.0.1", port)).is_ok()
    });
    dir.write("www/index.html", "hi\n");
    let conf = dir.write(
        "terminus.toml",
        format!(
            "listen = [\"127.0.0.1:{}\"]\nworkers = 1\n[acme]\ndirectory = \"https://localhost:{port}/dir\"\nca = \"{}\"\nstate_dir = \"{}\"\n[[server]]\nnames = [\"a.test\"]\ncertificates = \"acme\"\nroot = \"{}\"\n",
            free_port(),
            certs.join("pebble.minica.pem").display(),
            dir.path("state").display(),
            dir.path("www").display(),
        ),
    );
    let server = ServerBuilder::config(&conf).admin().start();
    eventually(Duration::from_secs(20), "the account refused", || {
        server.stderr().contains("no account at")
    });
    let _ = ca.kill();
    let _ = ca.wait();
    let log = server.stderr();
    assert!(
        log.contains("the CA answered 429 Too Many Requests and asked to be left alone for 2 h)")
            && log.contains("trying again in 2 h"),
        "{log}"
    );
}

/// In a fleet, a failed order keeps the server's lock for its backoff: the other
/// instance does not try the same names meanwhile, so the CA counts one failure, not
/// one per instance. (Pebble validates HTTP-01 at a port where no instance listens.)
#[test]
fn in_a_fleet_a_failed_order_holds_the_lock_for_its_backoff_and_no_other_instance_tries() {
    let _alone = exclusive();
    let Some(redis) = Redis::start() else {
        return;
    };
    let (tls_port, http_port, nowhere) = (free_port(), free_port(), free_port());
    let Some(pebble) = Pebble::start(nowhere, tls_port, None) else {
        return;
    };
    let dir = TestDir::new("acme-fleet-fail");
    let fleet = fleet_settings(&dir, &redis, "1s");
    let instances: Vec<Server> = ["127.0.0.1", "127.0.0.2"]
        .iter()
        .map(|ip| {
            ServerBuilder::config(&acme_site_on(
                &dir,
                &pebble,
                ip,
                tls_port,
                Some(http_port),
                &fleet,
            ))
            .admin()
            .start()
        })
        .collect();
    let failed = || -> f64 { instances.iter().map(|s| orders(s, "failed")).sum() };
    eventually(Duration::from_secs(60), "an order failed", || {
        failed() >= 1.0
    });
    // The first backoff is 30 to 60 s; the other instance looks for the lock every 2 s.
    std::thread::sleep(Duration::from_secs(8));
    let logs: Vec<String> = instances.iter().map(Server::stderr).collect();
    assert_eq!(failed(), 1.0, "{logs:#?}");
    let ttl: i64 = redis
        .cli(&["PTTL", "terminus:acme:lock:order:a.test"])
        .trim()
        .parse()
        .unwrap();
    assert!(ttl > 15_000, "the lock lapses in {ttl} ms");
}

#[test]
fn acme_settings_that_cannot_work_are_refused_at_their_line() {
    let dir = TestDir::new("acme-config");
    let cases = [
        (
            "[acme]\ndirectory = \"https://ca.test/dir\"\nstate_dir = \"s\"\n[[server]]\nnames = [\"*.a.test\"]\ncertificates = \"acme\"\n",
            "DNS-01",
            5,
        ),
        (
            "listen = [\"127.0.0.1:0\"]\n[acme]\ndirectory = \"https://ca.test/dir\"\nstate_dir = \"s\"\nchallenge = \"http-01\"\n",
            "needs a plain-HTTP listener",
            2,
        ),
        (
            "[acme]\ndirectory = \"https://ca.test/dir\"\n",
            "needs state_dir",
            1,
        ),
        (
            "[[server]]\nnames = [\"a.test\"]\ncertificates = \"acme\"\n",
            "needs an [acme] issuer",
            3,
        ),
        (
            "listen = [{ address = \"127.0.0.1:0\", plain = \"serve\" }]\n",
                        "not a plain-HTTP mode",
            1,
        ),
        (
            "[acme]\ndirectory = \"http://ca.test/dir\"\nstate_dir = \"s\"\n",
            "not an https:// URL",
            1,
        ),
        (
            "[acme]\ndirectory = \"https://ca.test/dir\"\nstate_dir = \"s\"\n[[server]]\nnames = [\"a.test\"]\ncertificates = \"acme\"\n[[server]]\nnames = [\"b.test\", \"A.test\"]\ncertificates = \"acme\"\n",
            "\"A.test\" is already a name of the [[server]] at line 5",
            8,
        ),
        (
            "[acme]\ndirectory = \"https://ca.test/dir\"\nstate_dir = \"s\"\n[[server]]\nnames = [\"..\"]\ncertificates = \"acme\"\n",
            "not a DNS name",
            5,
        ),
    ];
    for (text, says, line) in cases {
        check_refuses(&dir, text, says, line);
    }
}
