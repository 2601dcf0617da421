//! `terminus upgrade`: a running terminus hands its listening sockets to a new process
//! and drains; under load, nothing is refused or lost, and a new process that cannot
//! start, or dies half-way, leaves the old one serving.

use std::net::TcpStream;
use std::os::unix::net::UnixDatagram;
use std::path::Path;
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use crate::harness::*;

/// `terminus upgrade --socket SOCKET [ARGS]`, run to its end.
fn upgrade(socket: &Path, args: &[&str]) -> Output {
    Command::new(terminus_bin())
        .args(["upgrade", "--socket", socket.to_str().unwrap()])
        .args(args)
        .output()
        .unwrap()
}

/// The PID `terminus upgrade` said serves now.
fn new_pid(out: &Output) -> u32 {
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "terminus upgrade failed: {text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    text.split_whitespace()
        .skip_while(|w| *w != "pid")
        .nth(1)
        .and_then(|p| p.parse().ok())
        .unwrap_or_else(|| panic!("no pid in {text:?}"))
}

/// A process the test started indirectly (a successor), killed by its PID at the end.
struct Successor(u32);

impl Drop for Successor {
    fn drop(&mut self) {
        let _ = Command::new("kill")
            .args(["-KILL", &self.0.to_string()])
            .status();
    }
}

fn alive(pid: u32) -> bool {
    Path::new(&format!("/proc/{pid}")).exists()
        && !std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .unwrap_or_default()
            .contains(") Z ")
}

/// A server with a control socket (and `extra` before its server block), two workers.
fn server_with_control(dir: &TestDir, extra: &str) -> (Config, std::path::PathBuf) {
    let pair = make_cert(&dir.0, "k", KeyKind::EcdsaP256, &["localhost"]);
    dir.write("www/index.html", "hello\n");
    let socket = dir.path("control.sock");
    let config = Config::new(dir, &pair).before(&format!(
        "[upgrade]\nsocket = \"{}\"\ndrain = \"20s\"\n{extra}",
        socket.display()
    ));
    (config, socket)
}

/// Under new TLS connections at 60 a second, keep-alive HTTP/1.1 and HTTP/2 requests,
/// the process is replaced: every connection is accepted and every request answered
/// (the new process took the listening sockets before the old one stopped accepting),
/// systemd is told the new main PID, and the old process drains and exits.
#[test]
fn an_upgrade_under_load_refuses_no_connection_and_loses_no_request() {
    let dir = TestDir::new("upgrade-load");
    let (config, socket) = server_with_control(&dir, "");
    let notify_path = dir.path("notify.sock");
    let notify = UnixDatagram::bind(&notify_path).unwrap();
    notify
        .set_read_timeout(Some(Duration::from_millis(200)))
        .unwrap();
    let mut old = ServerBuilder::with(&dir, &config)
        .env("NOTIFY_SOCKET", notify_path.to_str().unwrap())
        .admin()
        .start();
    let url = old.url("/index.html");
    let new_connections = load_in_background(full_handshakes(&url, "127.0.0.1", 60, 6));
    let keep_alive = load_in_background(
        [url.as_str(), "-c", "2", "-d", "6s", "-k"]
            .map(str::to_owned)
            .to_vec(),
    );
    let h2 = load_in_background(
        [url.as_str(), "-c", "2", "-d", "6s", "-k", "--http2"]
            .map(str::to_owned)
            .to_vec(),
    );
    // A client that says nothing: the old process holds it (its handshake's
    // deadline) while it drains.
    let lingering = TcpStream::connect(old.addr).unwrap();
    std::thread::sleep(Duration::from_secs(2));
    let out = upgrade(&socket, &[]);
    let pid = new_pid(&out);
    let _successor = Successor(pid);
    assert_ne!(pid, old.pid());
    // The admin listener is the new process's now: its generation, and what the old
    // one still holds.
    assert_eq!(old.metric("terminus_process_generation", &[]), 2.0);
    // The status page says so too.
    let page: serde_json::Value =
        serde_json::from_slice(&old.admin_get("/status.json").stdout).unwrap();
    let generation = page["facts"]
        .as_array()
        .unwrap()
        .iter()
        .find(|f| f["label"] == "generation")
        .map(|f| f["cell"]["v"].clone());
    assert_eq!(generation, Some(serde_json::json!(2.0)), "{page}");
    eventually(
        Duration::from_secs(5),
        "the old process's drain seen",
        || old.metric("terminus_upgrade_predecessor_connections", &[]) >= 1.0,
    );
    for (name, load) in [
        ("new connections", new_connections),
        ("keep-alive HTTP/1.1", keep_alive),
        ("HTTP/2", h2),
    ] {
        let report = load.join().unwrap();
        assert_eq!(
            report["errors_total"],
            0,
            "{name}: errors across the upgrade: {report}; old's log:\n{}",
            old.stderr()
        );
        assert!(
            report["requests"].as_u64().unwrap() > 100,
            "{name}: {report}"
        );
    }
    drop(lingering);
    let status = old.wait_exit(Duration::from_secs(25));
    assert!(status.success(), "the old process exited {status:?}");
    eventually(
        Duration::from_secs(5),
        "the old process's exit seen",
        || old.metric("terminus_upgrade_predecessor_connections", &[]) == 0.0,
    );
    // The new process serves on the same port, alone.
    assert_eq!(status_code(&old, "/index.html"), 200);
    let out = upgrade(&socket, &["--status"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(text.trim(), format!("serving: pid {pid}, generation 2"));
    let mut heard = String::new();
    let mut buf = [0u8; 4096];
    let deadline = Instant::now() + Duration::from_secs(2);
    while Instant::now() < deadline {
        if let Ok(n) = notify.recv(&mut buf) {
            heard.push_str(&String::from_utf8_lossy(&buf[..n]));
        }
    }
    assert!(
        heard.contains(&format!("MAINPID={pid}\nREADY=1")),
        "systemd heard: {heard:?}"
    );
}

fn status_code(server: &Server, path: &str) -> u16 {
    status(server, &[], path)
}

/// A new configuration that does not load: `terminus upgrade` fails with its file and
/// line, and the old process serves on, untouched (same PID, generation 1); a good
/// configuration then upgrades.
#[test]
fn a_new_process_that_cannot_start_leaves_the_old_one_serving() {
    let dir = TestDir::new("upgrade-bad");
    let (config, socket) = server_with_control(&dir, "");
    let path = config.write(&dir);
    let old = ServerBuilder::config(&path).start();
    let good = std::fs::read_to_string(&path).unwrap();
    std::fs::write(
        &path,
        format!("{good}\n[limits]\nhandshake_queue = \"soon\"\n"),
    )
    .unwrap();
    let out = upgrade(&socket, &[]);
    let said = String::from_utf8_lossy(&out.stderr);
    // 1: a terminus answered and serves on (3 would have the package restart it).
    assert_eq!(
        out.status.code(),
        Some(1),
        "a broken configuration upgraded: {said}"
    );
    assert!(
        said.contains("terminus.toml:") && said.contains("handshake_queue"),
        "the error names the file, its line and the setting: {said}"
    );
    assert_eq!(status_code(&old, "/index.html"), 200);
    let out = upgrade(&socket, &["--status"]);
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        format!("serving: pid {}, generation 1", old.pid())
    );
    std::fs::write(&path, good).unwrap();
    let out = upgrade(&socket, &[]);
    let _successor = Successor(new_pid(&out));
    // Nothing answering: 3, the one case where the package restarts the service.
    let out = upgrade(&dir.path("nobody.sock"), &[]);
    assert_eq!(out.status.code(), Some(3), "{out:?}");
}

/// A new process killed half-way (it has the sockets, it is not serving yet) leaves
/// the old one serving; an upgrade asked for while one is under way is refused with
/// the reason; and the next upgrade succeeds.
#[test]
fn a_new_process_killed_half_way_leaves_the_old_one_serving() {
    let dir = TestDir::new("upgrade-killed");
    let (config, socket) = server_with_control(&dir, "");
    let stall = dir.write("stall", "");
    let old = ServerBuilder::with(&dir, &config)
        .env("TERMINUS_TEST_SUCCESSOR_STALL", stall.to_str().unwrap())
        .start();
    let asked = {
        let socket = socket.clone();
        std::thread::spawn(move || upgrade(&socket, &[]))
    };
    // The successor: the old process's child, stalled before it says ready.
    let mut successor = None;
    eventually(Duration::from_secs(20), "a successor started", || {
        successor = children(old.pid()).into_iter().next();
        successor.is_some()
    });
    let successor = successor.unwrap();
    std::thread::sleep(Duration::from_millis(500));
    let again = upgrade(&socket, &[]);
    assert!(!again.status.success());
    assert!(
        String::from_utf8_lossy(&again.stderr).contains("an upgrade is under way"),
        "{}",
        String::from_utf8_lossy(&again.stderr)
    );
    Command::new("kill")
        .args(["-KILL", &successor.to_string()])
        .status()
        .unwrap();
    let out = asked.join().unwrap();
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{said}");
    assert!(
        said.contains("exited") || said.contains("did not"),
        "{said}"
    );
    assert_eq!(status_code(&old, "/index.html"), 200);
    for _ in 0..20 {
        TcpStream::connect(old.addr).expect("the old process still accepts");
    }
    std::fs::remove_file(&stall).unwrap();
    let out = upgrade(&socket, &[]);
    if !out.status.success() {
        eprintln!("{}", old.stderr());
    }
    let _successor = Successor(new_pid(&out));
}

/// The PIDs of `pid`'s living children (from each process's `stat`: its parent).
fn children(pid: u32) -> Vec<u32> {
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|&child| {
            let stat = std::fs::read_to_string(format!("/proc/{child}/stat")).unwrap_or_default();
            let after = stat.rsplit(')').next().unwrap_or("");
            after.split_whitespace().nth(1) == Some(&pid.to_string())
        })
        .filter(|&p| alive(p))
        .collect()
}

/// An HTTP/3 GET of /index.html by curl (ngtcp2) on `port`: its status line.
fn h3_get(dir: &TestDir, port: u16) -> String {
    let script = dir.write("curl_h3.py", crate::http3::CURL_H3);
    let out = Command::new("python3")
        .arg(&script)
        .arg(port.to_string())
        .arg("GET:/index.html")
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

/// Workers change by upgrade, listeners and QUIC's sockets with them: a server of 2
/// workers with an HTTP/3 listener is upgraded to 1 worker (one worker then accepts
/// on both of the TCP sockets handed over, and reads both UDP sockets) and then
/// to 3 (one more socket of each bound), serving HTTPS and HTTP/3 on the same port
/// after each, the metrics naming as many workers.
#[test]
fn workers_change_by_upgrade_and_every_listener_quics_too_goes_on() {
    if !crate::http3::curl_cffi() {
        return;
    }
    let dir = TestDir::new("upgrade-workers");
    let socket = dir.path("control.sock");
    let more = format!(
        "[upgrade]\nsocket = \"{}\"\ndrain = \"20s\"\n",
        socket.display()
    );
    let (mut old, port) = h3_server_on(
        &dir,
        "127.0.0.1",
        H3Config {
            key: KeyKind::EcdsaP256,
            backend: "scalar",
            http3: "",
            in_server: "",
            more: &more,
            workers: 2,
        },
    );
    let served = format!("GET /index.html 200 30 8 {}", openssl_sha256(b"over h3\n"));
    assert_eq!(h3_get(&dir, port), served, "before: {}", old.stderr());
    let conf = dir.path("terminus.toml");
    let text = std::fs::read_to_string(&conf).unwrap();
    let mut successors = Vec::new();
    for workers in [1, 3] {
        let edited = text.replace("workers = 2", &format!("workers = {workers}"));
        assert_ne!(edited, text);
        std::fs::write(&conf, edited).unwrap();
        let out = upgrade(&socket, &[]);
        let pid = new_pid(&out);
        successors.push(Successor(pid));
        // The process replaced drains and exits (no upgrade is taken before).
        match &successors[..] {
            [_] => assert!(old.wait_exit(Duration::from_secs(25)).success()),
            [previous, _] => eventually(Duration::from_secs(25), "the previous one exits", || {
                !alive(previous.0)
            }),
            _ => unreachable!(),
        }
        assert_eq!(status_code(&old, "/index.html"), 200, "{workers} workers");
        assert_eq!(
            h3_get(&dir, port),
            served,
            "{workers} workers: {}",
            old.stderr()
        );
        let metrics = old.metrics();
        let named = (0..4)
            .filter(|w| metrics.contains(&format!("worker=\"{w}\"")))
            .count();
        assert_eq!(named, workers, "workers in the metrics");
    }
}

/// A session ticket the old process issued resumes in the new one, TLS 1.3 and 1.2
/// alike: the session-ticket keys cross with the sockets (each sealed under a key only
/// the two processes' environments hold), so an upgrade costs no client a full
/// handshake.
#[test]
fn tickets_issued_before_an_upgrade_resume_after_it() {
    let dir = TestDir::new("upgrade-tickets");
    let (config, socket) = server_with_control(&dir, "");
    let mut old = ServerBuilder::with(&dir, &config).start();
    let sessions: Vec<(&str, std::path::PathBuf)> = ["-tls1_3", "-tls1_2"]
        .into_iter()
        .map(|version| (version, dir.path(&format!("session{version}.pem"))))
        .collect();
    for (version, sess) in &sessions {
        // TLS 1.3 tickets come after the handshake: s_client stays for the answer.
        let first = crate::harness::run(Command::new("sh").arg("-c").arg(format!(
            "printf 'GET /index.html HTTP/1.1\\r\\nHost: localhost\\r\\nConnection: close\\r\\n\\r\\n' | openssl s_client -connect {} {version} -ign_eof -sess_out {} 2>&1",
            old.addr,
            sess.display()
        )));
        assert!(String::from_utf8_lossy(&first.stdout).contains("HTTP/1.1 200"));
        assert!(sess.exists(), "{version}: no session to resume");
    }
    let out = upgrade(&socket, &[]);
    let _successor = Successor(new_pid(&out));
    assert!(old.wait_exit(Duration::from_secs(25)).success());
    for (version, sess) in &sessions {
        let resumed = crate::harness::run(Command::new("sh").arg("-c").arg(format!(
            "openssl s_client -connect {} {version} -sess_in {} < /dev/null 2>&1 | grep -E '^(Reused|New),'",
            old.addr,
            sess.display()
        )));
        let line = String::from_utf8_lossy(&resumed.stdout);
        assert!(
            line.starts_with("Reused,"),
            "{version}: the old process's ticket in the new one: {line:?}"
        );
    }
}

/// A keep-alive HTTP/1.1 client: one GET, then (after a line on stdin) another on the
/// same connection; prints each answer's status line and whether it said
/// `Connection: close`, or `closed` if the connection ended instead.
const KEEP_ALIVE: &str = r#"
import socket, ssl, sys
ctx = ssl.create_default_context()
ctx.check_hostname = False
ctx.verify_mode = ssl.CERT_NONE
s = ctx.wrap_socket(socket.create_connection(("127.0.0.1", int(sys.argv[1]))), server_hostname="localhost")
def get():
    s.sendall(b"GET /index.html HTTP/1.1\r\nHost: localhost\r\n\r\n")
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = s.recv(4096)
        if not chunk:
            return "closed"
        data += chunk
    head, body = data.split(b"\r\n\r\n", 1)
    lines = head.decode().split("\r\n")
    n = int(next(l for l in lines if l.lower().startswith("content-length")).split(":")[1])
    while len(body) < n:
        body += s.recv(4096)
    return f"{lines[0]} close={'connection: close' in head.decode().lower()}"
print(get(), flush=True)
sys.stdin.readline()
print(get(), flush=True)
"#;

/// A keep-alive HTTP/1.1 connection idle at the handover is not closed then: its next
/// request is answered by the old process, with `Connection: close` (a client may be
/// sending one at that very moment, and would lose it).
#[test]
fn a_keep_alive_connection_idle_at_the_handover_gets_its_next_answer() {
    use std::io::{BufRead, Write};
    let dir = TestDir::new("upgrade-idle");
    let (config, socket) = server_with_control(&dir, "");
    let old = ServerBuilder::with(&dir, &config).start();
    let script = dir.write("keep_alive.py", KEEP_ALIVE);
    let mut client = Command::new("python3")
        .arg(&script)
        .arg(old.port().to_string())
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = std::io::BufReader::new(client.stdout.take().unwrap()).lines();
    assert_eq!(
        lines.next().unwrap().unwrap(),
        "HTTP/1.1 200 OK close=False"
    );
    let out = upgrade(&socket, &[]);
    let _successor = Successor(new_pid(&out));
    std::thread::sleep(Duration::from_millis(500));
    client.stdin.as_mut().unwrap().write_all(b"\n").unwrap();
    assert_eq!(
        lines.next().unwrap().unwrap(),
        "HTTP/1.1 200 OK close=True",
        "{}",
        old.stderr()
    );
    assert!(client.wait().unwrap().success());
}

/// SIGTERM to a process draining after a handover (its idle keep-alive connection would
/// keep it for `upgrade.drain`, 20 s) ends the drain within `shutdown_grace` (1 s):
/// systemd stopping the service does not wait minutes for the old process.
#[test]
fn sigterm_cuts_a_handed_over_process_drain_to_the_shutdown_grace() {
    use std::io::BufRead;
    let dir = TestDir::new("upgrade-term");
    let (config, socket) = server_with_control(&dir, "[timeouts]\nshutdown_grace = \"1s\"\n");
    let mut old = ServerBuilder::with(&dir, &config).start();
    let script = dir.write("keep_alive.py", KEEP_ALIVE);
    let mut client = Command::new("python3")
        .arg(&script)
        .arg(old.port().to_string())
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = std::io::BufReader::new(client.stdout.take().unwrap()).lines();
    assert_eq!(
        lines.next().unwrap().unwrap(),
        "HTTP/1.1 200 OK close=False"
    );
    let out = upgrade(&socket, &[]);
    let _successor = Successor(new_pid(&out));
    std::thread::sleep(Duration::from_millis(1500));
    assert!(
        alive(old.pid()),
        "the idle connection keeps the old process draining"
    );
    let told = Instant::now();
    old.signal("TERM");
    old.wait_exit(Duration::from_secs(8));
    let took = told.elapsed();
    assert!(
        took < Duration::from_secs(5),
        "SIGTERM ended the drain after {took:?}, not within shutdown_grace:\n{}",
        old.stderr()
    );
    let _ = client.kill();
    let _ = client.wait();
}

/// Downloads `/big.bin` over HTTP/3 (aioquic) with small flow-control windows, so that
/// the server sends more only as the client's MAX_DATA frames reach it; after the first
/// MiB it prints `started` and stops reading (the event loop blocked) until a line
/// comes on stdin; then prints the status, length and SHA-256 of what came.
const H3_DOWNLOAD: &str = r#"
import asyncio, ssl, sys, hashlib
from aioquic.asyncio.client import connect
from aioquic.asyncio.protocol import QuicConnectionProtocol
from aioquic.h3.connection import H3_ALPN, H3Connection
from aioquic.h3.events import HeadersReceived, DataReceived
from aioquic.quic.configuration import QuicConfiguration

class Client(QuicConnectionProtocol):
    def __init__(self, *a, **k):
        super().__init__(*a, **k)
        self.h3 = H3Connection(self._quic)
        self.body, self.status, self.held = bytearray(), None, False
        self.done = self._loop.create_future()
    def quic_event_received(self, event):
        for ev in self.h3.handle_event(event):
            if isinstance(ev, HeadersReceived):
                self.status = dict(ev.headers).get(b":status", b"?").decode()
            elif isinstance(ev, DataReceived):
                self.body += ev.data
                if not self.held and len(self.body) >= 1 << 20:
                    self.held = True
                    print("started", flush=True)
                    sys.stdin.readline()
            if getattr(ev, "stream_ended", False) and not self.done.done():
                self.done.set_result(None)

async def main(port):
    config = QuicConfiguration(is_client=True, alpn_protocols=H3_ALPN, verify_mode=ssl.CERT_NONE,
                               server_name="localhost", max_data=256 << 10, max_stream_data=256 << 10)
    async with connect("127.0.0.1", port, configuration=config, create_protocol=Client) as client:
        sid = client._quic.get_next_available_stream_id()
        client.h3.send_headers(sid, [(b":method", b"GET"), (b":scheme", b"https"),
            (b":authority", b"localhost"), (b":path", b"/big.bin")], end_stream=True)
        client.transmit()
        await asyncio.wait_for(client.done, 60)
        print(client.status, len(client.body), hashlib.sha256(client.body).hexdigest(), flush=True)

asyncio.run(main(int(sys.argv[1])))
"#;

/// An HTTP/3 download in flight at the handover completes, served by the old process:
/// the client's datagrams (its acknowledgements, its flow-control credit) reach the
/// successor's sockets, which pass them back to the old process (seen failing without
/// the passing: the download stalls at the flow-control window and times out).
#[test]
fn an_http3_download_in_flight_at_an_upgrade_completes_from_the_old_process() {
    use std::io::{BufRead, Write};
    if !crate::http3::aioquic() {
        return;
    }
    let dir = TestDir::new("upgrade-h3-download");
    let socket = dir.path("control.sock");
    let more = format!(
        "[upgrade]\nsocket = \"{}\"\ndrain = \"30s\"\n",
        socket.display()
    );
    let (mut old, port) = h3_server_on(
        &dir,
        "127.0.0.1",
        H3Config {
            key: KeyKind::EcdsaP256,
            backend: "scalar",
            http3: "",
            in_server: "",
            more: &more,
            workers: 2,
        },
    );
    // 8 MiB that no two runs share, so a hit cannot come from anywhere but the file.
    let mut state = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos() as u64
        | 1;
    let big: Vec<u8> = (0..8 << 20)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state as u8
        })
        .collect();
    std::fs::write(dir.path("www/big.bin"), &big).unwrap();
    let script = dir.write("h3_download.py", H3_DOWNLOAD);
    let mut client = Command::new("python3")
        .arg(&script)
        .arg(port.to_string())
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = std::io::BufReader::new(client.stdout.take().unwrap()).lines();
    assert_eq!(lines.next().unwrap().unwrap(), "started");
    let out = upgrade(&socket, &[]);
    let _successor = Successor(new_pid(&out));
    // The client goes on only now: all it sends reaches the successor's sockets.
    client.stdin.as_mut().unwrap().write_all(b"\n").unwrap();
    let last = lines.next().and_then(Result::ok).unwrap_or_default();
    let _ = client.kill();
    let _ = client.wait();
    assert_eq!(
        last,
        format!("200 {} {}", big.len(), openssl_sha256(&big)),
        "{}",
        old.stderr()
    );
    let passed = old.metric("terminus_quic_passed_to_predecessor_total", &[]);
    assert!(passed > 0.0, "datagrams passed back: {passed}");
    assert!(old.wait_exit(Duration::from_secs(30)).success());
}
