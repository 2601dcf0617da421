//! Static file semantics with curl: headers, conditional requests, ranges, HEAD,
//! directories, error statuses, and every traversal trick we know of.

use std::os::unix::fs::symlink;
use std::process::Command;
use std::time::Duration;

use crate::harness::raw::Raw;
use crate::harness::*;

struct Site {
    dir: TestDir,
    server: Server,
}

fn site() -> Site {
    let dir = TestDir::new("static");
    dir.write("www/index.html", "<h1>root index</h1>\n");
    dir.write("www/0kb.bin", "");
    dir.write("www/style.css", "body{}\n");
    dir.write("www/data.json", "{}\n");
    dir.write("www/digits.txt", "0123456789");
    dir.write("www/sub/index.html", "sub index\n");
    dir.write("www/noindex/file.txt", "x");
    dir.write("secret.txt", "TOP SECRET outside the root\n");
    symlink(dir.path("secret.txt"), dir.path("www/escape.txt")).unwrap();
    symlink("/etc", dir.path("www/etc-link")).unwrap();
    symlink("digits.txt", dir.path("www/inside-link.txt")).unwrap();
    let server = ServerBuilder::flags(&[
        "--root",
        dir.path("www").to_str().unwrap(),
        "--workers",
        "1",
    ])
    .start();
    Site { dir, server }
}

#[test]
fn files_have_type_length_validators() {
    let s = site();
    let (code, head, body) = headers(&s.server, &[], "/style.css");
    assert_eq!(code, 200);
    assert_eq!(body, b"body{}\n");
    assert_eq!(
        header_value(&head, "content-type").unwrap(),
        "text/css; charset=utf-8"
    );
    assert_eq!(header_value(&head, "content-length").unwrap(), "7");
    assert!(header_value(&head, "last-modified")
        .unwrap()
        .ends_with("GMT"));
    assert!(header_value(&head, "etag").unwrap().starts_with('"'));
    assert_eq!(header_value(&head, "accept-ranges").unwrap(), "bytes");
    let (_, head, _) = headers(&s.server, &[], "/data.json");
    assert_eq!(
        header_value(&head, "content-type").unwrap(),
        "application/json"
    );
    // The benchmark's empty file.
    let (code, head, body) = headers(&s.server, &[], "/0kb.bin");
    assert_eq!((code, body.len()), (200, 0));
    assert_eq!(header_value(&head, "content-length").unwrap(), "0");
    assert_eq!(
        header_value(&head, "content-type").unwrap(),
        "application/octet-stream"
    );
}

#[test]
fn conditional_requests_give_304() {
    let s = site();
    let (_, head, _) = headers(&s.server, &[], "/digits.txt");
    let etag = header_value(&head, "etag").unwrap();
    let modified = header_value(&head, "last-modified").unwrap();
    let inm = format!("If-None-Match: {etag}");
    let (code, _, body) = headers(&s.server, &["-H", &inm], "/digits.txt");
    assert_eq!((code, body.len()), (304, 0));
    assert_eq!(
        headers(
            &s.server,
            &["-H", "If-None-Match: \"other\""],
            "/digits.txt"
        )
        .0,
        200
    );
    let ims = format!("If-Modified-Since: {modified}");
    assert_eq!(headers(&s.server, &["-H", &ims], "/digits.txt").0, 304);
    assert_eq!(
        headers(
            &s.server,
            &["-H", "If-Modified-Since: Mon, 01 Jan 2001 00:00:00 GMT"],
            "/digits.txt"
        )
        .0,
        200
    );
    // If-None-Match wins over If-Modified-Since.
    assert_eq!(
        headers(
            &s.server,
            &["-H", "If-None-Match: \"other\"", "-H", &ims],
            "/digits.txt"
        )
        .0,
        200
    );
}

#[test]
fn ranges_give_206_and_416() {
    let s = site();
    let (code, head, body) = headers(&s.server, &["-r", "2-5"], "/digits.txt");
    assert_eq!((code, body.as_slice()), (206, b"2345".as_slice()));
    assert_eq!(
        header_value(&head, "content-range").unwrap(),
        "bytes 2-5/10"
    );
    assert_eq!(header_value(&head, "content-length").unwrap(), "4");
    let (code, _, body) = headers(&s.server, &["-r", "-3"], "/digits.txt");
    assert_eq!((code, body.as_slice()), (206, b"789".as_slice()));
    let (code, _, body) = headers(&s.server, &["-r", "7-"], "/digits.txt");
    assert_eq!((code, body.as_slice()), (206, b"789".as_slice()));
    let (code, head, _) = headers(&s.server, &["-r", "20-30"], "/digits.txt");
    assert_eq!(code, 416);
    assert_eq!(header_value(&head, "content-range").unwrap(), "bytes */10");
    // If-Range with a stale validator: the whole file.
    let (code, _, body) = headers(
        &s.server,
        &["-r", "2-5", "-H", "If-Range: \"stale\""],
        "/digits.txt",
    );
    assert_eq!((code, body.len()), (200, 10));
    // HTTP/2 too.
    let (code, _, body) = headers(&s.server, &["--http2", "-r", "0-0"], "/digits.txt");
    assert_eq!((code, body.as_slice()), (206, b"0".as_slice()));
}

#[test]
fn head_has_headers_and_no_body() {
    let s = site();
    for flag in ["--http1.1", "--http2"] {
        // With -I curl writes the header block to the output, so read it from there.
        let out = curl(
            &s.server,
            &[flag, "-I", "-w", "%{http_code} %{size_download}"],
            "/digits.txt",
        );
        let text = String::from_utf8_lossy(&out.stdout);
        assert_eq!(
            header_value(&text, "content-length").as_deref(),
            Some("10"),
            "{flag}: {text}"
        );
        assert!(text.trim_end().ends_with("200 0"), "{flag}: {text}");
    }
}

#[test]
fn directories_index_redirect_forbidden() {
    let s = site();
    let (code, _, body) = headers(&s.server, &[], "/");
    assert_eq!(
        (code, body.as_slice()),
        (200, b"<h1>root index</h1>\n".as_slice())
    );
    let (code, _, body) = headers(&s.server, &[], "/sub/");
    assert_eq!((code, body.as_slice()), (200, b"sub index\n".as_slice()));
    let (code, head, _) = headers(&s.server, &[], "/sub");
    assert_eq!(code, 301);
    assert_eq!(header_value(&head, "location").unwrap(), "/sub/");
    assert_eq!(
        headers(&s.server, &[], "/noindex/").0,
        403,
        "directory without index.html"
    );
    assert_eq!(headers(&s.server, &[], "/missing.html").0, 404);
    assert_eq!(
        headers(&s.server, &[], "/digits.txt/").0,
        404,
        "a file is not a directory"
    );
    let (code, head, _) = headers(&s.server, &["-X", "POST", "-d", "x"], "/digits.txt");
    assert_eq!(code, 405);
    assert_eq!(header_value(&head, "allow").unwrap(), "GET, HEAD");
    assert_eq!(headers(&s.server, &["-X", "DELETE"], "/digits.txt").0, 405);
}

#[test]
fn nothing_outside_the_root_is_served() {
    let s = site();
    let secret = std::fs::read_to_string(s.dir.path("secret.txt")).unwrap();
    assert!(secret.contains("TOP SECRET"));
    let attempts = [
        "/../secret.txt",
        "/sub/../../secret.txt",
        "/%2e%2e/secret.txt",
        "/%2E%2E/%2E%2E/etc/passwd",
        "/sub/%2e%2e%2f%2e%2e%2fsecret.txt",
        "/..%2fsecret.txt",
        "/%2fetc%2fpasswd",
        "//etc/passwd",
        "/sub/..%5c..%5csecret.txt",
        "/digits.txt%00.html",
        "/escape.txt",
        "/etc-link/passwd",
        "/etc-link/",
    ];
    // Through terminus's own HTTP/1.1 parser and through hyper's HTTP/2.
    for (protocol, answer) in [("--http1.1", "HTTP/1.1 "), ("--http2", "HTTP/2 ")] {
        for path in attempts {
            let (code, head, body) = headers(&s.server, &["--path-as-is", protocol], path);
            assert!(head.starts_with(answer), "{protocol} {path}: {head}");
            let body = String::from_utf8_lossy(&body);
            assert!(
                !body.contains("TOP SECRET") && !body.contains("root:x:0:0"),
                "{protocol} {path} leaked: {body}"
            );
            assert!([400, 403, 404].contains(&code), "{protocol} {path}: {code}");
        }
    }
    let (code, _, _) = headers(&s.server, &["--path-as-is"], "/../secret.txt");
    assert_eq!(code, 400, "above the root is a bad request, as in nginx");
    assert_eq!(
        headers(&s.server, &[], "/escape.txt").0,
        403,
        "symlink leaving the root"
    );
    assert_eq!(
        headers(&s.server, &[], "/digits.txt%00.html").0,
        400,
        "NUL byte"
    );
    // A symlink that stays inside the root is fine; dot segments inside the root too.
    let (code, _, body) = headers(&s.server, &[], "/inside-link.txt");
    assert_eq!((code, body.as_slice()), (200, b"0123456789".as_slice()));
    let (code, _, body) = headers(&s.server, &["--path-as-is"], "/sub/../digits.txt");
    assert_eq!((code, body.as_slice()), (200, b"0123456789".as_slice()));
}

/// A files route's prefix holds: with `path = "/static/"` and `root = APP`, only
/// APP/static/ is served, never the rest of APP (`.env`) through an encoded slash or
/// backslash, a backslash, or a `..;` segment, over HTTP/1.1 and HTTP/2: each is a 400.
#[test]
fn a_files_route_is_not_left_through_encoded_slashes_backslashes_or_parameters() {
    let dir = TestDir::new("static-route-escape");
    dir.write("app/.env", "TOP SECRET=beside the route\n");
    dir.write("app/static/ok.txt", "ok\n");
    dir.write("www/index.html", "root\n");
    let pair = make_cert(&dir.0, "k", KeyKind::EcdsaP256, &["localhost"]);
    let conf = dir.write(
        "terminus.toml",
        format!(
            "listen = [\"127.0.0.1:0\"]\nworkers = 1\n[[server]]\nnames = [\"localhost\"]\nroot = \"{}\"\n[[server.route]]\npath = \"/static/\"\nroot = \"{}\"\n[[server.certificate]]\ncert = \"{}\"\nkey = \"{}\"\n",
            dir.path("www").display(),
            dir.path("app").display(),
            pair.cert.display(),
            pair.key.display()
        ),
    );
    let server = ServerBuilder::config(&conf).start();
    for protocol in ["--http1.1", "--http2"] {
        let (code, _, body) = headers(&server, &[protocol], "/static/ok.txt");
        assert_eq!(
            (code, body.as_slice()),
            (200, b"ok\n".as_slice()),
            "{protocol}"
        );
        for path in [
            "/static/..%2F.env",
            "/static/..%2f.env",
            "/static/%2e%2e%2f.env",
            "/static/%2E%2E%2F.env",
            "/static/..%5C.env",
            "/static/..%5c.env",
            "/static/..\\.env",
            "/static/..;/.env",
            "/static/%2e%2e;/.env",
            "/static/x/..%2F..%2F.env",
        ] {
            let (code, _, body) = headers(&server, &["--path-as-is", protocol], path);
            let body = String::from_utf8_lossy(&body);
            assert!(
                !body.contains("TOP SECRET"),
                "{protocol} {path} leaked: {body}"
            );
            assert_eq!(code, 400, "{protocol} {path}");
        }
    }
}

/// `[[server]] headers`: added to every answer of that server (a file, a 404), over
/// HTTP/1.1 and HTTP/2, and to none of a server without them.
#[test]
fn configured_headers_are_added_to_every_answer() {
    let dir = TestDir::new("hsts");
    dir.write("www/index.html", "hi\n");
    let pair = make_cert(
        &dir.path(""),
        "c",
        KeyKind::EcdsaP256,
        &["localhost", "plain.test"],
    );
    let conf = dir.write(
        "terminus.toml",
        format!(
            r#"listen = ["127.0.0.1:0"]
workers = 1
[[server]]
names = ["localhost"]
root = "{www}"
headers = {{ "Strict-Transport-Security" = "max-age=31536000; includeSubDomains", "X-Content-Type-Options" = "nosniff" }}
[[server.certificate]]
cert = "{cert}"
key = "{key}"
[[server]]
names = ["plain.test"]
root = "{www}"
[[server.certificate]]
cert = "{cert}"
key = "{key}"
"#,
            www = dir.path("www").display(),
            cert = pair.cert.display(),
            key = pair.key.display()
        ),
    );
    let server = ServerBuilder::config(&conf).start();
    for http in ["--http1.1", "--http2"] {
        for (path, status) in [("/", 200), ("/missing", 404)] {
            let (code, head, _) = headers(&server, &[http], path);
            assert_eq!(code, status, "{http} {path}");
            assert_eq!(
                header_value(&head, "strict-transport-security").as_deref(),
                Some("max-age=31536000; includeSubDomains"),
                "{http} {path}: {head}"
            );
            assert_eq!(
                header_value(&head, "x-content-type-options").as_deref(),
                Some("nosniff"),
                "{http} {path}: {head}"
            );
        }
        let out = curl_host(
            &server,
            "plain.test",
            &["-D", "-", "-o", "/dev/null", http],
            "/",
        );
        let head = String::from_utf8_lossy(&out.stdout);
        assert!(head.contains(" 200"), "{head}");
        assert_eq!(
            header_value(&head, "strict-transport-security"),
            None,
            "{head}"
        );
    }
}

/// A `[[server]]` named `name` serving `www/` with `pair`, with `more` (its options)
/// and one route, `route` (its keys): the servers of the `Server` header's tests.
fn server_block(dir: &TestDir, pair: &CertPair, name: &str, more: &str, route: &str) -> String {
    format!(
        "[[server]]\nnames = [\"{name}\"]\nroot = \"{www}\"\n{more}\n[[server.route]]\n{route}\n[[server.certificate]]\ncert = \"{cert}\"\nkey = \"{key}\"\n",
        www = dir.path("www").display(),
        cert = pair.cert.display(),
        key = pair.key.display()
    )
}

/// `headers = { Server = ... }`: the `Server` of every answer of that server, a file's,
/// an error's and a proxied one's (the upstream's own replaced), over HTTP/1.1 and
/// HTTP/2; `Server = ""` sends none; a server that says nothing sends `terminus`.
#[test]
fn the_server_header_is_set_or_removed_per_server() {
    let dir = TestDir::new("server-token");
    dir.write("www/index.html", "hi\n");
    let app = App::start("a");
    let pair = make_cert(
        &dir.path(""),
        "c",
        KeyKind::EcdsaP256,
        &["localhost", "hidden.test", "plain.test"],
    );
    let server_block = |name: &str, headers: &str| {
        server_block(
            &dir,
            &pair,
            name,
            headers,
            "path = \"/app/\"\nupstream = \"app\"",
        )
    };
    let conf = dir.write(
        "terminus.toml",
        format!(
            "listen = [\"127.0.0.1:0\"]\nworkers = 1\n[[upstream]]\nname = \"app\"\nservers = [\"{}\"]\n{}{}{}",
            app.addr(),
            server_block("localhost", "headers = { Server = \"edge\", \"X-Content-Type-Options\" = \"nosniff\" }"),
            server_block("hidden.test", "headers = { Server = \"\" }"),
            server_block("plain.test", ""),
        ),
    );
    let server = ServerBuilder::config(&conf).start();
    for http in ["--http1.1", "--http2"] {
        for (host, want) in [
            ("localhost", Some("edge")),
            ("hidden.test", None),
            ("plain.test", Some("terminus")),
        ] {
            for (path, status) in [("/", 200), ("/missing", 404), ("/app/whoami", 200)] {
                let out = curl_host(&server, host, &["-D", "-", "-o", "/dev/null", http], path);
                let head = String::from_utf8_lossy(&out.stdout);
                assert!(
                    head.starts_with(&format!(
                        "HTTP/{} {status}",
                        if http == "--http2" { "2" } else { "1.1" }
                    )),
                    "{http} {host}{path}: {head}"
                );
                assert_eq!(
                    header_value(&head, "server").as_deref(),
                    want,
                    "{http} {host}{path}: {head}"
                );
                assert_eq!(
                    head.to_ascii_lowercase().matches("\nserver:").count(),
                    usize::from(want.is_some()),
                    "one Server field at most: {http} {host}{path}: {head}"
                );
            }
        }
    }
}

/// What `headers = { Server = ... }` says is said by every answer terminus makes for
/// that server, not only those of the request path: an error page's body ends with the
/// token (HTML-escaped) or names no server without one; a malformed or oversized
/// HTTP/1.1 head's 400 and 431, made before any request; HTTP/2's 431; a route's
/// redirect; the plain listener's 308 (by its Host's server) and 400. Where no server is
/// known yet (no SNI, no Host, plain HTTP to the TLS port), the default server's.
#[test]
fn every_answer_terminus_makes_carries_its_servers_token() {
    let dir = TestDir::new("server-token-everywhere");
    dir.write("www/index.html", "hi\n");
    let pair = make_cert(
        &dir.path(""),
        "c",
        KeyKind::EcdsaP256,
        &["localhost", "hidden.test", "plain.test"],
    );
    let (tls_port, http_port) = (free_port(), free_port());
    let server_block = |name: &str, more: &str| {
        server_block(
            &dir,
            &pair,
            name,
            more,
            "path = \"/old/\"\nredirect = { to = \"/new{path}\" }",
        )
    };
    let conf = dir.write(
        "terminus.toml",
        format!(
            "listen = [\"127.0.0.1:{tls_port}\", {{ address = \"127.0.0.1:{http_port}\", plain = \"redirect\" }}]\nworkers = 1\n{}{}{}",
            server_block("localhost", "headers = { Server = \"edge/1.0 (<b>)\" }"),
            server_block("hidden.test", "default = true\nheaders = { Server = \"\" }"),
            server_block("plain.test", ""),
        ),
    );
    let server = ServerBuilder::config(&conf).start();
    // `what`'s head says `token` (None: no Server field), and so does its page's last
    // line (None: a page naming no server); HTTP/2's 431 has no page.
    let says = |what: &str, reply: &[u8], status: u16, token: Option<&str>| {
        let reply = String::from_utf8_lossy(reply);
        let (head, body) = reply.split_once("\r\n\r\n").unwrap_or((&reply, ""));
        assert!(
            head.split_whitespace().nth(1) == Some(&status.to_string()),
            "{what}: not a {status}: {reply}"
        );
        assert_eq!(
            header_value(head, "server").as_deref(),
            token,
            "{what}: {reply}"
        );
        if status == 431 && head.starts_with("HTTP/2") {
            assert_eq!(body, "", "{what}");
            return;
        }
        match token {
            None => assert!(
                !body.contains("terminus") && !body.contains("<hr>"),
                "{what}: the page names a server: {body}"
            ),
            Some("terminus") => assert!(
                body.contains("<hr><center>terminus</center>"),
                "{what}: {body}"
            ),
            Some(_) => assert!(
                body.contains("<hr><center>edge/1.0 (&lt;b&gt;)</center>")
                    && !body.contains("terminus"),
                "{what}: the page does not end with the token: {body}"
            ),
        }
    };
    let curl_reply = |host: &str, args: &[&str], path: &str| -> Vec<u8> {
        let mut args = args.to_vec();
        args.push("-i");
        curl_host(&server, host, &args, path).stdout
    };
    for (host, token) in [
        ("localhost", Some("edge/1.0 (<b>)")),
        ("hidden.test", None),
        ("plain.test", Some("terminus")),
    ] {
        for http in ["--http1.1", "--http2"] {
            let what = format!("{host} {http}");
            says(
                &format!("{what} 404"),
                &curl_reply(host, &[http], "/missing"),
                404,
                token,
            );
            says(
                &format!("{what} redirect route"),
                &curl_reply(host, &[http], "/old/x"),
                302,
                token,
            );
        }
        // HTTP/2: fields over SETTINGS_MAX_HEADER_LIST_SIZE (32 KiB), answered 431 by
        // the connection before any request.
        let big = format!("X-Big: {}", "b".repeat(40_000));
        says(
            &format!("{host} h2 431"),
            &curl_reply(host, &["--http2", "-H", &big], "/"),
            431,
            token,
        );
        // HTTP/1.1 heads the connection refuses before any request: malformed (400)
        // and 16 KiB without its end (431; exactly that, one TLS record, so that the
        // server has read all of it when it closes); the handshake's SNI names the
        // server.
        let start = format!("GET / HTTP/1.1\r\nHost: {host}\r\nX-Big: ");
        let oversized = format!("{start}{}", "b".repeat(16 * 1024 - start.len()));
        for (head, status) in [
            (
                format!("GET / HTTP/1.1\r\nHost: {host}\r\nno colon\r\n\r\n"),
                400,
            ),
            (oversized, 431),
        ] {
            let mut raw = Raw::connect_as(&server, Some(host));
            raw.send(head.as_bytes()).unwrap();
            let reply = raw.read_to_close(Duration::from_secs(10));
            says(&format!("{host} HTTP/1.1 {status}"), &reply, status, token);
        }
        // The plain listener's redirect: the server its Host names.
        let out = run(Command::new("curl").args([
            "-sS",
            "-i",
            "-H",
            &format!("Host: {host}"),
            &format!("http://127.0.0.1:{http_port}/a"),
        ]));
        says(&format!("{host} plain 308"), &out.stdout, 308, token);
    }
    // No server known: the default one's (hidden.test: no token). No SNI and a
    // malformed head; plain HTTP to the TLS port; the plain listener without Host.
    let mut raw = Raw::connect_as(&server, None);
    raw.send(b"GET / HTTP/1.1\r\nno colon\r\n\r\n").unwrap();
    says(
        "no SNI, 400",
        &raw.read_to_close(Duration::from_secs(10)),
        400,
        None,
    );
    let out =
        run(Command::new("curl").args(["-sS", "-i", &format!("http://127.0.0.1:{tls_port}/")]));
    says("plain HTTP to the TLS port", &out.stdout, 400, None);
    let out = run(Command::new("curl").args([
        "-sS",
        "-i",
        "--http1.0",
        "-H",
        "Host:",
        &format!("http://127.0.0.1:{http_port}/"),
    ]));
    says("the plain listener without Host", &out.stdout, 308, None);
}
