#!/usr/bin/python3
"""Minimal Python client of dcformer-serve: streams one Generate call.

Prints the text (or token ids) as it arrives; with --json prints one JSON object
{token_ids, text, finish_reason, usage} instead.

Needs python3-grpcio and python3-protobuf plus the generated modules: build them with
`cmake --build build --target dcformer_proto_python` and run with PYTHONPATH=build/python
(or run protoc --python_out/--grpc_python_out on proto/dcformer/v1/dcformer.proto yourself).

  PYTHONPATH=build/python client/examples/python/generate.py --prompt "Hello" --max-new-tokens 16
  ... --prompt-ids 1,2,3 --temperature 0 --ignore-eos --json
"""
import argparse
import json
import sys

import grpc
from dcformer.v1 import dcformer_pb2, dcformer_pb2_grpc

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

if args.tls_ca:
    with open(args.tls_ca, "rb") as f:
        channel = grpc.secure_channel(args.target, grpc.ssl_channel_credentials(f.read()))
else:
    channel = grpc.insecure_channel(args.target)
metadata = []
if args.api_key_file:
    with open(args.api_key_file) as f:
        metadata.append(("authorization", "Bearer " + f.read().strip()))

stub = dcformer_pb2_grpc.TextGenerationStub(channel)
result = {"token_ids": [], "text": "", "finish_reason": None, "usage": None}
try:
    for msg in stub.Generate(request, metadata=metadata, timeout=args.timeout):
        result["token_ids"].extend(msg.token_ids)
        result["text"] += msg.text
        if not args.json:
            print(msg.text or ",".join(map(str, msg.token_ids)) + ",", end="", flush=True)
        if msg.finish_reason != dcformer_pb2.FINISH_REASON_UNSPECIFIED:
            result["finish_reason"] = dcformer_pb2.FinishReason.Name(msg.finish_reason)
            result["usage"] = {"prompt_tokens": msg.usage.prompt_tokens,
                               "generated_tokens": msg.usage.generated_tokens}
except grpc.RpcError as e:
    print(f"generate failed: {e.code().name}: {e.details()}", file=sys.stderr)
    sys.exit(1)
if args.json:
    print(json.dumps(result))
else:
    print(f"\n[{result['finish_reason']}]", file=sys.stderr)
