#!/usr/bin/python3
"""Minimal Python client of dcformer-serve: streams one Generate call.

Prints the text (or token ids, comma-separated) to stdout as it arrives, then a summary line
on stderr like dcformer-cli's: [FINISH_REASON_LENGTH prompt_tokens=3 generated_tokens=16].
With --json it prints one JSON object {token_ids, text, finish_reason, usage} instead. A failed
call prints "generate failed: CODE: message" on stderr and exits 1.

Needs python3-grpcio and python3-protobuf plus the generated modules: build them with
`cmake --build build --target dcformer_proto_python` and run with PYTHONPATH=build/python
(or run protoc --python_out/--grpc_python_out on proto/dcformer/v1/dcformer.proto and
proto/grpc/health/v1/health.proto yourself).

  PYTHONPATH=build/python client/examples/python/generate.py --prompt "Hello" --max-new-tokens 16
  ... --prompt-ids 1,2,3 --temperature 0 --ignore-eos --json
  ... --wait-ready --prompt "Hello"    # first wait (60 s) for a server that is still starting
"""
import argparse
import json
import sys

import grpc
from dcformer.v1 import dcformer_pb2, dcformer_pb2_grpc

DEFAULT_WAIT_READY_S = 60.0


def seconds(text):
    try:
        value = float(text[:-1] if text.endswith("s") else text)
    except ValueError:
        value = 0
    if not value > 0:
        raise argparse.ArgumentTypeError(f"'{text}' is not a number of seconds > 0")
    return value


parser = argparse.ArgumentParser()
parser.add_argument("--target", default="127.0.0.1:50051")
parser.add_argument("--prompt")
parser.add_argument("--prompt-ids")
parser.add_argument("--max-new-tokens", type=int)
parser.add_argument("--temperature", type=float)
parser.add_argument("--ignore-eos", action="store_true")
parser.add_argument("--api-key-file")
parser.add_argument("--tls-ca", help="PEM CA of the server certificate (enables TLS)")
parser.add_argument("--timeout", type=float, help="deadline in seconds")
parser.add_argument("--wait-ready", nargs="?", type=seconds, const=DEFAULT_WAIT_READY_S,
                    metavar="SECONDS",
                    help="first wait up to this long (default 60) until the server listens and "
                         "its health service reports SERVING (a server still loading its model)")
parser.add_argument("--json", action="store_true")
args = parser.parse_args()

request = dcformer_pb2.GenerateRequest()
if args.prompt_ids:
    request.token_ids.ids.extend(int(i) for i in args.prompt_ids.split(","))
else:
    request.text = args.prompt or ""
if args.max_new_tokens is not None:
    request.stopping.max_new_tokens = args.max_new_tokens
if args.temperature is not None:
    request.sampling.temperature = args.temperature
request.stopping.ignore_eos = args.ignore_eos

# Reconnect within a second once the server listens (gRPC's default backoff grows to 120 s).
options = [("grpc.initial_reconnect_backoff_ms", 100), ("grpc.max_reconnect_backoff_ms", 1000)]
if args.tls_ca:
    with open(args.tls_ca, "rb") as f:
        channel = grpc.secure_channel(args.target, grpc.ssl_channel_credentials(f.read()),
                                      options=options)
else:
    channel = grpc.insecure_channel(args.target, options=options)
metadata = []
if args.api_key_file:
    with open(args.api_key_file) as f:
        metadata.append(("authorization", "Bearer " + f.read().strip()))

if args.wait_ready is not None:
    # The standard health service (generated into build/python from
    # proto/grpc/health/v1/health.proto), watched with wait-for-ready: the call waits for a
    # connection instead of failing, then streams the status until SERVING.
    # A watch that ends early (the server restarted or drained: UNAVAILABLE, or ended without
    # SERVING) is watched again until the deadline, as dcformer-cli does.
    import time
    import health_pb2
    import health_pb2_grpc
    health = health_pb2_grpc.HealthStub(channel)
    deadline = time.monotonic() + args.wait_ready
    last, serving, error = "no answer", False, "the watch ended"
    while not serving and time.monotonic() < deadline:
        watch = health.Watch(
            health_pb2.HealthCheckRequest(service="dcformer.v1.TextGeneration"),
            wait_for_ready=True, timeout=max(deadline - time.monotonic(), 0.001))
        try:
            for msg in watch:
                last = health_pb2.HealthCheckResponse.ServingStatus.Name(msg.status)
                if msg.status == health_pb2.HealthCheckResponse.SERVING:
                    serving = True
                    watch.cancel()
                    break
        except grpc.RpcError as e:
            error = f"{e.code().name}: {e.details()}"
            if e.code() not in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED):
                break
        if not serving:
            time.sleep(0.1)
    if not serving:
        print(f"the server at {args.target} was not SERVING within {args.wait_ready:g} s "
              f"({error}; last status: {last})", file=sys.stderr)
        sys.exit(1)

stub = dcformer_pb2_grpc.TextGenerationStub(channel)
result = {"token_ids": [], "text": "", "finish_reason": None, "usage": None}
printed = False
try:
    for msg in stub.Generate(request, metadata=metadata, timeout=args.timeout):
        if not args.json:
            # Text when the response carries it; else the ids, comma-separated across messages.
            piece = msg.text or "".join(("," if len(result["token_ids"]) + i else "") + str(t)
                                        for i, t in enumerate(msg.token_ids))
            print(piece, end="", flush=True)
            printed = printed or bool(piece)
        result["token_ids"].extend(msg.token_ids)
        result["text"] += msg.text
        if msg.finish_reason != dcformer_pb2.FINISH_REASON_UNSPECIFIED:
            result["finish_reason"] = dcformer_pb2.FinishReason.Name(msg.finish_reason)
            result["usage"] = {"prompt_tokens": msg.usage.prompt_tokens,
                               "generated_tokens": msg.usage.generated_tokens}
except grpc.RpcError as e:
    if printed:
        print()
    print(f"generate failed: {e.code().name}: {e.details()}", file=sys.stderr)
    sys.exit(1)
if args.json:
    print(json.dumps(result))
else:
    if printed:
        print()
    usage = result["usage"] or {}
    print(f"[{result['finish_reason']} prompt_tokens={usage.get('prompt_tokens')} "
          f"generated_tokens={usage.get('generated_tokens')}]", file=sys.stderr)
