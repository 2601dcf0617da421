#!/usr/bin/env python3
"""An HTTP/1.1 upstream that stalls, for the proxy's memory tests: it accepts every
connection and reads nothing from any until the file GATE exists; then it reads each
request on them (Content-Length or chunked body) and answers it with the body's sha256
and length ("HEX N"), keep-alive. Its receive buffers are small, so that what a proxy
sends it stays in the proxy rather than in the kernel.

Usage: stall_app.py GATE; prints "ready PORT" once listening.
"""
import hashlib
import os
import socket
import sys
import threading
import time

OPEN = threading.Event()


def serve(conn):
    OPEN.wait()
    reader = conn.makefile("rb")
    try:
        while True:
            if not reader.readline():
                return
            fields = {}
            while (line := reader.readline()) not in (b"\r\n", b"\n", b""):
                name, _, value = line.decode("latin-1").partition(":")
                fields[name.strip().lower()] = value.strip()
            sha, n = hashlib.sha256(), 0
            if fields.get("transfer-encoding", "").lower() == "chunked":
                while size := int(reader.readline().split(b";")[0], 16):
                    piece = reader.read(size)
                    sha.update(piece)
                    n += len(piece)
                    reader.readline()
                while reader.readline() not in (b"\r\n", b"\n", b""):
                    pass
            else:
                piece = reader.read(int(fields.get("content-length", "0")))
                sha.update(piece)
                n += len(piece)
            body = f"{sha.hexdigest()} {n}".encode()
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
    except (OSError, ValueError):
        pass
    finally:
        conn.close()


def open_at(gate):
    while not os.path.exists(gate):
        time.sleep(0.05)
    OPEN.set()


def main():
    listener = socket.socket()
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    # Inherited by accepted connections: the kernel takes little of what is sent.
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    listener.bind(("127.0.0.1", 0))
    listener.listen(4096)
    threading.Thread(target=open_at, args=(sys.argv[1],), daemon=True).start()
    print("ready", listener.getsockname()[1], flush=True)
    while True:
        conn, _ = listener.accept()
        threading.Thread(target=serve, args=(conn,), daemon=True).start()


if __name__ == "__main__":
    main()
