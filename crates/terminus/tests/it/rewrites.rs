//! `[[server.route]] rewrite` with curl against app.py, which says what request target it
//! got: a route's prefix stripped or replaced before the upstream sees the path, on the
//! path routing matched (settled, `;` parameters as routing reads them), query kept.

use crate::harness::*;

/// The request-target app.py saw for `path` sent through terminus.
fn upstream_target(server: &Server, path: &str) -> String {
    let out = curl(server, &["-g", "--path-as-is"], path);
    let seen: serde_json::Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("{path}: {e}: {}", String::from_utf8_lossy(&out.stdout)));
    seen["target"].as_str().unwrap_or_default().to_owned()
}

#[test]
fn a_rewrite_strips_or_replaces_the_route_s_prefix_before_the_upstream_sees_the_path() {
    let app = App::start("a");
    let dir = TestDir::new("rewrites");
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
            r#"[[server.route]]
path = "/api/"
upstream = "app"
rewrite = "/"
[[server.route]]
path = "/v1/"
upstream = "app"
rewrite = "/v2/"
[[server.route]]
path = "/same/"
upstream = "app""#,
        );
    let server = ServerBuilder::with(&dir, &conf).start();
    for (sent, seen) in [
        // nginx's `location /api/ { proxy_pass http://app/; }`, Caddy's strip_prefix.
        ("/api/headers", "/headers"),
        ("/api/headers?x=1&y=%20", "/headers?x=1&y=%20"),
        ("/v1/headers", "/v2/headers"),
        ("/v1/a/b/headers?q", "/v2/a/b/headers?q"),
        // The settled path is rewritten: dot segments and doubled slashes resolved first.
        ("/api/x/../headers", "/headers"),
        ("/v1//a/./headers", "/v2/a/headers"),
        // The prefix as routing matched it: the parameters of its segments go with it.
        ("/api;v=1/headers", "/headers"),
        ("/v1;jsessionid=7/x;p/headers", "/v2/x;p/headers"),
        // Without a rewrite the path goes unchanged.
        ("/same/headers", "/same/headers"),
    ] {
        assert_eq!(upstream_target(&server, sent), seen, "{sent}");
    }
    // A path that leaves the prefix once settled is not the route's at all.
    assert_eq!(
        status(&server, &["--path-as-is"], "/api/%2e%2e/headers"),
        404
    );
    let seen =
        run(std::process::Command::new("curl")
            .args(["-sS", &format!("http://{}/seen", app.addr())]));
    let seen = String::from_utf8_lossy(&seen.stdout);
    assert!(!seen.contains(".."), "{seen}");
    assert!(!seen.contains("%2e"), "{seen}");
}
