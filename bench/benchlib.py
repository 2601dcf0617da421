"""Shared pieces of the benchmark scripts: certificates, the servers under test (terminus,
Debian's nginx and HAProxy, one worker each pinned to CPU 0), their CPU time from /proc,
and the CPU-quota cgroup (one server worker capped so one client thread saturates it)."""

import os
import socket
import subprocess
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
CGROUP_CPU = Path("/sys/fs/cgroup/cpu")
CGROUP = CGROUP_CPU / "terminus-bench"
CLK_TCK = os.sysconf("SC_CLK_TCK")


def sh(cmd, **kw):
    return subprocess.run(cmd, check=True, capture_output=True, text=True, **kw)


def make_certs(d: Path):
    """rsa.pem/rsa.key (RSA-2048) and ecdsa.pem/ecdsa.key (P-256) for localhost, and
    rsa.bundle/ecdsa.bundle (certificate then key, as HAProxy takes them)."""
    sh(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "30",
        "-subj", "/CN=localhost", "-keyout", str(d / "rsa.key"), "-out", str(d / "rsa.pem")])
    sh(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256",
        "-nodes", "-days", "30", "-subj", "/CN=localhost",
        "-keyout", str(d / "ecdsa.key"), "-out", str(d / "ecdsa.pem")])
    for key in ("rsa", "ecdsa"):
        (d / f"{key}.bundle").write_text((d / f"{key}.pem").read_text() + (d / f"{key}.key").read_text())


def setup_cgroup(quota_pct: float, group: Path = CGROUP) -> Path:
    """A cgroup-v1 cpu group capped at quota_pct % of one CPU (period 100 ms)."""
    group.mkdir(exist_ok=True)
    (group / "cpu.cfs_period_us").write_text("100000")
    (group / "cpu.cfs_quota_us").write_text(str(int(quota_pct * 1000)))
    return group


def proc_cpu_seconds(pid: int) -> float:
    """utime+stime of a process (all its threads)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def tree_pids(pid: int):
    pids = [pid]
    try:
        kids = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    except OSError:
        kids = []
    for k in kids:
        pids += tree_pids(int(k))
    return pids


def proc_cpu_split(pid: int) -> (float, float):
    """utime and stime of a process (all its threads), seconds."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(fields[11]) / CLK_TCK, int(fields[12]) / CLK_TCK


def tree_cpu_split(pid: int) -> (float, float):
    """User-space and kernel CPU seconds of a process and its children."""
    user = system = 0.0
    for p in tree_pids(pid):
        try:
            u, s = proc_cpu_split(p)
        except OSError:
            continue
        user += u
        system += s
    return user, system


def tree_cpu(pid: int) -> float:
    """CPU seconds of a process and its children (nginx and HAProxy workers)."""
    total = 0.0
    for p in tree_pids(pid):
        try:
            total += proc_cpu_seconds(p)
        except OSError:
            pass
    return total


def wait_port(port: int, proc, timeout=10.0):
    end = time.time() + timeout
    while time.time() < end:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited early with {proc.returncode}")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"port {port} did not open")


def pinned_cmd(cmd, cpu: int = 0, group: Path = None):
    """`cmd` pinned to `cpu` (servers on 0, clients on 1), inside a quota cgroup if given."""
    if group:
        # The shell joins the cgroup, then becomes the command.
        return ["sh", "-c", f'echo $$ > {group}/cgroup.procs && exec taskset -c {cpu} "$@"', "sh"] + cmd
    return ["taskset", "-c", str(cpu)] + cmd


def versions_list(version):
    return ["1.2", "1.3"] if version is None else [version]


# aws-lc reads this once, at its CPU-capability set-up: the second word is CPUID leaf 7's
# EBX:ECX, and clearing AVX512F (EBX bit 16) turns off every AVX-512 path aws-lc gates (its
# bulk AES-GCM and RSA modexp; crypto_mb dispatches on its own). Issue 40's bulk question.
MASK_AVX512 = {"OPENSSL_ia32cap": ":~0x10000"}

# Small files every server serves from www/ (HAProxy from memory, one rule each).
SMALL_FILES = {"0kb.bin": 0, "1kb.bin": 1024, "16kb.bin": 16384}
# The addresses the servers listen on, unless a bench asks for more.
HOSTS = ("127.0.0.1",)


def write_small_files(www: Path):
    for name, size in SMALL_FILES.items():
        (www / name).write_bytes(os.urandom(size))


def terminus_config(work: Path, port: int, key: str, backend: str, version=None, resumption=False,
                    http3=False, hosts=HOSTS, ktls=False) -> str:
    """`ktls`: every connection's records go to the kernel, or it is refused."""
    versions = ", ".join(f'"{v}"' for v in versions_list(version))
    tickets = "true" if resumption else "false"
    cache = 262144 if resumption else 0
    extra = (", http3 = true" if http3 else "") + (', ktls = "required"' if ktls else "")
    listen = ", ".join(f'{{ address = "{h}:{port}"{extra} }}' for h in hosts)
    return f"""workers = 1
pin = true
listen = [{listen}]
[tls]
versions = [{versions}]
session_tickets = {tickets}
session_cache = {cache}
[crypto]
backend = "{backend}"
[[server]]
names = ["localhost"]
root = "{work / 'www'}"
[[server.certificate]]
cert = "{work / (key + '.pem')}"
key = "{work / (key + '.key')}"
"""


def nofile(wanted: int) -> int:
    """What a server may ask for: `wanted` descriptors (20,000 at least), within this
    process's hard limit, which a container may not let even root raise."""
    import resource
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    wanted = max(20000, wanted)
    return wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)


def nginx_config(work: Path, port: int, key: str, version=None, resumption=False, hosts=HOSTS,
                 connections=8192, ktls=False) -> str:
    """`ktls`: OpenSSL hands the records to the kernel where it can (nginx 1.21.4+)."""
    protocols = " ".join(f"TLSv{v}" for v in versions_list(version))
    session = ("ssl_session_cache shared:SSL:10m;\n        ssl_session_tickets on;" if resumption
               else "ssl_session_cache off;\n        ssl_session_tickets off;")
    return f"""worker_processes 1;
worker_cpu_affinity 01;
daemon off;
pid {work}/nginx.pid;
error_log {work}/nginx.err warn;
events {{ worker_connections {connections}; }}
worker_rlimit_nofile {nofile(2 * connections + 4000)};
http {{
    access_log off;
    sendfile on;
    keepalive_requests 100000;
    # The fair setting for small files: descriptors and metadata cached, as terminus's
    # [files] cache does by default.
    open_file_cache max=1000 inactive=60s;
    open_file_cache_valid 1s;
    open_file_cache_errors on;
    server {{
""" + "\n".join(f"        listen {h}:{port} ssl http2;" for h in hosts) + f"""
        ssl_certificate {work / (key + '.pem')};
        ssl_certificate_key {work / (key + '.key')};
        ssl_protocols {protocols};
        {session}
        {"ssl_conf_command Options KTLS;" if ktls else ""}
        root {work / 'www'};
    }}
}}
"""


def haproxy_config(work: Path, port: int, key: str, version=None, resumption=False, tune="",
                   hosts=HOSTS, connections=8000) -> str:
    vs = versions_list(version)
    tickets = "" if resumption else " no-tls-tickets"
    cache = "" if resumption else "    tune.ssl.cachesize 0\n"
    return f"""global
{tune}    nbthread 1
    cpu-map 1/1 0
    maxconn {connections}
    # return file answers from one buffer: room for a 16 KiB file and its head.
    tune.bufsize 32768
{cache}    log stderr format raw local0 err

defaults
    mode http
    timeout connect 5s
    timeout client 30s
    timeout server 30s
    timeout http-keep-alive 30s

frontend bench
""" + "".join(f"    bind {h}:{port} ssl crt {work / (key + '.bundle')} ssl-min-ver TLSv{vs[0]} ssl-max-ver TLSv{vs[-1]}{tickets} prefer-client-ciphers alpn h2,http/1.1\n"
              for h in hosts) + f"""    # HAProxy serves no files: each small file is read into memory at start and returned
    # for its path; anything else gets the 0-byte one.
""" + "".join(f"    http-request return status 200 content-type application/octet-stream file {work / 'www' / name} if {{ path /{name} }}\n"
              for name in SMALL_FILES if (work / 'www' / name).exists()) + f"""    http-request return status 200 content-type application/octet-stream file {work / 'www' / '0kb.bin'}
"""


def caddy_config(work: Path, port: int, key: str) -> str:
    """Caddy serving www over HTTP/1.1, h2 and h3 (its default) with our certificate, no
    admin API, no access log."""
    return f"""{{
    admin off
    auto_https off
}}
https://localhost:{port} {{
    bind 127.0.0.1
    tls {work / (key + '.pem')} {work / (key + '.key')}
    root * {work / 'www'}
    file_server
}}
"""


def start_server(server: str, work: Path, port: int, key: str, version=None, resumption=False,
                 admin_port=None, cgroup=False, tune="", http3=False, hosts=HOSTS, connections=None,
                 ktls=False):
    """Starts `terminus-BACKEND[@PATH]`, `nginx`, `haproxy` or `caddy` (one Go thread:
    GOMAXPROCS=1); returns (Popen, config text). `tune`: lines for HAProxy's global
    section, or TOML appended to terminus's config. `http3`: terminus's listener serves
    HTTP/3 too (Caddy's always does). `hosts`: the loopback addresses listened on (more
    than one lets a client hold more connections than one address has ports);
    `connections`: nginx's and HAProxy's connection limits, where the default is too
    few (terminus's is its `[limits]`, given in `tune`); `ktls`: terminus and nginx hand
    the records to the kernel (terminus refuses a connection it cannot hand over)."""
    limits = {"connections": connections} if connections else {}
    name = server.split("@")[0]
    conf = work / f"{name}-{key}.conf"
    err = open(work / f"{name}.err", "a")
    if name == "nginx":
        text = nginx_config(work, port, key, version, resumption, hosts, ktls=ktls, **limits)
        conf.write_text(text)
        # An environment variable named NGINX makes nginx treat it as inherited sockets.
        env = {k: v for k, v in os.environ.items() if k != "NGINX"}
        cmd = ["nginx", "-c", str(conf), "-p", str(work)]
    elif name == "haproxy":
        text = haproxy_config(work, port, key, version, resumption, tune, hosts, **limits)
        conf.write_text(text)
        env = dict(os.environ)
        cmd = ["haproxy", "-db", "-f", str(conf)]
    elif name == "caddy":
        text = caddy_config(work, port, key)
        conf.write_text(text)
        env = dict(os.environ, GOMAXPROCS="1", XDG_DATA_HOME=str(work / "caddy-data"),
                   XDG_CONFIG_HOME=str(work / "caddy-config"))
        cmd = ["caddy", "run", "--adapter", "caddyfile", "--config", str(conf)]
    elif name.startswith("terminus-"):
        _, _, path = server.partition("@")
        binary = Path(path) if path else REPO / "target/release/terminus"
        text = terminus_config(work, port, key, name.split("-", 1)[1], version, resumption, http3,
                               hosts, ktls) + tune
        conf.write_text(text)
        env = dict(os.environ, RUST_LOG="warn")
        cmd = [str(binary), "serve", "--config", str(conf)]
        if admin_port:
            cmd += ["--admin", f"127.0.0.1:{admin_port}"]
    else:
        raise ValueError(f"unknown server {server}")
    proc = subprocess.Popen(pinned_cmd(cmd, 0, CGROUP if cgroup else None), stdout=subprocess.DEVNULL, stderr=err, env=env)
    return proc, text


def engine_counters(admin_port: int, op: str) -> dict:
    """terminus's engine counters for one operation (`rsa_sign`, `x25519`, ...), from its
    admin port's /metrics: batches, batched requests and requests computed scalar."""
    import urllib.request
    text = urllib.request.urlopen(f"http://127.0.0.1:{admin_port}/metrics", timeout=5).read().decode()
    names = {"terminus_crypto_batches_total": "batches",
             "terminus_crypto_batched_requests_total": "requests",
             "terminus_crypto_scalar_computed_total": "scalar"}
    values = dict.fromkeys(names.values(), 0.0)
    for line in text.splitlines():
        name = line.split("{", 1)[0]
        if name in names and f'op="{op}"' in line:
            values[names[name]] = float(line.rsplit(" ", 1)[1])
    return values


def mean_batch(admin_port: int, op: str, since: dict = None) -> float:
    """Mean size of the batches terminus handed its backend for `op` (since an earlier
    engine_counters reading, if given)."""
    now = engine_counters(admin_port, op)
    since = since or dict.fromkeys(now, 0.0)
    batches = now["batches"] - since["batches"]
    return (now["requests"] - since["requests"]) / batches if batches else float("nan")


def stop_server(proc):
    proc.terminate()
    try:
        proc.wait(timeout=15)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def versions():
    """Versions of everything a report depends on."""
    def first_line(cmd):
        try:
            out = subprocess.run(cmd, capture_output=True, text=True)
            return (out.stdout or out.stderr).strip().splitlines()[0]
        except (OSError, IndexError):
            return "not found"
    rev = first_line(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"])
    cpu = next((l.split(":", 1)[1].strip() for l in Path("/proc/cpuinfo").read_text().splitlines()
                if l.startswith("model name")), "?")
    flags = next((l for l in Path("/proc/cpuinfo").read_text().splitlines() if l.startswith("flags")), "")
    return {
        "terminus": f"git {rev}",
        "nginx": first_line(["nginx", "-v"]),
        "haproxy": first_line(["haproxy", "-v"]),
        "openssl": first_line(["openssl", "version"]),
        "kernel": os.uname().release,
        "cpu": cpu + (" with AVX-512 IFMA" if "avx512ifma" in flags else " without AVX-512 IFMA"),
        "cores": str(os.cpu_count()),
    }
