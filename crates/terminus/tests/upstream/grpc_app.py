#!/usr/bin/env python3
"""A real gRPC server and client (grpcio) for the reverse proxy's h2c tests, with raw-byte
messages (no generated code).

  grpc_app.py serve [CERT KEY]       serves h2c (h2 over TLS with CERT and KEY) on a free
                                     port; prints "ready PORT"
  grpc_app.py call HOST:PORT CA.pem  calls through TLS (SNI and name "localhost") and
                                     prints what came back as JSON

Methods of service test.Echo:
  Unary         the request echoed, with trailing metadata x-echo-trailer: yes
  Stream        the request is a count N: N messages "0".."N-1"
  Sum           client streaming: the concatenation of the requests
  Fail          status NOT_FOUND with details "no such thing"
"""
import json
import sys
from concurrent import futures

import grpc

IDENTITY = (lambda b: b, lambda b: b)


def unary(request, context):
    context.set_trailing_metadata((("x-echo-trailer", "yes"),))
    return request


def stream(request, context):
    for i in range(int(request)):
        yield str(i).encode()


def total(requests, context):
    return b"".join(requests)


def fail(request, context):
    context.abort(grpc.StatusCode.NOT_FOUND, "no such thing")


def serve(tls):
    handlers = {
        "Unary": grpc.unary_unary_rpc_method_handler(unary, *IDENTITY),
        "Stream": grpc.unary_stream_rpc_method_handler(stream, *IDENTITY),
        "Sum": grpc.stream_unary_rpc_method_handler(total, *IDENTITY),
        "Fail": grpc.unary_unary_rpc_method_handler(fail, *IDENTITY),
    }
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=8))
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler("test.Echo", handlers),))
    if tls:
        cert, key = (open(f, "rb").read() for f in tls)
        port = server.add_secure_port("127.0.0.1:0", grpc.ssl_server_credentials([(key, cert)]))
    else:
        port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    print("ready", port, flush=True)
    server.wait_for_termination()


def call(target, ca):
    creds = grpc.ssl_channel_credentials(root_certificates=open(ca, "rb").read())
    options = (("grpc.ssl_target_name_override", "localhost"), ("grpc.default_authority", "localhost"))
    out = {}
    with grpc.secure_channel(target, creds, options=options) as channel:
        method = lambda kind, name: getattr(channel, kind)(f"/test.Echo/{name}", *IDENTITY)
        big = b"x" * 300_000
        reply, call_ = method("unary_unary", "Unary").with_call(big, timeout=20)
        out["unary_ok"] = reply == big
        out["unary_trailer"] = dict(call_.trailing_metadata()).get("x-echo-trailer")
        out["stream"] = [m.decode() for m in method("unary_stream", "Stream")(b"5", timeout=20)]
        out["sum"] = method("stream_unary", "Sum")(iter([b"a", b"b", b"c"]), timeout=20).decode()
        try:
            method("unary_unary", "Fail")(b"", timeout=20)
            out["fail"] = "no error"
        except grpc.RpcError as e:
            out["fail"] = [e.code().name, e.details()]
    print(json.dumps(out))


if __name__ == "__main__":
    if sys.argv[1] == "serve":
        serve(sys.argv[2:4])
    else:
        call(sys.argv[2], sys.argv[3])
