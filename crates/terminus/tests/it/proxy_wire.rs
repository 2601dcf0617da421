//! What a proxied request looks like on the upstream's wire, whatever the client's HTTP
//! version: the `Host` it carries when the client named none, its body's framing
//! (`Content-Length` where the length is known, held to it), and what is never opened
//! upstream (an extended CONNECT that already ended its stream). The upstream is app.py,
//! which records what it parsed; clients are curl, a raw TLS socket, and the Python `h2`
//! package, which sends frames a well-behaved client library would refuse to.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::Command;
use std::time::Duration;

use serde_json::{json, Value};

use crate::harness::raw::Raw;
use crate::harness::*;
use crate::proxy::{body, one_app};

/// One HTTP/2 stream, sent as told: `PORT STEPS [SNI]` (SNI "localhost" unless given,
/// none if empty), STEPS a JSON list of
///   {"headers": [[name, value], ...], "end": bool}   a HEADERS frame (fields unchecked)
///   {"data": TEXT, "end": bool}                       a DATA frame
///   {"await": URL, "for": TEXT}                       what was sent goes, then waits until
///                                                     GET URL (an upstream, straight) holds TEXT
/// after the server's SETTINGS came. Prints the outcome as JSON: status, headers, body,
/// and the RST_STREAM's code (`reset`) where the server reset the stream.
const H2_STREAM: &str = r#"
import json, socket, ssl, sys, time, urllib.request
import h2.config, h2.connection, h2.events

port, steps = int(sys.argv[1]), json.loads(sys.argv[2])
sni = sys.argv[3] if len(sys.argv) > 3 else "localhost"
ctx = ssl.create_default_context()
ctx.check_hostname = False
ctx.verify_mode = ssl.CERT_NONE
ctx.set_alpn_protocols(["h2"])
sock = ctx.wrap_socket(socket.create_connection(("127.0.0.1", port)), server_hostname=sni or None)
sock.settimeout(20)
config = h2.config.H2Configuration(client_side=True, header_encoding="utf-8",
                                   validate_outbound_headers=False,
                                   normalize_outbound_headers=False)
conn = h2.connection.H2Connection(config)
conn.initiate_connection()
sock.sendall(conn.data_to_send())
out = {"status": None, "headers": {}, "body": "", "reset": None}
state = {"settings": False, "done": False}

def pump():
    data = sock.recv(65536)
    if not data:
        out["closed"] = True
        state["done"] = True
        return
    for ev in conn.receive_data(data):
        if isinstance(ev, h2.events.RemoteSettingsChanged):
            state["settings"] = True
        elif isinstance(ev, h2.events.ResponseReceived):
            out["headers"] = dict(ev.headers)
            out["status"] = int(out["headers"][":status"])
        elif isinstance(ev, h2.events.DataReceived):
            out["body"] += ev.data.decode("latin-1")
            conn.acknowledge_received_data(ev.flow_controlled_length, ev.stream_id)
        elif isinstance(ev, h2.events.StreamEnded):
            state["done"] = True
        elif isinstance(ev, h2.events.StreamReset):
            out["reset"] = int(ev.error_code)
            state["done"] = True
        elif isinstance(ev, h2.events.ConnectionTerminated):
            out["goaway"] = int(ev.error_code)
            state["done"] = True
    sock.sendall(conn.data_to_send())

while not state["settings"]:
    pump()
sid = conn.get_next_available_stream_id()
for step in steps:
    if "headers" in step:
        conn.send_headers(sid, [tuple(f) for f in step["headers"]], end_stream=step["end"])
    elif "data" in step:
        conn.send_data(sid, step["data"].encode(), end_stream=step["end"])
    else:
        sock.sendall(conn.data_to_send())
        deadline = time.monotonic() + 10
        while step["for"] not in urllib.request.urlopen(step["await"]).read().decode():
            assert time.monotonic() < deadline, f"{step['for']} never reached {step['await']}"
            time.sleep(0.05)
sock.sendall(conn.data_to_send())
while not state["done"]:
    pump()
print(json.dumps(out))
"#;

/// Whether the `h2` package is there (else the skip is shown and counted).
fn h2_package() -> bool {
    python_imports("h2", "python3 -m pip install h2")
}

/// Runs [`H2_STREAM`] against `server` with `steps`; its outcome.
fn h2_stream(dir: &TestDir, server: &Server, steps: Value) -> Value {
    h2_stream_as(dir, server, steps, "localhost")
}

/// [`h2_stream`] with `sni` in the ClientHello ("": none).
fn h2_stream_as(dir: &TestDir, server: &Server, steps: Value, sni: &str) -> Value {
    let script = dir.write("h2_stream.py", H2_STREAM);
    let out = run(Command::new("python3")
        .arg(&script)
        .arg(server.port().to_string())
        .arg(steps.to_string())
        .arg(sni));
    assert!(out.status.success(), "{out:?}\n{}", server.stderr());
    serde_json::from_slice(&out.stdout).unwrap()
}

/// GET `path` from app.py straight (plain HTTP/1.0, not through terminus): its body.
fn upstream_get(app: &App, path: &str) -> String {
    let mut conn = TcpStream::connect(app.addr()).unwrap();
    conn.set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    write!(conn, "GET {path} HTTP/1.0\r\n\r\n").unwrap();
    let mut reply = String::new();
    conn.read_to_string(&mut reply).unwrap();
    reply
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_owned())
        .unwrap_or_default()
}

/// The values of `name` among the fields app.py's `/headers` saw.
fn seen_field(seen: &Value, name: &str) -> Vec<String> {
    seen["headers"]
        .as_array()
        .unwrap_or_else(|| panic!("not app.py's /headers: {seen}"))
        .iter()
        .filter(|h| h[0] == name)
        .map(|h| h[1].as_str().unwrap().to_owned())
        .collect()
}

/// RFC 8441 section 4 and RFC 9113 section 8.1.1: an extended CONNECT whose HEADERS end
/// the stream has no stream left to carry a WebSocket, so it is malformed. It is reset
/// with PROTOCOL_ERROR (1), and the upstream never hears of it: no connection opened,
/// no request line parsed.
#[test]
fn an_extended_connect_that_ended_its_stream_is_reset_and_opens_nothing_upstream() {
    if !h2_package() {
        return;
    }
    let (app, dir, server) = one_app("wire-connect-ended");
    let connect = json!([
        [":method", "CONNECT"],
        [":protocol", "websocket"],
        [":scheme", "https"],
        [":path", "/app/ws"],
        [":authority", "localhost"],
        ["sec-websocket-version", "13"]
    ]);
    let out = h2_stream(&dir, &server, json!([{"headers": connect, "end": true}]));
    assert_eq!(out["reset"], 1, "reset with PROTOCOL_ERROR: {out}");
    assert_eq!(out["status"], Value::Null, "{out}");
    let opened = server.metric("terminus_upstream_connections_total", &[]);
    assert_eq!(opened, 0.0, "an upstream connection was opened");
    let seen = upstream_get(&app, "/seen");
    assert!(!seen.contains("/app/ws"), "the upstream saw it: {seen}");
}

/// A request body whose length is known goes upstream with `Content-Length` and no
/// chunked framing, from every client version: curl's uploads over HTTP/1.1 and h2 and
/// an HTTP/1.0 POST (which declare it), and an h2 client that declares none but sends
/// its body whole with its request.
#[test]
fn request_bodies_of_known_length_reach_the_upstream_with_content_length_not_chunked() {
    let (_app, dir, server) = one_app("wire-body-length");
    let upload = dir.write("upload.bin", vec![b'x'; 100_000]);
    let upload = format!("@{}", upload.display());
    for version in ["--http1.1", "--http2"] {
        let out = curl(
            &server,
            &[version, "--data-binary", &upload],
            "/app/headers",
        );
        let seen: Value = serde_json::from_str(&body(&out)).unwrap();
        assert_eq!(
            seen_field(&seen, "content-length"),
            ["100000"],
            "{version}: {seen}"
        );
        assert!(
            seen_field(&seen, "transfer-encoding").is_empty(),
            "{version}: {seen}"
        );
    }
    let mut raw = Raw::connect(&server);
    raw.send(b"POST /app/headers HTTP/1.0\r\nHost: localhost\r\nContent-Length: 5\r\n\r\nhello")
        .unwrap();
    let reply = String::from_utf8(raw.read_to_close(Duration::from_secs(10))).unwrap();
    let seen: Value = serde_json::from_str(reply.split_once("\r\n\r\n").unwrap().1).unwrap();
    assert_eq!(
        seen_field(&seen, "content-length"),
        ["5"],
        "HTTP/1.0: {seen}"
    );
    assert!(seen_field(&seen, "transfer-encoding").is_empty(), "{seen}");
    if !h2_package() {
        return;
    }
    let post = json!([
        [":method", "POST"],
        [":scheme", "https"],
        [":path", "/app/headers"],
        [":authority", "localhost"]
    ]);
    let out = h2_stream(
        &dir,
        &server,
        json!([
        {"headers": post, "end": false}, {"data": "hello", "end": true}]),
    );
    assert_eq!(out["status"], 200, "{out}");
    let seen: Value = serde_json::from_str(out["body"].as_str().unwrap()).unwrap();
    assert_eq!(seen_field(&seen, "content-length"), ["5"], "{seen}");
    assert!(seen_field(&seen, "transfer-encoding").is_empty(), "{seen}");
}

/// An h2 client that declares `content-length: 10`, waits until the upstream has the
/// request's head (sent by that length), then sends 5 bytes and ends the stream: the
/// stream is reset (PROTOCOL_ERROR), and the upstream never gets a whole request of a
/// wrong length: its connection ends with the body cut short.
#[test]
fn an_h2_body_shorter_than_its_content_length_never_reaches_the_upstream_whole() {
    if !h2_package() {
        return;
    }
    let (app, dir, server) = one_app("wire-body-short");
    let post = json!([
        [":method", "POST"],
        [":scheme", "https"],
        [":path", "/app/sha256"],
        [":authority", "localhost"],
        ["content-length", "10"]
    ]);
    let seen = format!("http://{}/seen", app.addr());
    let out = h2_stream(
        &dir,
        &server,
        json!([
        {"headers": post, "end": false},
        {"await": seen, "for": "POST /app/sha256"},
        {"data": "hello", "end": true}]),
    );
    assert_eq!(out["reset"], 1, "reset with PROTOCOL_ERROR: {out}");
    eventually(
        Duration::from_secs(10),
        "the upstream's connection ends",
        || upstream_get(&app, "/received") != "[]",
    );
    assert_eq!(upstream_get(&app, "/received"), "[\"cut\"]");
}

/// A request that names no host (HTTP/1.0 without `Host`, h2 without `:authority` or
/// `host`) reaches an HTTP/1.1 upstream with a `Host` (RFC 9112 section 3.2; nginx's
/// `$host`), not without one: the name the client's SNI sent where it is its server's
/// (one of its names, or under its wildcards), else the server's first exact name (no
/// SNI, or an SNI the default server answers without it being its own), never a
/// wildcard. A server of wildcards alone, reached without an SNI of its own, has no name
/// to give: the request goes without `Host`, as it came, and a warning says so once
/// (throttled). A request that names a host keeps it.
#[test]
fn a_request_that_names_no_host_reaches_the_upstream_with_its_sni_or_its_servers_name() {
    let app = App::start("a");
    let dir = TestDir::new("wire-no-host");
    let pair = make_cert(&dir.0, "k", KeyKind::EcdsaP256, &["localhost"]);
    let server_block = |names: &str, default: bool| {
        format!(
            "[[server]]\nnames = {names}\ndefault = {default}\n[[server.route]]\npath = \"/app/\"\nupstream = \"app\"\n[[server.certificate]]\ncert = \"{}\"\nkey = \"{}\"\n",
            pair.cert.display(),
            pair.key.display()
        )
    };
    // The first server is the default one, or the one of wildcards alone.
    let config = |wildcards_default: bool| {
        format!(
            "listen = [\"127.0.0.1:0\"]\nworkers = 1\n[[upstream]]\nname = \"app\"\nservers = [\"{}\"]\n{}{}",
            app.addr(),
            server_block(
                "[\"*.wild.test\", \"app.test\", \"localhost\"]",
                !wildcards_default
            ),
            server_block("[\"*.only.test\"]", wildcards_default),
        )
    };
    let conf = dir.write("terminus.toml", config(false));
    let server = ServerBuilder::config(&conf).admin().start();
    // curl over HTTP/1.0 with its Host taken out; SNI `sni` (curl sends none for an IP).
    // No ALPN: curl would offer `http/1.0` alone, which terminus does not agree to.
    let http10 = |sni: &str, host: Option<&str>| -> Vec<String> {
        let host_field = match host {
            Some(h) => format!("Host: {h}"),
            None => "Host:".to_owned(),
        };
        let args = ["--http1.0", "--no-alpn", "-H", host_field.as_str()];
        let out = if sni.is_empty() {
            run(Command::new("curl")
                .args(["-sS", "-k", "--max-time", "20"])
                .args(args)
                .arg(format!("https://127.0.0.1:{}/app/headers", server.port())))
        } else {
            curl_host(&server, sni, &args, "/app/headers")
        };
        let seen: Value = serde_json::from_slice(&out.stdout)
            .unwrap_or_else(|e| panic!("{e}: {out:?}\n{}", server.stderr()));
        seen_field(&seen, "host")
    };
    assert_eq!(
        http10("x.wild.test", None),
        ["x.wild.test"],
        "SNI under a wildcard"
    );
    assert_eq!(
        http10("localhost", None),
        ["localhost"],
        "SNI of an exact name"
    );
    assert_eq!(
        http10("", None),
        ["app.test"],
        "no SNI: the first exact name"
    );
    assert_eq!(
        http10("other.test", None),
        ["app.test"],
        "an SNI the default server answers, not its own"
    );
    assert_eq!(
        http10("x.wild.test", Some("localhost")),
        ["localhost"],
        "a named host is kept"
    );
    if h2_package() {
        let get = json!([
            [":method", "GET"],
            [":scheme", "https"],
            [":path", "/app/headers"]
        ]);
        for (sni, want) in [("y.wild.test", "y.wild.test"), ("", "app.test")] {
            let out = h2_stream_as(&dir, &server, json!([{"headers": get, "end": true}]), sni);
            assert_eq!(out["status"], 200, "{out}");
            let seen: Value = serde_json::from_str(out["body"].as_str().unwrap()).unwrap();
            assert_eq!(seen_field(&seen, "host"), [want], "h2, SNI {sni:?}: {seen}");
        }
    }

    // The server of wildcards alone made the default one.
    std::fs::write(&conf, config(true)).unwrap();
    server.signal("HUP");
    eventually(Duration::from_secs(10), "the reload", || {
        server.stderr().contains("configuration reloaded")
    });
    assert_eq!(
        http10("z.only.test", None),
        ["z.only.test"],
        "SNI under its wildcard"
    );
    let warning = "whose names are all wildcards";
    assert!(!server.stderr().contains(warning));
    for _ in 0..3 {
        assert_eq!(
            http10("", None),
            Vec::<String>::new(),
            "no name: no Host, as it came"
        );
    }
    eventually(Duration::from_secs(5), "the warning", || {
        server.stderr().contains(warning)
    });
    assert_eq!(
        server.stderr().matches(warning).count(),
        1,
        "said once: {}",
        server.stderr()
    );
}

/// Uploads over HTTP/2 (the `h2` package, a thread per connection): `PORT CONNECTIONS
/// STREAMS SIZE`, each stream a POST of SIZE bytes of its own to /up/, sent as fast as
/// the server's windows allow. Prints `stuck BYTES` once nothing more has gone for two
/// seconds, then, once every answer is in, a JSON summary: how many answers were 200
/// with the body's own sha256 and length, and the first few that were not.
const H2_UPLOADS: &str = r#"
import hashlib, json, select, socket, ssl, sys, threading, time
import h2.config, h2.connection, h2.events

port, conns, streams, size = map(int, sys.argv[1:5])
sent = [0]
lock = threading.Lock()
ok, bad = [0], []

def body_of(c, s):
    seed = hashlib.sha256(f"{c}/{s}".encode()).digest()
    return (seed * (size // len(seed) + 1))[:size]

def upload(c):
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    ctx.set_alpn_protocols(["h2"])
    sock = ctx.wrap_socket(socket.create_connection(("127.0.0.1", port)), server_hostname="localhost")
    sock.settimeout(60)
    conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True, header_encoding="utf-8"))
    conn.initiate_connection()
    bodies, offsets, answers, status = {}, {}, {}, {}
    for s in range(streams):
        sid = conn.get_next_available_stream_id()
        conn.send_headers(sid, [(":method", "POST"), (":scheme", "https"), (":authority", "localhost"),
                                (":path", f"/up/{c}/{s}"), ("content-length", str(size))])
        bodies[sid], offsets[sid], answers[sid] = body_of(c, s), 0, b""
    sock.sendall(conn.data_to_send())
    done = set()
    while len(done) < streams:
        for sid, body in bodies.items():
            off = start = offsets[sid]
            while off < len(body):
                n = min(conn.local_flow_control_window(sid), conn.max_outbound_frame_size, len(body) - off)
                if n <= 0:
                    break
                conn.send_data(sid, body[off:off + n], end_stream=off + n == len(body))
                off += n
            offsets[sid] = off
            with lock:
                sent[0] += off - start
        sock.sendall(conn.data_to_send())
        if not sock.pending() and not select.select([sock], [], [], 0.2)[0]:
            continue
        data = sock.recv(65536)
        if not data:
            raise ConnectionError("the server closed the connection")
        for ev in conn.receive_data(data):
            if isinstance(ev, h2.events.ResponseReceived):
                status[ev.stream_id] = dict(ev.headers)[":status"]
            elif isinstance(ev, h2.events.DataReceived):
                answers[ev.stream_id] += ev.data
                conn.acknowledge_received_data(ev.flow_controlled_length, ev.stream_id)
            elif isinstance(ev, h2.events.StreamEnded):
                done.add(ev.stream_id)
            elif isinstance(ev, h2.events.StreamReset):
                done.add(ev.stream_id)
                status[ev.stream_id] = f"reset {int(ev.error_code)}"
        sock.sendall(conn.data_to_send())
    for sid, body in bodies.items():
        want = f"{hashlib.sha256(body).hexdigest()} {len(body)}"
        got = f"{status.get(sid)} {answers[sid].decode('latin-1')}"
        with lock:
            if got == f"200 {want}":
                ok[0] += 1
            elif len(bad) < 5:
                bad.append(got)

threads = [threading.Thread(target=upload, args=(c,), daemon=True) for c in range(conns)]
for t in threads:
    t.start()
last, since = -1, time.monotonic()
while time.monotonic() - since < 2:
    time.sleep(0.1)
    with lock:
        now = sent[0]
    if now != last:
        last, since = now, time.monotonic()
print("stuck", last, flush=True)
for t in threads:
    t.join()
print(json.dumps({"ok": ok[0], "bad": bad}), flush=True)
"#;

/// A worker's request-body budget, against clients that upload to an upstream that
/// reads nothing (stall_app.py, until its gate opens): 4 HTTP/2 connections to one
/// worker, 128 streams each, 256 KiB bodies. Without budgets every stream holds its
/// 64 KiB window and the copy kept for a retry (more than 64 MiB); with them the worker
/// holds at most 16 MiB beyond each connection's first 64 KiB (README), so its RSS grows
/// by less than that and what each stream costs besides its body (a stream, a handler,
/// an upstream connection: 24 KiB allowed). Once the upstream reads, every body arrives
/// whole: nothing was lost to the budget.
#[test]
fn request_bodies_for_a_stalled_upstream_stay_within_the_workers_budget_and_all_arrive() {
    use std::io::BufRead;
    if !h2_package() {
        return;
    }
    let dir = TestDir::new("wire-body-budget");
    let gate = dir.path("gate");
    let app = App::launch("stall_app.py", &[gate.to_str().unwrap()]);
    let pair = make_cert(&dir.0, "k", KeyKind::EcdsaP256, &["localhost"]);
    dir.write("www/index.html", "from files\n");
    let upstream = format!(
        "[[upstream]]\nname = \"stalled\"\nservers = [\"{}\"]\n",
        app.addr()
    );
    let config = Config::new(&dir, &pair)
        .workers(1)
        .before(&upstream)
        .in_server("[[server.route]]\npath = \"/up/\"\nupstream = \"stalled\"\n");
    let server = ServerBuilder::with(&dir, &config).start();
    // The baseline after one connection and request (lazily built state is in it).
    assert!(curl(&server, &[], "/index.html").status.success());
    let before = server.memory_kib("VmRSS");
    let (conns, streams, size) = (4, 128, 256 << 10);
    let script = dir.write("h2_uploads.py", H2_UPLOADS);
    let mut client = Command::new("python3")
        .arg(&script)
        .args([
            server.port().to_string(),
            conns.to_string(),
            streams.to_string(),
            size.to_string(),
        ])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = std::io::BufReader::new(client.stdout.take().unwrap()).lines();
    let stuck = lines.next().unwrap().unwrap();
    let grown = server.memory_kib("VmRSS").saturating_sub(before);
    std::fs::write(&gate, "").unwrap();
    let summary: Value = serde_json::from_str(&lines.next().unwrap().unwrap()).unwrap();
    assert!(client.wait().unwrap().success());
    eprintln!("RSS grew {grown} KiB with the upstream stalled ({stuck} bytes sent)");
    let budget_kib = 16 * 1024 + conns * 64;
    let overhead_kib = conns * streams * 24;
    assert!(
        grown < budget_kib + overhead_kib,
        "RSS grew {grown} KiB with the upstream stalled ({stuck} bytes sent), past {budget_kib} KiB of \
         bodies and {overhead_kib} KiB for the streams"
    );
    assert_eq!(summary["ok"], conns * streams, "{summary}");
}

/// An HTTP/2 client connection for the scripts below (python-h2 over TLS to the
/// global `port`): `pump` reads what came and acknowledges DATA, keeping the widest
/// connection window seen; `request` opens a stream; `until` pumps until a condition.
/// `step` prints a phase's name and waits for the test's line to go on.
const H2_CLIENT: &str = r#"
import hashlib, json, select, socket, ssl, sys, time
import h2.config, h2.connection, h2.events

class Conn:
    def __init__(self):
        ctx = ssl.create_default_context()
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
        ctx.set_alpn_protocols(["h2"])
        self.sock = ctx.wrap_socket(socket.create_connection(("127.0.0.1", port)), server_hostname="localhost")
        self.h2 = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True, header_encoding="utf-8"))
        self.h2.initiate_connection()
        self.flush()
        self.status, self.body, self.ended = {}, {}, set()
        self.max_window, self.goaway, self.closed = 0, False, False

    def flush(self):
        data = self.h2.data_to_send()
        if data:
            self.sock.sendall(data)

    def pump(self, timeout):
        if not self.sock.pending() and not select.select([self.sock], [], [], timeout)[0]:
            return
        try:
            data = self.sock.recv(65536)
        except (ssl.SSLError, OSError):
            data = b""
        if not data:
            self.closed = True
            return
        for ev in self.h2.receive_data(data):
            if isinstance(ev, h2.events.ResponseReceived):
                self.status[ev.stream_id] = dict(ev.headers)[":status"]
            elif isinstance(ev, h2.events.DataReceived):
                self.body[ev.stream_id] = self.body.get(ev.stream_id, b"") + ev.data
                self.h2.acknowledge_received_data(ev.flow_controlled_length, ev.stream_id)
            elif isinstance(ev, (h2.events.StreamEnded, h2.events.StreamReset)):
                self.ended.add(ev.stream_id)
            elif isinstance(ev, h2.events.ConnectionTerminated):
                self.goaway = True
        self.max_window = max(self.max_window, self.h2.outbound_flow_control_window)
        self.flush()

    def request(self, method, path, end):
        sid = self.h2.get_next_available_stream_id()
        self.h2.send_headers(sid, [(":method", method), (":scheme", "https"),
                                   (":authority", "localhost"), (":path", path)], end_stream=end)
        self.flush()
        return sid

    def until(self, done, seconds):
        deadline = time.monotonic() + seconds
        while not done() and not self.closed and time.monotonic() < deadline:
            self.pump(0.05)
        return done()

def step(name):
    print(name, flush=True)
    sys.stdin.readline()

"#;

/// HTTP/2 clients for the connection windows, in phases, each begun by a line on
/// stdin and ended by one on stdout: `PORT IDLE HOARDERS UPLOADS`.
/// 1. `IDLE` connections make one GET each and stay open, pinging: prints `idle`.
/// 2. `HOARDERS` connections each start 16 POSTs to /fast/, wait for the connection's
///    window to open beyond 64 KiB, then end the bodies empty and read their answers:
///    they hold an opened window and send nothing more. Prints `hoarded N` (how many
///    saw their window open).
/// 3. One connection starts `UPLOADS` POSTs to /fast/, waits a second for the server to
///    open its window, then sends each a body of 256 KiB as fast as its windows allow.
///    Prints JSON: `ok` (200s with the body's sha256 and length), `max_window` (the
///    widest the connection's window was seen), `goaways` (hoarders and idle
///    connections told to go).
///
/// With `stalled` as a fourth argument, phase 3 instead sends bodies of 6 MiB to /up/
/// (a stalled upstream: the kernel's send buffers for it take up to 4 MiB each, the
/// rest stays in terminus) on `UPLOADS` streams and, once nothing more goes for a second,
/// one more of 1 MiB to /fast/ on the same connection: JSON `fast` (its answer) and
/// `seconds`.
const H2_WINDOWS: &str = r#"
port, idle_n, hoard_n, uploads = map(int, sys.argv[1:5])
stalled = len(sys.argv) > 5 and sys.argv[5] == "stalled"

idle = [Conn() for _ in range(idle_n)]
for c in idle:
    sid = c.request("GET", "/index.html", True)
    c.until(lambda: sid in c.ended, 10)
    c.h2.ping(b"12345678")
    c.flush()
for c in idle:
    c.pump(0.05)
step("idle")

hoarders, opened = [Conn() for _ in range(hoard_n)], 0
for c in hoarders:
    sids = [c.request("POST", f"/fast/h{i}", False) for i in range(16)]
    opened += c.until(lambda: c.h2.outbound_flow_control_window > 65_535, 5)
    for sid in sids:
        c.h2.end_stream(sid)
    c.flush()
    assert c.until(lambda: len(c.ended) == 16, 10), "the hoarder's POSTs were answered"
step(f"hoarded {opened}")

def watch_others():
    for c in idle + hoarders:
        if not c.closed and not c.goaway:
            c.pump(0)

up = Conn()
def body_of(i, size):
    seed = hashlib.sha256(str(i).encode()).digest()
    return (seed * (size // 32 + 1))[:size]
if stalled:
    bodies = {up.request("POST", f"/up/{i}", False): body_of(i, 6 << 20) for i in range(uploads)}
else:
    bodies = {up.request("POST", f"/fast/{i}", False): body_of(i, 256 << 10) for i in range(uploads)}
    # Nothing sent for a second: the window seen is what the server opened for them.
    deadline = time.monotonic() + 1
    while time.monotonic() < deadline:
        up.pump(0.02)
        watch_others()
sent = {sid: 0 for sid in bodies}
def send_some():
    moved = 0
    for sid, body in bodies.items():
        while sent[sid] < len(body):
            n = min(up.h2.local_flow_control_window(sid), up.h2.max_outbound_frame_size, len(body) - sent[sid])
            if n <= 0:
                break
            up.h2.send_data(sid, body[sent[sid]:sent[sid] + n], end_stream=sent[sid] + n == len(body))
            sent[sid] += n
            moved += n
    up.flush()
    return moved
start, last_move = time.monotonic(), time.monotonic()
fast = None
while time.monotonic() - start < 60 and not up.closed:
    if send_some():
        last_move = time.monotonic()
    up.pump(0.02)
    watch_others()
    if stalled:
        if fast is None and time.monotonic() - last_move > 1:
            stuck_sent = sum(sent.values())
            fast = up.request("POST", "/fast/alone", False)
            bodies[fast], sent[fast] = body_of("alone", 1 << 20), 0
            fast_start = time.monotonic()
        if fast is not None and (fast in up.ended or time.monotonic() - fast_start > 10):
            break
    elif len(up.ended) == len(bodies):
        break
for _ in range(10):
    watch_others()
out = {"max_window": up.max_window, "goaways": sum(c.goaway for c in idle + hoarders)}
if stalled:
    out["fast"] = up.status.get(fast) if fast in up.ended else None
    out["seconds"] = time.monotonic() - fast_start if fast is not None else None
    out["stuck_sent"] = stuck_sent if fast is not None else None
else:
    want = {sid: f"{hashlib.sha256(b).hexdigest()} {len(b)}" for sid, b in bodies.items()}
    out["ok"] = sum(up.status.get(s) == "200" and up.body.get(s, b"").decode() == w for s, w in want.items())
print(json.dumps(out), flush=True)
"#;

/// The HTTP/2 windows, phase by phase ([`H2_WINDOWS`]), to a worker whose /fast/ route
/// goes to an upstream that answers at once and /up/ to one that reads nothing.
struct Windows {
    server: Server,
    client: std::process::Child,
    lines: std::io::Lines<std::io::BufReader<std::process::ChildStdout>>,
    _dir: TestDir,
    _apps: (App, App),
}

impl Windows {
    fn start(name: &str, args: &[&str]) -> Option<Windows> {
        Self::start_with(name, H2_WINDOWS, "", args)
    }

    /// `script` (after [`H2_CLIENT`]) with `ARGS`, `before` in the configuration.
    fn start_with(name: &str, script: &str, before: &str, args: &[&str]) -> Option<Windows> {
        use std::io::BufRead;
        if !h2_package() {
            return None;
        }
        let dir = TestDir::new(name);
        let open = dir.write("open", "");
        let fast = App::launch("stall_app.py", &[open.to_str().unwrap()]);
        let stalled = App::launch("stall_app.py", &[dir.path("shut").to_str().unwrap()]);
        let pair = make_cert(&dir.0, "k", KeyKind::EcdsaP256, &["localhost"]);
        dir.write("www/index.html", "from files\n");
        let upstreams = format!(
            "[[upstream]]\nname = \"fast\"\nservers = [\"{}\"]\n[[upstream]]\nname = \"stalled\"\nservers = [\"{}\"]\n",
            fast.addr(),
            stalled.addr()
        );
        let config = Config::new(&dir, &pair).workers(1).before(&upstreams).before(before).in_server(
            "[[server.route]]\npath = \"/fast/\"\nupstream = \"fast\"\n[[server.route]]\npath = \"/up/\"\nupstream = \"stalled\"\n",
        );
        let server = ServerBuilder::with(&dir, &config).admin().start();
        let script = dir.write("h2_windows.py", format!("{H2_CLIENT}{script}"));
        let mut client = Command::new("python3")
            .arg(&script)
            .arg(server.port().to_string())
            .args(args)
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let lines = std::io::BufReader::new(client.stdout.take().unwrap()).lines();
        Some(Windows {
            server,
            client,
            lines,
            _dir: dir,
            _apps: (fast, stalled),
        })
    }

    /// The client's next line (the end of a phase).
    fn line(&mut self) -> String {
        self.lines.next().expect("the client's next line").unwrap()
    }

    /// Begins the client's next phase.
    fn go_on(&mut self) {
        self.client
            .stdin
            .as_mut()
            .unwrap()
            .write_all(b"\n")
            .unwrap();
    }

    fn budget(&self) -> f64 {
        self.server
            .metric("terminus_request_body_budget_bytes", &[])
    }
}

/// Idle HTTP/2 connections, kept open with PINGs, hold none of the worker's
/// request-body budget (each took 960 KiB of it at its first poll before, and 17 of
/// them left every other connection the protocol's 64 KiB window); connections whose
/// uploads ended hold the window they were given (it cannot be taken back), and when the
/// budget keeps an uploader short of its share (less is free than its first MiB) as
/// many of them as cover it are asked to go (GOAWAY): 48 uploads of 256 KiB, all whole,
/// on a window opened past 1 MiB beside 12 such connections (which held 11.25 MiB of
/// the 12 windows may), not all of them sent away.
#[test]
fn idle_connections_hold_no_upload_budget_and_ended_uploads_give_theirs_way() {
    let Some(mut w) = Windows::start("wire-windows", &["40", "12", "48"]) else {
        return;
    };
    assert_eq!(w.line(), "idle");
    assert_eq!(
        w.budget(),
        0.0,
        "40 idle connections hold none of the budget"
    );
    w.go_on();
    assert_eq!(w.line(), "hoarded 12", "each of 12 got an opened window");
    let held = w.budget();
    assert!(held > 11.0 * 1048576.0, "the hoarders hold {held} bytes");
    w.go_on();
    let out: Value = serde_json::from_str(&w.line()).unwrap();
    assert!(w.client.wait().unwrap().success());
    eprintln!(
        "{out}; gave way {}, budget {}",
        w.server
            .metric("terminus_request_body_budget_gave_way_total", &[]),
        w.budget()
    );
    assert_eq!(out["ok"], 48, "{out}");
    // 0.75 MiB was free: its first MiB is had from connections asked to go, and no
    // more of them go than that takes (its share holds it to its first MiB while the
    // rest hold theirs).
    assert!(
        out["max_window"].as_f64().unwrap() > 1048576.0,
        "the uploader's window opened past 1 MiB: {out}"
    );
    assert!(out["goaways"].as_u64().unwrap() >= 1, "{out}");
    assert!(
        out["goaways"].as_u64().unwrap() < 12,
        "every holder went: {out}"
    );
    assert!(
        w.server
            .metric("terminus_request_body_budget_gave_way_total", &[])
            >= 1.0
    );
}

/// HTTP/2 clients that hold uploads open and send (next to) nothing: `PORT HOLDERS`.
/// 1. `HOLDERS` connections each open 128 POSTs to /up/ and send a byte on each every
///    second, pinging every half second: prints `held`.
/// 2. The first sends 5,000 bytes on one of them and resets it (leaving the worker's
///    budget a few KiB short of full): prints `nearly full`.
/// 3. One more connection opens 16 POSTs to /fast/ and sends each 256 KiB as its
///    windows allow (next to nothing while the budget is full); the holders trickle on
///    until the server has reset their streams (12 s at most), and the uploader goes on
///    until it has its answers (20 s at most). Prints JSON: `reset` (the holders'
///    streams the server ended), `ok` (the uploads answered 200 with their sha256 and
///    length), `cut` (the uploader's streams reset), `goaways` (holders told to go).
const H2_HOLD: &str = r#"
port, holders_n = int(sys.argv[1]), int(sys.argv[2])
conns, last_ping, last_drip = [], 0, 0
def service(seconds, done=lambda: False, extra=lambda: None):
    global last_ping, last_drip
    end = time.monotonic() + seconds
    while time.monotonic() < end and not done():
        now = time.monotonic()
        if now - last_ping > 0.5:
            last_ping = now
            for c in conns:
                if not c.closed and not c.goaway:
                    c.h2.ping(b"pingping")
                    c.flush()
        if now - last_drip > 1:
            last_drip = now
            for c in holders:
                if c.closed or c.goaway:
                    continue
                for sid in c.sids:
                    if sid not in c.ended and sid not in c.gone and c.h2.local_flow_control_window(sid) > 0:
                        c.h2.send_data(sid, b"x")
                c.flush()
        extra()
        for c in conns:
            if not c.closed:
                c.pump(0)
        time.sleep(0.02)

holders = []
for i in range(holders_n):
    c = Conn()
    conns.append(c)
    holders.append(c)
    c.gone = set()
    c.sids = [c.request("POST", f"/up/h{i}-{k}", False) for k in range(128)]
    service(0.5)
step("held")
h = holders[0]
h.h2.send_data(h.sids[0], b"x" * 5000)
h.flush()
service(0.3)
h.h2.reset_stream(h.sids[0])
h.gone.add(h.sids[0])
h.flush()
service(0.2)
step("nearly full")
up = Conn()
conns.append(up)
def body_of(i):
    seed = hashlib.sha256(str(i).encode()).digest()
    return (seed * (8192 + 1))[:256 << 10]
bodies = {up.request("POST", f"/fast/{i}", False): body_of(i) for i in range(16)}
sent = {sid: 0 for sid in bodies}
def send_some():
    for sid, body in bodies.items():
        while sent[sid] < len(body) and sid not in up.ended:
            n = min(up.h2.local_flow_control_window(sid), up.h2.max_outbound_frame_size, len(body) - sent[sid])
            if n <= 0:
                break
            up.h2.send_data(sid, body[sent[sid]:sent[sid] + n], end_stream=sent[sid] + n == len(body))
            sent[sid] += n
    up.flush()
service(12, lambda: all(len(c.ended) + len(c.gone) >= 128 for c in holders), send_some)
service(20, lambda: len(up.ended) == len(bodies), send_some)
want = {sid: f"{hashlib.sha256(b).hexdigest()} {len(b)}" for sid, b in bodies.items()}
print(json.dumps({
    "reset": sum(len(c.ended) for c in holders),
    "ok": sum(up.status.get(s) == "200" and up.body.get(s, b"").decode() == w for s, w in want.items()),
    "cut": sum(s in up.ended and s not in up.status for s in bodies),
    "goaways": sum(c.goaway for c in holders),
}), flush=True)
"#;

/// Uploads whose bodies do not come hold no window for good, one starved of window by
/// them is not taken for one of them, and a budget a few KiB short of full is no spin:
/// 5 connections opening 128 uploads each and sending a byte a second on each take the
/// worker's 12 MiB of windows; with 5,000 bytes of it given back the worker stays idle
/// (it spun a whole core: each waiter took the few bytes and gave them back, waking
/// every waiter); each trickling stream is reset within two keep-alive periods (nginx's
/// `client_body_timeout` with a minimum rate, as Apache's), while an uploader beside
/// them, whose window stays shut meanwhile, is not; the idle holders are then asked to
/// go, and its 16 uploads of 256 KiB all arrive whole.
#[test]
fn trickling_uploads_are_reset_a_starved_one_is_not_and_a_nearly_full_budget_does_not_spin() {
    let Some(mut w) = Windows::start_with(
        "wire-hold",
        H2_HOLD,
        "[timeouts]\nkeepalive = \"4s\"\n",
        &["5"],
    ) else {
        return;
    };
    assert_eq!(w.line(), "held");
    let held = w.budget();
    assert!(held > 11.0 * 1048576.0, "the holders hold {held} bytes");
    w.go_on();
    assert_eq!(w.line(), "nearly full");
    let before = w.server.cpu_ticks();
    std::thread::sleep(Duration::from_millis(1500));
    let spent = w.server.cpu_ticks() - before;
    assert!(
        spent < 50,
        "the worker spent {spent} ticks of CPU in 1.5 s with nothing to do"
    );
    w.go_on();
    let out: Value = serde_json::from_str(&w.line()).unwrap();
    assert!(w.client.wait().unwrap().success());
    eprintln!("{out}");
    // The first holder reset one of its own.
    assert_eq!(out["reset"], 5 * 128 - 1, "{out}");
    assert_eq!(
        out["cut"], 0,
        "the starved uploader's streams were cut: {out}"
    );
    assert_eq!(out["ok"], 16, "{out}");
    assert!(out["goaways"].as_u64().unwrap() >= 1, "{out}");
}

/// A slow client's uploads: `PORT STREAMS RATE SECONDS`: one connection opens
/// `STREAMS` POSTs to /fast/ and sends their bodies round-robin at `RATE` bytes a
/// second in all, for `SECONDS`, pausing 2 s once half-way, then ends each. Prints JSON
/// `ok` (answered 200) and `cut` (reset by the server).
const H2_SLOW: &str = r#"
port, streams, rate, seconds = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3]), float(sys.argv[4])
c = Conn()
sids = [c.request("POST", f"/fast/slow{k}", False) for k in range(streams)]
start, sent, turn, last_ping = time.monotonic(), 0, 0, 0
while time.monotonic() - start < seconds and not c.closed:
    now = time.monotonic() - start
    paused = seconds / 2 <= now < seconds / 2 + 2
    if not paused and sent < rate * now:
        sid = sids[turn % streams]
        turn += 1
        if sid not in c.ended and c.h2.local_flow_control_window(sid) >= 100:
            c.h2.send_data(sid, b"y" * 100)
            sent += 100
            c.flush()
    if time.monotonic() - last_ping > 0.5:
        last_ping = time.monotonic()
        c.h2.ping(b"pingping")
        c.flush()
    c.pump(0.005)
for sid in sids:
    if sid not in c.ended:
        c.h2.end_stream(sid)
c.flush()
c.until(lambda: all(s in c.ended for s in sids), 10)
print(json.dumps({
    "ok": sum(c.status.get(s) == "200" for s in sids),
    "cut": sum(s in c.ended and s not in c.status for s in sids),
}), flush=True)
"#;

/// A slow client is not taken for a stalling one: 8 uploads on one connection sharing
/// 1,500 bytes a second (under 200 each, below the per-stream minimum), with a 2 s
/// pause, over 4 periods of a 3 s keep-alive, are all answered: the minimum rate is the
/// connection's, over two periods.
#[test]
fn a_slow_clients_uploads_sharing_its_link_are_not_reset() {
    let Some(mut w) = Windows::start_with(
        "wire-slow",
        H2_SLOW,
        "[timeouts]\nkeepalive = \"3s\"\n",
        &["8", "1500", "12"],
    ) else {
        return;
    };
    let out: Value = serde_json::from_str(&w.line()).unwrap();
    assert!(w.client.wait().unwrap().success());
    assert_eq!(out["cut"], 0, "{out}");
    assert_eq!(out["ok"], 8, "{out}");
}

/// An upload on a connection whose other uploads are stuck (20 streams to an upstream
/// that reads nothing, their 64 KiB windows full: 1.25 MiB unread) gets a window of its
/// own and is answered: the connection's window opens toward every stream still
/// receiving a body, not to a fixed 1 MiB the stuck ones fill.
#[test]
fn an_upload_beside_stuck_ones_on_its_connection_gets_its_own_window() {
    let Some(mut w) = Windows::start("wire-stuck", &["0", "0", "20", "stalled"]) else {
        return;
    };
    assert_eq!(w.line(), "idle");
    w.go_on();
    assert_eq!(w.line(), "hoarded 0");
    w.go_on();
    let out: Value = serde_json::from_str(&w.line()).unwrap();
    eprintln!("{out}");
    assert_eq!(out["fast"], "200", "{out}");
}
