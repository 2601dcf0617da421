#!/usr/bin/env python3
"""Proves the kernel we run on offers kTLS: installs TLS_TX and TLS_RX (TLS 1.3,
AES-128-GCM) on both ends of a loopback TCP connection, sends a record through the kernel
and reads it back decrypted, and checks /proc/net/tls_stat counted both. Exit 0 on success;
prints what failed otherwise."""
import os
import socket
import struct
import sys

SOL_TLS = 282
TCP_ULP = 31
TLS_TX, TLS_RX = 1, 2
TLS_1_3_VERSION = 0x0304
TLS_CIPHER_AES_GCM_128 = 51


def crypto_info(key, iv, salt, seq):
    # struct tls12_crypto_info_aes_gcm_128: version, cipher_type, iv[8], key[16], salt[4], rec_seq[8]
    return struct.pack("=HH8s16s4s8s", TLS_1_3_VERSION, TLS_CIPHER_AES_GCM_128, iv, key, salt, seq)


def tls_stat():
    with open("/proc/net/tls_stat") as f:
        return {k: int(v) for k, v in (line.split() for line in f)}


def main():
    before = tls_stat()
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    client = socket.create_connection(listener.getsockname())
    server, _ = listener.accept()
    key, iv, salt, seq = os.urandom(16), os.urandom(8), os.urandom(4), bytes(8)
    info = crypto_info(key, iv, salt, seq)
    for sock, direction in ((client, TLS_TX), (server, TLS_RX)):
        sock.setsockopt(socket.IPPROTO_TCP, TCP_ULP, b"tls")
        sock.setsockopt(SOL_TLS, direction, info)
    message = b"kernel TLS works " * 100
    client.sendall(message)
    got = b""
    while len(got) < len(message):
        chunk = server.recv(65536)
        if not chunk:
            break
        got += chunk
    after = tls_stat()
    if got != message:
        print(f"kTLS probe: received {len(got)} bytes, not the {len(message)} sent", file=sys.stderr)
        return 1
    for counter in ("TlsTxSw", "TlsRxSw"):
        if after[counter] <= before[counter]:
            print(f"kTLS probe: {counter} did not count up: {before[counter]} -> {after[counter]}", file=sys.stderr)
            return 1
    print(f"kTLS probe: ok (TlsTxSw {after['TlsTxSw']}, TlsRxSw {after['TlsRxSw']})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
