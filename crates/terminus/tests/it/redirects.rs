//! `[[server.route]] redirect` with curl: the status, and a Location with the request's
//! path, query and host in the placeholders.

use crate::harness::*;

/// curl's status and Location (`%{redirect_url}`) for `path`.
fn redirected(server: &Server, path: &str) -> (u16, String) {
    let out = curl(
        server,
        &[
            "-g",
            "--path-as-is",
            "-o",
            "/dev/null",
            "-w",
            "%{http_code} %{redirect_url}",
        ],
        path,
    );
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let (code, location) = text.split_once(' ').unwrap_or((&text, ""));
    (code.parse().unwrap_or(0), location.to_owned())
}

#[test]
fn a_redirect_route_answers_its_status_with_the_request_in_the_location() {
    let dir = TestDir::new("redirects");
    dir.write("www/index.html", "home\n");
    let pair = make_cert(
        dir.path("").as_path(),
        "ecdsa",
        KeyKind::EcdsaP256,
        &["localhost"],
    );
    let conf = Config::new(&dir, &pair).workers(1).in_server(
        r#"[[server.route]]
path = "/old/"
redirect = { to = "https://new.example{uri}", status = 301 }
[[server.route]]
path = "/moved/"
redirect = { to = "/elsewhere?from={path}&q={query}&host={host}" }
[[server.route]]
path = "/post/"
redirect = { to = "https://api.example{path}", status = 308 }"#,
    );
    let server = ServerBuilder::with(&dir, &conf).start();
    assert_eq!(
        redirected(&server, "/old/a/b.html?x=1&y=2"),
        (301, "https://new.example/old/a/b.html?x=1&y=2".to_owned())
    );
    // The settled path, not the bytes sent: dot segments and doubled slashes resolved.
    assert_eq!(
        redirected(&server, "/old/a/../c//d"),
        (301, "https://new.example/old/c/d".to_owned())
    );
    // 302 unless given; a relative Location is curl's to resolve against the request.
    let port = server.port();
    assert_eq!(
        redirected(&server, "/moved/x?k=v"),
        (
            302,
            format!("https://localhost:{port}/elsewhere?from=/moved/x&q=k=v&host=localhost")
        )
    );
    // What a placeholder brings is not read as one (curl -g sends the braces as they are).
    assert_eq!(
        redirected(&server, "/post/{host}?x={uri}"),
        (308, "https://api.example/post/{host}".to_owned())
    );
    // A path outside ASCII leaves percent-encoded.
    assert_eq!(
        redirected(&server, "/old/caf\u{e9}"),
        (301, "https://new.example/old/caf%C3%A9".to_owned())
    );
    // Other routes are untouched.
    assert_eq!(status(&server, &[], "/index.html"), 200);
}

/// The plain listener's answer to an HTTP/1.0 request without Host (curl --http1.0
/// -H 'Host:'), on a site whose default server is named `names`: its status and
/// Location.
fn hostless_on_the_plain_listener(names: &str) -> (String, String) {
    let dir = TestDir::new("redirects-no-host");
    let pair = make_cert(
        dir.path("").as_path(),
        "ecdsa",
        KeyKind::EcdsaP256,
        &["www.example.test", "a.example.test"],
    );
    let (tls_port, http_port) = (free_port(), free_port());
    let conf = dir.write(
        "terminus.toml",
        format!(
            r#"listen = ["127.0.0.1:{tls_port}", {{ address = "127.0.0.1:{http_port}", plain = "redirect" }}]
workers = 1
[[server]]
names = ["other.test"]
[[server.certificate]]
cert = "{cert}"
key = "{key}"
[[server]]
names = {names}
default = true
[[server.certificate]]
cert = "{cert}"
key = "{key}"
"#,
            cert = pair.cert.display(),
            key = pair.key.display(),
        ),
    );
    let _server = ServerBuilder::config(&conf).start();
    let out = run(std::process::Command::new("curl").args([
        "-sS",
        "-o",
        "/dev/null",
        "-w",
        "%{http_code} %{redirect_url}",
        "--http1.0",
        "-H",
        "Host:",
        &format!("http://127.0.0.1:{http_port}/a/b?c=1"),
    ]));
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let (code, location) = text.split_once(' ').unwrap_or((&text, ""));
    let location = location.replace(&format!(":{tls_port}/"), ":TLS/");
    (code.to_owned(), location)
}

/// An HTTP/1.0 request naming no host is sent to https:// with the default server's
/// first exact name (nginx's `$host` falls back on `server_name`), a wildcard passed
/// over; a default server of wildcards alone has no name to send it to: 400.
#[test]
fn the_plain_listener_sends_a_request_without_host_to_the_default_servers_first_exact_name() {
    assert_eq!(
        hostless_on_the_plain_listener(
            r#"["*.example.test", "www.example.test", "a.example.test"]"#
        ),
        (
            "308".to_owned(),
            "https://www.example.test:TLS/a/b?c=1".to_owned()
        )
    );
    assert_eq!(
        hostless_on_the_plain_listener(r#"["*.example.test"]"#),
        ("400".to_owned(), String::new())
    );
}
