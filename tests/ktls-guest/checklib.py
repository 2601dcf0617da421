"""What the guest check scripts share: free ports, one line per check, the kernel's TLS
counters, terminus's metrics, and the verdict."""
import os
import socket
import urllib.request

failures = []


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def check(name, ok, detail=""):
    print(f"{'ok  ' if ok else 'FAIL'} {name}{'' if ok else ': ' + detail}", flush=True)
    if not ok:
        failures.append(name)


def tls_stat():
    """/proc/net/tls_stat, or counters that stay at zero where the kernel has no kTLS."""
    if not os.path.exists("/proc/net/tls_stat"):
        return {k: 0 for k in ("TlsTxSw", "TlsRxSw", "TlsDecryptError")}
    with open("/proc/net/tls_stat") as f:
        return {k: int(v) for k, v in (line.split() for line in f)}


def tcp_losses():
    """The kernel's TCP loss counters: retransmitted segments, segments dropped for a full
    socket backlog or receive queue, and packets the per-CPU input queue (loopback's
    path) dropped. A relay that stops for seconds with these rising is waiting out TCP
    retransmission backoff, not a wakeup."""
    counters = {}
    for path in ("/proc/net/snmp", "/proc/net/netstat"):
        with open(path) as f:
            lines = f.read().splitlines()
        for names, values in zip(lines[::2], lines[1::2]):
            prefix = names.split(":")[0]
            for k, v in zip(names.split()[1:], values.split()[1:]):
                counters[f"{prefix}.{k}"] = int(v)
    wanted = ("Tcp.RetransSegs", "TcpExt.TCPBacklogDrop", "TcpExt.TCPRcvQDrop", "TcpExt.TCPTimeouts")
    out = {k: counters.get(k, 0) for k in wanted}
    with open("/proc/net/softnet_stat") as f:
        out["softnet.dropped"] = sum(int(line.split()[1], 16) for line in f)
    return out


def metrics(admin):
    text = urllib.request.urlopen(f"http://127.0.0.1:{admin}/metrics", timeout=5).read().decode()
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            key, value = line.rsplit(" ", 1)
            out[key] = float(value)
    return out


def verdict(what, log_path):
    """Prints the end of terminus's log if a check failed; returns the exit status."""
    if failures:
        print(open(log_path).read()[-3000:])
        print(f"{len(failures)} {what} checks failed: {', '.join(failures)}")
        return 1
    print(f"all {what} checks passed")
    return 0
