//! Signals and limits: graceful shutdown, SIGHUP reload, slow clients, max connections.

use std::io::Read;
use std::net::TcpStream;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::harness::*;

#[test]
fn sigterm_finishes_in_flight_request_then_exits_zero() {
    let dir = TestDir::new("shutdown");
    let pair = make_cert(&dir.0, "k", KeyKind::EcdsaP256, &["localhost"]);
    let big: Vec<u8> = (0..3_000_000u32).map(|i| (i * 7 % 251) as u8).collect();
    dir.write("www/big.bin", &big);
    let conf = Config::new(&dir, &pair)
        .before("[timeouts]\nshutdown_grace = \"30s\"\n")
        .write(&dir);
    let mut server = ServerBuilder::config(&conf).start();
    let out_file = dir.path("download.bin");
    // ~3 s at 1 MB/s: still running when the signal arrives.
    let download = slow_download(&server, &out_file);
    let received = || std::fs::metadata(&out_file).map_or(0, |m| m.len());
    server.signal("TERM");
    assert!(
        received() < big.len() as u64,
        "the download was over before the signal: the test proves nothing"
    );
    // No new connections once shutdown started.
    eventually(
        Duration::from_secs(10),
        "listener closed after SIGTERM",
        || TcpStream::connect_timeout(&server.addr, Duration::from_secs(2)).is_err(),
    );
    let out = download.wait_with_output().unwrap();
    assert_eq!(String::from_utf8_lossy(&out.stdout), "200");
    assert!(out.status.success());
    assert_eq!(
        std::fs::read(&out_file).unwrap(),
        big,
        "the in-flight download completed intact"
    );
    let status = server.wait_exit(Duration::from_secs(20));
    assert!(status.success(), "exit status {status:?}");
}

#[test]
fn shutdown_grace_cuts_off_a_request_that_outlives_it() {
    let dir = TestDir::new("grace");
    let pair = make_cert(&dir.0, "k", KeyKind::EcdsaP256, &["localhost"]);
    // Far more than the socket buffers hold: the response cannot be handed to the
    // kernel whole and finish behind the server's back.
    let big = vec![7u8; 50_000_000];
    dir.write("www/big.bin", &big);
    let conf = Config::new(&dir, &pair)
        .before("[timeouts]\nshutdown_grace = \"1s\"\n")
        .write(&dir);
    let mut server = ServerBuilder::config(&conf).start();
    // 50 s at 1 MB/s: far longer than the grace period.
    let out_file = dir.path("download.bin");
    let download = slow_download(&server, &out_file);
    let received = || std::fs::metadata(&out_file).map_or(0, |m| m.len());
    let signalled = Instant::now();
    server.signal("TERM");
    let status = server.wait_exit(Duration::from_secs(20));
    let took = signalled.elapsed();
    assert!(status.success(), "exit status {status:?}");
    assert!(
        took >= Duration::from_secs(1),
        "exited {took:?} after SIGTERM: the request was not given its grace"
    );
    let out = download.wait_with_output().unwrap();
    assert!(
        !out.status.success() && received() < big.len() as u64,
        "the download was not cut: curl {:?}, {} of {} bytes",
        out.status,
        received(),
        big.len()
    );
    assert!(
        server
            .stderr()
            .contains("still open after the shutdown grace period"),
        "{}",
        server.stderr()
    );
}

#[test]
fn sighup_swaps_certificate_and_rejects_broken_config() {
    let dir = TestDir::new("reload");
    let first = make_cert(&dir.0, "first", KeyKind::EcdsaP256, &["localhost"]);
    let second = make_cert(&dir.0, "second", KeyKind::EcdsaP256, &["localhost"]);
    dir.write("www/index.html", "hi\n");
    let live = live_pair(&dir, &first);
    let conf = Config::new(&dir, &live).write(&dir);
    let server = ServerBuilder::config(&conf).start();
    let served = |server: &Server| served_fingerprint(server, &[]);
    assert_eq!(served(&server), fingerprint(&first.cert));

    // An established keep-alive connection: one request before the reload, one after.
    let script = r#"
import socket, ssl, sys
ctx = ssl.create_default_context(); ctx.check_hostname = False; ctx.verify_mode = ssl.CERT_NONE
ctx.set_alpn_protocols(["http/1.1"])
s = ctx.wrap_socket(socket.create_connection(("127.0.0.1", int(sys.argv[1]))), server_hostname="localhost")
f = s.makefile("rb")
def get():
    s.sendall(b"GET /index.html HTTP/1.1\r\nHost: localhost\r\n\r\n")
    status = f.readline().decode().strip()
    length = 0
    while True:
        line = f.readline().decode().strip()
        if not line:
            break
        if line.lower().startswith("content-length:"):
            length = int(line.split(":")[1])
    f.read(length)
    return status
print(get(), flush=True)
sys.stdin.readline()
print(get(), flush=True)
"#;
    let mut established = Command::new("python3")
        .args(["-c", script, &server.port().to_string()])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut first_line = String::new();
    std::io::BufRead::read_line(
        &mut std::io::BufReader::new(established.stdout.as_mut().unwrap()),
        &mut first_line,
    )
    .unwrap();
    assert_eq!(first_line.trim(), "HTTP/1.1 200 OK");

    std::fs::copy(&second.cert, &live.cert).unwrap();
    std::fs::copy(&second.key, &live.key).unwrap();
    server.signal("HUP");
    let deadline = Instant::now() + Duration::from_secs(10);
    while served(&server) != fingerprint(&second.cert) {
        assert!(
            Instant::now() < deadline,
            "new certificate not served after SIGHUP:\n{}",
            server.stderr()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    // The connection from before the reload still works.
    std::io::Write::write_all(established.stdin.as_mut().unwrap(), b"go\n").unwrap();
    let out = established.wait_with_output().unwrap();
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        "HTTP/1.1 200 OK",
        "established connection dropped by reload"
    );

    // A broken config is rejected; the running one keeps serving.
    std::fs::write(&conf, "workers = \"many\"\n").unwrap();
    server.signal("HUP");
    let deadline = Instant::now() + Duration::from_secs(10);
    while !server.stderr().contains("reload failed") {
        assert!(
            Instant::now() < deadline,
            "no reload error logged:\n{}",
            server.stderr()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(
        server.stderr().contains("terminus.toml:1"),
        "{}",
        server.stderr()
    );
    assert_eq!(served(&server), fingerprint(&second.cert));
    assert_eq!(status(&server, &[], "/index.html"), 200);
}

#[test]
fn slow_clients_are_cut_off_without_hurting_others() {
    let dir = TestDir::new("slowloris");
    let pair = make_cert(&dir.0, "k", KeyKind::EcdsaP256, &["localhost"]);
    dir.write("www/index.html", "hi\n");
    let conf = Config::new(&dir, &pair)
        .before("[timeouts]\nhandshake = \"1s\"\n")
        .write(&dir);
    let server = ServerBuilder::config(&conf).admin().start();

    // Twenty connections that never send a ClientHello.
    let idle: Vec<TcpStream> = (0..20)
        .map(|_| TcpStream::connect(server.addr).unwrap())
        .collect();
    // Everyone else is served meanwhile.
    for _ in 0..5 {
        assert_eq!(status(&server, &[], "/index.html"), 200);
    }
    // Closed by the handshake timeout (1 s): within 20 s, when nothing else would ever
    // close them. (Timeouts after the handshake are tested in http1.rs.)
    for mut sock in idle {
        sock.set_read_timeout(Some(Duration::from_secs(20)))
            .unwrap();
        let mut buf = [0u8; 16];
        let n = sock.read(&mut buf).unwrap_or(usize::MAX);
        assert_eq!(n, 0, "silent connection closed by the handshake timeout");
    }
    assert!(server.metric("terminus_handshake_failures_total", &["reason=\"timeout\""]) >= 20.0);
}

#[test]
fn at_max_connections_new_clients_wait_instead_of_spinning() {
    let dir = TestDir::new("maxconn");
    let pair = make_cert(&dir.0, "k", KeyKind::EcdsaP256, &["localhost"]);
    dir.write("www/index.html", "hi\n");
    let conf = Config::new(&dir, &pair)
        .before("[limits]\nmax_connections = 2\n[timeouts]\nhandshake = \"30s\"\n")
        .write(&dir);
    let server = ServerBuilder::config(&conf).admin().start();
    // Four silent clients: two are served, the others wait (accepted or in the backlog).
    let clients: Vec<TcpStream> = (0..4)
        .map(|_| TcpStream::connect(server.addr).unwrap())
        .collect();
    eventually(Duration::from_secs(10), "two connections taken", || {
        server.metric("terminus_connections_open", &[]) == 2.0
    });
    let before = server.cpu_ticks();
    for _ in 0..5 {
        assert_eq!(
            server.metric("terminus_connections_open", &[]),
            2.0,
            "limit not enforced"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    assert!(
        server.cpu_ticks() - before < 20,
        "the server spun while at its connection limit"
    );
    drop(clients);
    // Once they are gone, everyone is served again: the two that waited are taken
    // (and find their clients gone) as permits come back, perhaps after a new client
    // on the other worker is answered.
    assert_eq!(status(&server, &[], "/index.html"), 200);
    eventually(Duration::from_secs(10), "every connection taken", || {
        server.metric("terminus_connections_total", &[]) >= 5.0
    });
}

#[test]
fn out_of_file_descriptors_backs_off_and_recovers() {
    let dir = TestDir::new("emfile");
    let pair = make_cert(&dir.0, "k", KeyKind::EcdsaP256, &["localhost"]);
    dir.write("www/index.html", "hi\n");
    let conf = Config::new(&dir, &pair)
        .before("[timeouts]\nhandshake = \"30s\"\n")
        .write(&dir);
    // 64 descriptors for the whole process: the flood below exhausts them.
    let server = ServerBuilder::config(&conf).admin().fd_limit(64).start();
    let flood: Vec<TcpStream> = (0..100)
        .map(|_| TcpStream::connect(server.addr).unwrap())
        .collect();
    // On purpose: the flood settled into the limit, then a window of CPU time measured.
    std::thread::sleep(Duration::from_millis(500));
    let before = server.cpu_ticks();
    std::thread::sleep(Duration::from_millis(1500));
    assert!(
        server.cpu_ticks() - before < 30,
        "accept loop spun on EMFILE"
    );
    drop(flood);
    // Served again once the flood is gone, and the failures were counted and logged.
    let deadline = Instant::now() + Duration::from_secs(10);
    while status(&server, &["--max-time", "5"], "/index.html") != 200 {
        assert!(
            Instant::now() < deadline,
            "not serving after the flood:\n{}",
            server.stderr()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    // The admin listener shares the descriptor limit: give it the same chance to recover.
    let admin = format!("http://{}/healthz", server.admin.unwrap());
    while !run(Command::new("curl").args(["-sf", "--max-time", "5", &admin]))
        .status
        .success()
    {
        assert!(
            Instant::now() < deadline,
            "admin not answering after the flood:\n{}",
            server.stderr()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    assert!(
        server.metric("terminus_accept_errors_total", &[]) > 0.0,
        "no accept errors counted"
    );
    assert!(
        server.stderr().contains("backing off"),
        "{}",
        server.stderr()
    );
}

/// With the multibuffer backend, start-up measures what batches cost scalar code after
/// them and says what `crypto.simd = "auto"` would choose; with scalar, nothing is batched
/// and nothing is said.
#[test]
fn the_after_effect_of_batches_is_measured_at_start_up_only_with_multibuffer() {
    let dir = TestDir::new("after-effect");
    let cert = make_cert(&dir.0, "ecdsa", KeyKind::EcdsaP256, &["localhost"]);
    dir.write("www/index.html", "hi\n");
    let start = |backend: &str| {
        let conf = Config::new(&dir, &cert)
            .before(&format!("[crypto]\nbackend = \"{backend}\"\n"))
            .write(&dir);
        ServerBuilder::config(&conf).admin().start()
    };
    let scalar = start("scalar");
    assert!(
        !scalar.metrics().contains("terminus_crypto_mb_after_effect"),
        "{}",
        scalar.metrics()
    );
    drop(scalar);
    if !ifma() {
        return;
    }
    let server = start("multibuffer");
    let ratio = server.metric("terminus_crypto_mb_after_effect", &["op=\"rsa2048\""]);
    // A ratio of two throughputs of one probe, whatever this machine's after-effect.
    assert!(ratio > 0.2 && ratio < 5.0, "{}", server.metrics());
    assert_eq!(
        server.metric("terminus_crypto_simd_auto", &[]),
        1.0,
        "one placement chosen:\n{}",
        server.metrics()
    );
    assert!(
        server
            .stderr()
            .contains("crypto.simd = \"auto\" would choose"),
        "{}",
        server.stderr()
    );
}

/// Whether this machine can dedicate a core: crypto_mb runs, and a second physical core
/// is there (an SMT sibling is no core of its own).
fn can_dedicate() -> bool {
    ifma()
        && terminus_testkit::runs_here(
            terminus_testkit::Need::SpareCpu,
            terminus_testkit::physical_cores() >= 2,
            "one physical core: none to dedicate",
        )
}

/// A config of one RSA-2048 server with crypto_mb batches dedicated (`crypto` lines
/// added) and `workers` as given, or left unset; in a fresh directory named `name`.
fn dedicated_config(name: &str, crypto: &str, workers: Option<usize>) -> (TestDir, PathBuf) {
    let dir = TestDir::new(name);
    let cert = make_cert(&dir.0, "rsa", KeyKind::Rsa(2048), &["localhost"]);
    dir.write("www/index.html", "hi\n");
    let extra = format!("[crypto]\nbackend = \"multibuffer\"\nsimd = \"dedicated\"\n{crypto}");
    let conf = Config::new(&dir, &cert).before(&extra).write(&dir);
    let workers = workers.map_or(String::new(), |n| format!("workers = {n}\n"));
    let text = std::fs::read_to_string(&conf).unwrap();
    std::fs::write(&conf, text.replace("workers = 2\n", &workers)).unwrap();
    (dir, conf)
}

/// `crypto.simd = "dedicated"` with one crypto core and `workers` left to it: each crypto
/// thread runs pinned to a CPU of that core, the workers (one per other CPU) never there;
/// every operation of RSA handshakes from many clients at once is computed by the crypto
/// threads, none on a worker.
#[test]
fn dedicated_simd_signs_on_a_core_no_worker_runs_on() {
    if !can_dedicate() {
        return;
    }
    let _serial = exclusive();
    // Workers left to it: one per CPU the crypto core leaves.
    let (_dir, conf) = dedicated_config("dedicated", "simd_cores = 1\n", None);
    let server = ServerBuilder::config(&conf).admin().start();
    let threads = terminus_testkit::thread_cpus(server.pid());
    let of = |prefix: &str| -> Vec<&(String, Vec<usize>)> {
        threads
            .iter()
            .filter(|(n, _)| n.starts_with(prefix))
            .collect()
    };
    // One crypto thread per CPU of the dedicated core (its SMT siblings too), each
    // pinned to its own.
    let crypto = of("crypto-simd");
    assert!(!crypto.is_empty(), "{threads:?}");
    let dedicated: Vec<usize> = crypto.iter().flat_map(|(_, on)| on.clone()).collect();
    assert!(crypto.iter().all(|(_, on)| on.len() == 1), "{threads:?}");
    let workers = of("worker-");
    // Workers left unset: one for each CPU the dedicated core leaves.
    assert_eq!(
        workers.len() + dedicated.len(),
        terminus_sys::allowed_cpus().unwrap().len(),
        "{threads:?}"
    );
    for (name, on) in &workers {
        assert!(
            !on.is_empty() && on.iter().all(|c| !dedicated.contains(c)),
            "{name} may run on a dedicated CPU {dedicated:?}: {threads:?}"
        );
    }
    assert_eq!(
        server.metric("terminus_crypto_simd", &["placement=\"dedicated\""]),
        1.0
    );

    let url = format!("https://localhost:{}/", server.port());
    let report = load_in_background(full_handshakes(&url, "127.0.0.1", 400, 2))
        .join()
        .unwrap();
    let ok = report["handshakes"].as_f64().unwrap_or(0.0);
    assert!(
        ok > 100.0 && report["errors"].as_object().unwrap().is_empty(),
        "{report:#}"
    );

    let m = server.metrics();
    let rsa = ["op=\"rsa_sign\""];
    let signed = metric_sum(&m, "terminus_crypto_requests_total", &rsa);
    assert!(signed >= ok, "{m}");
    assert_eq!(
        metric_sum(&m, "terminus_crypto_fallbacks_total", &rsa),
        0.0,
        "{m}"
    );
    // Every operation of every handshake computed by the crypto thread.
    assert_eq!(
        metric_sum(&m, "terminus_crypto_offload_computed_total", &[]),
        metric_sum(&m, "terminus_crypto_requests_total", &[]),
        "{m}"
    );
}

/// Dedicating a core the configured workers already use is refused by `check` and at
/// start, saying what to change.
#[test]
fn dedicated_simd_without_a_free_core_does_not_start() {
    if !can_dedicate() {
        return;
    }
    let cpus = terminus_sys::allowed_cpus().unwrap().len();
    let (_dir, conf) = dedicated_config("dedicated-full", "", Some(cpus));
    for command in ["check", "serve"] {
        let out =
            run(Command::new(terminus_bin()).args([command, "--config", conf.to_str().unwrap()]));
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{command}: {stderr}");
        assert!(
            stderr.contains("crypto.simd = \"dedicated\" needs")
                && stderr.contains(&format!("workers = {cpus}; lower workers")),
            "{command}: {stderr}"
        );
    }
}

#[test]
fn reload_measures_the_crossover_of_a_new_key_size() {
    if !ifma() {
        return;
    }
    let dir = TestDir::new("remeasure");
    let first = make_cert(&dir.0, "rsa2048", KeyKind::Rsa(2048), &["localhost"]);
    let second = make_cert(&dir.0, "rsa3072", KeyKind::Rsa(3072), &["localhost"]);
    dir.write("www/index.html", "hi\n");
    let live = live_pair(&dir, &first);
    let conf = Config::new(&dir, &live)
        .before("[crypto]\nbackend = \"multibuffer\"\n")
        .write(&dir);
    let server = ServerBuilder::config(&conf).admin().start();
    let measured = |op: &str| {
        let m = server.metrics();
        m.contains(&format!(
            "terminus_crypto_crossover{{op=\"{op}\",measured=\"1\"}}"
        ))
    };
    assert!(measured("rsa2048"), "{}", server.metrics());
    assert!(!measured("rsa3072"), "measured a key size nobody uses");

    std::fs::copy(&second.cert, &live.cert).unwrap();
    std::fs::copy(&second.key, &live.key).unwrap();
    server.signal("HUP");
    eventually(
        Duration::from_secs(20),
        "the RSA-3072 certificate served",
        || served_fingerprint(&server, &[]) == fingerprint(&second.cert),
    );
    assert!(
        measured("rsa3072"),
        "the new key size's crossover was not measured on reload:\n{}",
        server.metrics()
    );
    assert!(server.stderr().contains("rsa3072"), "{}", server.stderr());
    assert_eq!(status(&server, &[], "/index.html"), 200);
}

/// curl fetching `/big.bin` at 1 MB/s into `out_file`, returned once the first bytes
/// have arrived; its stdout is the status code, its stderr piped.
fn slow_download(server: &Server, out_file: &std::path::Path) -> std::process::Child {
    let resolve = format!("localhost:{}:127.0.0.1", server.port());
    let download = Command::new("curl")
        .args(["-sS", "-k", "--limit-rate", "1M", "--resolve", &resolve])
        .args(["-w", "%{http_code}", "-o"])
        .arg(out_file)
        .arg(server.url("/big.bin"))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    eventually(Duration::from_secs(20), "the download started", || {
        std::fs::metadata(out_file).is_ok_and(|m| m.len() > 0)
    });
    download
}

/// live.pem/live.key, a copy of `first`: the config names these files, and a reload test
/// swaps their contents.
fn live_pair(dir: &TestDir, first: &CertPair) -> CertPair {
    let live = CertPair {
        cert: dir.path("live.pem"),
        key: dir.path("live.key"),
    };
    std::fs::copy(&first.cert, &live.cert).unwrap();
    std::fs::copy(&first.key, &live.key).unwrap();
    live
}

/// SIGTERM stops every service terminus started (the workers, the `threads` backend's
/// crypto threads, the admin listener, the health checks with an upstream to check,
/// memory housekeeping, the ACME manager retrying a CA that does not answer, and the
/// fleet's store rounds connected to Redis) and the process says, after they have all
/// been joined and before it exits, that no thread and no network socket is left: not a
/// thread detached, not the store's connection (whose closing the store would see at
/// exit anyway, so the process's own count is what is asserted).
#[test]
fn sigterm_stops_every_service_and_leaves_no_thread_or_connection() {
    let Some(redis) = terminus_testkit::Redis::start() else {
        return;
    };
    let dir = TestDir::new("stop-all");
    let key_file = dir.write("fleet.key", format!("{}\n", "ab".repeat(32)));
    let unanswered = free_port();
    let conf = dir.write(
        "terminus.toml",
        format!(
            "listen = [\"127.0.0.1:0\"]\nworkers = 2\n\
             [crypto]\nbackend = \"threads\"\nthreads = 2\n\
             [fleet]\nstore = \"{}\"\nkey_file = \"{}\"\npoll = \"200ms\"\n\
             [acme]\ndirectory = \"https://127.0.0.1:{unanswered}/dir\"\nstate_dir = \"{}\"\n\
             [[upstream]]\nname = \"app\"\nservers = [\"127.0.0.1:{unanswered}\"]\n\
             health = {{ path = \"/healthz\", interval = \"100ms\" }}\n\
             [[server]]\nnames = [\"localhost\"]\ndefault = true\n\
             [[server.route]]\npath = \"/\"\nupstream = \"app\"\n\
             [[server]]\nnames = [\"acme.test\"]\ncertificates = \"acme\"\n",
            redis.url(),
            key_file.display(),
            dir.path("acme").display(),
        ),
    );
    let mut server = ServerBuilder::config(&conf).admin().start();
    eventually(Duration::from_secs(10), "the fleet on its store", || {
        server.metric("terminus_fleet_store_up", &[]) == 1.0
    });
    let clients = || redis.cli(&["CLIENT", "LIST"]).lines().count();
    assert!(clients() >= 2, "terminus holds no connection to the store");
    // The ACME manager is running: it has tried the CA that does not answer.
    eventually(Duration::from_secs(10), "the ACME manager at work", || {
        server.stderr().contains("acme: no account at")
    });
    server.signal("TERM");
    let status = server.wait_exit(Duration::from_secs(30));
    assert!(status.success(), "{status:?}");
    let log = server.stderr();
    assert!(
        log.contains("terminus stopped: every service joined, no thread or socket left"),
        "a service did not stop:\n{log}"
    );
}
