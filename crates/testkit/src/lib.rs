//! Test support shared by the workspace's suites.
//!
//! The machines this project is tested on differ: some CPUs run crypto_mb (AVX-512 IFMA),
//! some do not, and the kTLS tests need a guest kernel that may fail to boot. A test that
//! cannot run must neither fail (the machine is not broken) nor pass silently (cargo hides
//! a passing test's output, so a `println!("SKIPPED")` is invisible and the test counts
//! as passed). [`runs_here`] is the one place that decides, and it makes a skip:
//! - **visible**: one line written to the process's stderr file descriptor, which libtest's
//!   output capture does not intercept (it captures the `print!` macros only);
//! - **countable**: the same line appended to the file named by `TERMINUS_SKIP_LOG`, from
//!   which `.ci/run` prints "N tests skipped" with every test's name and reason, and takes
//!   the skipped tests out of the passed count;
//! - **enforceable**: when `TERMINUS_REQUIRE` (a comma-separated list of [`Need`] names)
//!   names what is missing, the test fails instead. `.ci/run` always requires the kTLS
//!   guest and requires IFMA whenever `/proc/cpuinfo` shows `avx512ifma`, except in its
//!   second pass on such a CPU, which masks IFMA with `OPENSSL_ia32cap` (the engine's
//!   `multibuffer::applicable` honours it) so that the scalar side runs there too.
//!
//! [`support`] has what every suite needs besides: scratch directories, the openssl
//! command line, and waiting for an event; [`ports`], ports to name before a server binds
//! them ([`free_port`]).

mod ports;
mod redis;
mod support;

pub use ports::free_port;
pub use redis::Redis;
pub use support::{eventually, openssl, openssl_stdout, run, TestDir};

use std::ffi::OsStr;
use std::fmt;
use std::fs::OpenOptions;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// What a test may need that some machines lack.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Need {
    /// A CPU on which crypto_mb runs (AVX-512 IFMA).
    Ifma,
    /// A guest kernel with kernel TLS (`tests/ktls-guest/run`).
    KtlsGuest,
    /// The Python packages the reverse proxy's gRPC and WebSocket tests drive (grpcio,
    /// websockets; `.ci/run` installs them).
    PythonPackages,
    /// A tlsfuzzer checkout and its tlslite-ng library (`tests/conformance/run`): a GitHub
    /// project, brought by hand where GitHub is reachable.
    Tlsfuzzer,
    /// h2spec, the HTTP/2 conformance suite (`.ci/run` installs it with `go install`).
    H2spec,
    /// testssl.sh (`.ci/run` installs Debian's).
    Testssl,
    /// testssl.sh 3.2 or later, which grades servers (a GitHub project: Debian 12 packages
    /// 3.0), brought by hand where GitHub is reachable.
    TestsslGrade,
    /// bpftrace, run as root where uprobes attach (`.ci/run` installs Debian's).
    Bpftrace,
    /// redis-server, the fleet's store (`.ci/run` installs Debian's).
    Redis,
    /// Pebble and pebble-challtestsrv, the ACME test CA and its DNS (`.ci/run` installs
    /// them with `go install`).
    Pebble,
    /// A second physical core this process may use (an SMT sibling is not one), for a
    /// core of its own (`crypto.simd = "dedicated"`).
    SpareCpu,
    /// A Go toolchain (`go` on the PATH), for clients written on Go's crypto/tls.
    Go,
    /// Chromium (`chromium` on the PATH), a real browser on BoringSSL, run headless
    /// (`.ci/run` installs Debian's).
    Chromium,
    /// nghttp2's clients, `nghttp` and `h2load` (`.ci/run` installs Debian's
    /// nghttp2-client).
    Nghttp2,
    /// `systemd-analyze`, which checks a unit file (Debian's systemd package).
    SystemdAnalyze,
    /// dpkg-dev's `dpkg-shlibdeps` beside dpkg's `dpkg-deb`, which build and read the
    /// Debian package (`.ci/run` installs dpkg-dev).
    DpkgDev,
    /// logrotate, which reads contrib/logrotate/terminus (`.ci/run` installs Debian's).
    Logrotate,
}

impl Need {
    /// The name `TERMINUS_REQUIRE` uses.
    pub fn name(self) -> &'static str {
        match self {
            Need::Ifma => "ifma",
            Need::KtlsGuest => "ktls-guest",
            Need::PythonPackages => "python-packages",
            Need::Tlsfuzzer => "tlsfuzzer",
            Need::H2spec => "h2spec",
            Need::Testssl => "testssl",
            Need::TestsslGrade => "testssl-grade",
            Need::Bpftrace => "bpftrace",
            Need::Redis => "redis",
            Need::Pebble => "pebble",
            Need::SpareCpu => "spare-cpu",
            Need::Go => "go",
            Need::Chromium => "chromium",
            Need::Nghttp2 => "nghttp2",
            Need::SystemdAnalyze => "systemd-analyze",
            Need::DpkgDev => "dpkg-dev",
            Need::Logrotate => "logrotate",
        }
    }
}

impl fmt::Display for Need {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// True when the calling test can go on (`available`). Otherwise the skip is reported and
/// recorded and the caller should return, unless `TERMINUS_REQUIRE` names `need`: then
/// this panics, failing the test with `reason`.
pub fn runs_here(need: Need, available: bool, reason: impl fmt::Display) -> bool {
    if available {
        return true;
    }
    let test = std::thread::current()
        .name()
        .unwrap_or("<unnamed test>")
        .to_owned();
    if required(need) {
        panic!("{test} needs {need} (TERMINUS_REQUIRE names it) but cannot run here: {reason}");
    }
    let line = format!("SKIPPED {test} [{need}]: {reason}\n");
    // Straight to the file descriptor: `eprintln!` would be captured and hidden.
    let _ = std::io::stderr().lock().write_all(line.as_bytes());
    if let Some(path) = std::env::var_os("TERMINUS_SKIP_LOG") {
        // One short O_APPEND write per skip: lines from parallel tests and test binaries
        // do not interleave.
        let logged = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .and_then(|mut f| f.write_all(line.as_bytes()));
        if let Err(e) = logged {
            panic!("cannot record a skip in TERMINUS_SKIP_LOG={path:?}: {e}");
        }
    }
    false
}

/// True when `TERMINUS_REQUIRE` names `need`.
fn required(need: Need) -> bool {
    std::env::var("TERMINUS_REQUIRE")
        .map(|list| list.split(',').any(|n| n.trim() == need.name()))
        .unwrap_or(false)
}

/// [`runs_here`] for a test that calls crypto_mb: `applicable` is
/// `terminus_engine::multibuffer::applicable()` (passed in: this crate is a dependency of
/// the engine's own tests, so it cannot depend on the engine). That decision honours
/// `OPENSSL_ia32cap`; where the variable is set, the skip's reason names it, since the
/// mask, not the CPU, may be what took IFMA away.
pub fn runs_with_ifma(applicable: bool) -> bool {
    let reason = match std::env::var("OPENSSL_ia32cap") {
        Ok(mask) => format!(
            "crypto_mb is not applicable here (no AVX-512 IFMA on this CPU, or OPENSSL_ia32cap={mask:?} clears it)"
        ),
        Err(_) => "crypto_mb is not applicable on this CPU (no AVX-512 IFMA)".to_owned(),
    };
    runs_here(Need::Ifma, applicable, reason)
}

/// Each thread of process `pid`: its name and the CPUs it may run on.
pub fn thread_cpus(pid: u32) -> Vec<(String, Vec<usize>)> {
    let tasks = std::fs::read_dir(format!("/proc/{pid}/task")).expect("the process's threads");
    tasks
        .flatten()
        .filter_map(|task| {
            let comm = std::fs::read_to_string(task.path().join("comm")).ok()?;
            let status = std::fs::read_to_string(task.path().join("status")).ok()?;
            let cpus = status
                .lines()
                .find_map(|l| l.strip_prefix("Cpus_allowed_list:"))?;
            Some((comm.trim().to_owned(), terminus_sys::cpu_list(cpus)))
        })
        .collect()
}

/// Physical cores among the CPUs this process may use (SMT siblings counted once).
pub fn physical_cores() -> usize {
    let mut cores: Vec<Vec<usize>> = terminus_sys::allowed_cpus()
        .unwrap_or_default()
        .into_iter()
        .map(terminus_sys::smt_siblings)
        .collect();
    cores.sort();
    cores.dedup();
    cores.len()
}

/// h2spec's binary: `$TERMINUS_H2SPEC`, else `target/tools/h2spec` (where `.ci/run`
/// installs it), else `h2spec` on the PATH; `None` when there is none.
pub fn h2spec() -> Option<PathBuf> {
    if let Some(path) = std::env::var_os("TERMINUS_H2SPEC") {
        return Some(path.into());
    }
    let local = repo().join("target/tools/h2spec");
    if local.exists() {
        return Some(local);
    }
    let on_path = Command::new("h2spec").arg("--version").output();
    on_path.is_ok().then(|| "h2spec".into())
}

/// Runs h2spec 2.2.1's every test (strict mode) against `port` on loopback, `tls` or in
/// cleartext with prior knowledge, and asserts they all passed; returns its summary line.
pub fn h2spec_passes(h2spec: &Path, port: u16, tls: bool) -> String {
    let mut cmd = Command::new(h2spec);
    if tls {
        cmd.args(["-t", "-k"]);
    }
    let out = cmd
        .args(["-S", "-o", "5", "-h", "127.0.0.1", "-p"])
        .arg(port.to_string())
        .output()
        .expect("h2spec runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let summary = stdout
        .lines()
        .rev()
        .find(|l| l.contains(" tests, "))
        .unwrap_or_default()
        .to_owned();
    assert!(
        out.status.success() && summary.contains(" 0 skipped, 0 failed"),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    summary
}

/// The repository's root directory.
pub fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// What the guest harness prints, instead of running the command, where no guest starts.
const GUEST_SKIP_MARKER: &str = "SKIPPED: kTLS guest tests";

/// Runs `program args` in `dir` inside the kTLS guest kernel (`tests/ktls-guest/run`) and
/// returns its output; None when no guest could start here (a skip, see [`runs_here`]).
pub fn in_ktls_guest(program: impl AsRef<OsStr>, args: &[&str], dir: &Path) -> Option<Output> {
    // One guest at a time: a guest has one CPU, and two of them beside the host's own
    // tests on a 2-core machine starve each other (the guest stream test slowed to its
    // idle timeout more often with two guests running).
    static ONE_GUEST: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _turn = ONE_GUEST.lock().unwrap_or_else(|p| p.into_inner());
    let out = Command::new(repo().join("tests/ktls-guest/run"))
        .arg(program)
        .args(args)
        .current_dir(dir)
        .output()
        .expect("run the kTLS guest harness");
    let stderr = String::from_utf8_lossy(&out.stderr);
    let booted = !stderr.contains(GUEST_SKIP_MARKER);
    runs_here(Need::KtlsGuest, booted, stderr.trim()).then_some(out)
}
