#!/usr/bin/env python3
"""A real WebSocket server and clients (the `websockets` package) for the reverse proxy's
upgrade tests.

  ws_app.py serve              echoes every message, on a free port; prints "ready PORT"
  ws_app.py call URL CA.pem    connects through TLS (wss://), exchanges messages and
                               prints what came back as JSON
  ws_app.py call-h2 URL CA.pem the same over HTTP/2 (RFC 8441): an extended CONNECT on
                               an h2 stream (the `h2` package) carrying the WebSocket's
                               frames (websockets' sans-I/O protocol)
"""
import asyncio
import json
import socket
import ssl
import sys
from urllib.parse import urlparse

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


def call_h2(url, ca):
    import h2.config
    import h2.connection
    import h2.events
    from websockets.frames import Opcode
    from websockets.protocol import Protocol, Side

    target = urlparse(url)
    context = ssl.create_default_context(cafile=ca)
    context.set_alpn_protocols(["h2"])
    raw = socket.create_connection(("127.0.0.1", target.port), timeout=10)
    tls = context.wrap_socket(raw, server_hostname="localhost")
    out = {"alpn": tls.selected_alpn_protocol()}
    conn = h2.connection.H2Connection(
        h2.config.H2Configuration(client_side=True, header_encoding="utf-8")
    )
    conn.initiate_connection()
    tls.sendall(conn.data_to_send())
    state = {"settings": False, "status": None, "ended": False, "frames": []}
    ws = Protocol(Side.CLIENT, max_size=None)
    stream = None

    def pump():
        """Reads what the server sent and handles it."""
        data = tls.recv(65536)
        if not data:
            raise ConnectionError("the server closed the connection")
        for event in conn.receive_data(data):
            if isinstance(event, h2.events.RemoteSettingsChanged):
                state["settings"] = True
            elif isinstance(event, h2.events.ResponseReceived):
                state["status"] = dict(event.headers)[":status"]
            elif isinstance(event, h2.events.DataReceived):
                conn.acknowledge_received_data(event.flow_controlled_length, event.stream_id)
                ws.receive_data(event.data)
                state["frames"].extend(ws.events_received())
            elif isinstance(event, h2.events.StreamEnded):
                # The stream's end is the WebSocket's transport closing.
                ws.receive_eof()
                state["ended"] = True
            elif isinstance(event, h2.events.StreamReset):
                raise ConnectionError(f"stream reset: {event.error_code}")
        tls.sendall(conn.data_to_send())

    def until(done):
        while not done():
            pump()

    def send_ws():
        for chunk in ws.data_to_send():
            while chunk:
                n = min(len(chunk), conn.max_outbound_frame_size)
                conn.send_data(stream, chunk[:n])
                chunk = chunk[n:]
        tls.sendall(conn.data_to_send())

    def messages(n):
        until(lambda: len([f for f in state["frames"] if f.opcode in (Opcode.TEXT, Opcode.BINARY)]) >= n)
        got = [f for f in state["frames"] if f.opcode in (Opcode.TEXT, Opcode.BINARY)][:n]
        state["frames"] = [f for f in state["frames"] if f not in got]
        return [bytes(f.data) for f in got]

    until(lambda: state["settings"])
    out["enable_connect_protocol"] = conn.remote_settings.enable_connect_protocol
    stream = conn.get_next_available_stream_id()
    conn.send_headers(stream, [
        (":method", "CONNECT"), (":protocol", "websocket"), (":scheme", "https"),
        (":path", target.path), (":authority", f"localhost:{target.port}"),
        ("sec-websocket-version", "13"),
    ])
    tls.sendall(conn.data_to_send())
    until(lambda: state["status"] is not None)
    out["status"] = int(state["status"])
    if out["status"] != 200:
        print(json.dumps(out))
        return
    ws.send_text(b"hello")
    send_ws()
    out["text"] = messages(1)[0].decode()
    big = bytes(range(256)) * 200
    ws.send_binary(big)
    send_ws()
    out["binary_ok"] = messages(1)[0] == big
    for i in range(100):
        ws.send_text(f"m{i}".encode())
    send_ws()
    out["in_order"] = [m.decode() for m in messages(100)] == [f"m{i}" for i in range(100)]
    ws.send_close(1000)
    send_ws()
    until(lambda: state["ended"])
    out["closed"] = ws.close_code
    print(json.dumps(out))


if __name__ == "__main__":
    if sys.argv[1] == "serve":
        asyncio.run(run_server())
    elif sys.argv[1] == "call-h2":
        call_h2(sys.argv[2], sys.argv[3])
    else:
        asyncio.run(call(sys.argv[2], sys.argv[3]))
