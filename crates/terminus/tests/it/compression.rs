//! Response compression with real clients: curl asking for each coding with a raw
//! `Accept-Encoding` (the bytes kept as sent, decoded by Python's gzip, brotli and
//! zstandard) and with `--compressed`; precompressed copies beside files; proxied
//! responses from app.py; and what is never compressed (ranges, HEAD, small bodies,
//! other types, `no-transform`, bodies already encoded, a route that turns it off).

use std::path::Path;
use std::process::Command;

use crate::harness::*;

/// SHA-256 of `data`, hex (Python's hashlib).
fn sha256(data: &[u8]) -> String {
    let dir = TestDir::new("compression-sha");
    let file = dir.write("data", data);
    python(&format!(
        "import hashlib; print(hashlib.sha256(open({:?}, 'rb').read()).hexdigest())",
        file.display().to_string()
    ))
}

/// SHA-256 of `file` decoded from `coding` by Python's decoders (`-` for none).
fn decoded_sha256(coding: &str, file: &Path) -> String {
    python(&format!(
        r#"
import gzip, hashlib, brotli, zstandard
data = open({file:?}, 'rb').read()
coding = {coding:?}
if coding == 'gzip': data = gzip.decompress(data)
elif coding == 'br': data = brotli.decompress(data)
elif coding == 'zstd': data = zstandard.ZstdDecompressor().decompressobj().decompress(data)
print(hashlib.sha256(data).hexdigest())
"#,
        file = file.display().to_string()
    ))
}

fn python(code: &str) -> String {
    let out = run(Command::new("python3").args(["-c", code]));
    assert!(
        out.status.success(),
        "python: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

/// What a request with `Accept-Encoding: accept` (`None`: none sent) gets: status, head,
/// and the body as sent, in `dir/name`.
fn fetch(
    server: &Server,
    dir: &TestDir,
    accept: Option<&str>,
    extra: &[&str],
    path: &str,
) -> (u16, String, std::path::PathBuf) {
    let body = dir.path("body");
    let header = accept.map(|a| format!("Accept-Encoding: {a}"));
    let mut args: Vec<&str> = vec!["-D", "-", "-o", body.to_str().unwrap()];
    if let Some(h) = &header {
        args.extend(["-H", h]);
    }
    args.extend_from_slice(extra);
    let out = curl(server, &args, path);
    let head = String::from_utf8_lossy(&out.stdout).into_owned();
    let code = head
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    assert!(code != 0, "{path}: {out:?}");
    (code, head, body)
}

fn varies(head: &str) -> bool {
    head.lines().any(|l| {
        l.split_once(':').is_some_and(|(n, v)| {
            n.eq_ignore_ascii_case("vary") && v.to_ascii_lowercase().contains("accept-encoding")
        })
    })
}

/// Text that compresses as pages do: words, repeated with variation.
fn page_text(lines: usize) -> String {
    (0..lines)
        .map(|i| {
            format!(
                "<p>line {i}: the quick brown fox {} jumps</p>\n",
                i * 7919 % 1000
            )
        })
        .collect()
}

#[test]
fn static_files_are_compressed_in_the_coding_the_client_prefers_and_copies_beside_them_served() {
    let dir = TestDir::new("compression-files");
    let page = page_text(3000);
    dir.write("www/big.html", &page);
    dir.write("www/small.txt", "short\n");
    dir.write("www/image.png", &page);
    dir.write("www/private/big.html", &page);
    dir.write("www/pre/app.js", &page);
    // Copies beside app.js, as a build step makes them (Python's compressors).
    let js = dir.path("www/pre/app.js");
    python(&format!(
        "import gzip, brotli; d = open({js:?}, 'rb').read(); open({js:?} + '.gz', 'wb').write(gzip.compress(d)); open({js:?} + '.br', 'wb').write(brotli.compress(d))",
        js = js.display().to_string()
    ));
    let want = sha256(page.as_bytes());
    let pair = make_cert(
        dir.path("").as_path(),
        "ecdsa",
        KeyKind::EcdsaP256,
        &["localhost"],
    );
    let conf = Config::new(&dir, &pair).workers(1).in_server(&format!(
        r#"compress = ["zstd", "br", "gzip"]
precompressed = ["br", "gzip"]
headers = {{ Vary = "Origin" }}
[[server.route]]
path = "/private/"
root = "{www}"
compress = []"#,
        www = dir.path("www").display()
    ));
    let server = ServerBuilder::with(&dir, &conf).start();

    for (accept, coding, extra) in [
        ("gzip", "gzip", &[][..]),
        ("br", "br", &[]),
        ("zstd", "zstd", &[]),
        ("gzip, deflate, br, zstd", "zstd", &[]),
        ("gzip;q=0.5, br;q=0.9", "br", &[]),
        ("zstd;q=0, gzip", "gzip", &["--http1.1"]),
        ("br", "br", &["--http1.1"]),
    ] {
        let (code, head, body) = fetch(&server, &dir, Some(accept), extra, "/big.html");
        assert_eq!(code, 200, "{accept}: {head}");
        assert_eq!(
            header_value(&head, "content-encoding").as_deref(),
            Some(coding),
            "{accept}: {head}"
        );
        assert!(varies(&head), "{accept}: {head}");
        assert!(header_value(&head, "content-length").is_none(), "{head}");
        assert!(
            header_value(&head, "etag").is_some_and(|t| t.starts_with("W/")),
            "{head}"
        );
        assert!(
            std::fs::metadata(&body).unwrap().len() * 4 < page.len() as u64,
            "{accept}: not smaller"
        );
        assert_eq!(decoded_sha256(coding, &body), want, "{accept} {extra:?}");
    }
    // No coding asked for, or none acceptable: the file, saying it could vary.
    for accept in [None, Some("identity"), Some("gzip;q=0, *;q=0")] {
        let (code, head, body) = fetch(&server, &dir, accept, &[], "/big.html");
        assert_eq!(code, 200);
        assert!(header_value(&head, "content-encoding").is_none(), "{head}");
        assert!(varies(&head), "{head}");
        assert_eq!(decoded_sha256("-", &body), want);
    }
    // curl's own decoding.
    let out = curl(&server, &["--compressed"], "/big.html");
    assert_eq!(sha256(&out.stdout), want);
    // The server's own Vary is kept beside Accept-Encoding.
    let (_, head, _) = fetch(&server, &dir, Some("gzip"), &[], "/big.html");
    let vary: Vec<String> = head
        .lines()
        .filter_map(|l| l.split_once(':'))
        .filter(|(n, _)| n.eq_ignore_ascii_case("vary"))
        .map(|(_, v)| v.trim().to_ascii_lowercase())
        .collect();
    assert!(vary.iter().any(|v| v.contains("origin")), "{head}");
    assert!(vary.iter().any(|v| v.contains("accept-encoding")), "{head}");
    // Accept-Encoding over two field lines is one list: zstd refused by the second.
    let (_, head, _) = fetch(
        &server,
        &dir,
        Some("*"),
        &["-H", "Accept-Encoding: zstd;q=0"],
        "/big.html",
    );
    assert_eq!(
        header_value(&head, "content-encoding").as_deref(),
        Some("br"),
        "{head}"
    );
    // A revalidation of the compressed representation: a 304 with its weak validator and
    // Vary, as the 200 had (a cache can freshen what it holds with it).
    let (_, head, _) = fetch(&server, &dir, Some("gzip"), &[], "/big.html");
    let weak = header_value(&head, "etag").unwrap();
    let (code, head, _) = fetch(
        &server,
        &dir,
        Some("gzip"),
        &["-H", &format!("If-None-Match: {weak}")],
        "/big.html",
    );
    assert_eq!(code, 304, "{head}");
    assert_eq!(header_value(&head, "etag"), Some(weak.clone()), "{head}");
    assert!(varies(&head), "{head}");
    // ... and of the file itself, without Accept-Encoding: its strong validator.
    let (code, head, _) = fetch(
        &server,
        &dir,
        None,
        &[
            "-H",
            &format!("If-None-Match: {}", weak.trim_start_matches("W/")),
        ],
        "/big.html",
    );
    assert_eq!(code, 304, "{head}");
    assert_eq!(
        header_value(&head, "etag").as_deref(),
        Some(weak.trim_start_matches("W/"))
    );

    // Never compressed: a range, a HEAD, a small body, a type that does not compress, a
    // route that turned it off.
    let (code, head, body) = fetch(&server, &dir, Some("gzip"), &["-r", "0-99"], "/big.html");
    assert_eq!(code, 206, "{head}");
    assert!(header_value(&head, "content-encoding").is_none(), "{head}");
    assert_eq!(std::fs::read(&body).unwrap(), &page.as_bytes()[..100]);
    let (_, head, _) = fetch(&server, &dir, Some("gzip"), &["-I"], "/big.html");
    assert!(header_value(&head, "content-encoding").is_none(), "{head}");
    assert!(varies(&head), "a HEAD varies as its GET: {head}");
    for path in ["/small.txt", "/image.png", "/private/big.html"] {
        let (code, head, _) = fetch(&server, &dir, Some("gzip, br, zstd"), &[], path);
        assert_eq!(code, 200, "{path}");
        assert!(
            header_value(&head, "content-encoding").is_none(),
            "{path}: {head}"
        );
    }

    // A file with copies beside it: the copy the client prefers, with its own strong
    // validator, at no compression cost; a coding without a copy is made on the fly.
    let (_, plain_head, _) = fetch(&server, &dir, None, &[], "/pre/app.js");
    let plain_tag = header_value(&plain_head, "etag").unwrap();
    assert!(varies(&plain_head), "{plain_head}");
    for (accept, coding, from_copy) in [
        ("gzip, br", "br", true),
        ("gzip", "gzip", true),
        ("zstd", "zstd", false),
    ] {
        let (code, head, body) = fetch(&server, &dir, Some(accept), &[], "/pre/app.js");
        assert_eq!(code, 200);
        assert_eq!(
            header_value(&head, "content-encoding").as_deref(),
            Some(coding),
            "{accept}: {head}"
        );
        assert!(varies(&head), "{head}");
        assert_eq!(
            header_value(&head, "content-type").as_deref(),
            Some("text/javascript; charset=utf-8"),
            "{head}"
        );
        // A copy's validator is its own; one made on the fly has the file's, weak.
        let tag = header_value(&head, "etag").unwrap();
        assert_eq!(
            tag.trim_start_matches("W/") != plain_tag,
            from_copy,
            "{head}"
        );
        assert_eq!(!tag.starts_with("W/"), from_copy, "{accept}: {head}");
        if from_copy {
            assert_eq!(
                header_value(&head, "content-length").map(|l| l.parse::<u64>().unwrap()),
                Some(std::fs::metadata(&body).unwrap().len())
            );
            // The copy's own validator answers a conditional request.
            let (code, _, _) = fetch(
                &server,
                &dir,
                Some(accept),
                &["-H", &format!("If-None-Match: {tag}")],
                "/pre/app.js",
            );
            assert_eq!(code, 304);
        }
        assert_eq!(decoded_sha256(coding, &body), want, "{accept}");
    }
}

#[test]
fn proxied_responses_are_compressed_as_they_stream_unless_encoded_or_no_transform() {
    let app = App::start("a");
    let dir = TestDir::new("compression-proxy");
    dir.write("www/index.html", "home\n");
    let pair = make_cert(
        dir.path("").as_path(),
        "ecdsa",
        KeyKind::EcdsaP256,
        &["localhost"],
    );
    let conf = Config::new(&dir, &pair)
        .workers(1)
        .before(&format!(
            "[[upstream]]\nname = \"app\"\nservers = [\"{}\"]\n",
            app.addr()
        ))
        .in_server(
            "compress = [\"zstd\", \"br\", \"gzip\"]\n[[server.route]]\npath = \"/app/\"\nupstream = \"app\"\n",
        );
    let server = ServerBuilder::with(&dir, &conf).admin().start();
    let direct = |query: &str| {
        let out = run(
            Command::new("curl").args(["-sS", &format!("http://{}/bytes?{query}", app.addr())])
        );
        sha256(&out.stdout)
    };
    for mode in ["chunked", "length"] {
        let query = format!("n=300000&mode={mode}&type=text/plain");
        let want = direct(&query);
        for coding in ["gzip", "br", "zstd"] {
            for extra in [&[][..], &["--http1.1"]] {
                let (code, head, body) = fetch(
                    &server,
                    &dir,
                    Some(coding),
                    extra,
                    &format!("/app/bytes?{query}"),
                );
                assert_eq!(code, 200, "{head}");
                assert_eq!(
                    header_value(&head, "content-encoding").as_deref(),
                    Some(coding),
                    "{mode} {extra:?}: {head}"
                );
                assert!(varies(&head), "{head}");
                assert!(header_value(&head, "content-length").is_none(), "{head}");
                assert_eq!(
                    decoded_sha256(coding, &body),
                    want,
                    "{mode} {coding} {extra:?}"
                );
            }
        }
    }
    // The upstream's own coding, its no-transform, or a type that does not compress:
    // passed on as they are.
    for (query, encoding) in [
        ("n=100000&type=text/plain&encoding=gzip", Some("gzip")),
        (
            "n=100000&type=text/plain&cache=public,%20no-transform",
            None,
        ),
        ("n=100000", None),
    ] {
        let want = direct(query);
        for extra in [&[][..], &["--http1.1"]] {
            let (code, head, body) = fetch(
                &server,
                &dir,
                Some("gzip, br, zstd"),
                extra,
                &format!("/app/bytes?{query}"),
            );
            assert_eq!(code, 200, "{head}");
            assert_eq!(
                header_value(&head, "content-encoding").as_deref(),
                encoding,
                "{query}: {head}"
            );
            assert_eq!(decoded_sha256("-", &body), want, "{query}");
        }
    }
    // What was compressed, counted: 4 responses a coding (two modes, two versions), each
    // of 300,000 bytes in and fewer out.
    let metrics = server.metrics();
    for coding in ["gzip", "br", "zstd"] {
        let label = format!("coding=\"{coding}\"");
        let responses = metric_sum(&metrics, "terminus_compressed_responses_total", &[&label]);
        let bytes_in = metric_sum(&metrics, "terminus_compression_in_bytes_total", &[&label]);
        let bytes_out = metric_sum(&metrics, "terminus_compression_out_bytes_total", &[&label]);
        assert_eq!(responses, 4.0, "{coding}");
        assert_eq!(bytes_in, 4.0 * 300_000.0, "{coding}");
        assert!(
            bytes_out > 0.0 && bytes_out * 4.0 < bytes_in,
            "{coding}: {bytes_out}"
        );
    }
}

/// A proxied stream's first part reaches the client, compressed and decodable, before the
/// upstream has sent the rest: app.py's /gate sends "event 1" and waits until /release is
/// asked for, which the client does only once it has decoded "event 1". Without the
/// flush when the upstream pauses, the client would wait for ever (here, 10 s).
#[test]
fn a_proxied_stream_is_flushed_compressed_when_the_upstream_pauses() {
    let app = App::start("a");
    let dir = TestDir::new("compression-stream");
    dir.write("www/index.html", "home\n");
    let pair = make_cert(
        dir.path("").as_path(),
        "ecdsa",
        KeyKind::EcdsaP256,
        &["localhost"],
    );
    let conf = Config::new(&dir, &pair)
        .workers(1)
        .before(&format!(
            "[compression]\nmin_length = 1\n[[upstream]]\nname = \"app\"\nservers = [\"{}\"]\n",
            app.addr()
        ))
        .in_server(
            "compress = [\"zstd\", \"br\", \"gzip\"]\n[[server.route]]\npath = \"/app/\"\nupstream = \"app\"\n",
        );
    let server = ServerBuilder::with(&dir, &conf).start();
    let out = python(&format!(
        r#"
import http.client, ssl, zlib, urllib.request, brotli, zstandard
tls = ssl._create_unverified_context()
for coding in ("gzip", "br", "zstd"):
    decoder = {{"gzip": lambda: zlib.decompressobj(wbits=31),
               "br": lambda: brotli.Decompressor(),
               "zstd": lambda: zstandard.ZstdDecompressor().decompressobj()}}[coding]()
    decode = decoder.process if coding == "br" else decoder.decompress
    conn = http.client.HTTPSConnection("127.0.0.1", {port}, context=tls, timeout=10)
    conn.request("GET", "/app/gate", headers={{"Accept-Encoding": coding}})
    resp = conn.getresponse()
    assert resp.getheader("Content-Encoding") == coding, resp.getheaders()
    text = b""
    while b"event 1" not in text:
        piece = resp.read1(65536)
        assert piece, coding + ": the stream ended before event 1"
        text += decode(piece)
    urllib.request.urlopen("http://{app}/release", timeout=10).read()
    while True:
        piece = resp.read1(65536)
        if not piece:
            break
        text += decode(piece)
    if coding == "gzip":
        assert decoder.eof, "the gzip stream was not ended"
    if coding == "br":
        assert decoder.is_finished(), "the brotli stream was not ended"
    print(coding, text.decode().strip())
"#,
        port = server.port(),
        app = app.addr()
    ));
    assert_eq!(
        out,
        "gzip event 1\nevent 2\nbr event 1\nevent 2\nzstd event 1\nevent 2"
    );
}

/// An HTTP/2 client that asks for `/big.txt` on 128 streams at once in one coding and
/// then reads nothing: its streams' windows are 1 byte (SETTINGS_INITIAL_WINDOW_SIZE),
/// so every response it started stays open. Prints `ready N` once every response's head
/// has come (N of them compressed), then holds the connection until its stdin closes.
const STALLED_STREAMS: &str = r#"
import socket, ssl, sys
import h2.config, h2.connection, h2.events, h2.settings
port, coding = int(sys.argv[1]), sys.argv[2]
ctx = ssl.create_default_context()
ctx.check_hostname = False
ctx.verify_mode = ssl.CERT_NONE
ctx.set_alpn_protocols(["h2"])
sock = ctx.wrap_socket(socket.create_connection(("127.0.0.1", port)), server_hostname="localhost")
conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
conn.local_settings = h2.settings.Settings(client=True, initial_values={
    h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: 1,
    h2.settings.SettingCodes.MAX_CONCURRENT_STREAMS: 1000,
})
conn.initiate_connection()
sock.sendall(conn.data_to_send())
streams = []
for i in range(128):
    sid = conn.get_next_available_stream_id()
    conn.send_headers(sid, [(":method", "GET"), (":scheme", "https"), (":authority", "localhost"),
                            (":path", "/big.txt"), ("accept-encoding", coding)], end_stream=True)
    streams.append(sid)
sock.sendall(conn.data_to_send())
heads, compressed = set(), 0
while len(heads) < len(streams):
    data = sock.recv(65536)
    if not data:
        sys.exit("the server closed the connection")
    for event in conn.receive_data(data):
        if isinstance(event, h2.events.ResponseReceived):
            heads.add(event.stream_id)
            if any(k == b"content-encoding" for k, _ in event.headers):
                compressed += 1
        elif isinstance(event, h2.events.StreamReset):
            sys.exit(f"stream {event.stream_id} reset: {event.error_code}")
    sock.sendall(conn.data_to_send())
print("ready", compressed, flush=True)
sys.stdin.read()
"#;

/// What the server's resident memory grows by while one HTTP/2 connection holds 128
/// stalled responses of a 2.7 MB text in `coding`, and how many of them were compressed.
fn stalled_streams_growth(server: &Server, coding: &str) -> (u64, usize) {
    use std::io::{BufRead, BufReader};
    let before = server.memory_kib("VmRSS");
    let mut client = Command::new("python3")
        .args(["-c", STALLED_STREAMS, &server.port().to_string(), coding])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(client.stdout.as_mut().unwrap())
        .read_line(&mut line)
        .unwrap();
    let compressed: usize = line
        .strip_prefix("ready ")
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or_else(|| panic!("{coding}: the client said {line:?}"));
    // The encoders' first input is compressed as the responses start; give the worker
    // a moment to have done all it will do for them.
    std::thread::sleep(std::time::Duration::from_millis(500));
    let during = server.memory_kib("VmRSS");
    drop(client.stdin.take());
    client.wait().unwrap();
    (during.saturating_sub(before), compressed)
}

/// The attack on compression's memory: 128 HTTP/2 streams on one connection, each
/// asking for a large text in zstd, br or gzip and reading nothing. Each encoder is
/// reserved against the connection's 8 MiB (and the worker's 128 MiB) before it is
/// made: past that, responses go out uncompressed, so the server's memory grows by less
/// than README's bound (16 MiB) whatever the coding; it grew by 175 MiB with zstd
/// without the budget. Responses within the budget are still compressed.
#[test]
fn stalled_http2_streams_hold_compression_memory_to_the_connections_budget() {
    let dir = TestDir::new("compression-stalled-streams");
    dir.write("www/big.txt", page_text(60_000));
    let pair = make_cert(
        dir.path("").as_path(),
        "ecdsa",
        KeyKind::EcdsaP256,
        &["localhost"],
    );
    let conf = Config::new(&dir, &pair)
        .workers(1)
        .in_server(r#"compress = ["zstd", "br", "gzip"]"#);
    // A server for each coding, so that none reuses what another's encoders freed.
    for coding in ["identity", "zstd", "br", "gzip"] {
        let server = ServerBuilder::with(&dir, &conf).admin().start();
        let (grew_kib, compressed) = stalled_streams_growth(&server, coding);
        eprintln!("{coding}: RSS +{grew_kib} KiB, {compressed} of 128 compressed");
        if coding == "identity" {
            continue;
        }
        assert!(
            grew_kib < 16 * 1024,
            "{coding}: the server's memory grew by {grew_kib} KiB for 128 stalled streams"
        );
        assert!(
            (1..128).contains(&compressed),
            "{coding}: {compressed} of 128 compressed"
        );
        assert!(server.metric("terminus_compression_no_memory_total", &[]) > 0.0);
    }
}
