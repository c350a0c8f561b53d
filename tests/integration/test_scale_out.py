"""Scale-out: three servers on loopback behind one client channel with gRPC's round_robin
policy over their addresses (what a headless Service gives a client in Kubernetes), under
load and while one replica drains after SIGTERM.

Replicas are told apart by their --default-max-new-tokens, which GetModelInfo reports."""
import concurrent.futures
import contextlib
import json
import os
import queue
import signal
import subprocess
import threading
import unittest

import grpc

import harness as h

PROMPTS = [[156, 232, 174, 60, 127, 277, 298, 270, 224, 172, 11, 203], [5, 6, 7],
           [8, 9, 10, 11, 12], [13, 14, 15, 16, 17, 18, 19], [250, 17, 3, 99],
           [42, 42, 42, 1, 2, 3, 4, 5, 6, 7, 8]]
NEW_TOKENS = 16
REPLICA_IDS = (201, 202, 203)  # each replica's --default-max-new-tokens
SMALL_WINDOW = [("grpc.http2.lookahead_bytes", 1024), ("grpc.http2.bdp_probe", 0)]
# Plain round_robin, no retry policy: what the server does alone is under test.
ROUND_ROBIN = json.dumps({"loadBalancingConfig": [{"round_robin": {}}]})
# The client configuration deploy/README.md documents (round_robin plus a retry policy).
with open(os.path.join(h.SOURCE_DIR, "deploy", "client", "service-config.json")) as f:
    DOCUMENTED_CONFIG = json.dumps(json.load(f))


class Replicas(contextlib.ExitStack):
    """Three servers of the short golden model; `servers[i]` reports REPLICA_IDS[i]. They
    start and stop side by side."""

    def __enter__(self):
        super().__enter__()
        self.servers = [self.enter_context(h.Server(args=["--drain-timeout=60s",
                                                          f"--default-max-new-tokens={rid}"],
                                                    ready=False))
                        for rid in REPLICA_IDS]
        try:
            for s in self.servers:
                s.wait_serving()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc):
        for s in self.servers:
            if s.proc.poll() is None:
                s.proc.send_signal(signal.SIGTERM)
        for s in self.servers:
            try:
                s.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                pass  # Server.__exit__ kills it
        return super().__exit__(*exc)

    def channel(self, service_config):
        target = "ipv4:" + ",".join(f"127.0.0.1:{s.port}" for s in self.servers)
        return grpc.insecure_channel(target, options=[("grpc.service_config", service_config)])

    def requests_served(self, i):
        m = self.servers[i].metrics()
        return sum(v for (name, _), v in m.items() if name == "dcformer_requests_total")


def reference(server):
    """One server's greedy continuation of every prompt, one request at a time."""
    with server.channel() as ch:
        stub = h.pb_grpc.TextGenerationStub(ch)
        return {tuple(p): h.collect(stub.Generate(h.ids_request(p, NEW_TOKENS), timeout=60))[0]
                for p in PROMPTS}


def replica_of(stub):
    return stub.GetModelInfo(h.pb.GetModelInfoRequest(), timeout=30).default_max_new_tokens


def connect_all(stub):
    """Returns once round_robin has used every replica: all three connections are up (it
    picks only among connected ones; they connect in the background, within ~0.1 s here)."""
    seen = set()
    h.wait_until(lambda: seen.add(replica_of(stub)) or len(seen) == 3, timeout=30,
                 what=f"round_robin to reach every replica (reached {seen})")


class ScaleOutTest(unittest.TestCase):
    def check_generate(self, stub, prompt, expected):
        tokens, final = h.collect(stub.Generate(h.ids_request(prompt, NEW_TOKENS), timeout=60))
        self.assertEqual(tokens, expected, prompt)
        self.assertEqual(final.finish_reason, h.pb.FINISH_REASON_LENGTH)

    def test_load_spreads_over_replicas_and_matches_one_server(self):
        with Replicas() as r:
            expected = reference(r.servers[0])
            before = [r.requests_served(i) for i in range(3)]
            n = 36
            with r.channel(DOCUMENTED_CONFIG) as ch:
                stub = h.pb_grpc.TextGenerationStub(ch)
                connect_all(stub)
                with concurrent.futures.ThreadPoolExecutor(6) as pool:
                    jobs = [pool.submit(self.check_generate, stub, p, expected[tuple(p)])
                            for p in PROMPTS * (n // len(PROMPTS))]
                    for job in jobs:
                        job.result()
            served = [r.requests_served(i) - before[i] for i in range(3)]
            self.assertEqual(sum(served), n, served)
            for i, count in enumerate(served):
                self.assertGreater(count, 0, f"replica {i} served nothing: {served}")

    def test_sigterm_moves_new_calls_to_the_other_replicas(self):
        with Replicas() as r:
            expected = reference(r.servers[0])
            ch = r.channel(ROUND_ROBIN)
            self.addCleanup(ch.close)
            stub = h.pb_grpc.TextGenerationStub(ch)
            health = h.health_pb2_grpc.HealthStub(ch)
            # Connected to all three: round_robin then rotates over them call by call.
            connect_all(stub)
            # One health watch per replica (three consecutive picks), read by threads.
            events = queue.Queue()
            watches = [health.Watch(h.health_pb2.HealthCheckRequest(), timeout=120)
                       for _ in range(3)]
            self.assertEqual([next(w).status for w in watches], [h.SERVING] * 3)

            def follow(watch):
                try:
                    for msg in watch:
                        events.put(msg.status)
                except grpc.RpcError:
                    pass  # cancelled at the end, or the replica closed it

            for w in watches:
                threading.Thread(target=follow, args=(w,), daemon=True).start()

            # Load across the SIGTERM and after, through a second channel configured as
            # deploy/README.md documents: its retry policy covers the calls that race the
            # GOAWAY (see docs/API.md, "Shutdown").
            load_ch = r.channel(DOCUMENTED_CONFIG)
            self.addCleanup(load_ch.close)
            load_stub = h.pb_grpc.TextGenerationStub(load_ch)
            connect_all(load_stub)
            results = []  # (ok, description)
            stop = threading.Event()

            def load(k):
                i = k
                while not stop.is_set():
                    prompt = PROMPTS[i % len(PROMPTS)]
                    i += 1
                    try:
                        self.check_generate(load_stub, prompt, expected[tuple(prompt)])
                        results.append((True, ""))
                    except (grpc.RpcError, AssertionError) as e:
                        results.append((False, f"{prompt}: {e}"))

            loaders = [threading.Thread(target=load, args=(k,)) for k in range(3)]
            for t in loaders:
                t.start()
            try:
                h.wait_until(lambda: len(results) >= 30, what="load")
                served = [r.requests_served(i) for i in range(3)]
                self.assertTrue(all(c > 0 for c in served), served)

                # Replica 0 keeps running streams (its client reads them only later) so that
                # it stays in its drain while the rest of the test runs.
                held_ch = r.servers[0].channel(options=SMALL_WINDOW)
                self.addCleanup(held_ch.close)
                held = [h.pb_grpc.TextGenerationStub(held_ch).Generate(
                    h.ids_request(PROMPTS[0], 240), timeout=120) for _ in range(2)]
                firsts = [next(s) for s in held]

                r.servers[0].proc.send_signal(signal.SIGTERM)
                # Replica 0 is draining, and this channel knows: its watch on replica 0 says
                # NOT_SERVING, which the server sends after the GOAWAY on that connection.
                try:
                    self.assertEqual(events.get(timeout=60), h.NOT_SERVING)
                except queue.Empty:
                    self.fail("no health watch through the channel saw replica 0 drain")
                self.assertIsNone(r.servers[0].proc.poll())

                # The reported case: calls sent now used to fail about 1 in 3 with
                # UNAVAILABLE "server is shutting down". All succeed, on the other two.
                for i in range(30):
                    prompt = PROMPTS[i % len(PROMPTS)]
                    self.check_generate(stub, prompt, expected[tuple(prompt)])
                    self.assertIn(replica_of(stub), REPLICA_IDS[1:])

                # What replica 0 accepted before the signal is not lost: it drains.
                for first, stream in zip(firsts, held):
                    tokens, final = h.collect(stream)
                    self.assertEqual(len(first.token_ids) + len(tokens), 240)
                    self.assertEqual(final.finish_reason, h.pb.FINISH_REASON_LENGTH)
                self.assertEqual(r.servers[0].proc.wait(timeout=60), 0)
                done = len(results)
                h.wait_until(lambda: len(results) >= done + 30, what="load after the exit")
            finally:
                stop.set()
                for t in loaders:
                    t.join()
                for w in watches:
                    w.cancel()
            failures = [d for ok, d in results if not ok]
            self.assertEqual(failures, [], f"{len(failures)} of {len(results)} calls failed")


if __name__ == "__main__":
    unittest.main(verbosity=2)
