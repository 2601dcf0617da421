#!/usr/bin/env python3
"""A terminated [[stream]] on kernel TLS: 100 MB each way between a real TLS client
(Python's ssl) and a plain TCP upstream, through terminus.

    tests/ktls-guest/run python3 tests/ktls-guest/stream_ktls.py path/to/terminus
    python3 tests/ktls-guest/stream_ktls.py path/to/terminus auto

With `ktls = "required"` (the default) the kernel must carry the connection and the
bytes must move by splice(2) between the kTLS socket and the upstream, never through
terminus's memory: terminus's stream metrics say so, and /proc/net/tls_stat shows the
kernel installed both directions. With `auto` on a kernel without kTLS the same bytes
must move through rustls instead. Both directions are checked by sha256 at the far end.
Prints one line per check; exits 1 if any failed.
"""
import hashlib
import os
import shutil
import socket
import ssl
import subprocess
import sys
import tempfile
import threading
import time

from checklib import check, free_port, metrics, tcp_losses, tls_stat, verdict

BIG = 100 * 1024 * 1024
BLOCK = hashlib.sha256(b"terminus stream").digest() * 2048  # 64 KiB

def read_exact(sock, n, digest):
    while n:
        chunk = sock.recv(min(n, 1 << 20))
        if not chunk:
            raise ConnectionError(f"{n} bytes short")
        digest.update(chunk)
        n -= len(chunk)


def pattern_sha(n):
    h = hashlib.sha256()
    for _ in range(n // len(BLOCK)):
        h.update(BLOCK)
    return h.hexdigest()


def upstream(listener, seen):
    """One connection: `n\\n` and n bytes in; their sha256 back, then n bytes out. A
    stream that does not start with its header (bytes lost before it) is closed at once."""
    conn, _ = listener.accept()
    with conn:
        head = b""
        while not head.endswith(b"\n"):
            byte = conn.recv(1)
            if not byte or len(head) > 20 or not (byte.isdigit() or byte == b"\n"):
                seen["upload"] = f"a stream that does not start with its length: {head + byte!r}"
                return
            head += byte
        n = int(head)
        digest = hashlib.sha256()
        read_exact(conn, n, digest)
        seen["upload"] = digest.hexdigest()
        conn.sendall(digest.hexdigest().encode() + b"\n")
        for _ in range(n // len(BLOCK)):
            conn.sendall(BLOCK)


def stream_metric(m, family, **labels):
    want = [f'{k}="{v}"' for k, v in labels.items()]
    return sum(v for k, v in m.items() if k.startswith(family + "{") and all(w in k for w in want))


def main(terminus, mode):
    root = tempfile.mkdtemp(prefix="terminus-stream-")
    port, admin = free_port(), free_port()
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    seen = {}
    threading.Thread(target=upstream, args=(listener, seen), daemon=True).start()
    with open(f"{root}/terminus.toml", "w") as f:
        f.write(f"""
listen = [{{ address = "127.0.0.1:{port}", ktls = "{mode}" }}]
workers = 1
[log]
access = "{root}/access.log"
[[upstream]]
name = "sink"
servers = ["127.0.0.1:{listener.getsockname()[1]}"]
[[stream]]
names = ["stream.test"]
upstream = "sink"
""")
    log = open(f"{root}/terminus.log", "w")
    server = subprocess.Popen(
        [terminus, "serve", "--config", f"{root}/terminus.toml", "--admin", f"127.0.0.1:{admin}"],
        stdout=log, stderr=subprocess.STDOUT,
    )
    try:
        for _ in range(100):
            try:
                metrics(admin)
                break
            except OSError:
                time.sleep(0.1)
        kernel = mode == "required" or "kernel TLS available" in open(f"{root}/terminus.log").read()
        method = "splice" if kernel else "userspace"
        print(f"expecting the stream on {'kernel TLS, by splice' if kernel else 'userspace TLS'} ({mode})")
        before, losses_before = tls_stat(), tcp_losses()
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
        started = time.time()
        answer, down = b"", hashlib.sha256()
        try:
            with socket.create_connection(("127.0.0.1", port)) as raw:
                with context.wrap_socket(raw, server_hostname="stream.test") as tls:
                    tls.sendall(f"{BIG}\n".encode())
                    for _ in range(BIG // len(BLOCK)):
                        tls.sendall(BLOCK)
                    while not answer.endswith(b"\n"):
                        answer += tls.recv(1)
                    read_exact(tls, BIG, down)
        except OSError as e:
            check("the stream carried both directions to their end", False,
                  f"{e!r} after {time.time() - started:.1f} s")
        took = time.time() - started
        losses = {k: v - losses_before[k] for k, v in tcp_losses().items()}
        expected = pattern_sha(BIG)
        check("100 MB up: the upstream got every byte", seen.get("upload") == expected
              and answer.decode().strip() == expected, f"{seen}, answer {answer[:80]!r}")
        check("100 MB down: the client got every byte", down.hexdigest() == expected)
        print(f"moved 2 x 100 MB in {took:.1f} s; TCP losses meanwhile: {losses}")
        m = {}
        for _ in range(50):
            m = metrics(admin)
            if stream_metric(m, "terminus_stream_connections_total", mode="terminate") >= 1:
                break
            time.sleep(0.1)
        streams = stream_metric(m, "terminus_stream_connections_total", mode="terminate", method=method)
        sent = stream_metric(m, "terminus_stream_bytes_total", method=method, direction="sent")
        received = stream_metric(m, "terminus_stream_bytes_total", method=method, direction="received")
        check(f"metrics: one terminated stream, its bytes moved by {method}",
              streams == 1 and sent >= BIG and received >= BIG,
              f"streams {streams}, sent {sent}, received {received}")
        after = tls_stat()
        installed = (after["TlsTxSw"] - before["TlsTxSw"], after["TlsRxSw"] - before["TlsRxSw"])
        check("/proc/net/tls_stat: " + ("the kernel carried the stream's TLS" if kernel
                                        else "no connection went through the kernel"),
              installed == ((1, 1) if kernel else (0, 0)), f"TlsTxSw/TlsRxSw +{installed}")
        check("terminus is still running", server.poll() is None, "exited")
    finally:
        server.terminate()
        server.wait(timeout=30)
        log.close()
    if os.path.exists(f"{root}/access.log"):
        print("".join(open(f"{root}/access.log").readlines()[-2:]), end="")
    status = verdict("stream", f"{root}/terminus.log")
    shutil.rmtree(root, ignore_errors=True)
    return status

if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else "required"))
