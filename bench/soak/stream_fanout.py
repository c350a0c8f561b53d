#!/usr/bin/env python3
"""Engine-loop time per step against the number of concurrent streams.

For each N in --streams, starts N Generate streams at once (same prompt length, max_new_tokens
--tokens, top_logprobs 20 and text, so that every response is large) and measures, from the
server's metrics, the loop's wall time per step (elapsed / steps: everything the loop thread
does, including handing output to the streams) and the model step alone
(dcformer_engine_step_duration_seconds). Their difference is what the loop spends per step
outside the model. That holds for serial steps (the server's default cpu backend); with
pipelined steps (--pipeline-steps on) a step's time runs from the end of the one before, so
the difference would be about 0. Prints one line per N and a JSON summary.

  PYTHONPATH=build/python /usr/bin/python3 bench/soak/stream_fanout.py --streams 1,16,64
"""
import argparse
import concurrent.futures
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request

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


def metrics(port):
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
        out = {}
        for line in r.read().decode().splitlines():
            if line and not line.startswith("#"):
                k, v = line.rsplit(" ", 1)
                out[k] = float(v)
        return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--server", default=os.path.join(ROOT, "build", "bin", "dcformer-server"))
    ap.add_argument("--model", default=os.path.join(ROOT, "models", "dcformer-tiny"))
    ap.add_argument("--streams", default="1,16,64")
    ap.add_argument("--tokens", type=int, default=200)
    ap.add_argument("--prompt", type=int, default=16)
    args = ap.parse_args()
    counts = [int(x) for x in args.streams.split(",")]
    port, mport = free_port(), free_port()
    log = tempfile.NamedTemporaryFile(prefix="fanout-", suffix=".log", delete=False)
    server = subprocess.Popen([args.server, f"--model={args.model}", f"--port={port}",
                               f"--metrics-port={mport}", f"--max-num-seqs={max(counts)}",
                               f"--max-batch-tokens={max(512, max(counts) * args.prompt)}"],
                              stdout=log, stderr=subprocess.STDOUT)
    results = []
    try:
        target = f"127.0.0.1:{port}"
        with grpc.insecure_channel(target) as ch:
            for msg in health_pb2_grpc.HealthStub(ch).Watch(health_pb2.HealthCheckRequest(),
                                                            wait_for_ready=True, timeout=120):
                if msg.status == health_pb2.HealthCheckResponse.SERVING:
                    break
        channels = [grpc.insecure_channel(target, options=[("grpc.use_local_subchannel_pool", 1)])
                    for _ in range(max(counts))]

        def one(i):
            r = pb.GenerateRequest(token_ids=pb.TokenIds(ids=[(7 * i + k) % 50000 + 3
                                                              for k in range(args.prompt)]))
            r.stopping.max_new_tokens = args.tokens
            r.stopping.ignore_eos = True
            r.sampling.temperature = 0
            r.output.top_logprobs = 20
            r.output.return_text = True
            n = 0
            for m in pb_grpc.TextGenerationStub(channels[i]).Generate(r, timeout=600):
                n += len(m.token_ids)
            return n

        for n in counts:
            m0, t0 = metrics(mport), time.monotonic()
            with concurrent.futures.ThreadPoolExecutor(n) as pool:
                got = list(pool.map(one, range(n)))
            m1, t1 = metrics(mport), time.monotonic()
            assert all(g == args.tokens for g in got), got
            steps = m1["dcformer_engine_steps_total"] - m0["dcformer_engine_steps_total"]
            model_s = (m1["dcformer_engine_step_duration_seconds_sum"]
                       - m0["dcformer_engine_step_duration_seconds_sum"])
            loop_ms = (t1 - t0) / steps * 1e3
            model_ms = model_s / steps * 1e3
            row = {"streams": n, "steps": int(steps), "loop_ms_per_step": round(loop_ms, 3),
                   "model_ms_per_step": round(model_ms, 3),
                   "outside_model_ms_per_step": round(loop_ms - model_ms, 3),
                   "tokens_per_s": round(n * args.tokens / (t1 - t0), 1)}
            print(row, flush=True)
            results.append(row)
        for c in channels:
            c.close()
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait(timeout=60)
        log.close()
        os.unlink(log.name)
    print(json.dumps(results))


if __name__ == "__main__":
    main()
