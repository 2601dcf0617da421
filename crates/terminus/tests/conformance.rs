//! TLS conformance: tlsfuzzer's scripts against terminus (`tests/conformance/run`, which
//! judges each script against the expected failures and reasons in
//! `tests/conformance/tlsfuzzer.toml`). tlsfuzzer is a GitHub project, not a package:
//! where no checkout is found this counts as a skip, or fails where `TERMINUS_REQUIRE`
//! names `tlsfuzzer` (see terminus_testkit).

mod common;

use std::process::Command;

use terminus_testkit::{repo, runs_here, Need};

const SKIP_MARKER: &str = "SKIPPED: tlsfuzzer conformance";

#[test]
fn tlsfuzzer_scripts_fail_only_as_listed() {
    let out = Command::new("python3")
        .arg(repo().join("tests/conformance/run"))
        .args(["--terminus", common::terminus_bin()])
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
