#!/usr/bin/env python3
"""terminus on kernel TLS, checked with real clients inside a guest kernel that has kTLS.

    tests/ktls-guest/run python3 tests/ktls-guest/terminus_ktls.py path/to/terminus
    python3 tests/ktls-guest/terminus_ktls.py path/to/terminus auto

Starts terminus with `--ktls required` (so a connection the kernel did not take is
refused, never served in userspace by accident), or with `--ktls auto` (on a kernel
without kTLS every connection must fall back to userspace TLS and pass the same checks),
then checks with curl, openssl s_client
and Python's ssl: TLS 1.2 and 1.3 x AES-128-GCM, AES-256-GCM, ChaCha20-Poly1305; a 100 MB
file's sha256; Range requests; keep-alive; close_notify from the client; a client
KeyUpdate (s_client's `k`); a corrupted record; sessions resumed from tickets sent as the
kernel took over; explicit nonces of a TLS 1.2 AES-GCM
connection never repeat across the hand-off; and /proc/net/tls_stat and terminus's
metrics prove the kernel carried every connection. Prints one line per check; exits 1 if
any failed.
"""
import hashlib
import os
import re
import shutil
import socket
import ssl
import subprocess
import sys
import tempfile
import threading
import time

from checklib import check, free_port, metrics, tls_stat, verdict


PORT = free_port()
ADMIN = free_port()
BASE = f"https://127.0.0.1:{PORT}"
BIG = 100 * 1024 * 1024

# (TLS version, curl/s_client cipher option value, AEAD)
MATRIX = [
    ("1.2", "ECDHE-RSA-AES128-GCM-SHA256:ECDHE-ECDSA-AES128-GCM-SHA256", "AES-128-GCM"),
    ("1.2", "ECDHE-RSA-AES256-GCM-SHA384:ECDHE-ECDSA-AES256-GCM-SHA384", "AES-256-GCM"),
    ("1.2", "ECDHE-RSA-CHACHA20-POLY1305:ECDHE-ECDSA-CHACHA20-POLY1305", "CHACHA20-POLY1305"),
    ("1.3", "TLS_AES_128_GCM_SHA256", "AES-128-GCM"),
    ("1.3", "TLS_AES_256_GCM_SHA384", "AES-256-GCM"),
    ("1.3", "TLS_CHACHA20_POLY1305_SHA256", "CHACHA20-POLY1305"),
]

# Files whose responses are measured in records: one byte, 1 KiB, a response of exactly
# one full record with terminus's head (16,384 bytes), and 1 MiB.
RECORD_FILES = {"one.bin": 1, "1k.bin": 1024, "record.bin": 16384 - 228, "1m.bin": 1 << 20}

def curl(version, cipher, *args, http="--http1.1"):
    cipher_flag = "--tls13-ciphers" if version == "1.3" else "--ciphers"
    cmd = ["curl", "-sk", http, f"--tlsv{version}", "--tls-max", version, cipher_flag, cipher, *args]
    return subprocess.run(cmd, capture_output=True, timeout=300)


class SClient:
    """openssl s_client driven step by step: each input is written only once the output
    shows what it waits for, so `k` reaches s_client as a command line of its own."""

    def __init__(self, version, cipher):
        flag = ["-tls1_3", "-ciphersuites", cipher] if version == "1.3" else ["-tls1_2", "-cipher", cipher]
        self.p = subprocess.Popen(
            ["openssl", "s_client", "-connect", f"127.0.0.1:{PORT}", "-servername", "localhost", *flag],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        )
        self.out = b""
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()
        self.wait_for(lambda out: "Verify return code" in out)

    def _read(self):
        while chunk := self.p.stdout.read1(1 << 16):
            self.out += chunk

    def text(self):
        return self.out.decode(errors="replace")

    def wait_for(self, done, timeout=20):
        deadline = time.time() + timeout
        while time.time() < deadline and not done(self.text()) and self.reader.is_alive():
            time.sleep(0.05)
        return done(self.text())

    def send(self, data):
        try:
            self.p.stdin.write(data)
            self.p.stdin.flush()
        except BrokenPipeError:
            pass

    def finish(self):
        try:
            self.p.stdin.close()
        except BrokenPipeError:
            pass
        self.p.wait(timeout=30)
        self.reader.join(timeout=10)
        return self.text()


def s_client(version, cipher, data):
    """One exchange: sends `data`, then stdin's end (s_client's close_notify)."""
    c = SClient(version, cipher)
    c.send(data)
    c.wait_for(lambda out: "HTTP/1.1" in out, timeout=10)
    return c.finish()


def request(path, extra=""):
    return f"GET {path} HTTP/1.1\r\nHost: localhost\r\n{extra}\r\n".encode()


class MemoryTls:
    """A Python ssl client over a raw socket that keeps every byte the server sent."""

    def __init__(self, ctx, session=None):
        self.sock = socket.create_connection(("127.0.0.1", PORT), timeout=20)
        self.incoming, self.outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
        self.obj = ctx.wrap_bio(self.incoming, self.outgoing, server_hostname="localhost", session=session)
        self.wire = bytearray()
        self.pump(self.obj.do_handshake)

    def flush(self):
        data = self.outgoing.read()
        if data:
            self.sock.sendall(data)

    def receive(self):
        data = self.sock.recv(1 << 16)
        if not data:
            self.incoming.write_eof()
        self.wire += data
        self.incoming.write(data)
        return data

    def pump(self, op, *args):
        while True:
            try:
                result = op(*args)
                self.flush()
                return result
            except ssl.SSLWantReadError:
                self.flush()
                if not self.receive():
                    raise ConnectionError("server closed")

    def send(self, data):
        self.pump(self.obj.write, data)

    def read_response(self):
        body = b""
        while b"\r\n\r\n" not in body:
            body += self.pump(self.obj.read, 1 << 16)
        head, rest = body.split(b"\r\n\r\n", 1)
        length = int(re.search(rb"(?i)content-length: *(\d+)", head).group(1))
        while len(rest) < length:
            rest += self.pump(self.obj.read, 1 << 16)
        return head, rest


def server_records(wire):
    """(type, fragment) of every TLS record in `wire`."""
    at, records = 0, []
    while at + 5 <= len(wire):
        length = int.from_bytes(wire[at + 3:at + 5], "big")
        records.append((wire[at], bytes(wire[at + 5:at + 5 + length])))
        at += 5 + length
    return records


def insecure_context(version, ciphers=None):
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    ctx.minimum_version = ctx.maximum_version = version
    if ciphers:
        ctx.set_ciphers(ciphers)
    return ctx


def main(terminus, mode):
    root = tempfile.mkdtemp(prefix="terminus-ktls-")
    small = os.urandom(70_000)
    with open(f"{root}/small.bin", "wb") as f:
        f.write(small)
    with open(f"{root}/big.bin", "wb") as f:
        block = os.urandom(1 << 20)
        for i in range(BIG >> 20):
            f.write(hashlib.sha256(block + bytes([i % 256])).digest() * (1 << 15))
    big_sha = hashlib.sha256(open(f"{root}/big.bin", "rb").read()).hexdigest()
    sized = {name: os.urandom(size) for name, size in RECORD_FILES.items()}
    for name, data in sized.items():
        with open(f"{root}/{name}", "wb") as f:
            f.write(data)
    log = open(f"{root}/terminus.log", "w")
    server = subprocess.Popen(
        [terminus, "serve", "--listen", f"127.0.0.1:{PORT}", "--admin", f"127.0.0.1:{ADMIN}",
         "--root", root, "--ktls", mode, "--workers", "1"],
        stdout=log, stderr=subprocess.STDOUT,
    )
    try:
        # The admin endpoint answers once start-up (and its kTLS probe) is over.
        for _ in range(100):
            try:
                metrics(ADMIN)
                break
            except OSError:
                time.sleep(0.1)
        kernel = mode == "required" or "kernel TLS available" in open(f"{root}/terminus.log").read()
        print(f"expecting every connection on {'kernel' if kernel else 'userspace'} TLS ({mode})")
        # Without kTLS there is no /proc/net/tls_stat: counters that stay at zero.
        before = tls_stat()
        connections = 0

        for version, cipher, aead in MATRIX:
            r = curl(version, cipher, f"{BASE}/small.bin")
            connections += 1
            check(f"curl TLS {version} {aead}: body intact", r.returncode == 0 and r.stdout == small,
                  f"exit {r.returncode}, {len(r.stdout)} bytes, {r.stderr[-300:]!r}")
            out = s_client(version, cipher, request("/small.bin", "Connection: close\r\n"))
            connections += 1
            negotiated = re.search(r"Cipher is (\S+)", out)
            check(f"s_client TLS {version} {aead}: negotiated and answered",
                  negotiated is not None and negotiated.group(1) != "(NONE)" and "HTTP/1.1 200" in out
                  and f"Protocol  : TLSv{version}" in out,
                  out[-600:])

        r = curl("1.3", "TLS_AES_256_GCM_SHA384", f"{BASE}/big.bin")
        connections += 1
        check("100 MB over TLS 1.3 AES-256-GCM: sha256 matches",
              r.returncode == 0 and hashlib.sha256(r.stdout).hexdigest() == big_sha,
              f"exit {r.returncode}, {len(r.stdout)} bytes")
        r = curl("1.2", "ECDHE-RSA-AES128-GCM-SHA256:ECDHE-ECDSA-AES128-GCM-SHA256", f"{BASE}/big.bin")
        connections += 1
        check("100 MB over TLS 1.2 AES-128-GCM: sha256 matches",
              r.returncode == 0 and hashlib.sha256(r.stdout).hexdigest() == big_sha,
              f"exit {r.returncode}, {len(r.stdout)} bytes")

        r = curl("1.3", "TLS_CHACHA20_POLY1305_SHA256", f"{BASE}/big.bin", http="--http2")
        connections += 1
        check("100 MB over HTTP/2, TLS 1.3 ChaCha20-Poly1305: sha256 matches",
              r.returncode == 0 and hashlib.sha256(r.stdout).hexdigest() == big_sha,
              f"exit {r.returncode}, {len(r.stdout)} bytes")

        r = curl("1.3", "TLS_AES_128_GCM_SHA256", "-r", "1000-1999", f"{BASE}/small.bin")
        connections += 1
        check("Range 1000-1999", r.stdout == small[1000:2000], f"{len(r.stdout)} bytes")
        r = curl("1.2", "ECDHE-RSA-AES128-GCM-SHA256:ECDHE-ECDSA-AES128-GCM-SHA256", "-r", f"{BIG - 5000}-", f"{BASE}/big.bin")
        connections += 1
        with open(f"{root}/big.bin", "rb") as f:
            f.seek(BIG - 5000)
            tail = f.read()
        check("Range of a large file's last 5000 bytes", r.stdout == tail, f"{len(r.stdout)} bytes")

        stat = tls_stat()
        r = curl("1.3", "TLS_AES_128_GCM_SHA256", "-w", "%{num_connects}\n", "-o", "/dev/null",
                 f"{BASE}/small.bin", "-o", "/dev/null", f"{BASE}/small.bin", "-o", "/dev/null", f"{BASE}/big.bin")
        connections += 1
        opened = sum(int(x) for x in r.stdout.split())
        check("keep-alive: three requests on one connection",
              r.returncode == 0 and opened == 1 and tls_stat()["TlsTxSw"] - stat["TlsTxSw"] == int(kernel),
              f"exit {r.returncode}, connects {r.stdout!r}")

        # close_notify: Python's unwrap() sends one and waits for the server's answer.
        for version in (ssl.TLSVersion.TLSv1_2, ssl.TLSVersion.TLSv1_3):
            c = MemoryTls(insecure_context(version))
            connections += 1
            c.send(request("/small.bin"))
            _, body = c.read_response()
            try:
                c.pump(c.obj.unwrap)
                clean = True
            except (ssl.SSLError, ConnectionError) as e:
                clean = str(e)
            check(f"close_notify from the client ({version.name}) answered with close_notify",
                  body == small and clean is True, f"{clean}")

        # Resumption across the hand-off: the session (TLS 1.3: the NewSessionTicket rustls
        # queued as the handshake ended, before the kernel took the connection) resumes.
        for version in (ssl.TLSVersion.TLSv1_2, ssl.TLSVersion.TLSv1_3):
            ctx = insecure_context(version)
            c = MemoryTls(ctx)
            c.send(request("/small.bin"))
            c.read_response()
            session = c.obj.session
            d = MemoryTls(ctx, session=session)
            d.send(request("/small.bin"))
            _, body = d.read_response()
            connections += 2
            check(f"a session from a {'kernel' if kernel else 'userspace'} TLS connection resumes ({version.name})",
                  session is not None and (session.has_ticket or version == ssl.TLSVersion.TLSv1_2)
                  and d.obj.session_reused and body == small,
                  f"ticket {session is not None and session.has_ticket}, reused {d.obj.session_reused}")

        # Records: a response of up to one record's plaintext (head and body) is one
        # record; a larger one fills every record but one, the last (userspace) or, with
        # sendfile on kernel TLS, the one where the kernel's first 64 KiB splice of the
        # file ends (the head sent with MSG_MORE shifted the file by its length there).
        for version, overhead in ((ssl.TLSVersion.TLSv1_2, 24), (ssl.TLSVersion.TLSv1_3, 17)):
            c = MemoryTls(insecure_context(version, "ECDHE-RSA-AES128-GCM-SHA256:ECDHE-ECDSA-AES128-GCM-SHA256"))
            connections += 1
            c.send(request("/small.bin"))  # tickets and the first response out of the way
            c.read_response()
            for name, data in sized.items():
                mark = len(c.wire)
                c.send(request(f"/{name}"))
                head, body = c.read_response()
                records = server_records(c.wire[mark:])
                sizes = [len(frag) - overhead for _, frag in records]
                plaintext = len(head) + 4 + len(body)
                full = plaintext // 16384
                expected = [16384] * full + ([plaintext % 16384] if plaintext % 16384 else [])
                check(f"{name} ({plaintext} bytes with its head, {version.name}) in {len(expected)} record(s)",
                      body == data and all(t == 23 for t, _ in records)
                      and (sorted(sizes, reverse=True) if kernel else sizes) == expected,
                      f"{len(sizes)} records, those not full (index: plaintext bytes): "
                      f"{[(i, n) for i, n in enumerate(sizes) if n != 16384]}")

        # Explicit nonces: rustls sent the Finished, the kernel every record after it.
        c = MemoryTls(insecure_context(ssl.TLSVersion.TLSv1_2, "ECDHE-RSA-AES128-GCM-SHA256:ECDHE-ECDSA-AES128-GCM-SHA256"))
        connections += 1
        for _ in range(3):
            c.send(request("/small.bin"))
            c.read_response()
        records = server_records(c.wire)
        ccs = next(i for i, (t, _) in enumerate(records) if t == 20)
        nonces = [frag[:8] for t, frag in records[ccs + 1:]]
        check("TLS 1.2 AES-GCM explicit nonces never repeat across the hand-off",
              len(nonces) > 10 and len(set(nonces)) == len(nonces),
              f"{len(nonces)} records, {len(set(nonces))} distinct nonces")

        # A record that fails to decrypt closes that connection; others go on.
        stat = tls_stat()
        c = MemoryTls(insecure_context(ssl.TLSVersion.TLSv1_3))
        connections += 1
        c.obj.write(request("/small.bin"))
        record = bytearray(c.outgoing.read())
        record[-1] ^= 1
        c.sock.sendall(record)
        # Whatever the server had sent (TLS 1.3 tickets) comes first, then end of file.
        closed = False
        try:
            while c.sock.recv(1 << 16):
                pass
            closed = True
        except ConnectionResetError:
            closed = True
        except socket.timeout:
            pass
        r = curl("1.3", "TLS_AES_128_GCM_SHA256", f"{BASE}/small.bin")
        connections += 1
        decrypt_errors = tls_stat()["TlsDecryptError"] - stat["TlsDecryptError"]
        check("a corrupted record closes its connection and others are served",
              closed and decrypt_errors == int(kernel) and r.stdout == small,
              f"closed {closed}, {decrypt_errors} kernel decrypt errors")

        # KeyUpdate: answered with close_notify, nothing after it is taken as data.
        m = metrics(ADMIN)
        c = SClient("1.3", "TLS_AES_128_GCM_SHA256")
        c.send(request("/small.bin"))
        c.wait_for(lambda out: "HTTP/1.1 200" in out)
        time.sleep(0.5)
        c.send(b"k\n")
        c.wait_for(lambda out: "KEYUPDATE" in out)
        time.sleep(0.5)
        c.send(request("/small.bin", "Connection: close\r\n"))
        # Kernel TLS: the server closes and s_client ends; userspace: a second answer.
        c.wait_for(lambda out: out.count("HTTP/1.1 200") == 2, timeout=5 if kernel else 20)
        out = c.finish()
        connections += 1
        answers = out.count("HTTP/1.1 200")
        summary = [line for line in out.splitlines() if re.match(r"HTTP/1.1|KEYUPDATE|closed|read:|DONE|Connection: close", line)]
        closes = metrics(ADMIN)["terminus_ktls_key_update_closes_total"] - m["terminus_ktls_key_update_closes_total"]
        if kernel:
            check("client KeyUpdate: one answer before it, then a clean close",
                  "KEYUPDATE" in out and answers == 1 and closes == 1,
                  f"{answers} answers, {closes} key-update closes: {summary}")
        else:
            check("client KeyUpdate: rustls takes the new keys and answers after it",
                  "KEYUPDATE" in out and answers == 2 and closes == 0,
                  f"{answers} answers, {closes} key-update closes: {summary}")

        stat = tls_stat()
        m = metrics(ADMIN)
        installed = (stat["TlsTxSw"] - before["TlsTxSw"], stat["TlsRxSw"] - before["TlsRxSw"])
        check("/proc/net/tls_stat: the kernel installed both directions of every connection"
              if kernel else "/proc/net/tls_stat: no connection went through the kernel",
              installed == ((connections, connections) if kernel else (0, 0)),
              f"{connections} connections, TlsTxSw/TlsRxSw +{installed}")
        path = m['terminus_connections_by_data_path_total{path="ktls"}']
        userspace = m['terminus_connections_by_data_path_total{path="userspace"}']
        fallbacks = sum(v for k, v in m.items() if k.startswith("terminus_ktls_fallbacks_total"))
        check(f"metrics: every connection on {'kernel' if kernel else 'userspace'} TLS, none refused",
              (path, userspace) == ((connections, 0) if kernel else (0, connections))
              and fallbacks == (0 if kernel else connections)
              and m["terminus_ktls_refused_total"] == 0,
              f"{connections} connections: ktls {path}, userspace {userspace}, fallbacks {fallbacks}")
        sent = {k.split('"')[1]: v for k, v in m.items() if k.startswith("terminus_response_bytes_total")}
        through_kernel = sent["ktls_write"] + sent["sendfile"]
        # HTTP/1.1 files by sendfile (two 100 MB downloads, ranges, keep-alive), HTTP/2
        # frames by write.
        check(f"metrics: response bytes left through {'the kernel (files by sendfile)' if kernel else 'rustls'} only",
              (sent["userspace"] == 0 and sent["sendfile"] >= 2 * BIG and sent["ktls_write"] >= BIG) if kernel
              else (through_kernel == 0 and sent["userspace"] >= 3 * BIG),
              f"{sent}")
        check("terminus is still running", server.poll() is None, "exited")
    finally:
        server.terminate()
        server.wait(timeout=30)
        log.close()
    status = verdict("kTLS", f"{root}/terminus.log")
    shutil.rmtree(root, ignore_errors=True)
    return status

if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else "required"))
