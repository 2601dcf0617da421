#!/usr/bin/env python3
"""A flood of clients from distinct addresses, as an L4 balancer would pass them on: N
TCP connections, each beginning with a PROXY v2 header naming its own source address
(FIRST, FIRST+1, ...; with "same", FIRST every time), then TLS (resumed after the first, to keep the flood cheap) and one
HTTP/1.1 GET of PATH. Prints a JSON object: how many answers of each status, and
"closed" for connections closed without one.

Usage: pp_flood.py PORT N FIRST PATH [same]
"""
import collections
import ipaddress
import json
import socket
import ssl
import struct
import sys
import threading

port, n, first, path = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
same = sys.argv[5:] == ["same"]
threads = 4
dst = ipaddress.ip_address("127.0.0.1")
start = ipaddress.ip_address(first)

context = ssl.create_default_context()
context.check_hostname = False
context.verify_mode = ssl.CERT_NONE
request = f"GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n".encode()

counts = collections.Counter()
lock = threading.Lock()


def header(src):
    addresses = src.packed + dst.packed + struct.pack("!HH", 4321, port)
    family = 0x11 if src.version == 4 else 0x21
    return (b"\r\n\r\n\x00\r\nQUIT\n" + bytes([0x21, family]) + struct.pack("!H", len(addresses))
            + addresses)


def one(src, session):
    sock = socket.create_connection(("127.0.0.1", port), timeout=10)
    try:
        sock.sendall(header(src))
        tls = context.wrap_socket(sock, server_hostname="localhost", session=session)
        tls.sendall(request)
        reply = b""
        while chunk := tls.recv(65536):
            reply += chunk
        status = reply.split(b" ", 2)[1].decode() if reply.startswith(b"HTTP/") else "closed"
        return status, tls.session
    except (ssl.SSLError, ConnectionError, OSError):
        return "closed", session
    finally:
        sock.close()


def worker(k):
    session = None
    for i in range(k, n, threads):
        status, session = one(start if same else start + i, session)
        with lock:
            counts[status] += 1


workers = [threading.Thread(target=worker, args=(k,)) for k in range(threads)]
for w in workers:
    w.start()
for w in workers:
    w.join()
print(json.dumps(dict(counts)))
