#!/usr/bin/env python3
"""An application server that upgrades HTTP/1.1 connections to h2c when asked (hypercorn,
a real ASGI server), for the test that terminus passes no such upgrade on. Usage:
h2c_app.py serve; it prints "ready PORT" once listening. It speaks HTTP/1.1 and h2c with
prior knowledge too. Every request is answered with the HTTP version it arrived over, its
path and the Upgrade field it carried, but a path ending in /stall, which gets the start
of a body and then nothing for 30 s."""
import asyncio
import socket
import sys

from hypercorn.asyncio import serve
from hypercorn.config import Config


async def app(scope, receive, send):
    if scope["type"] != "http":
        return
    if scope["path"].endswith("/stall"):
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"partial", "more_body": True})
        await asyncio.sleep(30)
        return
    headers = dict(scope["headers"])
    upgrade = headers.get(b"upgrade", b"-").decode()
    body = f"{scope['http_version']} {scope['path']} upgrade={upgrade}\n".encode()
    await send({
        "type": "http.response.start",
        "status": 200,
        "headers": [(b"content-length", str(len(body)).encode())],
    })
    await send({"type": "http.response.body", "body": body})


def main():
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    sock.listen(64)
    sock.set_inheritable(True)
    config = Config()
    config.bind = [f"fd://{sock.fileno()}"]
    config.accesslog = None
    config.errorlog = None
    print(f"ready {sock.getsockname()[1]}", flush=True)
    asyncio.run(serve(app, config))


if __name__ == "__main__":
    assert sys.argv[1:] == ["serve"], __doc__
    main()
