#!/usr/bin/python3
"""Shutdown measurements, printed (not a test; the integration tests assert the bounds):

1. exit time after SIGTERM with --drain-timeout 2s, no stream and one idle client connection;
2. three servers behind one round_robin channel: replica 0 holds two streams and gets
   SIGTERM; after --delay seconds, --calls Generate calls go through the channel one by one:
   how many fail, and with what.

  /usr/bin/python3 bench/drain_bench.py [--server build/bin/dcformer-server] [--runs 3]

Uses the build tree's Python stubs (build/python) and the short golden model."""
import argparse
import collections
import json
import os
import signal
import sys
import time

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
os.environ.setdefault("DCF_SOURCE_DIR", ROOT)
os.environ.setdefault("DCF_BIN_DIR", os.path.join(ROOT, "build", "bin"))
os.environ.setdefault("DCF_PY_DIR", os.path.join(ROOT, "build", "python"))
sys.path.insert(0, os.path.join(ROOT, "tests", "integration"))

import grpc  # noqa: E402

import harness as h  # noqa: E402

PROMPT = [156, 232, 174, 60, 127, 277, 298, 270, 224, 172, 11, 203]
SMALL_WINDOW = [("grpc.http2.lookahead_bytes", 1024), ("grpc.http2.bdp_probe", 0)]


def idle_exit_seconds():
    with h.Server(args=["--drain-timeout=2s"]) as server:
        with server.channel() as ch:
            h.pb_grpc.TextGenerationStub(ch).GetModelInfo(h.pb.GetModelInfoRequest(),
                                                          timeout=30)
            start = time.monotonic()
            server.proc.send_signal(signal.SIGTERM)
            server.proc.wait(timeout=60)
            return time.monotonic() - start


def round_robin_failures(delay, calls):
    servers = [h.Server(args=["--drain-timeout=30s"], ready=False) for _ in range(3)]
    for s in servers:
        s.__enter__()
    try:
        for s in servers:
            s.wait_serving()
        target = "ipv4:" + ",".join(f"127.0.0.1:{s.port}" for s in servers)
        config = json.dumps({"loadBalancingConfig": [{"round_robin": {}}]})
        with grpc.insecure_channel(target, options=[("grpc.service_config", config)]) as ch:
            stub = h.pb_grpc.TextGenerationStub(ch)
            for _ in range(30):  # let round_robin connect to every replica
                h.collect(stub.Generate(h.ids_request(PROMPT, 2), timeout=30))
            held_ch = servers[0].channel(options=SMALL_WINDOW)
            held = [h.pb_grpc.TextGenerationStub(held_ch).Generate(
                h.ids_request(PROMPT, 240), timeout=120) for _ in range(2)]
            for s in held:
                next(s)
            servers[0].proc.send_signal(signal.SIGTERM)
            time.sleep(delay)  # the reported case: calls sent this long after the signal
            results = collections.Counter()
            for _ in range(calls):
                try:
                    tokens, _ = h.collect(stub.Generate(h.ids_request(PROMPT, 4), timeout=30))
                    results["ok" if len(tokens) == 4 else "short"] += 1
                except grpc.RpcError as e:
                    results[f"{e.code().name} {e.details()!r}"] += 1
            for s in held:
                h.collect(s)
            held_ch.close()
            return results
    finally:
        for s in servers:
            s.__exit__(None, None, None)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--server", default=h.SERVER)
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--delay", type=float, default=0.2)
    p.add_argument("--calls", type=int, default=30)
    args = p.parse_args()
    h.SERVER = os.path.abspath(args.server)
    print(f"server: {h.SERVER}")
    for i in range(args.runs):
        print(f"run {i + 1}: SIGTERM with --drain-timeout 2s and an idle connection: exit after "
              f"{idle_exit_seconds():.2f} s", flush=True)
    for i in range(args.runs):
        r = round_robin_failures(args.delay, args.calls)
        failed = sum(v for k, v in r.items() if k != "ok")
        print(f"run {i + 1}: round_robin over 3, {args.calls} calls {args.delay} s after one "
              f"replica's SIGTERM: {failed} failed {dict(r)}", flush=True)


if __name__ == "__main__":
    main()
