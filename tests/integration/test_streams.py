"""Concurrent streams, cancellation, deadlines, a killed client and overload."""
import concurrent.futures
import os
import shutil
import signal
import subprocess
import tempfile
import time
import unittest

import grpc

import harness as h

PROMPT = [156, 232, 174, 60, 127, 277, 298, 270, 224, 172, 11, 203]
LONG = 300  # tokens; on the slow model this takes seconds, so requests are surely running
# A small HTTP/2 window: a stream the test does not read cannot complete on the server.
SMALL_WINDOW = [("grpc.http2.lookahead_bytes", 1024), ("grpc.http2.bdp_probe", 0)]


def idle(server):
    """True when the engine holds no request and no KV block."""
    m = server.metrics()
    used = sum(v for (n, _), v in m.items() if n == "dcformer_kv_cache_blocks_used")
    return (used == 0 and m[("dcformer_num_requests_running", frozenset())] == 0
            and m[("dcformer_num_requests_waiting", frozenset())] == 0)


class StreamsTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp()
        cls.model = h.make_slow_model(os.path.join(cls.tmp, "slow"))
        cls.server = h.Server(model=cls.model, args=["--kv-cache-bytes=200000000"]).__enter__()
        try:
            cls.expected = h.collect(cls.server.stub().Generate(h.ids_request(PROMPT, LONG),
                                                                 timeout=120))[0]
        except BaseException:
            cls.tearDownClass()
            raise

    @classmethod
    def tearDownClass(cls):
        cls.server.__exit__(None, None, None)
        shutil.rmtree(cls.tmp)

    def test_cancel_mid_stream_frees_blocks_and_spares_others(self):
        stub = self.server.stub()
        before = self.server.metric("dcformer_requests_total", outcome="cancelled")
        with concurrent.futures.ThreadPoolExecutor(4) as pool:
            others = [pool.submit(lambda: h.collect(stub.Generate(h.ids_request(PROMPT, LONG),
                                                                   timeout=120)))
                      for _ in range(3)]
            victim = self.server.stub(options=SMALL_WINDOW).Generate(
                h.ids_request(PROMPT, LONG), timeout=120)
            first = next(victim)  # generation has started
            self.assertGreater(len(first.token_ids), 0)
            self.assertGreater(self.server.kv_blocks_used(), 0)
            victim.cancel()
            with self.assertRaises(grpc.RpcError) as ctx:
                for _ in victim:
                    pass
            self.assertEqual(ctx.exception.code(), grpc.StatusCode.CANCELLED)
            for f in others:
                tokens, final = f.result()
                self.assertEqual(tokens, self.expected)
                self.assertEqual(final.finish_reason, h.pb.FINISH_REASON_LENGTH)
        h.wait_until(lambda: idle(self.server), what="KV blocks back to zero")
        h.wait_until(lambda: self.server.metric("dcformer_requests_total",
                                                outcome="cancelled") == before + 1,
                     what="cancelled outcome counted")

    def test_deadline_expiry_releases_request(self):
        stub = self.server.stub()
        before = self.server.metric("dcformer_requests_total", outcome="deadline_exceeded")
        with self.assertRaises(grpc.RpcError) as ctx:
            h.collect(stub.Generate(h.ids_request(PROMPT, LONG), timeout=0.3))
        self.assertEqual(ctx.exception.code(), grpc.StatusCode.DEADLINE_EXCEEDED)
        h.wait_until(lambda: idle(self.server), what="KV blocks back to zero")
        h.wait_until(lambda: self.server.metric("dcformer_requests_total",
                                                outcome="deadline_exceeded") == before + 1,
                     what="deadline outcome counted")
        # The server still serves normally afterwards.
        tokens, _ = h.collect(stub.Generate(h.ids_request(PROMPT, 8), timeout=60))
        self.assertEqual(tokens, self.expected[:8])

    def test_killed_client_is_released(self):
        example = os.path.join(h.SOURCE_DIR, "client", "examples", "python", "generate.py")
        env = dict(os.environ, PYTHONPATH=h.PY_DIR)
        proc = subprocess.Popen(["/usr/bin/python3", example, f"--target={self.server.target}",
                                 "--prompt-ids=" + ",".join(map(str, PROMPT)),
                                 f"--max-new-tokens={LONG}", "--temperature=0", "--ignore-eos"],
                                stdout=subprocess.PIPE, env=env)
        self.assertTrue(proc.stdout.read(1))  # the first token arrived: the stream is live
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        proc.stdout.close()
        h.wait_until(lambda: idle(self.server), what="KV blocks back to zero")
        self.assertEqual(self.server.check_health(), h.SERVING)
        tokens, _ = h.collect(self.server.stub().Generate(h.ids_request(PROMPT, 4), timeout=60))
        self.assertEqual(tokens, self.expected[:4])

    def test_slow_reader_gets_coalesced_tokens(self):
        # A small HTTP/2 window so that unread messages back up into the server.
        stub = self.server.stub(options=SMALL_WINDOW)
        stream = stub.Generate(h.ids_request(PROMPT, LONG), timeout=120)
        first = next(stream)
        # Not reading lets the server coalesce many tokens into each later message.
        h.wait_until(lambda: idle(self.server), what="generation to finish")
        rest = list(stream)
        tokens = list(first.token_ids) + [t for m in rest for t in m.token_ids]
        self.assertEqual(tokens, self.expected)
        self.assertLess(len(rest) + 1, LONG)
        self.assertEqual(rest[-1].finish_reason, h.pb.FINISH_REASON_LENGTH)


class OverloadTest(unittest.TestCase):
    def test_burst_beyond_queue_is_rejected_immediately(self):
        burst = 12
        tmp = tempfile.mkdtemp()
        self.addCleanup(shutil.rmtree, tmp)
        model = h.make_slow_model(os.path.join(tmp, "slow"))
        with h.Server(model=model, args=["--max-queued-requests=2", "--max-num-seqs=2",
                                         "--kv-cache-bytes=200000000"]) as server:
            stub = server.stub()

            def one():
                start = time.monotonic()
                try:
                    tokens, final = h.collect(stub.Generate(h.ids_request(PROMPT, LONG),
                                                            timeout=120))
                    return "ok", tokens, final, time.monotonic() - start
                except grpc.RpcError as e:
                    return e.code(), None, None, time.monotonic() - start

            with concurrent.futures.ThreadPoolExecutor(burst) as pool:
                results = list(pool.map(lambda _: one(), range(burst)))
            accepted = [r for r in results if r[0] == "ok"]
            rejected = [r for r in results if r[0] != "ok"]
            self.assertGreaterEqual(len(accepted), 2)
            self.assertGreaterEqual(len(rejected), 1)
            for code, _, _, elapsed in rejected:
                self.assertEqual(code, grpc.StatusCode.RESOURCE_EXHAUSTED)
                self.assertLess(elapsed, 2.0)  # immediately, not after a wait for capacity
            slowest_reject = max(r[3] for r in rejected)
            self.assertLess(slowest_reject, max(r[3] for r in accepted))
            for _, tokens, final, _ in accepted:
                self.assertEqual(len(tokens), LONG)
                self.assertEqual(final.finish_reason, h.pb.FINISH_REASON_LENGTH)
            self.assertEqual(server.metric("dcformer_requests_total",
                                           outcome="resource_exhausted"), len(rejected))
            self.assertEqual(server.metric("dcformer_requests_total", outcome="length"),
                             len(accepted))
            h.wait_until(lambda: idle(server), what="idle engine")


if __name__ == "__main__":
    unittest.main(verbosity=2)
