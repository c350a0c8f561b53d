#!/usr/bin/env python3
"""Soak: thousands of mixed requests against one dcformer-server for a given duration.

Starts a server on loopback (or uses --target with --pid and --metrics-port), then runs
--concurrency client threads, each looping over a mix of requests until --duration passes:
  greedy, sampled (seeded), stop strings, top logprobs, cancelled after the first message,
  short deadlines, Tokenize, and bad ones (invalid parameters, bytes that are not protobuf,
  invalid UTF-8). Every --sample-interval it samples the server's RSS, open file descriptors
  and threads. At the end it waits for the engine to go idle and reports KV blocks, running
  and waiting requests and the request counters.

With --check (the short CI run in tests/integration/test_soak.py) it fails unless, after the
warm-up (the first --warmup fraction of the run), RSS grew by at most --rss-bound-mib (plus
--rss-bound-frac of the warm RSS), open fds and threads by at most --fd-bound / --thread-bound,
every request got a well-formed answer, the server counted as many cancelled and
deadline_exceeded calls as the clients saw (within 1 call or 2%: see the check), and KV blocks, running and waiting are back to
zero.

  PYTHONPATH=build/python /usr/bin/python3 bench/soak/soak.py --duration 600 --concurrency 8

Loopback only; every loop is bounded by the duration. Prints a JSON report on the last line.
"""
import argparse
import json
import os
import random
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, os.environ.get("DCF_PY_DIR", os.path.join(ROOT, "build", "python")))

import grpc  # noqa: E402
from dcformer.v1 import dcformer_pb2 as pb  # noqa: E402
from dcformer.v1 import dcformer_pb2_grpc as pb_grpc  # noqa: E402
import health_pb2  # noqa: E402
import health_pb2_grpc  # noqa: E402

SERVICE = "dcformer.v1.TextGeneration"


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def proc_sample(pid):
    with open(f"/proc/{pid}/status") as f:
        status = dict(line.split(":", 1) for line in f if ":" in line)
    return {"rss_mib": int(status["VmRSS"].split()[0]) / 1024,
            "threads": int(status["Threads"]),
            "fds": len(os.listdir(f"/proc/{pid}/fd"))}


def scrape(metrics_port):
    with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=10) as r:
        text = r.read().decode()
    out = {}
    for line in text.splitlines():
        if line.startswith("#") or not line.strip():
            continue
        name, value = line.rsplit(" ", 1)
        out[name] = float(value)
    return out


def gauge_sum(metrics, prefix):
    return sum(v for k, v in metrics.items() if k.split("{")[0] == prefix)


class Mix:
    """One client thread's request mix. Returns the kind and whether the answer was right."""

    def __init__(self, channel, seed, vocab, has_tokenizer):
        self.stub = pb_grpc.TextGenerationStub(channel)
        self.raw = channel.unary_stream(f"/{SERVICE}/Generate")
        self.rng = random.Random(seed)
        self.vocab = vocab
        self.has_tokenizer = has_tokenizer
        self.observed = {"cancelled": 0, "deadline_exceeded": 0}  # what this client saw

    def prompt(self):
        return [self.rng.randrange(3, self.vocab) for _ in range(self.rng.randint(1, 48))]

    def request(self, greedy=True, n=None):
        r = pb.GenerateRequest(token_ids=pb.TokenIds(ids=self.prompt()))
        r.stopping.max_new_tokens = n or self.rng.randint(1, 48)
        r.stopping.ignore_eos = True
        if greedy:
            r.sampling.temperature = 0
        else:
            r.sampling.temperature = 0.8
            r.sampling.top_p = 0.9
            r.sampling.seed = self.rng.randrange(1 << 30)
        return r

    def run_stream(self, request, timeout=60):
        n, final = 0, None
        for msg in self.stub.Generate(request, timeout=timeout):
            n += len(msg.token_ids)
            if msg.finish_reason != pb.FINISH_REASON_UNSPECIFIED:
                final = msg
        return n, final

    def one(self):
        kind = self.rng.choice(["greedy", "greedy", "sampled", "sampled", "stop", "logprobs",
                                "cancel", "deadline", "tokenize", "bad_param", "bad_bytes",
                                "bad_utf8"])
        try:
            if kind in ("greedy", "sampled", "logprobs"):
                r = self.request(greedy=kind != "sampled")
                if kind == "logprobs":
                    r.output.top_logprobs = 5
                n, final = self.run_stream(r)
                return kind, final is not None and final.usage.generated_tokens == n == \
                    r.stopping.max_new_tokens
            if kind == "stop":
                r = self.request(greedy=True)
                if self.has_tokenizer:
                    r.stopping.stop_strings.extend(["e", "th"])
                r.stopping.stop_token_ids.append(self.rng.randrange(3, self.vocab))
                n, final = self.run_stream(r)
                return kind, final is not None and final.usage.generated_tokens == n
            if kind == "cancel":
                call = self.stub.Generate(self.request(n=200), timeout=60)
                next(call)
                call.cancel()
                try:
                    for _ in call:
                        pass
                except grpc.RpcError as e:
                    if e.code() == grpc.StatusCode.CANCELLED:
                        self.observed["cancelled"] += 1
                    return kind, e.code() == grpc.StatusCode.CANCELLED
                return kind, True  # finished before the cancel landed
            if kind == "deadline":
                try:
                    self.run_stream(self.request(n=400), timeout=self.rng.uniform(0.01, 0.2))
                    return kind, True  # fast enough
                except grpc.RpcError as e:
                    if e.code() == grpc.StatusCode.DEADLINE_EXCEEDED:
                        self.observed["deadline_exceeded"] += 1
                    return kind, e.code() == grpc.StatusCode.DEADLINE_EXCEEDED
            if kind == "tokenize":
                try:
                    ids = self.stub.Tokenize(pb.TokenizeRequest(text="soak test text"), timeout=30)
                    return kind, self.has_tokenizer and len(ids.token_ids) > 0
                except grpc.RpcError as e:
                    return kind, (not self.has_tokenizer
                                  and e.code() == grpc.StatusCode.FAILED_PRECONDITION)
            expect = grpc.StatusCode.INVALID_ARGUMENT
            try:
                if kind == "bad_param":
                    r = self.request()
                    r.sampling.top_p = 1.5
                    self.run_stream(r)
                elif kind == "bad_bytes":
                    list(self.raw(bytes(self.rng.randrange(256) for _ in range(12)) + b"\xff\xff",
                                  timeout=30))
                    return kind, True  # random bytes can happen to be a valid request
                else:
                    list(self.raw(b"\x12\x04ab\xff\xfe", timeout=30))
                return kind, False
            except grpc.RpcError as e:
                return kind, e.code() in (expect, grpc.StatusCode.OUT_OF_RANGE)
        except grpc.RpcError as e:
            return kind, False


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--duration", type=float, default=60, help="seconds of load")
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--sample-interval", type=float, default=1.0)
    ap.add_argument("--model", default=os.path.join(ROOT, "models", "dcformer-tiny"))
    ap.add_argument("--server", default=os.path.join(ROOT, "build", "bin", "dcformer-server"))
    ap.add_argument("--server-arg", action="append", default=[],
                    help="extra dcformer-server flag (repeatable)")
    ap.add_argument("--target", help="use a running server (with --pid and --metrics-port)")
    ap.add_argument("--pid", type=int)
    ap.add_argument("--metrics-port", type=int)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--check", action="store_true", help="assert no growth and clean counters")
    ap.add_argument("--warmup", type=float, default=0.3, help="fraction of the run before the "
                    "growth baseline")
    ap.add_argument("--rss-bound-mib", type=float, default=24)
    ap.add_argument("--rss-bound-frac", type=float, default=0.10)
    ap.add_argument("--fd-bound", type=int, default=8)
    ap.add_argument("--thread-bound", type=int, default=4)
    args = ap.parse_args()

    server = None
    log = None
    if args.target:
        target, pid, metrics_port = args.target, args.pid, args.metrics_port
    else:
        port, metrics_port = free_port(), free_port()
        target = f"127.0.0.1:{port}"
        log = tempfile.NamedTemporaryFile(prefix="soak-server-", suffix=".log", delete=False)
        server = subprocess.Popen([args.server, f"--model={args.model}", "--host=127.0.0.1",
                                   f"--port={port}", f"--metrics-port={metrics_port}"]
                                  + args.server_arg, stdout=log, stderr=subprocess.STDOUT)
        pid = server.pid
    try:
        with grpc.insecure_channel(target) as ch:
            health = health_pb2_grpc.HealthStub(ch)
            for msg in health.Watch(health_pb2.HealthCheckRequest(), wait_for_ready=True,
                                    timeout=120):
                if msg.status == health_pb2.HealthCheckResponse.SERVING:
                    break
            info = pb_grpc.TextGenerationStub(ch).GetModelInfo(pb.GetModelInfoRequest(),
                                                               timeout=30)
        report = run(args, target, pid, metrics_port, info)
    finally:
        if server is not None:
            server.send_signal(signal.SIGTERM)
            try:
                server.wait(timeout=60)
            except subprocess.TimeoutExpired:
                server.kill()
            log.close()
            if server.returncode not in (0, None):
                print(open(log.name, errors="replace").read()[-3000:], file=sys.stderr)
            os.unlink(log.name)
    print(json.dumps(report))
    if args.check and report["failures"]:
        for f in report["failures"]:
            print("soak check failed:", f, file=sys.stderr)
        sys.exit(1)


def run(args, target, pid, metrics_port, info):
    stop_at = time.monotonic() + args.duration
    lock = threading.Lock()
    counts, wrong = {}, {}
    observed = {"cancelled": 0, "deadline_exceeded": 0}
    samples = []

    def client(i):
        # Each client its own connection, as separate processes would have.
        with grpc.insecure_channel(target, options=[("grpc.use_local_subchannel_pool", 1)]) as ch:
            mix = Mix(ch, args.seed * 1000 + i, info.vocab_size, info.has_tokenizer)
            while time.monotonic() < stop_at:
                kind, ok = mix.one()
                with lock:
                    counts[kind] = counts.get(kind, 0) + 1
                    if not ok:
                        wrong[kind] = wrong.get(kind, 0) + 1
            with lock:
                for k, v in mix.observed.items():
                    observed[k] += v

    start = time.monotonic()
    threads = [threading.Thread(target=client, args=(i,)) for i in range(args.concurrency)]
    for t in threads:
        t.start()
    while any(t.is_alive() for t in threads):
        s = proc_sample(pid)
        s["t"] = round(time.monotonic() - start, 2)
        samples.append(s)
        for t in threads:
            t.join(timeout=args.sample_interval / len(threads))
    # Idle: the engine must let go of everything.
    deadline = time.monotonic() + 60
    while True:
        m = scrape(metrics_port)
        kv = gauge_sum(m, "dcformer_kv_cache_blocks_used")
        running = m.get("dcformer_num_requests_running", -1)
        waiting = m.get("dcformer_num_requests_waiting", -1)
        if (kv, running, waiting) == (0, 0, 0) or time.monotonic() > deadline:
            break
        time.sleep(0.1)  # polling the idle condition, bounded by the deadline above
    end = proc_sample(pid)
    end["t"] = round(time.monotonic() - start, 2)
    samples.append(end)
    warm = [s for s in samples if s["t"] >= args.warmup * args.duration]
    base = warm[0] if warm else samples[0]
    peak_after = {k: max(s[k] for s in warm or samples) for k in ("rss_mib", "fds", "threads")}
    outcomes = {}
    for k, v in m.items():  # summed over the protocol label
        if k.startswith("dcformer_requests_total{") and v > 0:
            outcome = k.split('outcome="')[1].split('"')[0]
            outcomes[outcome] = outcomes.get(outcome, 0) + int(v)
    report = {
        "duration_s": round(end["t"], 1),
        "requests": sum(counts.values()),
        "by_kind": counts,
        "wrong_answers": wrong,
        "server_outcomes": outcomes,
        "client_observed": observed,
        "rss_mib": {"start": round(samples[0]["rss_mib"], 1), "after_warmup": round(base["rss_mib"], 1),
                    "peak_after_warmup": round(peak_after["rss_mib"], 1),
                    "end": round(end["rss_mib"], 1)},
        "fds": {"start": samples[0]["fds"], "after_warmup": base["fds"], "end": end["fds"],
                "peak_after_warmup": peak_after["fds"]},
        "threads": {"start": samples[0]["threads"], "after_warmup": base["threads"],
                    "end": end["threads"], "peak_after_warmup": peak_after["threads"]},
        "end_state": {"kv_blocks_used": kv, "running": running, "waiting": waiting},
        "samples": samples,
        "failures": [],
    }
    f = report["failures"]
    rss_bound = args.rss_bound_mib + args.rss_bound_frac * base["rss_mib"]
    if end["rss_mib"] - base["rss_mib"] > rss_bound:
        f.append(f"RSS grew {end['rss_mib'] - base['rss_mib']:.1f} MiB after warm-up "
                 f"(bound {rss_bound:.1f} MiB)")
    if end["fds"] - base["fds"] > args.fd_bound:
        f.append(f"open fds grew from {base['fds']} to {end['fds']}")
    if end["threads"] - base["threads"] > args.thread_bound:
        f.append(f"threads grew from {base['threads']} to {end['threads']}")
    if (kv, running, waiting) != (0, 0, 0):
        f.append(f"not idle at the end: kv blocks {kv}, running {running}, waiting {waiting}")
    if wrong:
        f.append(f"wrong answers: {wrong}")
    # The server's classification of client-ended calls agrees with what the clients saw (a
    # deadline a client hit counted as a cancel, or the reverse, is a metrics bug). Allowed:
    # 1 call or 2%, for the two races no server can see through: a call that expired before
    # the server read it (never counted), and one the server finished just as the client's
    # deadline fired (counted by its finish reason).
    for k in ("cancelled", "deadline_exceeded"):
        if abs(outcomes.get(k, 0) - observed[k]) > max(1, 0.02 * observed[k]):
            f.append(f"server counted {outcomes.get(k, 0)} {k}, clients saw {observed[k]}")
    if sum(counts.values()) == 0:
        f.append("no request completed")
    return report


if __name__ == "__main__":
    main()
