//! The kTLS guest harness (`tests/ktls-guest/run`): it boots a kernel with kTLS, runs a
//! command there and returns its exit status. Where no guest can start, these tests are
//! counted as skipped, or fail where `TERMINUS_REQUIRE` names `ktls-guest` (see
//! terminus_testkit).

use std::process::{Command, Output};

use crate::harness::{curl, ServerBuilder};

/// `args` run inside the guest from the repository's root; None (a counted skip, or a
/// failure where the guest is required) when no guest starts here.
fn in_guest(args: &[&str]) -> Option<Output> {
    terminus_testkit::in_ktls_guest(args[0], &args[1..], &terminus_testkit::repo())
}

#[test]
fn guest_kernel_offers_ktls() {
    let Some(out) = in_guest(&["python3", "tests/ktls-guest/probe.py"]) else {
        return;
    };
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && stdout.contains("kTLS probe: ok"),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn the_command_exit_status_comes_back() {
    let Some(out) = in_guest(&["sh", "-c", "echo from the guest; exit 7"]) else {
        return;
    };
    assert_eq!(out.status.code(), Some(7), "{out:?}");
    assert_eq!(String::from_utf8_lossy(&out.stdout), "from the guest\n");
}

/// terminus with `--ktls required` against curl, openssl s_client and Python's ssl in the
/// guest: the version x cipher matrix, 100 MB files, Range, keep-alive, close_notify,
/// KeyUpdate, a corrupted record, nonces across the hand-off, tls_stat and metrics.
#[test]
fn terminus_serves_over_kernel_tls() {
    let Some(out) = in_guest(&[
        "python3",
        "tests/ktls-guest/terminus_ktls.py",
        env!("CARGO_BIN_EXE_terminus"),
    ]) else {
        return;
    };
    assert_all_checks_passed(&out);
}

fn assert_all_checks_passed(out: &Output) {
    let stdout = String::from_utf8_lossy(&out.stdout);
    println!("{stdout}");
    assert!(
        out.status.success() && stdout.contains("all kTLS checks passed"),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The same checks on this machine with `--ktls auto`: where the kernel has no kTLS (these
/// development machines) every connection falls back to userspace TLS and must pass them
/// all; where it has kTLS, every connection must be on it.
#[test]
fn auto_serves_every_check_on_the_host_kernel() {
    let out = Command::new("python3")
        .args([
            "tests/ktls-guest/terminus_ktls.py",
            env!("CARGO_BIN_EXE_terminus"),
            "auto",
        ])
        .current_dir(terminus_testkit::repo())
        .output()
        .expect("run terminus_ktls.py");
    assert_all_checks_passed(&out);
}

/// A terminated `[[stream]]` on kernel TLS in the guest: 100 MB each way between Python's
/// ssl and a plain upstream, moved by splice (terminus's stream metrics) with the kernel
/// carrying the TLS (/proc/net/tls_stat), sha256-checked at each end.
#[test]
fn a_stream_moves_its_bytes_by_splice_on_kernel_tls() {
    let Some(out) = in_guest(&[
        "python3",
        "tests/ktls-guest/stream_ktls.py",
        env!("CARGO_BIN_EXE_terminus"),
    ]) else {
        return;
    };
    assert_stream_checks_passed(&out);
}

/// The same stream on this machine with `ktls = "auto"`: through rustls where the kernel
/// has no kTLS, by splice where it has.
#[test]
fn a_stream_moves_its_bytes_on_the_host_kernel() {
    let out = Command::new("python3")
        .args([
            "tests/ktls-guest/stream_ktls.py",
            env!("CARGO_BIN_EXE_terminus"),
            "auto",
        ])
        .current_dir(terminus_testkit::repo())
        .output()
        .expect("run stream_ktls.py");
    assert_stream_checks_passed(&out);
}

fn assert_stream_checks_passed(out: &Output) {
    let stdout = String::from_utf8_lossy(&out.stdout);
    println!("{stdout}");
    assert!(
        out.status.success() && stdout.contains("all stream checks passed"),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// `ktls = "required"` where the kernel cannot take connections: each is closed after the
/// handshake, counted and logged. (Where the kernel can, it is served on kernel TLS.)
#[test]
fn required_refuses_connections_the_kernel_cannot_take() {
    let server = ServerBuilder::flags(&["--ktls", "required"])
        .admin()
        .start();
    let kernel_has_tls = server.stderr().contains("kernel TLS available");
    let out = curl(&server, &[], "/");
    if kernel_has_tls {
        assert!(out.status.success(), "{out:?}");
        assert_eq!(
            server.metric("terminus_connections_by_data_path_total", &["ktls"]),
            1.0
        );
        return;
    }
    assert!(!out.status.success(), "served without kernel TLS: {out:?}");
    assert!(out.stdout.is_empty());
    assert_eq!(server.metric("terminus_ktls_refused_total", &[]), 1.0);
    assert_eq!(
        server.metric("terminus_ktls_fallbacks_total", &["no_kernel_tls"]),
        1.0
    );
    assert_eq!(
        server.metric("terminus_connections_by_data_path_total", &[]),
        0.0
    );
    let log = server.stderr();
    assert!(
        log.contains("has ktls = \"required\" but this kernel has no usable kernel TLS")
            && log.contains("ktls = \"required\": closing the connection"),
        "{log}"
    );
}
