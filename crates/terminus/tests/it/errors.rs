//! Bad configuration and bad certificates/keys: terminus refuses to start and says which
//! file, which line and why; `terminus check` says the same and exits non-zero. Logs are
//! plain text unless stderr is a terminal.

use std::process::{Command, Stdio};
use std::time::Duration;

use crate::harness::*;

/// Runs `terminus check` and `terminus serve` on `config`; both must fail with every
/// fragment of `expected` in their error output.
fn assert_refused(config: &std::path::Path, expected: &[&str]) {
    let check =
        run(Command::new(terminus_bin()).args(["check", "--config", config.to_str().unwrap()]));
    let serve = run(Command::new(terminus_bin())
        .args(["serve", "--config", config.to_str().unwrap()])
        .stdin(Stdio::null()));
    for (what, out) in [("check", check), ("serve", serve)] {
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{what} should exit 1: {err}");
        for fragment in expected {
            assert!(
                err.contains(fragment),
                "{what}: expected {fragment:?} in:\n{err}"
            );
        }
    }
}

fn server_config(
    dir: &TestDir,
    cert: &std::path::Path,
    key: &std::path::Path,
) -> std::path::PathBuf {
    dir.write(
        "bad.toml",
        format!(
            "listen = [\"127.0.0.1:0\"]\n\n[[server]]\nnames = [\"localhost\"]\n[[server.certificate]]\ncert = \"{}\"\nkey = \"{}\"\n",
            cert.display(),
            key.display()
        ),
    )
}

#[test]
fn certificate_and_key_problems_name_the_file_and_reason() {
    let dir = TestDir::new("badkeys");
    let good = make_cert(&dir.0, "good", KeyKind::EcdsaP256, &["localhost"]);
    let other = make_cert(&dir.0, "other", KeyKind::EcdsaP256, &["localhost"]);
    let ed = make_cert(&dir.0, "ed", KeyKind::Ed25519, &["localhost"]);
    let small = make_cert(&dir.0, "small", KeyKind::Rsa(1024), &["localhost"]);
    let encrypted = dir.path("encrypted.key");
    openssl(&[
        "pkey",
        "-in",
        good.key.to_str().unwrap(),
        "-aes256",
        "-passout",
        "pass:secret",
        "-out",
        encrypted.to_str().unwrap(),
    ]);
    let empty_chain = dir.write("empty.pem", "# nothing here\n");
    let missing = dir.path("missing.pem");
    let line = "bad.toml:6:";

    let cases: Vec<(std::path::PathBuf, std::path::PathBuf, Vec<String>)> = vec![
        (
            missing.clone(),
            good.key.clone(),
            vec![missing.display().to_string(), "cannot read".into()],
        ),
        (
            good.cert.clone(),
            dir.path("nokey.key"),
            vec!["nokey.key".into(), "cannot read".into()],
        ),
        (
            good.cert.clone(),
            other.key.clone(),
            vec![
                other.key.display().to_string(),
                "does not match the certificate".into(),
                good.cert.display().to_string(),
            ],
        ),
        (
            good.cert.clone(),
            encrypted.clone(),
            vec![encrypted.display().to_string(), "encrypted".into()],
        ),
        (
            ed.cert.clone(),
            ed.key.clone(),
            vec![ed.key.display().to_string(), "unsupported key type".into()],
        ),
        (
            small.cert.clone(),
            small.key.clone(),
            vec![
                small.key.display().to_string(),
                "smaller than 2048 bits is not supported".into(),
            ],
        ),
        (
            empty_chain.clone(),
            good.key.clone(),
            vec![
                empty_chain.display().to_string(),
                "no certificate found".into(),
            ],
        ),
        (
            good.cert.clone(),
            good.cert.clone(),
            vec![
                good.cert.display().to_string(),
                "no private key found".into(),
            ],
        ),
    ];
    for (cert, key, expected) in cases {
        let conf = server_config(&dir, &cert, &key);
        let mut fragments: Vec<&str> = expected.iter().map(String::as_str).collect();
        fragments.push(line);
        assert_refused(&conf, &fragments);
    }
    // The same checks apply to certificates given on the command line.
    let out = run(Command::new(terminus_bin())
        .args([
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--cert",
            good.cert.to_str().unwrap(),
            "--key",
            other.key.to_str().unwrap(),
        ])
        .stdin(Stdio::null()));
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains("does not match") && err.contains("other.key"),
        "{err}"
    );
    // And a good pair passes `check`.
    let conf = server_config(&dir, &good.cert, &good.key);
    let out = run(Command::new(terminus_bin()).args(["check", "--config", conf.to_str().unwrap()]));
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("ok"));
}

/// The binary's side of a bad configuration: `check` and `serve` print the error as the
/// config crate makes it (every kind of mistake is unit-tested there, in
/// `terminus_config`'s `every_error_gives_file_line_what_and_hint`) and exit 1; a docroot
/// that does not exist is found when the site loads, and is named at its line too.
#[test]
fn config_errors_give_file_line_and_hint() {
    let dir = TestDir::new("badconf");
    let cases = [
        (
            "syntax.toml",
            "workers = 2\nlisten = [\"127.0.0.1:1\"\n",
            vec!["syntax.toml:3:", "expected `]`", "hint:"],
        ),
        (
            "root.toml",
            "[[server]]\nnames = [\"localhost\"]\nroot = \"/does/not/exist\"\n",
            vec!["root.toml:3:", "/does/not/exist", "hint:"],
        ),
        // A name of two servers: the second would never be served for it.
        (
            "twice.toml",
            "[[server]]\nnames = [\"localhost\", \"a.example\"]\n\n[[server]]\nnames = [\"A.example\"]\n",
            vec![
                "twice.toml:5:",
                "\"A.example\" is already a name of the [[server]] at line 2",
                "hint:",
            ],
        ),
        // Names show in logs, /metrics and the status page: no control characters.
        (
            "control.toml",
            "[[upstream]]\nname = \"app\\tone\"\nservers = [\"127.0.0.1:1\"]\n",
            vec!["control.toml:2:", "upstream name \"app\\tone\"", "control character"],
        ),
    ];
    for (name, text, expected) in cases {
        let conf = dir.write(name, text);
        assert_refused(&conf, &expected);
    }
    let out =
        run(Command::new(terminus_bin()).args(["check", "--config", "/nonexistent/terminus.toml"]));
    assert_eq!(out.status.code(), Some(1));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("/nonexistent/terminus.toml: cannot read")
    );
}

#[test]
fn mismatched_cert_and_key_flags_are_refused() {
    let out = run(Command::new(terminus_bin())
        .args(["serve", "--cert", "a.pem"])
        .stdin(Stdio::null()));
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("in pairs"));
}

#[test]
fn help_documents_every_flag() {
    let out = run(Command::new(terminus_bin()).args(["serve", "--help"]));
    let text = String::from_utf8_lossy(&out.stdout);
    for flag in [
        "--config",
        "--listen",
        "--cert",
        "--key",
        "--root",
        "--workers",
        "--pin",
        "--crypto-backend",
        "--no-resumption",
        "--admin",
    ] {
        assert!(text.contains(flag), "serve --help lacks {flag}");
    }
    assert!(
        text.contains("the status page") && text.contains("(GET / in a browser, /status.json)"),
        "serve --help does not say where the status page is: {text}"
    );
    let out = run(Command::new(terminus_bin()).arg("--help"));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("serve") && text.contains("check"));
}

#[test]
fn example_config_in_the_repo_is_valid() {
    let example =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../terminus.example.toml");
    let out =
        run(Command::new(terminus_bin()).args(["check", "--config", example.to_str().unwrap()]));
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// `--crypto-backend multibuffer` asks for crypto_mb outright: where it cannot run, serve
/// refuses to start and says why and what to use instead (never a silent scalar); where it
/// runs, the server starts and its handshakes go through the multibuffer backend. Both
/// branches assert, so the test means something on every CPU.
#[test]
fn multibuffer_backend_starts_exactly_where_crypto_mb_runs() {
    if terminus_engine::multibuffer::applicable() {
        let server = ServerBuilder::flags(&["--crypto-backend", "multibuffer"])
            .admin()
            .start();
        let out = curl(
            &server,
            &["-k", "-o", "/dev/null", "-w", "%{http_code}"],
            "/",
        );
        assert_eq!(String::from_utf8_lossy(&out.stdout), "200", "{out:?}");
        let requests = server.metric(
            "terminus_crypto_requests_total",
            &["backend=\"multibuffer\""],
        );
        assert!(requests >= 1.0, "{}", server.metrics());
        return;
    }
    let out = run(Command::new(terminus_bin())
        .args([
            "serve",
            "--crypto-backend",
            "multibuffer",
            "--listen",
            "127.0.0.1:0",
        ])
        .stdin(Stdio::null()));
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    for fragment in [
        "crypto backend multibuffer",
        "AVX-512 IFMA",
        "crypto.backend = \"auto\" or \"scalar\"",
    ] {
        assert!(err.contains(fragment), "expected {fragment:?} in:\n{err}");
    }
}

#[test]
fn a_port_already_in_use_is_refused_at_start() {
    // SO_REUSEPORT (which the workers' sockets use) would let a second server share the
    // port without a word: whoever holds it, a plain listener or another terminus,
    // terminus must refuse to start and say where.
    let plain = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let running = ServerBuilder::flags(&[]).start();
    for taken in [plain.local_addr().unwrap(), running.addr] {
        // A server that wrongly starts would serve forever: `timeout` turns that into
        // exit status 124 and a failure instead of a hung test.
        let out = run(Command::new("timeout")
            .arg("20")
            .arg(terminus_bin())
            .args(["serve", "--listen", &taken.to_string()])
            .stdin(Stdio::null()));
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "started on {taken}: {err}");
        assert!(
            err.contains(&taken.to_string()) && err.contains("in use"),
            "{err}"
        );
    }
    assert_eq!(status(&running, &[], "/"), 200);
}

#[test]
fn log_colours_only_on_a_terminal() {
    // To a file (journald and log shippers see the same): plain text.
    let server = ServerBuilder::flags(&[]).start();
    eventually(Duration::from_secs(10), "a log line", || {
        server.stderr().contains("INFO")
    });
    assert!(!server.stderr().contains('\x1b'), "{:?}", server.stderr());
    // On a terminal (script(1) gives it one): coloured, unless NO_COLOR is set.
    let on_tty = |no_color: bool| {
        let mut cmd = Command::new("script");
        let serve = format!("timeout 2 {} serve --listen 127.0.0.1:0", terminus_bin());
        cmd.args(["-qec", &serve, "/dev/null"]).stdin(Stdio::null());
        if no_color {
            cmd.env("NO_COLOR", "1");
        }
        String::from_utf8_lossy(&run(&mut cmd).stdout).into_owned()
    };
    let coloured = on_tty(false);
    assert!(
        coloured.contains("INFO") && coloured.contains('\x1b'),
        "{coloured:?}"
    );
    let plain = on_tty(true);
    assert!(
        plain.contains("INFO") && !plain.contains('\x1b'),
        "{plain:?}"
    );
}
