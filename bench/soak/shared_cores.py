#!/usr/bin/env python3
"""Several servers sharing the machine's cores under a light load (the case of idle compute
threads that spin): starts --servers servers with default threading, then every server gets
the same light load at once (--requests sequential requests of --tokens tokens each) and the
wall time of the whole load is printed. Run it against two builds (or with OMP_WAIT_POLICY set
either way in the environment) to compare.

  PYTHONPATH=build/python /usr/bin/python3 bench/soak/shared_cores.py --servers 3
"""
import argparse
import concurrent.futures
import os
import signal
import socket
import subprocess
import sys
import time

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, os.environ.get("DCF_PY_DIR", os.path.join(ROOT, "build", "python")))
import grpc  # noqa: E402
from dcformer.v1 import dcformer_pb2 as pb  # noqa: E402
from dcformer.v1 import dcformer_pb2_grpc as pb_grpc  # noqa: E402
import health_pb2  # noqa: E402
import health_pb2_grpc  # noqa: E402


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--server", default=os.path.join(ROOT, "build", "bin", "dcformer-server"))
    ap.add_argument("--model", default=os.path.join(ROOT, "models", "dcformer-tiny"))
    ap.add_argument("--servers", type=int, default=3)
    ap.add_argument("--requests", type=int, default=10)
    ap.add_argument("--tokens", type=int, default=16)
    args = ap.parse_args()
    procs, targets = [], []
    try:
        for _ in range(args.servers):
            port = free_port()
            procs.append(subprocess.Popen([args.server, f"--model={args.model}", f"--port={port}",
                                           "--metrics-port=0"], stdout=subprocess.DEVNULL,
                                          stderr=subprocess.DEVNULL))
            targets.append(f"127.0.0.1:{port}")
        for t in targets:
            with grpc.insecure_channel(t) as ch:
                for m in health_pb2_grpc.HealthStub(ch).Watch(health_pb2.HealthCheckRequest(),
                                                              wait_for_ready=True, timeout=120):
                    if m.status == health_pb2.HealthCheckResponse.SERVING:
                        break

        def load(target):
            with grpc.insecure_channel(target) as ch:
                stub = pb_grpc.TextGenerationStub(ch)
                for i in range(args.requests):
                    r = pb.GenerateRequest(token_ids=pb.TokenIds(ids=[5 + i, 6, 7, 8]))
                    r.stopping.max_new_tokens = args.tokens
                    r.stopping.ignore_eos = True
                    r.sampling.temperature = 0
                    list(stub.Generate(r, timeout=300))

        start = time.monotonic()
        with concurrent.futures.ThreadPoolExecutor(len(targets)) as pool:
            list(pool.map(load, targets))
        print(f"{args.servers} servers x {args.requests} requests x {args.tokens} tokens: "
              f"{time.monotonic() - start:.2f} s  (OMP_WAIT_POLICY="
              f"{os.environ.get('OMP_WAIT_POLICY', 'unset')}, server {args.server})")
    finally:
        for p in procs:
            p.send_signal(signal.SIGTERM)
        for p in procs:
            p.wait(timeout=60)


if __name__ == "__main__":
    main()
