#!/usr/bin/env python3
"""A real WebSocket server and client (the `websockets` package) for the reverse proxy's
upgrade test.

  ws_app.py serve              echoes every message, on a free port; prints "ready PORT"
  ws_app.py call URL CA.pem    connects through TLS (wss://), exchanges messages and
                               prints what came back as JSON
"""
import asyncio
import json
import ssl
import sys

from websockets.asyncio.client import connect
from websockets.asyncio.server import serve


async def echo(ws):
    async for message in ws:
        await ws.send(message)


async def run_server():
    async with serve(echo, "127.0.0.1", 0, max_size=None) as server:
        port = server.sockets[0].getsockname()[1]
        print("ready", port, flush=True)
        await asyncio.Future()


async def call(url, ca):
    context = ssl.create_default_context(cafile=ca)
    out = {}
    async with connect(url, ssl=context, server_hostname="localhost", max_size=None) as ws:
        await ws.send("hello")
        out["text"] = await ws.recv()
        big = bytes(range(256)) * 4096  # 1 MiB
        await ws.send(big)
        out["binary_ok"] = (await ws.recv()) == big
        pong = await ws.ping()
        await asyncio.wait_for(pong, 10)
        out["ping"] = True
        for i in range(100):
            await ws.send(f"m{i}")
        out["in_order"] = [await ws.recv() for _ in range(100)] == [f"m{i}" for i in range(100)]
    out["closed"] = ws.close_code
    print(json.dumps(out))


if __name__ == "__main__":
    if sys.argv[1] == "serve":
        asyncio.run(run_server())
    else:
        asyncio.run(call(sys.argv[2], sys.argv[3]))
