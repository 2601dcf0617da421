//! Protocol conformance under third-party suites: tlsfuzzer's scripts against terminus
//! (`tests/conformance/run`, which judges each script against the expected failures and
//! reasons in `tests/conformance/tlsfuzzer.toml`), and h2spec's HTTP/2 suite. Where a
//! suite is not installed the test counts as a skip, or fails where `TERMINUS_REQUIRE`
//! names it (see terminus_testkit): tlsfuzzer is a GitHub project CI machines cannot
//! fetch; h2spec comes from Go's module proxy and testssl.sh from Debian, and `.ci/run`
//! installs both.

use std::path::PathBuf;
use std::process::Command;

use crate::harness::{Ca, KeyKind, Leaf, ServerBuilder, TestDir};
use terminus_testkit::{repo, runs_here, Need};

const SKIP_MARKER: &str = "SKIPPED: tlsfuzzer conformance";

#[test]
fn tlsfuzzer_scripts_fail_only_as_listed() {
    let out = Command::new("python3")
        .arg(repo().join("tests/conformance/run"))
        .args(["--terminus", crate::harness::terminus_bin()])
        .output()
        .expect("python3 runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    if let Some(reason) = stderr.lines().find_map(|l| l.strip_prefix(SKIP_MARKER)) {
        runs_here(Need::Tlsfuzzer, false, reason.trim_start_matches(": "));
        return;
    }
    println!("{stdout}");
    assert!(out.status.success(), "{stdout}{stderr}");
}

/// Every h2spec test, strict mode included (146 with h2spec 2.2.1), over TLS with ALPN h2.
#[test]
fn h2spec_passes_every_test_in_strict_mode() {
    let Some(h2spec) = terminus_testkit::h2spec() else {
        runs_here(
            Need::H2spec,
            false,
            "no h2spec (go install github.com/summerwind/h2spec/cmd/h2spec@v2.2.1+incompatible, \
             or set TERMINUS_H2SPEC)",
        );
        return;
    };
    let server = ServerBuilder::flags(&["--workers", "1"]).start();
    let summary = terminus_testkit::h2spec_passes(&h2spec, server.port(), true);
    println!("h2spec: {summary}");
}

/// The response headers an operator would set, as a `[[server]]` line.
const HEADERS: &str = r#"headers = { "Strict-Transport-Security" = "max-age=31536000; includeSubDomains", "X-Content-Type-Options" = "nosniff", "X-Frame-Options" = "DENY", "Content-Security-Policy" = "default-src 'self'", "Referrer-Policy" = "no-referrer" }"#;

/// testssl.sh (Debian's 3.0.8) against terminus on its default certificates, with the
/// response headers an operator would set: no finding above INFO except the self-signed
/// certificate's own (trust, name, revocation, validity, CAA).
#[test]
fn testssl_finds_nothing_above_info_but_the_self_signed_certificate() {
    let installed = Command::new("testssl")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    if !runs_here(
        Need::Testssl,
        installed,
        "no testssl (apt-get install testssl.sh)",
    ) {
        return;
    }
    let dir = TestDir::new("testssl");
    let conf = dir.write(
        "terminus.toml",
        format!(
            "listen = [\"127.0.0.1:0\"]\nworkers = 1\n[[server]]\nnames = [\"localhost\"]\n{HEADERS}\n"
        ),
    );
    let server = ServerBuilder::config(&conf).start();
    let findings = testssl(
        Command::new("testssl"),
        &dir,
        &format!("127.0.0.1:{}", server.port()),
    );
    let above_info = above_info(&findings);
    assert!(above_info.is_empty(), "{above_info:#?}");
}

/// testssl.sh 3.2 or later, which rates servers as SSL Labs does (`$TERMINUS_TESTSSL`, else
/// `target/testssl/testssl.sh`): given a certificate it can trust (a test CA it is told
/// about) for the name it scans, terminus gets the grade A+, and no finding above INFO but
/// the test certificate's own (no revocation URI, no CAA record).
#[test]
fn testssl_grades_terminus_a_plus_with_a_trusted_certificate() {
    let program = std::env::var_os("TERMINUS_TESTSSL")
        .map(PathBuf::from)
        .unwrap_or_else(|| repo().join("target/testssl/testssl.sh"));
    if !runs_here(
        Need::TestsslGrade,
        program.exists(),
        format!(
            "no testssl.sh 3.2+ at {} (git clone --branch v3.2.3 \
             https://github.com/testssl/testssl.sh target/testssl, or set TERMINUS_TESTSSL)",
            program.display()
        ),
    ) {
        return;
    }
    let dir = TestDir::new("testssl-grade");
    let path = |name: &str| dir.path(name).to_str().unwrap().to_owned();
    let ca = Ca::new(&dir.0, "ca", "terminus test CA", 3650);
    let leaf = Leaf {
        key: KeyKind::Rsa(2048),
        days: 397,
        ..Leaf::server("localhost")
    };
    ca.issue(&dir.0, "leaf", &leaf);
    let chain = [
        std::fs::read(path("leaf.pem")).unwrap(),
        std::fs::read(path("ca.pem")).unwrap(),
    ]
    .concat();
    dir.write("chain.pem", chain);
    let conf = dir.write(
        "terminus.toml",
        format!(
            "listen = [\"127.0.0.1:0\"]\nworkers = 1\n[[server]]\nnames = [\"localhost\"]\n\
             {HEADERS}\n[[server.certificate]]\ncert = \"{}\"\nkey = \"{}\"\n",
            path("chain.pem"),
            path("leaf.key")
        ),
    );
    let server = ServerBuilder::config(&conf).start();
    let mut command = Command::new(&program);
    command.args(["--add-ca", &path("ca.pem"), "--ip", "127.0.0.1"]);
    let findings = testssl(command, &dir, &format!("localhost:{}", server.port()));
    let grade = findings
        .iter()
        .find(|f| f["id"] == "overall_grade")
        .and_then(|f| f["finding"].as_str())
        .unwrap_or("none");
    println!("testssl overall grade: {grade}");
    let above_info = above_info(&findings);
    assert!(above_info.is_empty(), "{above_info:#?}");
    assert_eq!(grade, "A+");
}

/// testssl's JSON findings for `target`: `testssl` is the command with any options of its
/// own already given.
fn testssl(mut testssl: Command, dir: &TestDir, target: &str) -> Vec<serde_json::Value> {
    let json = dir.path("testssl.json");
    let out = testssl
        .args(["--quiet", "--color", "0", "--warnings", "off", "--jsonfile"])
        .arg(&json)
        .arg(target)
        .output()
        .expect("testssl runs");
    let text = std::fs::read_to_string(&json).unwrap_or_else(|e| {
        panic!(
            "no JSON from testssl ({e}): {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    });
    let findings: Vec<serde_json::Value> = serde_json::from_str(&text).unwrap();
    let graded = findings.iter().filter(|f| f["severity"] == "OK").count();
    assert!(graded > 30, "testssl checked little: {text}");
    println!("testssl: {} findings, {graded} OK", findings.len());
    findings
}

/// Findings above INFO, but for the test certificate's own (trust, name, revocation,
/// validity, CAA). WARN is testssl saying a check of its own could not complete, not a
/// finding about the server: shown, not counted. (One in a few runs, Debian's testssl
/// reports "connect problem" in its session-ticket check; see the issue 16 notes.)
fn above_info(findings: &[serde_json::Value]) -> Vec<String> {
    let field = |f: &serde_json::Value, k: &str| f[k].as_str().unwrap_or_default().to_owned();
    let certificate = |id: &str| {
        ["cert_", "intermediate_cert", "DNS_CAArecord"]
            .iter()
            .any(|p| id.starts_with(p))
    };
    for f in findings.iter().filter(|f| field(f, "severity") == "WARN") {
        println!(
            "testssl could not complete {}: {}",
            field(f, "id"),
            field(f, "finding")
        );
    }
    findings
        .iter()
        .filter(|f| !matches!(field(f, "severity").as_str(), "OK" | "INFO" | "WARN"))
        .filter(|f| !certificate(&field(f, "id")))
        .map(|f| {
            format!(
                "{} {}: {}",
                field(f, "severity"),
                field(f, "id"),
                field(f, "finding")
            )
        })
        .collect()
}
