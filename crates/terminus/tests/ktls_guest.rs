//! The kTLS guest harness (`tests/ktls-guest/run`): it boots a kernel with kTLS, runs a
//! command there and returns its exit status. Where no guest can start, the harness and
//! these tests print a loud SKIPPED line.

use std::path::PathBuf;
use std::process::{Command, Output};

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn in_guest(args: &[&str]) -> Output {
    Command::new(repo().join("tests/ktls-guest/run"))
        .args(args)
        .current_dir(repo())
        .output()
        .expect("run the kTLS guest harness")
}

/// None (after a loud line) when the harness could not start a guest here.
fn guest_ran(out: &Output) -> Option<()> {
    let stderr = String::from_utf8_lossy(&out.stderr);
    if stderr.contains("SKIPPED: kTLS guest tests") {
        println!("SKIPPED: kTLS guest tests: {stderr}");
        return None;
    }
    Some(())
}

#[test]
fn guest_kernel_offers_ktls() {
    let out = in_guest(&["python3", "tests/ktls-guest/probe.py"]);
    if guest_ran(&out).is_none() {
        return;
    }
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && stdout.contains("kTLS probe: ok"),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn the_command_exit_status_comes_back() {
    let out = in_guest(&["sh", "-c", "echo from the guest; exit 7"]);
    if guest_ran(&out).is_none() {
        return;
    }
    assert_eq!(out.status.code(), Some(7), "{out:?}");
    assert_eq!(String::from_utf8_lossy(&out.stdout), "from the guest\n");
}
