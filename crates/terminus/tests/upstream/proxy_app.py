#!/usr/bin/env python3
"""An HTTP/1.1 upstream that wants a PROXY protocol header (v1 or v2) at the start of
each connection, as servers behind HAProxy's `send-proxy` do. Usage: proxy_app.py. It
prints "ready PORT". Every response (keep-alive) says which header its connection began
with: "v1 CLIENT_IP:PORT -> LOCAL_IP:PORT" (or v2); a connection without a valid header
is closed at once.
"""
import ipaddress
import socket
import socketserver
import struct
import sys

V2_SIG = b"\r\n\r\n\x00\r\nQUIT\n"


def read_exact(f, n):
    data = f.read(n)
    if len(data) != n:
        raise ConnectionError("short read")
    return data


def read_header(f):
    first = read_exact(f, 12)
    if first == V2_SIG:
        ver_cmd, fam, length = struct.unpack("!BBH", read_exact(f, 4))
        body = read_exact(f, length)
        if fam == 0x11:
            src, dst = ipaddress.ip_address(body[0:4]), ipaddress.ip_address(body[4:8])
            sport, dport = struct.unpack("!HH", body[8:12])
        elif fam == 0x21:
            src, dst = ipaddress.ip_address(body[0:16]), ipaddress.ip_address(body[16:32])
            sport, dport = struct.unpack("!HH", body[32:36])
        else:
            raise ValueError("family")
        return f"v2 {src}:{sport} -> {dst}:{dport}"
    line = first + f.readline(107)
    parts = line.decode().strip().split(" ")
    if parts[0] != "PROXY" or len(parts) != 6:
        raise ValueError("not a PROXY v1 line")
    return f"v1 {parts[2]}:{parts[4]} -> {parts[3]}:{parts[5]}"


class Handler(socketserver.StreamRequestHandler):
    def handle(self):
        try:
            said = read_header(self.rfile)
        except (ValueError, ConnectionError, UnicodeDecodeError):
            return
        while True:
            head = b""
            while not head.endswith(b"\r\n\r\n"):
                line = self.rfile.readline(8192)
                if not line:
                    return
                head += line
            body = said.encode()
            self.wfile.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
            self.wfile.flush()


class Server(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True
    # Hundreds of new connections a second in the pool-cap test.
    request_queue_size = 1024


if __name__ == "__main__":
    server = Server(("127.0.0.1", 0), Handler)
    print("ready", server.server_address[1], flush=True)
    server.serve_forever()
