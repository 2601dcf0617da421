//! terminus's own HTTP/1.1 parser against hostile clients: headers dribbled a byte at a
//! time, request smuggling, pipelining behind refused requests, bodies that must be
//! skipped exactly, path traversal, and clients that stop reading. Bytes are written by a
//! rustls client exactly as the test spells them (see harness/raw.rs).

use std::process::Command;
use std::time::{Duration, Instant};

use crate::harness::raw::{statuses, Ended, Raw};
use crate::harness::*;

/// A server whose timeouts are `request_header`, `keepalive` (also the stall timeout of
/// a response) and a long handshake timeout, with a few files; `/smuggled.txt` must never
/// be served to a test that did not ask for it in plain sight.
fn start(request_header: &str, keepalive: &str) -> (TestDir, Server) {
    let dir = TestDir::new("http1");
    let pair = make_cert(&dir.0, "k", KeyKind::EcdsaP256, &["localhost"]);
    dir.write("www/index.html", "hi\n");
    dir.write("www/digits.txt", "0123456789");
    dir.write("www/smuggled.txt", "SMUGGLED\n");
    let big: Vec<u8> = (0..32u32 << 20).map(|i| (i % 251) as u8).collect();
    dir.write("www/big.bin", big);
    let conf = Config::new(&dir, &pair).before(&format!(
            "[timeouts]\nhandshake = \"30s\"\nrequest_header = \"{request_header}\"\nkeepalive = \"{keepalive}\"\n"
        )).write(&dir);
    let server = ServerBuilder::config(&conf).admin().start();
    (dir, server)
}

/// Sends a header one byte every 0.5 s; returns how long after its first byte the
/// server closed, and how many bytes it had taken, or `None` if it was still open after
/// `give_up`.
fn dribble(server: &Server, give_up: Duration) -> Option<(Duration, usize)> {
    let mut c = Raw::connect(server);
    let header = b"GET /index.html HTTP/1.1\r\nHost: localhost\r\nX-Padding: aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa";
    let first = Instant::now();
    for (sent, byte) in header.iter().enumerate() {
        if c.send(std::slice::from_ref(byte)).is_err() {
            return Some((first.elapsed(), sent));
        }
        let (reply, ended) = c.read_for(Duration::from_millis(500));
        assert!(
            !String::from_utf8_lossy(&reply).contains("200 OK"),
            "an incomplete header was answered"
        );
        if ended == Ended::Closed {
            return Some((first.elapsed(), sent + 1));
        }
        if first.elapsed() > give_up {
            return None;
        }
    }
    panic!("the whole header was dribbled without the server closing or the test giving up");
}

#[test]
fn a_dribbled_header_is_cut_at_the_request_header_timeout() {
    // The header timeout counts from the first byte, however steadily bytes arrive: a
    // timer that restarted on every read would never fire here.
    let (_dir, server) = start("2s", "60s");
    let (after, bytes) = dribble(&server, Duration::from_secs(40))
        .expect("a dribbling client kept for 40 s with request_header = 2s");
    assert!(
        bytes >= 3,
        "closed after {bytes} bytes: the dribble never started"
    );
    assert!(
        after >= Duration::from_secs(2) && after < Duration::from_secs(30),
        "closed {after:?} after the first byte (request_header 2s, keepalive 60s)"
    );
    // The mirror image: with a long header timeout and a short keep-alive timeout, the
    // same client is still being read well past the keep-alive timeout.
    let (_dir, server) = start("60s", "1s");
    assert_eq!(
        dribble(&server, Duration::from_secs(4)),
        None,
        "a header in progress was cut by the keep-alive timeout"
    );
    // ...while a connection with nothing in progress goes at the keep-alive timeout.
    let mut c = Raw::connect(&server);
    c.send(b"GET /index.html HTTP/1.1\r\nHost: localhost\r\n\r\n")
        .unwrap();
    let started = Instant::now();
    let reply = c.read_to_close(Duration::from_secs(30));
    assert_eq!(statuses(&reply), [200]);
    assert!(started.elapsed() >= Duration::from_secs(1));
    assert_eq!(status(&server, &["--http1.1"], "/index.html"), 200);
}

#[test]
fn smuggling_attempts_are_refused_and_nothing_behind_them_is_served() {
    let (_dir, server) = start("10s", "10s");
    let behind = "GET /smuggled.txt HTTP/1.1\r\nHost: localhost\r\n\r\n";
    let attempts = [
        // Both framings: a proxy in front may honour either.
        "POST /index.html HTTP/1.1\r\nHost: localhost\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
        "POST /index.html HTTP/1.1\r\nHost: localhost\r\nTransfer-Encoding: chunked\r\nContent-Length: 5\r\n\r\n0\r\n\r\n",
        // Two lengths that disagree, or one that is not a plain number.
        "POST /index.html HTTP/1.1\r\nHost: localhost\r\nContent-Length: 5\r\nContent-Length: 0\r\n\r\nhello",
        "POST /index.html HTTP/1.1\r\nHost: localhost\r\nContent-Length: 5, 0\r\n\r\nhello",
        "POST /index.html HTTP/1.1\r\nHost: localhost\r\nContent-Length: +5\r\n\r\nhello",
        // Whitespace before the colon, and obsolete line folding.
        "POST /index.html HTTP/1.1\r\nHost: localhost\r\nTransfer-Encoding : chunked\r\n\r\n0\r\n\r\n",
        "GET /index.html HTTP/1.1\r\nHost: localhost\r\nX-A: 1\r\n folded\r\n\r\n",
    ];
    for attempt in attempts {
        let mut c = Raw::connect(&server);
        c.send(format!("{attempt}{behind}").as_bytes()).unwrap();
        let reply = c.read_to_close(Duration::from_secs(20));
        let text = String::from_utf8_lossy(&reply);
        assert_eq!(statuses(&reply), [400], "{attempt:?} got:\n{text}");
        assert!(
            text.to_ascii_lowercase().contains("connection: close"),
            "{text}"
        );
        assert!(
            !text.contains("SMUGGLED"),
            "{attempt:?} let through:\n{text}"
        );
    }
    assert_eq!(status(&server, &["--http1.1"], "/index.html"), 200);
}

#[test]
fn a_skipped_body_lines_up_with_the_next_request() {
    let (_dir, server) = start("10s", "10s");
    // The body looks like a request; it must be skipped as bytes, never parsed.
    let body = "GET /smuggled.txt HTTP/1.1\r\nHost: localhost\r\n\r\n";
    let post = format!(
        "POST /digits.txt HTTP/1.1\r\nHost: localhost\r\nContent-Length: {}\r\n\r\n",
        body.len()
    );
    let get = "GET /digits.txt HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n";
    // All in one write (the body comes out of the header buffer), and the body arriving
    // later, split across records (it is read from the connection).
    for split in [false, true] {
        let mut c = Raw::connect(&server);
        if split {
            c.send(post.as_bytes()).unwrap();
            // On purpose: the head alone first, so that the body is read from the
            // connection, not from the header buffer.
            std::thread::sleep(Duration::from_millis(100));
            c.send(&body.as_bytes()[..10]).unwrap();
            c.send(format!("{}{get}", &body[10..]).as_bytes()).unwrap();
        } else {
            c.send(format!("{post}{body}{get}").as_bytes()).unwrap();
        }
        let reply = c.read_to_close(Duration::from_secs(20));
        let text = String::from_utf8_lossy(&reply);
        assert_eq!(statuses(&reply), [405, 200], "split {split}:\n{text}");
        assert!(text.ends_with("0123456789"), "{text}");
        assert!(!text.contains("SMUGGLED"), "{text}");
    }
    // A chunked body is decoded and skipped the same way, split anywhere: the request
    // after its last chunk is served, and the body's contents never are.
    let chunked = format!(
        "POST /digits.txt HTTP/1.1\r\nHost: localhost\r\nTransfer-Encoding: chunked\r\n\r\n{:x};ext=1\r\n{body}\r\n3\r\nabc\r\n0\r\nX-Trailer: 1\r\n\r\n",
        body.len()
    );
    for cut in [0, 7, chunked.len() - 3] {
        let mut c = Raw::connect(&server);
        c.send(&chunked.as_bytes()[..cut.max(1)]).unwrap();
        // On purpose: the rest arrives apart, cut where the test says.
        std::thread::sleep(Duration::from_millis(50));
        c.send(format!("{}{get}", &chunked[cut.max(1)..]).as_bytes())
            .unwrap();
        let reply = c.read_to_close(Duration::from_secs(20));
        let text = String::from_utf8_lossy(&reply);
        assert_eq!(statuses(&reply), [405, 200], "cut {cut}:\n{text}");
        assert!(text.ends_with("0123456789"), "{text}");
        assert!(!text.contains("SMUGGLED"), "{text}");
    }
}

#[test]
fn bodies_that_cannot_be_framed_end_the_connection() {
    let (_dir, server) = start("10s", "10s");
    let behind = "GET /smuggled.txt HTTP/1.1\r\nHost: localhost\r\n\r\n";
    let cases = [
        // Malformed chunks: the request is answered, nothing after it is read as a request.
        (
            "Transfer-Encoding: chunked\r\n\r\n5\r\nhelloXX\r\n0\r\n\r\n",
            405,
        ),
        (
            "Transfer-Encoding: chunked\r\n\r\n 5\r\nhello\r\n0\r\n\r\n",
            405,
        ),
        (
            "Transfer-Encoding: chunked\r\n\r\n5\nhello\r\n0\r\n\r\n",
            405,
        ),
        // Codings terminus cannot undo are not guessed at, as nginx.
        ("Transfer-Encoding: gzip, chunked\r\n\r\n0\r\n\r\n", 501),
        ("Transfer-Encoding: identity\r\n\r\n", 501),
        // Too long to read away: answered, then closed.
        ("Content-Length: 1000000\r\n\r\n", 405),
    ];
    for (rest, want) in cases {
        let mut c = Raw::connect(&server);
        let request = format!("POST /digits.txt HTTP/1.1\r\nHost: localhost\r\n{rest}");
        c.send(format!("{request}{behind}").as_bytes()).unwrap();
        let reply = c.read_to_close(Duration::from_secs(20));
        let text = String::from_utf8_lossy(&reply);
        assert_eq!(statuses(&reply), [want], "{rest:?} got:\n{text}");
        assert!(!text.contains("SMUGGLED"), "{rest:?} let through:\n{text}");
    }
    assert_eq!(status(&server, &["--http1.1"], "/index.html"), 200);
}

#[test]
fn a_client_expecting_100_continue_gets_it_when_its_body_is_wanted() {
    let (_dir, server) = start("10s", "10s");
    let mut c = Raw::connect(&server);
    c.send(b"POST /digits.txt HTTP/1.1\r\nHost: localhost\r\nContent-Length: 5\r\nExpect: 100-continue\r\n\r\n")
        .unwrap();
    let (interim, ended) = c.read_for(Duration::from_secs(2));
    assert_eq!(ended, Ended::Open);
    assert_eq!(
        String::from_utf8_lossy(&interim),
        "HTTP/1.1 100 Continue\r\n\r\n",
        "the body is read away, so it is asked for first"
    );
    c.send(b"helloGET /digits.txt HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
        .unwrap();
    let reply = c.read_to_close(Duration::from_secs(20));
    assert_eq!(
        statuses(&reply),
        [405, 200],
        "{}",
        String::from_utf8_lossy(&reply)
    );

    // A client that sent its body without waiting is not told to continue.
    let mut c = Raw::connect(&server);
    c.send(b"POST /digits.txt HTTP/1.1\r\nHost: localhost\r\nContent-Length: 5\r\nExpect: 100-continue\r\nConnection: close\r\n\r\nhello")
        .unwrap();
    let reply = c.read_to_close(Duration::from_secs(20));
    let text = String::from_utf8_lossy(&reply);
    assert_eq!(statuses(&reply), [405], "{text}");
    assert!(!text.contains("100 Continue"), "{text}");
}

#[test]
fn uploads_over_http2_are_read_away_and_answered() {
    // The same route code reads the body as an HTTP/2 stream: curl sees its answer, not
    // a reset stream.
    let (dir, server) = start("10s", "10s");
    let small = dir.0.join("small.bin");
    std::fs::write(&small, vec![b'x'; 50_000]).unwrap();
    let data = format!("@{}", small.display());
    let out = curl(
        &server,
        &[
            "--http2",
            "-o",
            "/dev/null",
            "-w",
            "%{http_code} %{http_version}",
            "--data-binary",
            &data,
        ],
        "/digits.txt",
    );
    assert_eq!(String::from_utf8_lossy(&out.stdout), "405 2", "{out:?}");
}

#[test]
fn pipelined_requests_are_answered_in_order() {
    let (_dir, server) = start("10s", "10s");
    let mut c = Raw::connect(&server);
    c.send(
        b"GET /digits.txt HTTP/1.1\r\nHost: localhost\r\n\r\n\
          GET /nope HTTP/1.1\r\nHost: localhost\r\n\r\n\
          HEAD /index.html HTTP/1.1\r\nHost: localhost\r\n\r\n\
          GET /index.html HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n",
    )
    .unwrap();
    let reply = c.read_to_close(Duration::from_secs(20));
    let text = String::from_utf8_lossy(&reply);
    assert_eq!(statuses(&reply), [200, 404, 200, 200], "{text}");
    assert!(text.ends_with("\r\n\r\nhi\n"), "{text}");
}

#[test]
fn a_client_that_stops_reading_is_cut_at_the_stall_timeout() {
    let (_dir, server) = start("10s", "2s");
    let mut c = Raw::connect(&server);
    // Every step of the response starts after this, so none can be cut before +2 s.
    let sent = Instant::now();
    c.send(b"GET /big.bin HTTP/1.1\r\nHost: localhost\r\n\r\n")
        .unwrap();
    let first = c.read_some();
    assert!(
        String::from_utf8_lossy(&first).starts_with("HTTP/1.1 200"),
        "{:?}",
        String::from_utf8_lossy(&first[..first.len().min(200)])
    );
    // The client reads nothing more; the response cannot progress.
    assert_eq!(server.metric("terminus_connections_open", &[]), 1.0);
    eventually(Duration::from_secs(30), "a stalled response closed", || {
        server.metric("terminus_connections_open", &[]) == 0.0
    });
    assert!(
        sent.elapsed() >= Duration::from_secs(2),
        "cut {:?} after the request (stall timeout 2s)",
        sent.elapsed()
    );
    // What had been sent before the cut is all the client gets.
    let (rest, ended) = c.read_for(Duration::from_secs(20));
    assert_eq!(ended, Ended::Closed);
    assert!(
        first.len() + rest.len() < 32 << 20,
        "the whole file arrived"
    );
    assert_eq!(status(&server, &["--http1.1"], "/index.html"), 200);
}

/// An HTTP/2 client that asks for a large file, opens no window for its stream (the
/// connection's it opens), and keeps its connection busy: a PING every 0.3 s and a GET of /index.html every 1.5 s, whose
/// answers it reads. Prints JSON: `reset` (seconds after its request the large file's
/// stream was reset, or null after 20 s), `code` (the reset's), `after` (GETs answered
/// 200 on the same connection after the reset), `closed` (the connection ended).
const H2_PINGS_NO_WINDOW: &str = r#"
import json, select, socket, ssl, sys, time
import h2.config, h2.connection, h2.events, h2.settings

ctx = ssl.create_default_context()
ctx.check_hostname = False
ctx.verify_mode = ssl.CERT_NONE
ctx.set_alpn_protocols(["h2"])
sock = ctx.wrap_socket(socket.create_connection(("127.0.0.1", int(sys.argv[1]))), server_hostname="localhost")
conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
conn.initiate_connection()
def get(path):
    sid = conn.get_next_available_stream_id()
    conn.send_headers(sid, [(":method", "GET"), (":scheme", "https"), (":authority", "localhost"), (":path", path)], end_stream=True)
    return sid
big = get("/big.bin")
sock.sendall(conn.data_to_send())
start = last_ping = last_get = time.monotonic()
out = {"reset": None, "code": None, "after": 0, "closed": False}
small, status = set(), {}
while time.monotonic() - start < 20 and not out["closed"]:
    now = time.monotonic()
    if now - last_ping > 0.3:
        conn.ping(b"pingpong")
        last_ping = now
    if now - last_get > 1.5:
        small.add(get("/index.html"))
        last_get = now
    sock.sendall(conn.data_to_send())
    if out["reset"] is not None and out["after"] >= 2:
        break
    if not sock.pending() and not select.select([sock], [], [], 0.1)[0]:
        continue
    data = sock.recv(65536)
    if not data:
        out["closed"] = True
        break
    for ev in conn.receive_data(data):
        if isinstance(ev, h2.events.ConnectionTerminated):
            out["closed"] = True
        elif isinstance(ev, h2.events.StreamReset) and ev.stream_id == big:
            out["reset"] = round(time.monotonic() - start, 1)
            out["code"] = int(ev.error_code)
        elif isinstance(ev, h2.events.ResponseReceived):
            status[ev.stream_id] = dict(ev.headers)[b":status"]
        elif isinstance(ev, h2.events.DataReceived) and ev.stream_id != big:
            conn.acknowledge_received_data(ev.flow_controlled_length, ev.stream_id)
        elif isinstance(ev, h2.events.DataReceived) and ev.flow_controlled_length:
            # The connection's window is opened again, the large file's own never.
            conn.increment_flow_control_window(ev.flow_controlled_length)
        elif isinstance(ev, h2.events.StreamEnded) and ev.stream_id in small:
            if out["reset"] is not None and status.get(ev.stream_id) == b"200":
                out["after"] += 1
print(json.dumps(out))
"#;

/// An HTTP/2 answer that waits on a window its client never opens is cut as a stalled
/// HTTP/1.1 one is, though the client keeps its connection busy with PINGs and other
/// requests: its stream is reset (CANCEL) within a few stall timeouts (2 s here), and
/// the connection goes on answering (where PINGs kept the stream, and what it held,
/// for good before).
#[test]
fn an_http2_answer_whose_window_stays_shut_is_reset_and_its_connection_goes_on() {
    if !python_imports("h2", "python3 -m pip install h2") {
        return;
    }
    let (dir, server) = start("10s", "2s");
    let script = dir.write("h2_pings.py", H2_PINGS_NO_WINDOW);
    let out = run(Command::new("python3")
        .arg(&script)
        .arg(server.port().to_string()));
    let said: serde_json::Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|_| panic!("{}", String::from_utf8_lossy(&out.stderr)));
    let reset = said["reset"]
        .as_f64()
        .unwrap_or_else(|| panic!("never reset: {said}"));
    assert!(
        (2.0..=7.0).contains(&reset),
        "reset {reset} s after the request: {said}"
    );
    assert_eq!(said["code"], 8, "CANCEL: {said}");
    assert_eq!(said["closed"], false, "{said}");
    assert!(said["after"].as_u64().unwrap() >= 2, "{said}");
}
