//! `.ci/run`'s passes: on a CPU with AVX-512 IFMA the test command runs twice, the second
//! time with IFMA masked (`OPENSSL_ia32cap`) and not required; each pass keeps its own
//! skips; one closing line sums both passes; a failure in either fails the run. Driven
//! through `run_tests` (the script sourced, its `main` not run) with a stand-in for
//! `cargo test` that records what each pass was given.

use std::process::{Command, Output};

use terminus_testkit::{repo, TestDir};

/// A stand-in for the test command: prints two suites' libtest summaries (one of three
/// tests, failing one where `FAIL_<PASS>` is set, and an empty doc-test one), records the
/// mask and requirements it saw in `$SEEN`, and skips one IFMA test where masked.
const FAKE: &str = r#"
pass=cpu
if [ -n "${OPENSSL_ia32cap+set}" ]; then pass=masked; fi
echo "${OPENSSL_ia32cap-unset}|$TERMINUS_REQUIRE" >>"$SEEN"
if [ "$pass" = masked ]; then
    echo "SKIPPED crypto_mb_test [ifma]: masked" >>"$TERMINUS_SKIP_LOG"
fi
fail_var="FAIL_$pass"
if [ -n "${!fail_var:-}" ]; then
    echo "test result: FAILED. 2 passed; 1 failed; 0 ignored; 0 measured; 0 filtered out; finished in 0.01s"
    exit 101
fi
echo "test result: ok. 3 passed; 0 failed; 0 ignored; 0 measured; 0 filtered out; finished in 0.01s"
echo "test result: ok. 0 passed; 0 failed; 0 ignored; 0 measured; 0 filtered out; finished in 0.00s"
"#;

/// `run_tests "bash fake.sh" REQUIRE IFMA` with `fail` naming the passes whose command
/// fails; its output and the `MASK|REQUIRE` lines the passes saw.
fn run_tests(require: &str, ifma: bool, fail: &[&str]) -> (Output, Vec<String>) {
    let dir = TestDir::new("ci-run");
    let fake = dir.write("fake.sh", FAKE);
    let seen = dir.path("seen");
    let mut cmd = Command::new("bash");
    cmd.args([
        "-c",
        r#"source "$1" && run_tests "bash $2" "$3" "$4""#,
        "ci-run-test",
    ])
    .arg(repo().join(".ci/run"))
    .arg(&fake)
    .arg(require)
    .arg(if ifma { "1" } else { "0" })
    .env("SEEN", &seen)
    // This test may itself run in the masked pass: the passes set these, not the caller.
    .env_remove("OPENSSL_ia32cap")
    .env_remove("TERMINUS_REQUIRE")
    .env_remove("TERMINUS_SKIP_LOG");
    for pass in fail {
        cmd.env(format!("FAIL_{pass}"), "1");
    }
    let out = cmd.output().expect("run bash");
    let seen = std::fs::read_to_string(&seen).unwrap_or_default();
    (out, seen.lines().map(str::to_owned).collect())
}

/// The run's output for a failure message, indented: its `test result:` lines must not
/// start a line of the real CI log, whose totals count every such line.
fn shown(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| format!("  | {l}\n"))
        .collect()
}

fn last_line(out: &Output) -> String {
    let stdout = String::from_utf8_lossy(&out.stdout);
    stdout.lines().last().unwrap_or_default().to_owned()
}

#[test]
fn an_ifma_machine_runs_a_second_masked_pass_and_sums_both() {
    let (out, seen) = run_tests("ktls-guest", true, &[]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let shown = shown(&out);
    assert!(out.status.success(), "{shown}");
    // The first pass as the machine is, IFMA required; the second masked, IFMA not
    // required.
    assert_eq!(
        seen,
        ["unset|ktls-guest,ifma", ":~0x200000|ktls-guest"],
        "{shown}"
    );
    // 3 + 3 passed, of which the masked pass's skip is taken out.
    assert_eq!(last_line(&out), "5 passed, 0 failed, 1 skipped", "{shown}");
    assert!(
        stdout.contains("pass cpu: 3 passed, 0 failed, 0 skipped; exit status 0")
            && stdout.contains("pass ifma-masked: 2 passed, 0 failed, 1 skipped; exit status 0"),
        "{shown}"
    );
    // The masked pass's skips are listed as its own.
    assert!(
        stdout.contains(
            "1 tests skipped in pass ifma-masked (could not run on this machine):\n  crypto_mb_test [ifma]: masked\n"
        ),
        "{shown}"
    );
    assert!(!stdout.contains("skipped in pass cpu"), "{shown}");
}

#[test]
fn a_failure_in_either_pass_fails_the_run() {
    for (fail, closing) in [
        ("masked", "4 passed, 1 failed, 1 skipped"),
        ("cpu", "4 passed, 1 failed, 1 skipped"),
    ] {
        let (out, seen) = run_tests("ktls-guest", true, &[fail]);
        let shown = shown(&out);
        assert_eq!(out.status.code(), Some(1), "{fail} failing:\n{shown}");
        // The other pass still ran.
        assert_eq!(seen.len(), 2, "{fail} failing:\n{shown}");
        assert_eq!(last_line(&out), closing, "{fail} failing:\n{shown}");
    }
}

#[test]
fn ifma_is_never_required_in_the_masked_pass() {
    let (out, seen) = run_tests("ifma,ktls-guest", true, &[]);
    assert!(out.status.success(), "{}", shown(&out));
    assert_eq!(seen[1], ":~0x200000|ktls-guest");
}

#[test]
fn a_machine_without_ifma_runs_one_pass() {
    let (out, seen) = run_tests("ktls-guest", false, &[]);
    let shown = shown(&out);
    assert!(out.status.success(), "{shown}");
    assert_eq!(seen, ["unset|ktls-guest"], "{shown}");
    assert_eq!(last_line(&out), "3 passed, 0 failed, 0 skipped", "{shown}");
    let (failed, _) = run_tests("ktls-guest", false, &["cpu"]);
    assert_eq!(failed.status.code(), Some(1), "{}", self::shown(&failed));
}
