#!/usr/bin/env python3
"""A real HTTP/1.1 application server for the reverse proxy's tests (Python's own
http.server, threaded, keep-alive). Usage: app.py PORT NAME [CERT KEY [CLIENT_CA]]; with
CERT and KEY it speaks TLS (Python's ssl, OpenSSL underneath), and with CLIENT_CA it
requires a client certificate that CA signed. It prints "ready PORT" once
listening. Endpoints:
Endpoints are matched by the path's last segment ("/app/whoami" is /whoami), since the
proxy passes the path on unchanged.
  /whoami            its NAME (which server a balanced request reached)
  /headers           the request line and headers as JSON
  /fields            a 204 whose head repeats and interleaves fields (X-B, X-A, X-B,
                     two Set-Cookie), and carries hop-by-hop ones (Keep-Alive, a field
                     its Connection names, Proxy-Connection)
  /bytes?n=N[&mode=length|chunked|close[&end=abrupt]]   N bytes of a fixed pattern
                     (over TLS, mode=close ends with close_notify unless end=abrupt);
                     &type=T sets its Content-Type (application/octet-stream),
                     &cache=V a Cache-Control, &encoding=E a Content-Encoding
  /sha256            (any method with a body) the body's sha256 and length
  /received          what became of each /sha256 body, in order, as JSON: its length
                     where it came whole, "cut" where its connection ended first
  /trailers          a chunked body followed by trailers
  /gate               a chunked text/plain answer: "event 1", then nothing until a
                     request to /release arrives (30 s at most), then "event 2" and its end
                     (a stream whose first part must reach the client before the rest exists)
  /release           opens the gate (each /gate closes it again)
  /status?code=N[&retry=S][&pad=P]  an answer of status N saying "app's own N" (with
                     Retry-After; P bytes of padding after it)
  /slow?ms=M         answers after M ms
  /garbage           a response that is not HTTP
  /ambiguous         a response with both Content-Length and Transfer-Encoding
  /die?n=N[&mode=chunked]  announces N bytes (or chunks), sends half, then closes
  /echo              (a chunked upload) answers at once, chunked, and echoes each piece
                     of the body as it arrives: the request and the response stream
                     together (full duplex)
  /request-trailers  (a chunked upload) the names of the trailer fields that came with it,
                     as JSON
  /seen              every request line this server has parsed, in order, as JSON (the
                     requests a proxy delivered, smuggled ones included)
  /closes            over TLS, how many connections the client closed between requests
                     with a close_notify ("clean") and without one ("cut"), as JSON
With APP_KEEPALIVE_MS=M in its environment, a connection idle for more than M ms is
closed, unanswered, when its next request arrives: the race between a server's keep-alive
timeout and a client reusing the connection (the request crossing the server's FIN),
made certain instead of rare.
"""
import hashlib
import json
import os
import select
import socket
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlparse

PATTERN = bytes(range(256)) * 256  # 64 KiB
KEEPALIVE_MS = float(os.environ.get("APP_KEEPALIVE_MS", "0"))
CLOSES = {"clean": 0, "cut": 0}
SEEN = []
RECEIVED = []
GATE = threading.Event()


def pattern(n):
    full, rest = divmod(n, len(PATTERN))
    for _ in range(full):
        yield PATTERN
    if rest:
        yield PATTERN[:rest]


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "app"

    def log_message(self, *args):
        pass

    def handle_one_request(self):
        answered = getattr(self, "answered_at", None)
        if KEEPALIVE_MS and answered is not None:
            select.select([self.connection], [], [])
            if (time.monotonic() - answered) * 1000 > KEEPALIVE_MS:
                self.close_connection = True
                return
        try:
            super().handle_one_request()
        except OSError as e:
            # Over TLS, EOF without close_notify (ragged EOFs are not suppressed).
            if "EOF" in type(e).__name__ or "EOF" in str(e):
                CLOSES["cut"] += 1
            self.close_connection = True
            return
        if not self.raw_requestline and hasattr(self.connection, "unwrap"):
            CLOSES["clean"] += 1
        self.answered_at = time.monotonic()

    def read_body(self):
        """Yields the request body's pieces, content-length or chunked."""
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            while True:
                size = int(self.rfile.readline().split(b";")[0], 16)
                if size == 0:
                    self.trailer_names = []
                    while (line := self.rfile.readline()) not in (b"\r\n", b"\n", b""):
                        self.trailer_names.append(line.split(b":")[0].strip().lower().decode())
                    return
                left = size
                while left:
                    piece = self.rfile.read(min(left, 65536))
                    if not piece:
                        raise ConnectionError("body cut short")
                    left -= len(piece)
                    yield piece
                self.rfile.readline()
        else:
            left = int(self.headers.get("Content-Length", "0"))
            while left:
                piece = self.rfile.read(min(left, 65536))
                if not piece:
                    raise ConnectionError("body cut short")
                left -= len(piece)
                yield piece

    def reply(self, status, body, ctype="text/plain"):
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def handle_any(self):
        SEEN.append(f"{self.command} {self.path}")
        url = urlparse(self.path)
        q = {k: v[0] for k, v in parse_qs(url.query).items()}
        # Routed by the last segment: behind a route "/app/", "/app/whoami" is /whoami.
        path = "/" + url.path.rsplit("/", 1)[-1]
        if path == "/sha256":
            h, n = hashlib.sha256(), 0
            try:
                for piece in self.read_body():
                    h.update(piece)
                    n += len(piece)
            except (ConnectionError, ValueError):
                RECEIVED.append("cut")
                raise
            RECEIVED.append(n)
            return self.reply(200, f"{h.hexdigest()} {n}\n".encode())
        if path == "/echo":
            self.send_response(200)
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            for piece in self.read_body():
                self.wfile.write(b"%x\r\n%s\r\n" % (len(piece), piece))
            self.wfile.write(b"0\r\n\r\n")
            return
        for _ in self.read_body():
            pass
        if path == "/request-trailers":
            names = getattr(self, "trailer_names", [])
            return self.reply(200, json.dumps(names).encode(), "application/json")
        if path == "/received":
            return self.reply(200, json.dumps(RECEIVED).encode(), "application/json")
        if path == "/seen":
            return self.reply(200, json.dumps(SEEN).encode(), "application/json")
        if path == "/closes":
            return self.reply(200, json.dumps(CLOSES).encode(), "application/json")
        if path == "/whoami":
            return self.reply(200, NAME.encode())
        if path == "/headers":
            seen = {"method": self.command, "target": self.path,
                    "headers": [[k.lower(), v] for k, v in self.headers.items()]}
            return self.reply(200, json.dumps(seen).encode(), "application/json")
        if path == "/fields":
            self.send_response(204)
            for name, value in [("X-B", "1"), ("x-a", "one"), ("Connection", "keep-alive, X-Drop"),
                                ("X-Drop", "secret"), ("X-B", "2"), ("Keep-Alive", "timeout=5"),
                                ("Set-Cookie", "a=1"), ("Proxy-Connection", "keep-alive"),
                                ("set-cookie", "b=2")]:
                self.send_header(name, value)
            self.end_headers()
            return
        if path == "/bytes":
            n, mode = int(q.get("n", "0")), q.get("mode", "length")
            self.send_response(200)
            self.send_header("Content-Type", q.get("type", "application/octet-stream"))
            if "cache" in q:
                self.send_header("Cache-Control", q["cache"])
            if "encoding" in q:
                self.send_header("Content-Encoding", q["encoding"])
            if mode == "length":
                self.send_header("Content-Length", str(n))
            elif mode == "chunked":
                self.send_header("Transfer-Encoding", "chunked")
            else:
                self.send_header("Connection", "close")
                self.close_connection = True
            self.end_headers()
            if self.command == "HEAD":
                return
            for piece in pattern(n):
                if mode == "chunked":
                    self.wfile.write(b"%x\r\n%s\r\n" % (len(piece), piece))
                else:
                    self.wfile.write(piece)
            if mode == "chunked":
                self.wfile.write(b"0\r\n\r\n")
            if mode == "close" and hasattr(self.connection, "unwrap") and q.get("end") != "abrupt":
                # Over TLS the end of a close-delimited body is a close_notify; without
                # one (end=abrupt) the body may have been cut short.
                self.wfile.flush()
                try:
                    self.connection.unwrap()
                except OSError:
                    pass
            return
        if path == "/release":
            GATE.set()
            return self.reply(200, b"released\n")
        if path == "/gate":
            GATE.clear()
            self.send_response(200)
            self.send_header("Content-Type", "text/plain")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            for event in (b"event 1\n", b"event 2\n"):
                self.wfile.write(b"%x\r\n%s\r\n" % (len(event), event))
                self.wfile.flush()
                GATE.wait(30)
            self.wfile.write(b"0\r\n\r\n")
            return
        if path == "/status":
            code = int(q.get("code", "500"))
            body = f"app's own {code}\n".encode() + b"x" * int(q.get("pad", "0"))
            self.send_response(code)
            self.send_header("Content-Type", "text/plain")
            self.send_header("Content-Length", str(len(body)))
            self.send_header("X-App", "yes")
            if "retry" in q:
                self.send_header("Retry-After", q["retry"])
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(body)
            return
        if path == "/trailers":
            self.send_response(200)
            self.send_header("Transfer-Encoding", "chunked")
            self.send_header("Trailer", "x-checksum")
            self.end_headers()
            self.wfile.write(b"5\r\nhello\r\n0\r\nx-checksum: abc123\r\n\r\n")
            return
        if path == "/slow":
            time.sleep(int(q.get("ms", "1000")) / 1000)
            return self.reply(200, b"slow\n")
        if path == "/garbage":
            self.wfile.write(b"this is not http\r\n\r\n")
            self.close_connection = True
            return
        if path == "/ambiguous":
            self.wfile.write(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n")
            return
        if path == "/die":
            n = int(q.get("n", "1000000"))
            self.send_response(200)
            if q.get("mode") == "chunked":
                self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()
                self.wfile.write(b"%x\r\n%s\r\n" % (n // 2, b"x" * (n // 2)))
            else:
                self.send_header("Content-Length", str(n))
                self.end_headers()
                self.wfile.write(b"x" * (n // 2))
            self.wfile.flush()
            self.connection.shutdown(socket.SHUT_RDWR)
            self.close_connection = True
            return
        self.reply(404, b"not found\n")

    do_GET = do_POST = do_PUT = do_DELETE = do_HEAD = do_PATCH = handle_any


class Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True


if __name__ == "__main__":
    port, NAME = int(sys.argv[1]), sys.argv[2]
    server = Server(("127.0.0.1", port), Handler)
    if len(sys.argv) > 4:
        import ssl

        tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        tls.load_cert_chain(sys.argv[3], sys.argv[4])
        tls.set_alpn_protocols(["http/1.1"])
        if len(sys.argv) > 5:
            tls.verify_mode = ssl.CERT_REQUIRED
            tls.load_verify_locations(sys.argv[5])
        server.socket = tls.wrap_socket(
            server.socket, server_side=True, suppress_ragged_eofs=False
        )
    print("ready", server.server_address[1], flush=True)
    server.serve_forever()
