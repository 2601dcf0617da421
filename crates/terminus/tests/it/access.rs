//! `access` rules (nginx's `allow` and `deny`) with curl from two loopback addresses:
//! the server's rules, a route's rules in place of them, and 403 for the refused.

use crate::harness::*;

/// The status curl gets for `path` when it connects from `source`.
fn status_from(server: &Server, source: &str, path: &str) -> u16 {
    status(server, &["--interface", source, "--path-as-is"], path)
}

#[test]
fn access_rules_refuse_with_403_and_a_route_s_rules_replace_its_server_s() {
    let dir = TestDir::new("access");
    dir.write("www/index.html", "home\n");
    dir.write("www/open/page.txt", "open to all\n");
    dir.write("www/staff/page.txt", "staff only\n");
    let pair = make_cert(
        dir.path("").as_path(),
        "ecdsa",
        KeyKind::EcdsaP256,
        &["localhost"],
    );
    let conf = Config::new(&dir, &pair).workers(1).in_server(&format!(
        r#"access = ["allow 127.0.0.1", "deny all"]
[[server.route]]
path = "/open/"
root = "{www}"
access = ["allow all"]
[[server.route]]
path = "/staff/"
root = "{www}"
access = ["deny 127.0.0.1", "allow 127.0.0.0/8"]"#,
        www = dir.path("www").display()
    ));
    let server = ServerBuilder::with(&dir, &conf).start();
    // The server's rules: 127.0.0.1 only.
    assert_eq!(status_from(&server, "127.0.0.1", "/index.html"), 200);
    assert_eq!(status_from(&server, "127.0.0.2", "/index.html"), 403);
    // Over HTTP/1.1 as over h2 (curl's choice).
    assert_eq!(
        status(
            &server,
            &["--interface", "127.0.0.2", "--http1.1"],
            "/index.html"
        ),
        403
    );
    // A route's own rules replace the server's, whichever way.
    assert_eq!(status_from(&server, "127.0.0.2", "/open/page.txt"), 200);
    assert_eq!(status_from(&server, "127.0.0.2", "/staff/page.txt"), 200);
    assert_eq!(status_from(&server, "127.0.0.1", "/staff/page.txt"), 403);
    // The path is settled before the rules are asked: no way round them by spelling.
    assert_eq!(
        status_from(&server, "127.0.0.2", "/open/../index.html"),
        403
    );
    assert_eq!(status_from(&server, "127.0.0.1", "//staff/page.txt"), 403);
}
