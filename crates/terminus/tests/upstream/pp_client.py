#!/usr/bin/env python3
"""An L4 load balancer's client side, for the listener's PROXY protocol test: a TCP
connection that begins with a PROXY header (v1, v2, or none) saying the client is
SRC_IP:4321, then TLS (Python's ssl) and one HTTP/1.1 GET. Prints the response, or
"closed" if the server closed the connection before answering.

Usage: pp_client.py PORT v1|v2|none SRC_IP PATH
"""
import ipaddress
import socket
import ssl
import struct
import sys

port, version, src, path = int(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4]
dst = "127.0.0.1"
if version == "v1":
    header = f"PROXY TCP4 {src} {dst} 4321 {port}\r\n".encode()
elif version == "v2":
    header = (b"\r\n\r\n\x00\r\nQUIT\n" + bytes([0x21, 0x11]) + struct.pack("!H", 12)
              + ipaddress.ip_address(src).packed + ipaddress.ip_address(dst).packed
              + struct.pack("!HH", 4321, port))
else:
    header = b""
sock = socket.create_connection(("127.0.0.1", port), timeout=10)
sock.sendall(header)
context = ssl.create_default_context()
context.check_hostname = False
context.verify_mode = ssl.CERT_NONE
try:
    tls = context.wrap_socket(sock, server_hostname="localhost")
    tls.sendall(f"GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n".encode())
    reply = b""
    while chunk := tls.recv(65536):
        reply += chunk
    print(reply.decode(errors="replace"))
except (ssl.SSLError, ConnectionError, OSError):
    print("closed")
