"""The engine broken on purpose, end to end: a backend step that fails, and one that hangs.

Uses dcformer-server-faults, a test build of the server whose backend fails or stalls the step
that prefills a prompt starting with a chosen token id (tests/testing/fault_injecting_backend.h); the release
dcformer-server carries no such code."""
import concurrent.futures
import os
import shutil
import signal
import tempfile
import time
import unittest

import grpc

import harness as h

FAIL_TOKEN = 7
STALL_TOKEN = 8


def next_status(watch, want):
    """Reads the health Watch stream until it reports `want`."""
    for msg in watch:
        if msg.status == want:
            return True
    return False


class BackendFailureTest(unittest.TestCase):
    def test_failed_step_fails_requests_and_turns_health_not_serving(self):
        with h.Server(binary=h.SERVER_FAULTS, args=[f"--fault-fail-token={FAIL_TOKEN}"]) as server:
            stub = server.stub()
            # A healthy request first: the fault hits only batches with the token.
            tokens, final = h.collect(stub.Generate(h.ids_request([5, 6], 3), timeout=30))
            self.assertEqual(len(tokens), 3)
            with server.channel() as ch:
                watch = h.health_pb2_grpc.HealthStub(ch).Watch(h.health_pb2.HealthCheckRequest(),
                                                               timeout=60)
                self.assertEqual(next(watch).status, h.SERVING)
                with self.assertRaises(grpc.RpcError) as ctx:
                    h.collect(stub.Generate(h.ids_request([FAIL_TOKEN, 5, 9], 3), timeout=30))
                self.assertEqual(ctx.exception.code(), grpc.StatusCode.INTERNAL)
                self.assertIn("injected backend fault", ctx.exception.details())
                self.assertTrue(next_status(watch, h.NOT_SERVING))
                watch.cancel()
            self.assertEqual(server.check_health(h.SERVICE), h.NOT_SERVING)
            with self.assertRaises(grpc.RpcError) as ctx:
                h.collect(stub.Generate(h.ids_request([5, 6], 3), timeout=30))
            self.assertEqual(ctx.exception.code(), grpc.StatusCode.UNAVAILABLE)
            self.assertIn("failed", ctx.exception.details())
            # Counted when each call is done on the server (just after the client has its status).
            h.wait_until(lambda: server.metric("dcformer_requests_total", outcome="error") == 1,
                         what="the failed request counted")
            h.wait_until(lambda: server.metric("dcformer_requests_total",
                                               outcome="unavailable") == 1,
                         what="the refused request counted")
            self.assertEqual(server.kv_blocks_used(), 0)
            self.assertIn("engine backend failed", server.read_log())


class StallWatchdogTest(unittest.TestCase):
    def test_stalled_loop_turns_not_serving_and_recovers(self):
        tmp = tempfile.mkdtemp()
        self.addCleanup(shutil.rmtree, tmp)
        release = os.path.join(tmp, "release")
        args = [f"--fault-stall-token={STALL_TOKEN}", f"--fault-release-file={release}",
                "--engine-stall-timeout=300ms"]
        with h.Server(binary=h.SERVER_FAULTS, args=args) as server:
            stub = server.stub()
            with server.channel() as ch, concurrent.futures.ThreadPoolExecutor(1) as pool:
                watch = h.health_pb2_grpc.HealthStub(ch).Watch(h.health_pb2.HealthCheckRequest(),
                                                               timeout=120)
                self.assertEqual(next(watch).status, h.SERVING)
                stalled = pool.submit(lambda: h.collect(stub.Generate(
                    h.ids_request([STALL_TOKEN, 5, 9], 4), timeout=120)))
                # The loop is stuck in the step: the watchdog reports it.
                self.assertTrue(next_status(watch, h.NOT_SERVING))
                self.assertFalse(stalled.done())
                self.assertIn("engine loop stalled", server.read_log())
                # The device comes back: the loop moves again and health recovers.
                open(release, "w").close()
                self.assertTrue(next_status(watch, h.SERVING))
                watch.cancel()
                tokens, final = stalled.result(timeout=120)
                self.assertEqual(len(tokens), 4)
                self.assertEqual(final.finish_reason, h.pb.FINISH_REASON_LENGTH)
            self.assertIn("engine loop recovered", server.read_log())
            self.assertEqual(server.check_health(h.SERVICE), h.SERVING)

    def test_shutdown_with_a_hung_step_exits_after_the_hard_deadline(self):
        # A step that never returns (a hung device) would block the drain forever: the process
        # exits 1 at --drain-timeout + 5 s (docs/API.md, "Shutdown") instead of waiting for
        # the orchestrator's kill.
        tmp = tempfile.mkdtemp()
        self.addCleanup(shutil.rmtree, tmp)
        args = [f"--fault-stall-token={STALL_TOKEN}",
                f"--fault-release-file={os.path.join(tmp, 'never')}", "--drain-timeout=1s",
                "--engine-stall-timeout=300ms"]
        with h.Server(binary=h.SERVER_FAULTS, args=args) as server:
            stub = server.stub()
            stalled = stub.Generate(h.ids_request([STALL_TOKEN, 5, 9], 4), timeout=120)
            h.wait_until(lambda: "engine loop stalled" in server.read_log(),
                         what="the step to hang")
            start = time.monotonic()
            server.proc.send_signal(signal.SIGTERM)
            self.assertEqual(server.proc.wait(timeout=60), 1)
            elapsed = time.monotonic() - start
            self.assertIn("shutdown overran --drain-timeout", server.read_log())
            self.assertGreaterEqual(elapsed, 1.0 + 5.0 - 0.5)
            self.assertLess(elapsed, 1.0 + 5.0 + 5.0)
            with self.assertRaises(grpc.RpcError):
                h.collect(stalled)

    def test_second_signal_exits_at_once(self):
        tmp = tempfile.mkdtemp()
        self.addCleanup(shutil.rmtree, tmp)
        args = [f"--fault-stall-token={STALL_TOKEN}",
                f"--fault-release-file={os.path.join(tmp, 'never')}", "--drain-timeout=60s",
                "--engine-stall-timeout=300ms"]
        with h.Server(binary=h.SERVER_FAULTS, args=args) as server:
            stalled = server.stub().Generate(h.ids_request([STALL_TOKEN, 5, 9], 4), timeout=120)
            h.wait_until(lambda: "engine loop stalled" in server.read_log(),
                         what="the step to hang")
            server.proc.send_signal(signal.SIGTERM)
            h.wait_until(lambda: "draining" in server.read_log(), what="the drain to start")
            start = time.monotonic()
            server.proc.send_signal(signal.SIGINT)
            self.assertEqual(server.proc.wait(timeout=30), 1)
            self.assertLess(time.monotonic() - start, 5.0)
            self.assertIn("second signal: exiting without draining", server.read_log())
            with self.assertRaises(grpc.RpcError):
                h.collect(stalled)


if __name__ == "__main__":
    unittest.main(verbosity=2)
