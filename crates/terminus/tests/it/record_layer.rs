//! terminus's own TLS record layer (`tls::record`, `tls::secure::SecureStream`) against
//! real TLS clients, black box: openssl s_client (KeyUpdate both ways on each TLS 1.3
//! suite, TLS 1.2's AEAD suites), curl and Python's ssl (bodies at record boundaries,
//! uploads, pipelined requests), Go's crypto/tls, and a rustls client for what the others
//! will not do (an oversized record header, KeyUpdates crossing a long download). Every
//! server here has `ktls = "off"`: the userspace record layer is what is tested, on every
//! kernel.

use std::io::{self, Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rustls::pki_types::ServerName;
use rustls::{AlertDescription, ClientConfig, ClientConnection, StreamOwned};
use sha2::{Digest, Sha256};
use terminus_load::{tls::client_config, TlsChoice, Trust};

use crate::harness::*;

/// The three TLS 1.3 suites, by their OpenSSL (IANA) names.
const TLS13_SUITES: [&str; 3] = [
    "TLS_AES_128_GCM_SHA256",
    "TLS_AES_256_GCM_SHA384",
    "TLS_CHACHA20_POLY1305_SHA256",
];

/// TLS 1.2's AEAD suites for an ECDSA certificate, by their OpenSSL names.
const TLS12_SUITES: [&str; 3] = [
    "ECDHE-ECDSA-AES128-GCM-SHA256",
    "ECDHE-ECDSA-AES256-GCM-SHA384",
    "ECDHE-ECDSA-CHACHA20-POLY1305",
];

/// Body sizes around a record's 16 KiB of plaintext, and one of many records.
const BOUNDARY_SIZES: [usize; 6] = [0, 1, 16383, 16384, 16385, 1 << 20];

/// A terminus with userspace TLS on an ECDSA P-256 certificate, serving `dir/www`, its
/// access log in `dir/access.log`; with `upstream`, requests under `/app/` go to it
/// (app.py).
fn start(dir: &TestDir, upstream: Option<&App>) -> Server {
    let pair = make_cert(&dir.0, "k", KeyKind::EcdsaP256, &["localhost"]);
    let mut config = Config::new(dir, &pair).before(&format!(
        "[log]\naccess = \"{}\"\n[tls]\nktls = \"off\"",
        dir.path("access.log").display()
    ));
    if let Some(app) = upstream {
        config = config
            .before(&format!(
                "[[upstream]]\nname = \"app\"\nservers = [\"{}\"]",
                app.addr()
            ))
            .in_server("[[server.route]]\npath = \"/app/\"\nupstream = \"app\"");
    }
    ServerBuilder::with(dir, &config).start()
}

/// `n` bytes in which every 8-byte word holds its own index (xor `salt`): a record
/// repeated, lost or moved shows as a different digest.
fn pattern(n: usize, salt: u64) -> Vec<u8> {
    let mut out = Vec::with_capacity(n + 8);
    let mut word = 0u64;
    while out.len() < n {
        out.extend_from_slice(&(word ^ salt).to_le_bytes());
        word += 1;
    }
    out.truncate(n);
    out
}

/// `n` bytes of text lines, none of which begins with a letter s_client takes as a
/// command (Q, R, k, K).
fn text(n: usize, tag: &str) -> Vec<u8> {
    let mut out = Vec::with_capacity(n + 64);
    let mut line = 0;
    while out.len() < n {
        out.extend_from_slice(format!("{tag} line {line:06} of the body\n").as_bytes());
        line += 1;
    }
    out.truncate(n);
    out
}

/// The bodies of the HTTP/1.1 responses in `out`, in order, with their status codes
/// (each framed by its content-length; what lies between responses is skipped).
fn responses(out: &[u8]) -> Vec<(u16, Vec<u8>)> {
    let mut found = Vec::new();
    let mut at = 0;
    while let Some(start) = find(&out[at..], b"HTTP/1.1 ").map(|i| at + i) {
        let Some(head_len) = find(&out[start..], b"\r\n\r\n") else {
            break;
        };
        let head = String::from_utf8_lossy(&out[start..start + head_len]);
        let status = head[9..12].parse().unwrap_or(0);
        let len: usize = header_value(&head, "content-length")
            .and_then(|v| v.parse().ok())
            .unwrap_or(0);
        let body_start = start + head_len + 4;
        let Some(body) = out.get(body_start..body_start + len) else {
            break;
        };
        found.push((status, body.to_vec()));
        at = body_start + len;
    }
    found
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

fn get(path: &str) -> String {
    format!("GET {path} HTTP/1.1\r\nHost: localhost\r\n\r\n")
}

/// Waits for `child` to exit, for at most `within`; kills it and fails the test after.
fn wait_exit(child: &mut Child, within: Duration, what: &str) -> std::process::ExitStatus {
    let deadline = Instant::now() + within;
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("{what} did not exit within {within:?}");
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// An interactive `openssl s_client`: what it prints is collected as it comes, and its
/// `-msg` trace (every TLS message sent and received, decrypted) goes to a file of its
/// own so that responses stay whole on standard output.
struct SClient {
    child: Child,
    stdin: Option<ChildStdin>,
    out: Arc<Mutex<Vec<u8>>>,
    reader: Option<std::thread::JoinHandle<()>>,
    msg: PathBuf,
}

impl SClient {
    fn connect(server: &Server, dir: &TestDir, name: &str, args: &[&str]) -> SClient {
        let msg = dir.path(&format!("{name}.msg"));
        let mut child = Command::new("openssl")
            .args(["s_client", "-connect", &server.addr.to_string()])
            .args(["-servername", "localhost", "-msg", "-msgfile"])
            .arg(&msg)
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("openssl s_client");
        let stdin = child.stdin.take();
        let mut stdout = child.stdout.take().unwrap();
        let out = Arc::new(Mutex::new(Vec::new()));
        let collected = out.clone();
        let reader = std::thread::spawn(move || {
            let mut buf = [0u8; 65536];
            while let Ok(n @ 1..) = stdout.read(&mut buf) {
                collected.lock().unwrap().extend_from_slice(&buf[..n]);
            }
        });
        SClient {
            child,
            stdin,
            out,
            reader: Some(reader),
            msg,
        }
    }

    fn send(&mut self, bytes: &str) {
        let stdin = self.stdin.as_mut().unwrap();
        stdin.write_all(bytes.as_bytes()).unwrap();
        stdin.flush().unwrap();
    }

    fn stdout(&self) -> Vec<u8> {
        self.out.lock().unwrap().clone()
    }

    fn msg(&self) -> String {
        std::fs::read_to_string(&self.msg).unwrap_or_default()
    }

    /// The KeyUpdate messages of one direction (`>>>` sent, `<<<` received), each as
    /// the hex of its request_update byte (`00` not requested, `01` requested).
    fn key_updates(&self, direction: &str) -> Vec<String> {
        let msg = self.msg();
        let lines: Vec<&str> = msg.lines().collect();
        lines
            .iter()
            .enumerate()
            .filter(|(_, l)| l.starts_with(direction) && l.ends_with("], KeyUpdate"))
            .map(|(i, _)| {
                let bytes = lines.get(i + 1).copied().unwrap_or("").trim();
                assert!(bytes.starts_with("18 00 00 01"), "{bytes}");
                bytes.rsplit(' ').next().unwrap().to_owned()
            })
            .collect()
    }

    fn until(&self, what: &str, mut done: impl FnMut(&SClient) -> bool) {
        let deadline = Instant::now() + Duration::from_secs(10);
        while !done(self) {
            assert!(
                Instant::now() < deadline,
                "s_client: {what}: not within 10 s; stdout:\n{}\nmessages:\n{}",
                String::from_utf8_lossy(&self.stdout()),
                self.msg()
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Sends a GET and waits for its response: the `n`th on this connection.
    fn get(&mut self, path: &str, n: usize) {
        self.send(&get(path));
        self.until(&format!("response {n} ({path})"), |c| {
            responses(&c.stdout()).len() >= n
        });
    }

    /// Sends a KeyUpdate (`k` not requesting one back, `K` requesting one) and waits
    /// until s_client has sent it.
    fn key_update(&mut self, command: &str) {
        let sent = self.key_updates(">>>").len();
        self.send(&format!("{command}\n"));
        self.until(&format!("KeyUpdate {command} sent"), |c| {
            c.key_updates(">>>").len() > sent
        });
    }

    /// Closes standard input (s_client sends close_notify and exits) and returns what
    /// it printed.
    fn finish(mut self) -> Vec<u8> {
        drop(self.stdin.take());
        wait_exit(&mut self.child, Duration::from_secs(10), "s_client");
        // The reader ends at the end of the pipe, with the last bytes.
        self.reader.take().unwrap().join().unwrap();
        self.stdout()
    }
}

impl Drop for SClient {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// s_client on each TLS 1.3 suite: a GET, `K` (KeyUpdate, update_requested), a GET, `k`
/// (update_not_requested), a GET, `K`, a GET. Every response is whole and in order, and
/// terminus answers each `K` with a KeyUpdate of its own (update_not_requested) before its
/// next response, and the `k` with none: its read key follows the client's three changes
/// (the requests after them are read) and its write key changes twice (s_client reads
/// the responses after them).
#[test]
fn s_client_key_updates_both_ways_on_every_tls13_suite_keep_responses_intact() {
    let dir = TestDir::new("rl-s13");
    let big = text(23_500, "big");
    let small = text(700, "small");
    dir.write("www/big.txt", &big);
    dir.write("www/small.txt", &small);
    let server = start(&dir, None);
    for suite in TLS13_SUITES {
        let mut c = SClient::connect(&server, &dir, suite, &["-tls1_3", "-ciphersuites", suite]);
        c.get("/big.txt", 1);
        assert!(
            c.key_updates("<<<").is_empty(),
            "{suite}: unasked KeyUpdate"
        );
        c.key_update("K");
        c.get("/small.txt", 2);
        assert_eq!(
            c.key_updates("<<<"),
            ["00"],
            "{suite}: terminus answers update_requested before its next response"
        );
        c.key_update("k");
        c.get("/big.txt", 3);
        assert_eq!(
            c.key_updates("<<<"),
            ["00"],
            "{suite}: update_not_requested is not answered"
        );
        c.key_update("K");
        c.get("/small.txt", 4);
        assert_eq!(c.key_updates("<<<"), ["00", "00"], "{suite}");
        assert_eq!(c.key_updates(">>>"), ["01", "00", "01"], "{suite}");
        let msg = c.msg();
        assert!(!msg.contains("Alert"), "{suite}: an alert before the close");
        let out = c.finish();
        let text = String::from_utf8_lossy(&out);
        assert!(
            text.contains(&format!("New, TLSv1.3, Cipher is {suite}")),
            "{suite}: {text}"
        );
        let got = responses(&out);
        let want = [(200, &big), (200, &small), (200, &big), (200, &small)];
        assert_eq!(got.len(), want.len(), "{suite}: {text}");
        for (i, ((status, body), (want_status, want_body))) in got.iter().zip(want).enumerate() {
            assert_eq!(*status, want_status, "{suite}: response {i}");
            assert!(body == want_body, "{suite}: response {i}'s body differs");
        }
    }
}

/// s_client on each of TLS 1.2's AEAD suites (AES-128-GCM, AES-256-GCM, ChaCha20-Poly1305:
/// explicit and implicit nonces), three keep-alive requests each, every body whole.
#[test]
fn s_client_keep_alive_requests_on_every_tls12_aead_suite_arrive_intact() {
    let dir = TestDir::new("rl-s12");
    let big = text(40_000, "big");
    let small = text(300, "small");
    dir.write("www/big.txt", &big);
    dir.write("www/small.txt", &small);
    let server = start(&dir, None);
    for suite in TLS12_SUITES {
        let mut c = SClient::connect(&server, &dir, suite, &["-tls1_2", "-cipher", suite]);
        c.get("/big.txt", 1);
        c.get("/small.txt", 2);
        c.get("/big.txt", 3);
        let out = c.finish();
        let text = String::from_utf8_lossy(&out);
        assert!(
            text.contains(&format!("New, TLSv1.2, Cipher is {suite}")),
            "{suite}: {text}"
        );
        let got = responses(&out);
        let want = [&big, &small, &big];
        assert_eq!(got.len(), 3, "{suite}: {text}");
        for (i, ((status, body), want)) in got.iter().zip(want).enumerate() {
            assert_eq!(*status, 200, "{suite}: response {i}");
            assert!(body == want, "{suite}: response {i}'s body differs");
        }
    }
}

/// curl (OpenSSL), TLS 1.2 and 1.3, HTTP/1.1 and h2: one invocation fetches bodies of
/// 0, 1, 16383, 16384, 16385 bytes and 1 MiB over one connection (curl reuses it), each
/// byte for byte what the file holds.
#[test]
fn curl_fetches_record_boundary_sized_bodies_intact_over_one_connection() {
    let dir = TestDir::new("rl-curl");
    let files: Vec<(String, Vec<u8>)> = BOUNDARY_SIZES
        .iter()
        .enumerate()
        .map(|(i, &n)| (format!("f{n}.bin"), pattern(n, i as u64 + 1)))
        .collect();
    for (name, body) in &files {
        dir.write(&format!("www/{name}"), body);
    }
    let server = start(&dir, None);
    let resolve = format!("localhost:{}:127.0.0.1", server.port());
    for (tls, tls_args) in [
        ("TLSv1.2", ["--tlsv1.2", "--tls-max", "1.2"]),
        ("TLSv1.3", ["--tlsv1.3", "--tls-max", "1.3"]),
    ] {
        for http in ["--http1.1", "--http2"] {
            let what = format!("{tls} {http}");
            let mut cmd = Command::new("curl");
            cmd.args(["-sS", "-v", "-k", "--max-time", "30", "--resolve", &resolve])
                .args(tls_args)
                .arg(http)
                .args(["-w", "%{http_code} %{num_connects} %{size_download}\\n"]);
            for (name, _) in &files {
                cmd.arg(server.url(&format!("/{name}")))
                    .arg("-o")
                    .arg(dir.path(&format!("got-{name}")));
            }
            let out = run(&mut cmd);
            let stderr = String::from_utf8_lossy(&out.stderr);
            assert!(out.status.success(), "{what}: {stderr}");
            assert!(
                stderr.contains(&format!("SSL connection using {tls}")),
                "{what}: {stderr}"
            );
            let lines: Vec<String> = String::from_utf8_lossy(&out.stdout)
                .lines()
                .map(str::to_owned)
                .collect();
            assert_eq!(lines.len(), files.len(), "{what}: {lines:?}");
            for (i, ((name, body), line)) in files.iter().zip(&lines).enumerate() {
                let connects = if i == 0 { 1 } else { 0 };
                assert_eq!(
                    line,
                    &format!("200 {connects} {}", body.len()),
                    "{what} {name}: status, new connections, size"
                );
                let got = std::fs::read(dir.path(&format!("got-{name}"))).unwrap();
                assert_eq!(sha256_hex(&got), sha256_hex(body), "{what} {name}");
                assert!(&got == body, "{what} {name}");
            }
        }
    }
}

/// Python's ssl (OpenSSL) on TLS 1.3 and 1.2 over one connection: an 8 MiB POST of
/// random bytes, proxied to app.py, which answers the digest of what it received; then
/// three GETs written in one send (pipelined, one record), answered in order and whole.
const PYTHON_CLIENT: &str = r#"
import hashlib, json, os, socket, ssl, sys
port, version = int(sys.argv[1]), sys.argv[2]
paths = sys.argv[3:]
ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
ctx.check_hostname = False
ctx.verify_mode = ssl.CERT_NONE
v = {"1.2": ssl.TLSVersion.TLSv1_2, "1.3": ssl.TLSVersion.TLSv1_3}[version]
ctx.minimum_version = ctx.maximum_version = v
raw = socket.create_connection(("127.0.0.1", port), timeout=30)
sock = ctx.wrap_socket(raw, server_hostname="localhost")
f = sock.makefile("rb")

def response():
    status = f.readline().decode().strip()
    headers = {}
    while True:
        line = f.readline()
        if line in (b"\r\n", b""):
            break
        k, v = line.decode().split(":", 1)
        headers[k.strip().lower()] = v.strip()
    body = f.read(int(headers.get("content-length", "0")))
    return status, body

upload = os.urandom(8 << 20)
sock.sendall(b"POST /app/sha256 HTTP/1.1\r\nHost: localhost\r\nContent-Length: %d\r\n\r\n"
             % len(upload) + upload)
status, body = response()
posted = {"status": status, "answer": body.decode().strip(),
          "want": "%s %d" % (hashlib.sha256(upload).hexdigest(), len(upload))}
sock.sendall(b"".join(b"GET %s HTTP/1.1\r\nHost: localhost\r\n\r\n" % p.encode() for p in paths))
pipelined = []
for p in paths:
    status, body = response()
    pipelined.append([p, status, len(body), hashlib.sha256(body).hexdigest()])
print(json.dumps({"version": sock.version(), "cipher": sock.cipher()[0], "posted": posted,
                  "pipelined": pipelined}))
sock.close()
"#;

#[test]
fn python_ssl_uploads_8_mib_and_gets_pipelined_responses_in_order() {
    let dir = TestDir::new("rl-python");
    let files: Vec<(String, Vec<u8>)> = [16385usize, 1, 1 << 20]
        .iter()
        .enumerate()
        .map(|(i, &n)| (format!("p{n}.bin"), pattern(n, 100 + i as u64)))
        .collect();
    for (name, body) in &files {
        dir.write(&format!("www/{name}"), body);
    }
    let app = App::start("a");
    let server = start(&dir, Some(&app));
    for (version, name) in [("1.3", "TLSv1.3"), ("1.2", "TLSv1.2")] {
        let out = run(Command::new("python3")
            .args(["-c", PYTHON_CLIENT, &server.port().to_string(), version])
            .args(files.iter().map(|(n, _)| format!("/{n}"))));
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "TLS {version}: {stdout}{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let report: serde_json::Value = serde_json::from_str(stdout.trim()).unwrap();
        assert_eq!(report["version"], name, "{report}");
        let posted = &report["posted"];
        assert_eq!(
            posted["status"], "HTTP/1.1 200 OK",
            "TLS {version}: {report}"
        );
        assert_eq!(
            posted["answer"], posted["want"],
            "TLS {version}: the upstream got the upload as sent"
        );
        let pipelined = report["pipelined"].as_array().unwrap();
        assert_eq!(pipelined.len(), files.len(), "{report}");
        for ((name, body), got) in files.iter().zip(pipelined) {
            assert_eq!(got[0], format!("/{name}"), "{report}");
            assert_eq!(got[1], "HTTP/1.1 200 OK", "TLS {version} {name}");
            assert_eq!(got[2], body.len(), "TLS {version} {name}");
            assert_eq!(got[3], sha256_hex(body), "TLS {version} {name}");
        }
    }
}

/// A Go client (net/http on crypto/tls, standard library only) on TLS 1.3 or 1.2: GETs
/// on one keep-alive connection; one line per response: path, status, length, SHA-256,
/// whether the connection was reused, the TLS version (hex) and the suite.
const GO_CLIENT: &str = r#"package main

import (
	"crypto/sha256"
	"crypto/tls"
	"encoding/hex"
	"fmt"
	"io"
	"net/http"
	"net/http/httptrace"
	"os"
)

func main() {
	base, version := os.Args[1], os.Args[2]
	v := map[string]uint16{"1.2": tls.VersionTLS12, "1.3": tls.VersionTLS13}[version]
	transport := &http.Transport{
		TLSClientConfig:     &tls.Config{InsecureSkipVerify: true, ServerName: "localhost", MinVersion: v, MaxVersion: v},
		MaxIdleConnsPerHost: 1,
	}
	client := &http.Client{Transport: transport}
	for _, path := range os.Args[3:] {
		reused := false
		trace := &httptrace.ClientTrace{GotConn: func(info httptrace.GotConnInfo) { reused = info.Reused }}
		req, err := http.NewRequest("GET", base+path, nil)
		if err != nil {
			panic(err)
		}
		req.Host = "localhost"
		req = req.WithContext(httptrace.WithClientTrace(req.Context(), trace))
		resp, err := client.Do(req)
		if err != nil {
			fmt.Fprintln(os.Stderr, path, err)
			os.Exit(1)
		}
		h := sha256.New()
		n, err := io.Copy(h, resp.Body)
		resp.Body.Close()
		if err != nil {
			fmt.Fprintln(os.Stderr, path, err)
			os.Exit(1)
		}
		fmt.Printf("%s %d %d %s %t %x %s\n", path, resp.StatusCode, n, hex.EncodeToString(h.Sum(nil)),
			reused, resp.TLS.Version, tls.CipherSuiteName(resp.TLS.CipherSuite))
	}
}
"#;

#[test]
fn go_crypto_tls_keep_alive_gets_arrive_intact_on_tls13_and_tls12() {
    let go = Command::new("go").arg("version").output();
    let found = go.as_ref().is_ok_and(|o| o.status.success());
    if !terminus_testkit::runs_here(
        terminus_testkit::Need::Go,
        found,
        "no Go toolchain (`go`) on the PATH",
    ) {
        return;
    }
    let dir = TestDir::new("rl-go");
    let files: Vec<(String, Vec<u8>)> = BOUNDARY_SIZES
        .iter()
        .enumerate()
        .map(|(i, &n)| (format!("g{n}.bin"), pattern(n, 200 + i as u64)))
        .collect();
    for (name, body) in &files {
        dir.write(&format!("www/{name}"), body);
    }
    let program = dir.write("client/main.go", GO_CLIENT);
    let server = start(&dir, None);
    let base = format!("https://127.0.0.1:{}", server.port());
    for (version, hex) in [("1.3", "304"), ("1.2", "303")] {
        let out = run(Command::new("go")
            .arg("run")
            .arg(&program)
            .args([&base, version])
            .args(files.iter().map(|(n, _)| format!("/{n}")))
            .current_dir(dir.path("client"))
            .env("GOFLAGS", "-mod=mod")
            .env("GOTOOLCHAIN", "local")
            .env("GOPROXY", "off"));
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "TLS {version}: {stdout}{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let lines: Vec<&str> = stdout.lines().collect();
        assert_eq!(lines.len(), files.len(), "TLS {version}: {stdout}");
        for (i, ((name, body), line)) in files.iter().zip(&lines).enumerate() {
            let fields: Vec<&str> = line.split(' ').collect();
            let reused = if i == 0 { "false" } else { "true" };
            let want = [
                format!("/{name}"),
                "200".to_owned(),
                body.len().to_string(),
                sha256_hex(body),
                reused.to_owned(),
                hex.to_owned(),
            ];
            assert_eq!(
                fields[..6],
                want,
                "TLS {version}: path, status, length, digest, reused, version"
            );
        }
    }
}

/// rustls's client configuration for the tests that drive rustls by hand: TLS 1.3 only,
/// the server's certificate not checked (its signature is), secrets extractable (to read
/// the sequence number of the read key at the end).
fn rustls_tls13() -> Arc<ClientConfig> {
    let config = client_config(&TlsChoice {
        versions: vec!["1.3".into()],
        trust: Trust::Insecure,
        ..TlsChoice::default()
    })
    .unwrap();
    let mut config = (*config).clone();
    config.enable_secret_extraction = true;
    Arc::new(config)
}

fn rustls_connect(server: &Server) -> StreamOwned<ClientConnection, TcpStream> {
    let conn =
        ClientConnection::new(rustls_tls13(), ServerName::try_from("localhost").unwrap()).unwrap();
    let tcp = TcpStream::connect(server.addr).unwrap();
    tcp.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    let mut tls = StreamOwned::new(conn, tcp);
    while tls.conn.is_handshaking() {
        tls.conn.complete_io(&mut tls.sock).expect("handshake");
    }
    tls
}

/// Writes `raw` to the socket under a TLS 1.3 connection, as it is, and returns the
/// error with which rustls's client then ends: the server's alert, opened with its key.
/// The server must then close the connection.
fn refused_after_raw_bytes(server: &Server, raw: &[u8]) -> rustls::Error {
    let mut tls = rustls_connect(server);
    assert_eq!(
        tls.conn.protocol_version(),
        Some(rustls::ProtocolVersion::TLSv1_3)
    );
    tls.sock.write_all(raw).unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    let err = loop {
        assert!(Instant::now() < deadline, "no alert within 10 s");
        match tls.conn.read_tls(&mut tls.sock) {
            Ok(0) => panic!("the server closed without an alert"),
            Ok(_) => {}
            Err(e) => panic!("reading the alert: {e}"),
        }
        if let Err(e) = tls.conn.process_new_packets() {
            break e;
        }
    };
    let mut rest = [0u8; 64];
    let n = tls.sock.read(&mut rest).unwrap_or(0);
    assert_eq!(n, 0, "bytes after the fatal alert: {:?}", &rest[..n]);
    err
}

/// After a TLS 1.3 handshake, a record header announcing 65535 bytes, or 16641 (one more
/// than TLS 1.3's 2^14 + 256), is refused at once, before any body, with a record_overflow
/// alert that rustls's client opens with the server's key, and the connection closes; a
/// record of exactly 16640 bytes passes that check (refused as bad_record_mac: its body
/// is no ciphertext). The server serves the next connection.
#[test]
fn a_record_header_over_the_tls13_limit_is_refused_with_record_overflow_and_serving_goes_on() {
    let dir = TestDir::new("rl-overflow");
    dir.write("www/index.html", "still serving\n");
    let server = start(&dir, None);
    // The header alone: its length is refused before any body is awaited (and nothing
    // unread is left on the server's socket to turn its close into a reset).
    for len in [0xffffu16, 16641] {
        let [hi, lo] = len.to_be_bytes();
        assert_eq!(
            refused_after_raw_bytes(&server, &[23, 3, 3, hi, lo]),
            rustls::Error::AlertReceived(AlertDescription::RecordOverflow),
            "a header announcing {len} bytes"
        );
    }
    let mut at_the_limit = vec![23, 3, 3, 0x41, 0x00];
    at_the_limit.extend(pattern(16640, 1));
    assert_eq!(
        refused_after_raw_bytes(&server, &at_the_limit),
        rustls::Error::AlertReceived(AlertDescription::BadRecordMac),
        "a record of 16640 bytes"
    );

    let mut again = rustls_connect(&server);
    again.write_all(get("/index.html").as_bytes()).unwrap();
    again.flush().unwrap();
    let mut reply = Vec::new();
    let mut buf = [0u8; 4096];
    while responses(&reply).is_empty() {
        let n = again.read(&mut buf).expect("a response");
        assert!(n > 0, "closed: {}", String::from_utf8_lossy(&reply));
        reply.extend_from_slice(&buf[..n]);
    }
    assert_eq!(responses(&reply), [(200, b"still serving\n".to_vec())]);
}

/// GETs `path` on `tls` and streams the body through SHA-256, calling
/// `refresh_traffic_keys` (a KeyUpdate with update_requested) every `refresh_every`
/// bytes of body read while more is to come; returns the body's length and digest and
/// how many KeyUpdates were sent.
fn streamed_get(
    tls: &mut StreamOwned<ClientConnection, TcpStream>,
    path: &str,
    refresh_every: Option<u64>,
) -> (u64, String, u64) {
    tls.write_all(get(path).as_bytes()).unwrap();
    tls.flush().unwrap();
    let mut buf = vec![0u8; 256 << 10];
    let mut head = Vec::new();
    let (len, mut body_read, mut hasher) = loop {
        let n = tls.read(&mut buf).expect("a response head");
        assert!(n > 0, "closed before the head");
        head.extend_from_slice(&buf[..n]);
        if let Some(end) = find(&head, b"\r\n\r\n") {
            let text = String::from_utf8_lossy(&head[..end]).into_owned();
            assert!(text.starts_with("HTTP/1.1 200 "), "{text}");
            let len: u64 = header_value(&text, "content-length")
                .unwrap()
                .parse()
                .unwrap();
            let mut hasher = Sha256::new();
            hasher.update(&head[end + 4..]);
            break (len, (head.len() - end - 4) as u64, hasher);
        }
    };
    let mut refreshes = 0;
    while body_read < len {
        let want = buf.len().min((len - body_read) as usize);
        let n = match tls.read(&mut buf[..want]) {
            Ok(0) => panic!("closed after {body_read} of {len} bytes"),
            Ok(n) => n,
            Err(e) => panic!("after {body_read} of {len} bytes: {e}"),
        };
        hasher.update(&buf[..n]);
        let before = body_read;
        body_read += n as u64;
        if let Some(every) = refresh_every {
            if body_read / every > before / every && body_read < len {
                tls.conn.refresh_traffic_keys().unwrap();
                while tls.conn.wants_write() {
                    tls.conn.write_tls(&mut tls.sock).unwrap();
                }
                refreshes += 1;
            }
        }
    }
    assert_eq!(body_read, len, "more than the content-length came");
    (len, format!("{:x}", hasher.finalize()), refreshes)
}

/// Writes `size` bytes of [`pattern`] to `path` a MiB at a time; returns their SHA-256.
fn write_pattern_file(path: &Path, size: usize, salt: u64) -> String {
    let mut file = io::BufWriter::new(std::fs::File::create(path).unwrap());
    let mut hasher = Sha256::new();
    let chunk = 1 << 20;
    let mut word = 0u64;
    let mut block = Vec::with_capacity(chunk);
    let mut written = 0;
    while written < size {
        block.clear();
        while block.len() < chunk.min(size - written) {
            block.extend_from_slice(&(word ^ salt).to_le_bytes());
            word += 1;
        }
        block.truncate(chunk.min(size - written));
        hasher.update(&block);
        file.write_all(&block).unwrap();
        written += block.len();
    }
    file.flush().unwrap();
    format!("{:x}", hasher.finalize())
}

/// The sequence number of the key the client reads with now: records since the server's
/// last KeyUpdate (the one that came with the handshake's keys if it never sent one).
fn read_sequence(tls: StreamOwned<ClientConnection, TcpStream>) -> u64 {
    let (conn, _sock) = tls.into_parts();
    conn.dangerous_extract_secrets().unwrap().rx.0
}

/// A body downloaded `rounds` times over one connection, the client asking for a
/// KeyUpdate (update_requested) every 16 MiB it reads: every byte arrives, the server
/// follows each of the client's key changes (the next request, sealed with the client's
/// latest key, is read) and answers them (the client's read key is young at the end),
/// and the server keeps the connection.
///
/// terminus reads nothing while it writes a response, so it opens the KeyUpdates sent
/// during one when it reads the next request, and answers them then, once: its write key
/// changes between responses, not within one (each later round comes under a new key).
/// The check below holds either way: it fails only if they go unanswered.
fn download_across_key_updates(size: usize, rounds: usize) {
    const EVERY: u64 = 16 << 20;
    let dir = TestDir::new("rl-download");
    dir.write("www/small.txt", "after the keys changed\n");
    let digest = write_pattern_file(&dir.path("www/big.bin"), size, 0x5eed);
    let server = start(&dir, None);
    let mut tls = rustls_connect(&server);
    let mut refreshes = 0;
    let started = Instant::now();
    for round in 0..rounds {
        let (len, got, sent) = streamed_get(&mut tls, "/big.bin", Some(EVERY));
        assert_eq!(len, size as u64, "round {round}");
        assert_eq!(got, digest, "round {round}: the body differs");
        refreshes += sent;
    }
    let took = started.elapsed();
    assert_eq!(refreshes, (size as u64 - 1) / EVERY * rounds as u64);
    let (_, small, _) = streamed_get(&mut tls, "/small.txt", None);
    assert_eq!(small, sha256_hex(b"after the keys changed\n"));
    // Without the server's KeyUpdates the read key would have sealed every record of
    // every round (16 KiB each); with them, at most the last 16 MiB and the last
    // response (terminus: the last response alone, as it answers at the next request).
    let records = (size * rounds) as u64 / 16384;
    let seq = read_sequence(tls);
    assert!(
        seq < 2 * EVERY / 16384,
        "read key sealed {seq} records of {records}: the server did not answer the KeyUpdates"
    );
    eprintln!(
        "{} MiB in {took:?} across {refreshes} KeyUpdates from the client",
        (size * rounds) >> 20
    );
}

/// Two downloads of 256 MiB through one connection, 15 KeyUpdates from the client during
/// each (fewer in a row than terminus's limit of 32 without application data), the
/// server's answer between them.
#[test]
fn two_256_mib_downloads_cross_key_updates_both_ways_intact() {
    download_across_key_updates(256 << 20, 2);
}

/// 10 GiB through one connection: 40 downloads of 256 MiB, a KeyUpdate from the client
/// every 16 MiB (600 in all), answered at each next request (40). Too long for every run: `cargo test --release -p terminus --test
/// record_layer -- --ignored`.
#[test]
#[ignore]
fn a_10_gib_transfer_crosses_key_updates_both_ways_intact() {
    download_across_key_updates(256 << 20, 40);
}

/// Chromium (BoringSSL), headless, loads a page of many records over the record layer,
/// by HTTP/2 (its choice by ALPN) and by HTTP/1.1 (`--disable-http2`): the DOM it dumps
/// holds every line of the page, in order.
#[test]
fn chromium_loads_a_page_of_many_records_by_h2_and_http11() {
    if !crate::harness::chromium_runs_here() {
        return;
    }
    let dir = TestDir::new("rl-chromium");
    // ~330 KiB: some twenty full records, each line numbered so that a record lost,
    // repeated or reordered changes the text.
    let text: String = (0..8000)
        .map(|i| format!("line {i:05} abcdefghijklmnopqrstuvwxyz0123\n"))
        .collect();
    dir.write(
        "www/page.html",
        format!(
            "<!doctype html><html><body><pre id=t>{text}</pre><p id=end>the end</p></body></html>"
        ),
    );
    let server = start(&dir, None);
    let url = format!("https://localhost:{}/page.html", server.port());
    for (extra, protocol) in [
        (&[][..], "HTTP/2.0"),
        (&["--disable-http2"][..], "HTTP/1.1"),
    ] {
        let profile = dir.path(&format!("profile{}", extra.len()));
        let out = run(crate::harness::chromium(&profile)
            .args(extra)
            .args(["--dump-dom", &url]));
        let dom = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success() && dom.contains("the end"),
            "chromium {extra:?}: {}\n{}",
            dom.chars().take(500).collect::<String>(),
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(
            dom.contains(&text),
            "chromium {extra:?}: the page's text arrived changed ({} bytes of DOM)",
            dom.len()
        );
        // The log line is written as the answer ends: give it a moment to land.
        let line = format!("\"GET /page.html {protocol}\" 200");
        let deadline = Instant::now() + Duration::from_secs(5);
        let mut log = String::new();
        while !log.contains(&line) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(50));
            log = std::fs::read_to_string(dir.path("access.log")).unwrap_or_default();
        }
        assert!(
            log.contains(&line),
            "chromium {extra:?} fetched the page by {protocol}: {log}"
        );
    }
}
