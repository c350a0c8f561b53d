"""Abuse cases: what an attacker or a broken client can do to one server, and that it holds:
hundreds of idle connections, a client that never reads, keepalive ping floods, metadata near
the size limits, many streams on one connection, and prompts that would flood the queue."""
import concurrent.futures
import os
import shutil
import tempfile
import time
import unittest

import grpc

import harness as h

PROMPT = [156, 232, 174, 60, 127, 277, 298, 270, 224, 172, 11, 203]
# Small HTTP/2 windows: a stream the test does not read backs up into the server.
SMALL_WINDOW = [("grpc.http2.lookahead_bytes", 1024), ("grpc.http2.bdp_probe", 0)]
# A channel with its own TCP connection (grpcio shares connections between equal channels).
OWN_CONNECTION = [("grpc.use_local_subchannel_pool", 1)]


def open_fds(pid):
    return len(os.listdir(f"/proc/{pid}/fd"))


def threads(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("Threads:"):
                return int(line.split()[1])
    return 0


def idle(server):
    m = server.metrics()
    return (server.kv_blocks_used() == 0
            and m[("dcformer_num_requests_running", frozenset())] == 0
            and m[("dcformer_num_requests_waiting", frozenset())] == 0)


class AbuseTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.server = h.Server(args=["--max-stream-buffer-bytes=4096"]).__enter__()
        try:
            cls.expected = h.collect(cls.server.stub().Generate(h.ids_request(PROMPT, 200),
                                                                timeout=60))[0]
        except BaseException:
            cls.server.__exit__(None, None, None)
            raise

    @classmethod
    def tearDownClass(cls):
        cls.server.__exit__(None, None, None)

    def generate_ok(self, n=20):
        tokens, final = h.collect(self.server.stub().Generate(h.ids_request(PROMPT, n),
                                                              timeout=60))
        self.assertEqual(tokens, self.expected[:n])
        self.assertEqual(final.finish_reason, h.pb.FINISH_REASON_LENGTH)

    def test_hundreds_of_idle_connections(self):
        pid = self.server.proc.pid
        fds_before, threads_before = open_fds(pid), threads(pid)
        channels = []
        try:
            for _ in range(300):
                ch = self.server.channel(options=OWN_CONNECTION)
                h.health_pb2_grpc.HealthStub(ch).Check(h.health_pb2.HealthCheckRequest(),
                                                       timeout=30)
                channels.append(ch)
            # One socket each; no thread per connection. (Up to 8 descriptors of earlier
            # calls may close meanwhile: the same slack as the check after closing below.)
            self.assertGreaterEqual(open_fds(pid), fds_before + 300 - 8)
            self.assertLess(threads(pid), threads_before + 16)
            self.generate_ok()
            self.assertEqual(self.server.check_health(), h.SERVING)
        finally:
            for ch in channels:
                ch.close()
        h.wait_until(lambda: open_fds(pid) <= fds_before + 8, what="sockets closed")

    def test_client_that_never_reads_is_cut_off(self):
        request = h.ids_request(PROMPT, 200)
        request.output.top_logprobs = 20  # large responses fill the window fast
        silent = self.server.stub(options=SMALL_WINDOW + OWN_CONNECTION).Generate(request,
                                                                                  timeout=120)
        first = next(silent)  # started; from now on the test does not read it
        self.assertGreater(len(first.token_ids), 0)
        # Other streams and the engine loop go on: a full generation completes meanwhile...
        self.generate_ok(200)
        # ...and the silent stream's request was cancelled in the engine once its unsent
        # output passed --max-stream-buffer-bytes: nothing runs, no KV block is held.
        h.wait_until(lambda: idle(self.server), what="the silent stream released")
        with self.assertRaises(grpc.RpcError) as ctx:
            for _ in silent:
                pass
        self.assertEqual(ctx.exception.code(), grpc.StatusCode.RESOURCE_EXHAUSTED)
        self.assertIn("not reading", ctx.exception.details())
        h.wait_until(lambda: self.server.metric("dcformer_requests_total",
                                                outcome="resource_exhausted") == 1,
                     what="the cut-off stream counted")

    def test_keepalive_ping_flood(self):
        # The server allows a client ping every 10 s without data (--min-client-ping-interval-ms);
        # this client pings every 10 ms and answers nothing else.
        flood = [("grpc.keepalive_time_ms", 10), ("grpc.keepalive_timeout_ms", 1000),
                 ("grpc.keepalive_permit_without_calls", 1),
                 ("grpc.http2.max_pings_without_data", 0),
                 ("grpc.http2.min_time_between_pings_ms", 10)] + OWN_CONNECTION
        with self.server.channel(options=flood) as ch:
            health = h.health_pb2_grpc.HealthStub(ch)
            deadline = time.monotonic() + 3
            outcomes = set()
            while time.monotonic() < deadline:
                try:
                    health.Check(h.health_pb2.HealthCheckRequest(), timeout=5)
                    outcomes.add("ok")
                except grpc.RpcError as e:
                    outcomes.add(e.code())
                # Each Check is a new call: the flood keeps going with idle gaps in between.
                time.sleep(0.05)  # pacing of the abusive client, not synchronisation
            self.assertTrue(outcomes <= {"ok", grpc.StatusCode.UNAVAILABLE}, outcomes)
        # The server shrugged it off: others are served, health is SERVING.
        self.generate_ok()
        self.assertEqual(self.server.check_health(), h.SERVING)

    def test_metadata_near_the_size_limits(self):
        # Its own connection: gRPC answers headers past the hard limit by closing the
        # connection, which must not take down the connection other tests share.
        stub = self.server.stub(options=OWN_CONNECTION)
        # Just under gRPC's default 8 KiB metadata limit: served.
        tokens, _ = h.collect(stub.Generate(h.ids_request(PROMPT, 2), timeout=30,
                                            metadata=[("x-padding", "a" * 7000)]))
        self.assertEqual(tokens, self.expected[:2])
        # Far beyond it, as one large value and as many small headers: refused, not fatal.
        for metadata in ([("x-padding", "a" * 40000)],
                         [(f"x-h{i}", "b" * 40) for i in range(1000)]):
            with self.assertRaises(grpc.RpcError) as ctx:
                h.collect(stub.Generate(h.ids_request(PROMPT, 2), timeout=30,
                                        metadata=metadata))
            self.assertIn(ctx.exception.code(), (grpc.StatusCode.RESOURCE_EXHAUSTED,
                                                 grpc.StatusCode.INTERNAL,
                                                 grpc.StatusCode.UNAVAILABLE))
            stub = self.server.stub(options=OWN_CONNECTION)  # a fresh connection after that
        self.generate_ok()
        self.assertEqual(self.server.check_health(), h.SERVING)

    def test_many_concurrent_streams_on_one_connection(self):
        with self.server.channel(options=OWN_CONNECTION) as ch:
            stub = h.pb_grpc.TextGenerationStub(ch)
            with concurrent.futures.ThreadPoolExecutor(64) as pool:
                results = list(pool.map(
                    lambda _: h.collect(stub.Generate(h.ids_request(PROMPT, 40), timeout=120)),
                    range(128)))
        for tokens, final in results:
            self.assertEqual(tokens, self.expected[:40])
            self.assertEqual(final.finish_reason, h.pb.FINISH_REASON_LENGTH)
        h.wait_until(lambda: idle(self.server), what="idle engine")


class QueuedPromptTokensTest(unittest.TestCase):
    def test_admission_is_bounded_by_queued_prompt_tokens(self):
        tmp = tempfile.mkdtemp()
        self.addCleanup(shutil.rmtree, tmp)
        model = h.make_slow_model(os.path.join(tmp, "slow"))
        with h.Server(model=model, args=["--max-num-seqs=1", "--max-queued-prompt-tokens=100",
                                         "--kv-cache-bytes=200000000"]) as server:
            stub = server.stub()
            running = stub.Generate(h.ids_request(PROMPT, 400), timeout=120)
            next(running)  # running: the queue is empty
            waiting = stub.Generate(h.ids_request([5] * 80, 2), timeout=120)
            h.wait_until(lambda: server.metric("dcformer_num_requests_waiting") == 1,
                         what="the 80-token prompt queued")
            # Few requests wait, but their prompts would pass the token bound.
            with self.assertRaises(grpc.RpcError) as ctx:
                h.collect(stub.Generate(h.ids_request([5] * 30, 2), timeout=30))
            self.assertEqual(ctx.exception.code(), grpc.StatusCode.RESOURCE_EXHAUSTED)
            self.assertIn("prompt tokens", ctx.exception.details())
            # A small one still fits under the bound.
            small = stub.Generate(h.ids_request([5] * 10, 2), timeout=120)
            running.cancel()
            self.assertEqual(len(h.collect(waiting)[0]), 2)
            self.assertEqual(len(h.collect(small)[0]), 2)
            h.wait_until(lambda: idle(server), what="idle engine")


if __name__ == "__main__":
    unittest.main(verbosity=2)
