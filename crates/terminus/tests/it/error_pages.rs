//! `[[server]] error_pages` with curl: a file per status in place of the built-in text of
//! the errors terminus answers itself (a missing file, access refused, an upstream that
//! cannot be reached), never of an upstream's own error unless its route intercepts.

use crate::harness::*;

#[test]
fn error_pages_replace_terminus_s_own_errors_and_an_upstream_s_only_where_intercepted() {
    let app = App::start("a");
    let dead = free_port();
    let dir = TestDir::new("error-pages");
    dir.write("www/index.html", "home\n");
    dir.write("errors/404.html", "<h1>our 404 page</h1>\n");
    dir.write("errors/400.html", "<h1>our 400 page</h1>\n");
    dir.write("errors/403.txt", "our 403 page\n");
    dir.write("errors/502.html", "<h1>our 502 page</h1>\n");
    dir.write("errors/503.html", "<h1>our 503 page</h1>\n");
    let pair = make_cert(
        dir.path("").as_path(),
        "ecdsa",
        KeyKind::EcdsaP256,
        &["localhost"],
    );
    let errors = dir.path("errors");
    let conf = Config::new(&dir, &pair)
        .workers(1)
        .before(&format!(
            "[[upstream]]\nname = \"app\"\nservers = [\"{}\"]\n[[upstream]]\nname = \"dead\"\nservers = [\"127.0.0.1:{dead}\"]\n",
            app.addr()
        ))
        .in_server(&format!(
            r#"error_pages = {{ 400 = "{e}/400.html", 404 = "{e}/404.html", 403 = "{e}/403.txt", 502 = "{e}/502.html", 503 = "{e}/503.html" }}
[[server.route]]
path = "/closed/"
root = "{www}"
access = ["deny all"]
[[server.route]]
path = "/dead/"
upstream = "dead"
[[server.route]]
path = "/app/"
upstream = "app"
[[server.route]]
path = "/caught/"
upstream = "app"
intercept_errors = true"#,
            e = errors.display(),
            www = dir.path("www").display()
        ));
    let server = ServerBuilder::with(&dir, &conf).start();
    let body = |path: &str| String::from_utf8(curl(&server, &[], path).stdout).unwrap();

    // terminus's own errors: the server's pages, with their types and lengths.
    let (code, head, page) = headers(&server, &[], "/missing.html");
    assert_eq!(code, 404);
    assert_eq!(page, b"<h1>our 404 page</h1>\n");
    assert_eq!(
        header_value(&head, "content-type").as_deref(),
        Some("text/html; charset=utf-8")
    );
    assert_eq!(header_value(&head, "content-length").as_deref(), Some("22"));
    let (code, head, page) = headers(&server, &[], "/closed/index.html");
    assert_eq!((code, page.as_slice()), (403, &b"our 403 page\n"[..]));
    assert!(header_value(&head, "content-type")
        .unwrap()
        .starts_with("text/plain"));
    assert_eq!(body("/dead/x"), "<h1>our 502 page</h1>\n");
    // HEAD: the page's head (curl -I reads no body).
    let (code, head, _) = headers(&server, &["-I"], "/missing.html");
    assert_eq!(code, 404);
    assert_eq!(header_value(&head, "content-length").as_deref(), Some("22"));
    // A status without a page keeps the built-in text.
    let (code, _, page) = headers(&server, &["-X", "POST", "-d", "x"], "/index.html");
    assert_eq!(code, 405);
    assert!(String::from_utf8_lossy(&page).contains("405 Method Not Allowed"));

    // An upstream's own errors are its own ...
    let (code, head, page) = headers(&server, &[], "/app/status?code=404");
    assert_eq!((code, page.as_slice()), (404, &b"app's own 404\n"[..]));
    assert_eq!(header_value(&head, "x-app").as_deref(), Some("yes"));
    // ... unless its route intercepts them: then the page, what says when to retry kept,
    // the upstream's other fields gone.
    let (code, head, page) = headers(&server, &[], "/caught/status?code=503&retry=7");
    assert_eq!(
        (code, page.as_slice()),
        (503, &b"<h1>our 503 page</h1>\n"[..])
    );
    assert_eq!(header_value(&head, "retry-after").as_deref(), Some("7"));
    assert_eq!(header_value(&head, "x-app"), None);
    // A status without a page is the upstream's still; a success is untouched.
    assert_eq!(body("/caught/status?code=500"), "app's own 500\n");
    assert_eq!(body("/caught/whoami"), "a");
    // An intercepted body of megabytes is not read: the connection to the upstream is
    // given up, not left half read for the next request to find.
    for _ in 0..3 {
        assert_eq!(
            body("/caught/status?code=503&pad=3000000"),
            "<h1>our 503 page</h1>\n"
        );
        assert_eq!(body("/app/whoami"), "a");
        assert_eq!(body("/caught/whoami"), "a");
    }
    // The errors answered before a route is chosen get the pages too: a path that climbs
    // above the root.
    let (code, _, page) = headers(&server, &["--path-as-is"], "/a/../../x");
    assert_eq!(
        (code, page.as_slice()),
        (400, &b"<h1>our 400 page</h1>\n"[..])
    );
}

#[test]
fn an_error_page_that_cannot_be_read_is_refused_at_its_line() {
    let dir = TestDir::new("error-pages-bad");
    dir.write("www/index.html", "home\n");
    let pair = make_cert(
        dir.path("").as_path(),
        "ecdsa",
        KeyKind::EcdsaP256,
        &["localhost"],
    );
    let conf = Config::new(&dir, &pair).in_server(&format!(
        "error_pages = {{ 404 = \"{}\" }}",
        dir.path("nowhere.html").display()
    ));
    let path = conf.write(&dir);
    let out = run(std::process::Command::new(terminus_bin()).args([
        "check",
        "--config",
        path.to_str().unwrap(),
    ]));
    let text = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{text}");
    let line = conf
        .text()
        .lines()
        .position(|l| l.starts_with("error_pages"))
        .unwrap()
        + 1;
    assert!(text.contains(&format!("terminus.toml:{line}:")), "{text}");
    assert!(
        text.contains("error page for 404") && text.contains("nowhere.html"),
        "{text}"
    );
}
