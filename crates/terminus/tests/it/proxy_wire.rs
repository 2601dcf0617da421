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
