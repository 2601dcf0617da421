#!/usr/bin/env python3
"""An L4 load balancer's client side, for the listener's PROXY protocol test: a TCP
connection that begins with a PROXY header (v1, v2, or none) saying the client is
SRC_IP:4321, then TLS (Python's ssl) and one HTTP/1.1 GET. Prints the response, or
"closed" if the server closed the connection before answering.

Usage: pp_client.py PORT v1|v2|v2tlv|none SRC_IP PATH
v2tlv is a v2 header carrying TLVs as cloud balancers send them (AWS's VPC endpoint ID,
and 3,000 bytes of NOOP padding), written in two pieces 200 ms apart.
"""
import time
import ipaddress
import socket
import ssl
import struct
import sys

port, version, src, path = int(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4]
dst = "127.0.0.1"
if version == "v1":
    header = f"PROXY TCP4 {src} {dst} 4321 {port}\r\n".encode()
elif version in ("v2", "v2tlv"):
    addresses = (ipaddress.ip_address(src).packed + ipaddress.ip_address(dst).packed
                 + struct.pack("!HH", 4321, port))
    tlvs = b""
    if version == "v2tlv":
        vpce = b"\x01vpce-0123456789abcdef0"
        tlvs = (bytes([0xEA]) + struct.pack("!H", len(vpce)) + vpce
                + bytes([0x04]) + struct.pack("!H", 3000) + bytes(3000))
    body = addresses + tlvs
    header = (b"\r\n\r\n\x00\r\nQUIT\n" + bytes([0x21, 0x11]) + struct.pack("!H", len(body))
              + body)
else:
    header = b""
sock = socket.create_connection(("127.0.0.1", port), timeout=10)
if version == "v2tlv":
    sock.sendall(header[:1000])
    time.sleep(0.2)
    sock.sendall(header[1000:])
else:
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
