//! What the areas share: a spawned `terminus` ([`ServerBuilder`], [`Server`]) and its
//! configuration ([`Config`]), certificates (self-signed by the openssl CLI,
//! [`make_cert`]; a CA and what it signs, [`Ca`]), `terminus load` ([`load`]), real
//! clients (curl, `openssl s_client`, Python upstreams, Chromium), and [`exclusive`] for
//! the tests that must run alone.

use std::cell::{Cell, RefCell};
use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::{mpsc, PoisonError, RwLock, RwLockReadGuard, RwLockWriteGuard};
use std::time::{Duration, Instant};

pub mod ca;
pub mod raw;
pub mod replay;

pub use ca::{Ca, Leaf};

pub use terminus_testkit::{eventually, openssl, run, TestDir};

/// True when crypto_mb runs on this CPU; otherwise the skip is shown and counted (or
/// fails the test where IFMA is required; see terminus_testkit) and the caller returns.
pub fn ifma() -> bool {
    terminus_testkit::runs_with_ifma(terminus_engine::multibuffer::applicable())
}

/// The lock [`exclusive`] takes for writing and every test that starts a server for
/// reading.
static SUITE: RwLock<()> = RwLock::new(());

thread_local! {
    /// The read side of [`SUITE`] a test thread took when it started its first server,
    /// held until the thread (the test) ends.
    static ALONGSIDE: RefCell<Option<RwLockReadGuard<'static, ()>>> = const { RefCell::new(None) };
    /// Whether this thread's test holds [`exclusive`].
    static ALONE: Cell<bool> = const { Cell::new(false) };
}

/// Held by the tests that measure rates or time, or that saturate a CPU: while one holds
/// it, no other test of the binary runs a server (one that has started one finishes
/// first; one that starts one waits), so that no test's load can fail another's
/// measurement. Every area shares this process, so the lock spans them all, as the
/// separate binaries of before ran one after another. Take it first, before starting a
/// server.
pub fn exclusive() -> RwLockWriteGuard<'static, ()> {
    assert!(
        ALONGSIDE.with(|held| held.borrow().is_none()),
        "exclusive() must be taken before the test starts a server"
    );
    ALONE.with(|alone| alone.set(true));
    SUITE.write().unwrap_or_else(PoisonError::into_inner)
}

/// Called when a server starts: unless this test holds [`exclusive`], waits for any
/// test that does to finish and keeps those that will from starting until this test
/// ends. Only libtest's threads, named after their test (`area::test`), take it; a thread
/// a test spawned has no such name and goes on under its test's hold.
fn alongside_others() {
    let test_thread = std::thread::current()
        .name()
        .is_some_and(|name| name.contains("::"));
    if !test_thread || ALONE.with(Cell::get) {
        return;
    }
    ALONGSIDE.with(|held| {
        let mut held = held.borrow_mut();
        if held.is_none() {
            *held = Some(SUITE.read().unwrap_or_else(PoisonError::into_inner));
        }
    });
}

/// A self-signed certificate and key made by the openssl CLI.
#[derive(Clone, Debug)]
pub struct CertPair {
    pub cert: PathBuf,
    pub key: PathBuf,
}

pub enum KeyKind {
    Rsa(u32),
    EcdsaP256,
    EcdsaP384,
    Ed25519,
}

pub fn make_cert(dir: &Path, stem: &str, kind: KeyKind, names: &[&str]) -> CertPair {
    let key = dir.join(format!("{stem}.key"));
    let cert = dir.join(format!("{stem}.pem"));
    let key_s = key.to_str().unwrap();
    match kind {
        KeyKind::Rsa(bits) => {
            openssl(&[
                "genpkey",
                "-algorithm",
                "RSA",
                "-pkeyopt",
                &format!("rsa_keygen_bits:{bits}"),
                "-out",
                key_s,
            ]);
        }
        KeyKind::EcdsaP256 | KeyKind::EcdsaP384 => {
            let curve = match kind {
                KeyKind::EcdsaP384 => "P-384",
                _ => "P-256",
            };
            openssl(&[
                "genpkey",
                "-algorithm",
                "EC",
                "-pkeyopt",
                &format!("ec_paramgen_curve:{curve}"),
                "-out",
                key_s,
            ]);
        }
        KeyKind::Ed25519 => {
            openssl(&["genpkey", "-algorithm", "ED25519", "-out", key_s]);
        }
    }
    let san = names
        .iter()
        .map(|n| format!("DNS:{n}"))
        .collect::<Vec<_>>()
        .join(",");
    openssl(&[
        "req",
        "-x509",
        "-new",
        "-key",
        key_s,
        "-out",
        cert.to_str().unwrap(),
        "-days",
        "2",
        "-subj",
        &format!("/CN={}", names[0]),
        "-addext",
        &format!("subjectAltName={san}"),
        "-addext",
        "basicConstraints=critical,CA:FALSE",
        "-addext",
        "extendedKeyUsage=serverAuth",
    ]);
    CertPair { cert, key }
}

/// SHA-256 fingerprint of a PEM certificate, as terminus prints it.
pub fn fingerprint(cert: &Path) -> String {
    let out = openssl(&[
        "x509",
        "-in",
        cert.to_str().unwrap(),
        "-noout",
        "-fingerprint",
        "-sha256",
    ]);
    String::from_utf8(out.stdout)
        .unwrap()
        .trim()
        .rsplit('=')
        .next()
        .unwrap()
        .to_owned()
}

/// A `terminus.toml` for the common case: one listener on a loopback port (port 0: the
/// server prints the one it got), two workers unless told, and one server, `localhost`,
/// serving `dir/www` with `pair`'s certificate. What a test adds goes before the server
/// block ([`Config::before`]: `[timeouts]`, `[tls]`, upstreams...) or inside it
/// ([`Config::in_server`]: routes, headers). Anything else is a test's own text.
pub struct Config {
    listen: String,
    www: PathBuf,
    pair: CertPair,
    workers: usize,
    before: String,
    in_server: String,
}

impl Config {
    pub fn new(dir: &TestDir, pair: &CertPair) -> Config {
        Config {
            listen: "\"127.0.0.1:0\"".into(),
            www: dir.path("www"),
            pair: pair.clone(),
            workers: 2,
            before: String::new(),
            in_server: String::new(),
        }
    }

    /// The one entry of `listen`, as TOML (`"127.0.0.1:0"` unless set).
    pub fn listen(mut self, entry: &str) -> Config {
        self.listen = entry.to_owned();
        self
    }

    /// `workers` (2 unless set).
    pub fn workers(mut self, workers: usize) -> Config {
        self.workers = workers;
        self
    }

    /// TOML after the top-level keys and before the server block.
    pub fn before(mut self, toml: &str) -> Config {
        self.before.push_str(toml);
        self.before.push('\n');
        self
    }

    /// TOML inside the server block, before its certificate.
    pub fn in_server(mut self, toml: &str) -> Config {
        self.in_server.push_str(toml);
        self.in_server.push('\n');
        self
    }

    pub fn text(&self) -> String {
        format!(
            r#"
listen = [{listen}]
workers = {workers}
{before}
[[server]]
names = ["localhost"]
root = "{www}"
{in_server}
[[server.certificate]]
cert = "{cert}"
key = "{key}"
"#,
            listen = self.listen,
            workers = self.workers,
            before = self.before,
            www = self.www.display(),
            in_server = self.in_server,
            cert = self.pair.cert.display(),
            key = self.pair.key.display()
        )
    }

    /// Writes the file as `dir/terminus.toml` and returns its path.
    pub fn write(&self, dir: &TestDir) -> PathBuf {
        dir.write("terminus.toml", self.text())
    }
}

/// SHA-256 fingerprint of the certificate the server presents to `openssl s_client ARGS`.
pub fn served_fingerprint(server: &Server, args: &[&str]) -> String {
    let dir = TestDir::new("served");
    fingerprint(&dir.write("served.pem", served_pem(server, args)))
}

/// The certificate (PEM) the server presents to `openssl s_client ARGS`.
pub fn served_pem(server: &Server, args: &[&str]) -> String {
    let out = run(Command::new("openssl")
        .args([
            "s_client",
            "-connect",
            &server.addr.to_string(),
            "-showcerts",
        ])
        .args(args)
        .stdin(Stdio::null()));
    let text = String::from_utf8_lossy(&out.stdout);
    let start = text
        .find("-----BEGIN CERTIFICATE-----")
        .unwrap_or_else(|| panic!("no certificate served to {args:?}: {text}"));
    let end = text.find("-----END CERTIFICATE-----").unwrap() + 25;
    text[start..end].to_owned()
}

/// A running terminus, killed (by its PID, SIGKILL) on drop if the test has not stopped
/// it; started by [`ServerBuilder`].
pub struct Server {
    pub child: Child,
    pub addr: SocketAddr,
    pub admin: Option<SocketAddr>,
    pub stdout_lines: Vec<String>,
    stderr_path: PathBuf,
    _logs: TestDir,
}

pub fn terminus_bin() -> &'static str {
    env!("CARGO_BIN_EXE_terminus")
}

/// How to start a `terminus serve` for a test: from flags alone ([`ServerBuilder::flags`],
/// a loopback port given with `--listen`) or from a configuration file
/// ([`ServerBuilder::config`], [`ServerBuilder::with`]), plus options. [`Self::start`]
/// returns once the server accepts connections.
#[must_use = "a builder starts nothing until `start`"]
pub struct ServerBuilder {
    args: Vec<String>,
    listen_flag: bool,
    fd_limit: Option<u32>,
    env: Vec<(String, String)>,
}

impl ServerBuilder {
    /// `terminus serve ARGS --listen 127.0.0.1:0` (a self-signed certificate of its own
    /// unless ARGS name one).
    pub fn flags(args: &[&str]) -> ServerBuilder {
        ServerBuilder {
            args: args.iter().map(|&a| a.to_owned()).collect(),
            listen_flag: true,
            fd_limit: None,
            env: Vec::new(),
        }
    }

    /// `terminus serve --config PATH`: the file's listeners, which must be port 0 on
    /// loopback for the test to learn its port (or a port the test chose).
    pub fn config(path: &Path) -> ServerBuilder {
        ServerBuilder {
            args: vec!["--config".into(), path.to_str().unwrap().into()],
            listen_flag: false,
            fd_limit: None,
            env: Vec::new(),
        }
    }

    /// [`ServerBuilder::config`] of `config`, written to `dir/terminus.toml`.
    pub fn with(dir: &TestDir, config: &Config) -> ServerBuilder {
        Self::config(&config.write(dir))
    }

    /// More command-line arguments.
    pub fn args(mut self, args: &[&str]) -> ServerBuilder {
        self.args.extend(args.iter().map(|&a| a.to_owned()));
        self
    }

    /// The admin listener on a loopback port ([`Server::admin`], [`Server::metrics`]).
    pub fn admin(self) -> ServerBuilder {
        self.args(&["--admin", "127.0.0.1:0"])
    }

    /// One worker on the scalar backend (what a test pins where it asserts what a worker
    /// computes: `auto` picks multibuffer where crypto_mb runs), with the admin listener.
    pub fn one_scalar_worker(self) -> ServerBuilder {
        self.args(&["--workers", "1", "--crypto-backend", "scalar"])
            .admin()
    }

    /// `name=value` in the server's environment.
    pub fn env(mut self, name: &str, value: &str) -> ServerBuilder {
        self.env.push((name.to_owned(), value.to_owned()));
        self
    }

    /// Under a limit of `n` open files (`ulimit -n`).
    pub fn fd_limit(mut self, n: u32) -> ServerBuilder {
        self.fd_limit = Some(n);
        self
    }

    /// Starts the server and returns once it accepts connections: terminus prints
    /// `listening on` after its listener is bound and listening, when the kernel queues
    /// any connection to it. (No connection probes it: one would show in the server's
    /// connection and handshake counts, which tests read.)
    pub fn start(self) -> Server {
        Server::launch(&self.args, self.listen_flag, self.fd_limit, &self.env)
    }
}

impl Server {
    fn launch(
        args: &[String],
        listen_flag: bool,
        fd_limit: Option<u32>,
        env: &[(String, String)],
    ) -> Server {
        alongside_others();
        let logs = TestDir::new("logs");
        let stderr_path = logs.path("stderr.log");
        let mut cmd = match fd_limit {
            None => Command::new(terminus_bin()),
            Some(n) => {
                let mut sh = Command::new("sh");
                sh.args([
                    "-c",
                    &format!("ulimit -n {n} && exec \"$0\" \"$@\""),
                    terminus_bin(),
                ]);
                sh
            }
        };
        cmd.arg("serve")
            .args(args)
            .envs(env.iter().map(|(k, v)| (k, v)));
        if listen_flag {
            cmd.args(["--listen", "127.0.0.1:0"]);
        }
        cmd.env(
            "RUST_LOG",
            std::env::var("TERMINUS_TEST_LOG").unwrap_or_else(|_| "info".into()),
        )
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(std::fs::File::create(&stderr_path).unwrap());
        let mut child = cmd.spawn().expect("spawn terminus");
        let stdout = child.stdout.take().unwrap();
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let deadline = Instant::now() + Duration::from_secs(20);
        let mut lines = Vec::new();
        let mut addr = None;
        let mut admin = None;
        while addr.is_none() {
            let left = deadline.saturating_duration_since(Instant::now());
            match rx.recv_timeout(left) {
                Ok(line) => {
                    if let Some(a) = line.strip_prefix("listening on https://") {
                        addr = Some(a.trim_end_matches('/').parse().unwrap());
                    }
                    if let Some(a) = line.strip_prefix("admin on http://") {
                        admin = Some(a.trim_end_matches("/metrics").parse().unwrap());
                    }
                    lines.push(line);
                }
                Err(_) => {
                    let _ = child.kill();
                    let status = child.wait().ok();
                    panic!(
                        "terminus did not start ({status:?}); stdout {lines:?}; stderr:\n{}",
                        std::fs::read_to_string(&stderr_path).unwrap_or_default()
                    );
                }
            }
        }
        // Keep draining stdout so the server never blocks on a full pipe.
        std::thread::spawn(move || while rx.recv().is_ok() {});
        Server {
            child,
            addr: addr.unwrap(),
            admin,
            stdout_lines: lines,
            stderr_path,
            _logs: logs,
        }
    }

    /// The server's process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub fn port(&self) -> u16 {
        self.addr.port()
    }

    pub fn url(&self, path: &str) -> String {
        format!("https://localhost:{}{}", self.port(), path)
    }

    pub fn stderr(&self) -> String {
        std::fs::read_to_string(&self.stderr_path).unwrap_or_default()
    }

    pub fn signal(&self, sig: &str) {
        let status = Command::new("kill")
            .args([&format!("-{sig}"), &self.child.id().to_string()])
            .status()
            .unwrap();
        assert!(status.success());
    }

    /// Waits for the process to exit and returns its status.
    pub fn wait_exit(&mut self, within: Duration) -> std::process::ExitStatus {
        let deadline = Instant::now() + within;
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status;
            }
            assert!(
                Instant::now() < deadline,
                "terminus did not exit within {within:?}; stderr:\n{}",
                self.stderr()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// A memory figure of the server process from `/proc/PID/status` (`VmRSS`, its
    /// resident memory now; `VmHWM`, the most it has had), in KiB.
    pub fn memory_kib(&self, field: &str) -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.pid())).unwrap();
        status
            .lines()
            .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
            .and_then(|v| v.split_whitespace().next()?.parse().ok())
            .unwrap_or_else(|| panic!("no {field} in /proc/{}/status", self.pid()))
    }

    /// utime+stime of the server process so far, in clock ticks.
    pub fn cpu_ticks(&self) -> u64 {
        let stat = std::fs::read_to_string(format!("/proc/{}/stat", self.child.id())).unwrap();
        let fields: Vec<u64> = stat
            .rsplit(')')
            .next()
            .unwrap()
            .split_whitespace()
            .skip(11)
            .take(2)
            .map(|x| x.parse().unwrap())
            .collect();
        fields[0] + fields[1]
    }

    /// curl's `GET PATH` from the admin listener (`/metrics`, `/capacity`, `/healthz`),
    /// bounded by `--max-time 10`.
    pub fn admin_get(&self, path: &str) -> Output {
        let admin = self.admin.expect("server started without --admin");
        run(Command::new("curl").args([
            "-sS",
            "--max-time",
            "10",
            &format!("http://{admin}{path}"),
        ]))
    }

    /// `GET /metrics` from the admin listener.
    pub fn metrics(&self) -> String {
        let out = self.admin_get("/metrics");
        assert!(
            out.status.success(),
            "GET /metrics failed ({:?}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap()
    }

    /// Sum of every sample of `name` whose labels contain all of `labels`.
    pub fn metric(&self, name: &str, labels: &[&str]) -> f64 {
        metric_sum(&self.metrics(), name, labels)
    }
}

pub fn metric_sum(text: &str, name: &str, labels: &[&str]) -> f64 {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter(|l| {
            let series = l.split_whitespace().next().unwrap_or("");
            (series == name || series.starts_with(&format!("{name}{{")))
                && labels.iter().all(|lab| series.contains(lab))
        })
        .map(|l| l.rsplit(' ').next().unwrap().parse::<f64>().unwrap())
        .sum()
}

impl Drop for Server {
    fn drop(&mut self) {
        if self.child.try_wait().ok().flatten().is_none() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// curl against the server with the name resolved to its loopback address.
pub fn curl(server: &Server, extra: &[&str], path: &str) -> Output {
    curl_host(server, "localhost", extra, path)
}

pub fn curl_host(server: &Server, host: &str, extra: &[&str], path: &str) -> Output {
    let url = format!("https://{host}:{}{path}", server.port());
    run(curl_command(server, host).args(extra).arg(url))
}

/// The curl that [`curl`] runs, without its URL: `host` resolved to the server's loopback
/// address, the test certificate not checked, 20 s at most. For a test that gives it
/// several URLs (one connection reused for them) or runs it on a thread of its own.
pub fn curl_command(server: &Server, host: &str) -> Command {
    let resolve = format!("{host}:{}:127.0.0.1", server.port());
    let mut cmd = Command::new("curl");
    cmd.args(["-sS", "-k", "--max-time", "20", "--resolve", &resolve]);
    cmd
}

/// HTTP status code of a request (curl's `%{http_code}`), body discarded.
pub fn status(server: &Server, extra: &[&str], path: &str) -> u16 {
    let mut args = vec!["-o", "/dev/null", "-w", "%{http_code}"];
    args.extend_from_slice(extra);
    let out = curl(server, &args, path);
    String::from_utf8_lossy(&out.stdout)
        .trim()
        .parse()
        .unwrap_or(0)
}

/// `openssl s_client` handshake; returns its combined stdout/stderr text.
pub fn s_client(server: &Server, args: &[&str]) -> String {
    let out = run(Command::new("openssl")
        .args(["s_client", "-connect", &server.addr.to_string(), "-brief"])
        .args(args)
        .stdin(Stdio::null()));
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// curl's status, response head and body.
pub fn headers(server: &Server, extra: &[&str], path: &str) -> (u16, String, Vec<u8>) {
    let mut args = vec!["-D", "-", "-o", "/dev/stderr"];
    args.extend_from_slice(extra);
    let out = curl(server, &args, path);
    let head = String::from_utf8_lossy(&out.stdout).into_owned();
    let code = head
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    assert!(code != 0, "curl {extra:?} {path}: {out:?}");
    (code, head, out.stderr)
}

/// The value of header `name` (lower case) in a header block.
pub fn header_value(head: &str, name: &str) -> Option<String> {
    head.lines().find_map(|l| {
        let (n, v) = l.split_once(':')?;
        n.eq_ignore_ascii_case(name).then(|| v.trim().to_owned())
    })
}

/// `terminus load ARGS --json`, run to its end: the report it printed. Fails the test
/// when the load fails or prints no report.
pub fn load(args: &[&str]) -> serde_json::Value {
    let out = run(Command::new(terminus_bin())
        .arg("load")
        .args(args)
        .arg("--json"));
    assert!(
        out.status.success(),
        "terminus load {args:?} failed ({:?}): {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("not JSON ({e}): {}", String::from_utf8_lossy(&out.stdout)))
}

/// [`load`] on a thread of its own, for a test that watches the server meanwhile.
pub fn load_in_background(args: Vec<String>) -> std::thread::JoinHandle<serde_json::Value> {
    std::thread::spawn(move || load(&args.iter().map(String::as_str).collect::<Vec<_>>()))
}

/// [`load`]'s arguments for full TLS 1.3 handshakes to `url` from `address` at `rate` a
/// second for `seconds`, each on a new connection with one request.
pub fn full_handshakes(url: &str, address: &str, rate: u32, seconds: u32) -> Vec<String> {
    [
        url,
        "--address",
        address,
        "--rate",
        &rate.to_string(),
        "-d",
        &format!("{seconds}s"),
        "--new-connection",
        "-k",
        "--tls",
        "1.3",
    ]
    .map(str::to_owned)
    .to_vec()
}

/// A running app.py, killed on drop.
pub struct App {
    child: Child,
    pub port: u16,
}

impl App {
    pub fn start(name: &str) -> App {
        Self::launch("app.py", &["0", name])
    }

    /// Starts tests/upstream/SCRIPT with `args`; it prints "ready PORT" once listening.
    pub fn launch(script: &str, args: &[&str]) -> App {
        Self::launch_with(script, args, &[])
    }

    /// [`App::launch`] with `env` added to its environment.
    pub fn launch_with(script: &str, args: &[&str], env: &[(&str, &str)]) -> App {
        let script = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/upstream")
            .join(script);
        let mut child = Command::new("python3")
            .arg(script)
            .args(args)
            .envs(env.iter().copied())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("python3 runs the test upstream");
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        let port = line
            .strip_prefix("ready ")
            .and_then(|p| p.trim().parse().ok())
            .unwrap_or_else(|| panic!("{args:?} did not start: {line:?}"));
        App { child, port }
    }

    pub fn addr(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }
}

impl Drop for App {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A port free on 127.0.0.1 (TCP and UDP) that no other socket takes before the caller
/// binds it: outside the kernel's ephemeral range, where only an explicit bind takes a
/// port, and never handed out twice (terminus_testkit::free_port says why).
pub fn free_port() -> u16 {
    terminus_testkit::free_port()
}

/// A TCP connection to `to` from the loopback address `from` (127.0.0.x: any of them is
/// this host's), for what a server counts by its client's address.
pub fn connect_from(from: std::net::Ipv4Addr, to: SocketAddr) -> std::net::TcpStream {
    use socket2::{Domain, Socket, Type};
    let socket = Socket::new(Domain::IPV4, Type::STREAM, None).unwrap();
    socket.bind(&SocketAddr::from((from, 0)).into()).unwrap();
    socket.connect(&to.into()).unwrap();
    socket.into()
}

/// Asserts that `terminus check` refuses the configuration `text` (written in `dir`)
/// with an error that `says` so and names the file's `line`.
pub fn check_refuses(dir: &TestDir, text: &str, says: &str, line: usize) {
    let conf = dir.write("bad.toml", text);
    let out = run(Command::new(terminus_bin()).args(["check", "--config", conf.to_str().unwrap()]));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{text}");
    assert!(
        err.contains(says) && err.contains(&format!("bad.toml:{line}")),
        "{text}\n{err}"
    );
}

/// Whether python3 can import `imports` (Python packages `.ci/run` installs); otherwise
/// the skip is shown and counted with `install`, the command that would install them.
pub fn python_imports(imports: &str, install: &str) -> bool {
    let found = std::process::Command::new("python3")
        .args(["-c", &format!("import {imports}")])
        .status()
        .is_ok_and(|s| s.success());
    terminus_testkit::runs_here(terminus_testkit::Need::PythonPackages, found, install)
}

/// The SHA-256 of `bytes`, hex (sha2's).
pub fn sha256_hex(bytes: &[u8]) -> String {
    use sha2::Digest;
    format!("{:x}", sha2::Sha256::digest(bytes))
}

/// The SHA-256 of `bytes`, hex, by `openssl dgst` (an implementation apart from the
/// client's).
pub fn openssl_sha256(bytes: &[u8]) -> String {
    use std::io::Write;
    let mut child = std::process::Command::new("openssl")
        .args(["dgst", "-sha256", "-r"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(bytes).unwrap();
    let out = child.wait_with_output().unwrap();
    String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .next()
        .unwrap()
        .to_owned()
}

/// An HTTP/3 server's settings for [`h3_server_on`].
pub struct H3Config<'a> {
    /// Its certificate's key.
    pub key: KeyKind,
    /// `crypto.backend`.
    pub backend: &'a str,
    /// `[http3]`'s lines.
    pub http3: &'a str,
    /// Lines of the server's own, before its certificate (`headers = ...`).
    pub in_server: &'a str,
    /// Appended to the file, after the server.
    pub more: &'a str,
    pub workers: usize,
}

/// A server with HTTP/3 on its one listener at `host` and a free port (TCP and UDP),
/// serving `www/index.html` ("over h3"), with an admin listener; and the port.
pub fn h3_server_on(dir: &TestDir, host: &str, c: H3Config<'_>) -> (Server, u16) {
    let pair = make_cert(&dir.0, "k", c.key, &["localhost"]);
    dir.write("www/index.html", "over h3\n");
    let port = free_port();
    let conf = dir.write(
        "terminus.toml",
        format!(
            "listen = [{{ address = \"{host}:{port}\", http3 = true }}]\nworkers = {}\n[crypto]\nbackend = \"{}\"\n[http3]\n{}\n[[server]]\nnames = [\"localhost\"]\nroot = \"{}\"\n{}\n[[server.certificate]]\ncert = \"{}\"\nkey = \"{}\"\n{}",
            c.workers,
            c.backend,
            c.http3,
            dir.path("www").display(),
            c.in_server,
            pair.cert.display(),
            pair.key.display(),
            c.more
        ),
    );
    (ServerBuilder::config(&conf).admin().start(), port)
}

/// Whether `chromium` runs here; otherwise the skip is shown and counted.
pub fn chromium_runs_here() -> bool {
    let found = Command::new("chromium")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    terminus_testkit::runs_here(
        terminus_testkit::Need::Chromium,
        found,
        "no `chromium` on the PATH",
    )
}

/// Headless Chromium as the browser tests run it: bounded by timeout(1) (a browser that
/// hangs fails its test, not CI's whole run), a profile of its own in `profile`, the test
/// certificates' errors ignored, nothing fetched in the background.
pub fn chromium(profile: &Path) -> Command {
    let mut cmd = Command::new("timeout");
    cmd.args(["120", "chromium"])
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-dev-shm-usage",
            "--disable-background-networking",
            "--disable-component-update",
            "--ignore-certificate-errors",
            "--no-first-run",
        ])
        .arg(format!("--user-data-dir={}", profile.display()));
    cmd
}

/// The log file at `path` once `done` holds of its text (the access log is written by a
/// thread of its own, moments after the answer), or as it is after 10 s for the caller's
/// assertion to show.
pub fn log_when(path: &Path, done: impl Fn(&str) -> bool) -> String {
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let text = std::fs::read_to_string(path).unwrap_or_default();
        if done(&text) || std::time::Instant::now() > deadline {
            return text;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}
