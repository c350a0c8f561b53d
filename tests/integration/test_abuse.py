"""Abuse cases: what an attacker or a broken client can do to one server, and that it holds:
hundreds of idle connections, a client that never reads, keepalive ping floods, metadata near
the size limits, many streams on one connection, prompts that would flood the queue, and the
cases an outside probe broke (docs/API.md, "Security"): the metrics port, gzip bombs,
reflection and health streams, header floods, running out of file descriptors, log injection,
clients that never read, 1 MiB text prompts and counts that differ from what clients saw.

The raw HTTP/2 cases use h2probe.py (python3-h2): what grpcio will not do on purpose."""
import concurrent.futures
import os
import re
import resource
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import unittest

import grpc

import h2probe as hp
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
        cut_off = None
        try:
            first = next(silent)  # started; from now on the test does not read it
            self.assertGreater(len(first.token_ids), 0)
        except grpc.RpcError as e:
            # The same outcome, sooner: on a loaded machine the tiny model's ~14 tokens of 20
            # logprobs pass the 4 KiB bound before this client takes even its first message.
            cut_off = e
        # Other streams and the engine loop go on: a full generation completes meanwhile...
        self.generate_ok(200)
        # ...and the silent stream's request was cancelled in the engine once its unsent
        # output passed --max-stream-buffer-bytes: nothing runs, no KV block is held.
        h.wait_until(lambda: idle(self.server), what="the silent stream released")
        if cut_off is None:
            with self.assertRaises(grpc.RpcError) as ctx:
                for _ in silent:
                    pass
            cut_off = ctx.exception
        self.assertEqual(cut_off.code(), grpc.StatusCode.RESOURCE_EXHAUSTED)
        self.assertIn("not reading", cut_off.details())
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


GENERATE = "/dcformer.v1.TextGeneration/Generate"
WATCH = "/grpc.health.v1.Health/Watch"
CHECK = "/grpc.health.v1.Health/Check"
REFLECTION = "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo"
KJV = os.path.join(h.SOURCE_DIR, "models", "dcformer-kjv")
GRPC_UNIMPLEMENTED, GRPC_RESOURCE_EXHAUSTED = 12, 8
# The health service's Watch bounds (server/dcformer_server.cc).
MAX_WATCHERS, MAX_WATCHERS_PER_ADDRESS = 4096, 1024


def pump_all_until(clients, predicate, timeout, what):
    """Reads what arrives on every connection until `predicate()` holds."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        for c in clients:
            c.pump(0.01)


def generate_body(ids, n, **kw):
    return hp.grpc_message(h.ids_request(ids, n, **kw).SerializeToString())


class MetricsPortTest(unittest.TestCase):
    """Issue items 1 and 10: the metrics port answers every request, whatever it is, and no
    client can keep it from others."""

    @classmethod
    def setUpClass(cls):
        cls.server = h.Server().__enter__()

    @classmethod
    def tearDownClass(cls):
        cls.server.__exit__(None, None, None)

    def ask(self, raw):
        return h.http_request(self.server.metrics_port, raw)

    def status(self, raw):
        answer = self.ask(raw)
        return int(answer.split(b" ", 2)[1]) if answer.startswith(b"HTTP/1.") else None

    def test_other_paths_methods_and_malformed_requests_are_answered(self):
        get = lambda path: f"GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode()
        for path in ("/", "/foo", "/metrics/", "/favicon.ico", "//metrics", "/metrics%00",
                     "/" + "a" * 4000):
            with self.subTest(path=path):
                self.assertEqual(self.status(get(path)), 404)
        self.assertEqual(self.status(get("/metrics?x=1")), 200)
        for method in ("POST", "PUT", "DELETE", "OPTIONS", "PATCH", "BREW"):
            with self.subTest(method=method):
                answer = self.ask(f"{method} /metrics HTTP/1.1\r\nHost: x\r\n"
                                  "Content-Length: 0\r\nConnection: close\r\n\r\n".encode())
                self.assertTrue(answer.startswith(b"HTTP/1.1 405"), answer[:80])
                self.assertIn(b"Allow: GET, HEAD", answer)
        head = self.ask(b"HEAD /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        self.assertTrue(head.startswith(b"HTTP/1.1 200"), head[:80])
        self.assertTrue(head.endswith(b"\r\n\r\n"), "HEAD carries no body")
        for raw, expected in ((b"GARBAGE\r\n\r\n", 400), (b"GET\r\n\r\n", 400),
                              (b"GET / HTTP/9.9\r\n\r\n", 400),
                              (b"GET * HTTP/1.1\r\nHost: x\r\n\r\n", 400),
                              (b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n", 400),
                              (b"\x16\x03\x01\x00\xa5\x01\x00\x00\xa1\x03\x03" + bytes(64), 400),
                              (get("/metrics")[:-2] + b"X-Big: " + b"a" * 65536 + b"\r\n\r\n", 431),
                              (b"GET /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 1000000000"
                               b"\r\n\r\n", 413)):
            with self.subTest(raw=raw[:40]):
                self.assertIn(self.status(raw), (expected, 505) if expected == 400 else (expected,))
        # The process lived through all of it and still serves scrapes and calls.
        self.assertIsNone(self.server.proc.poll())
        self.assertEqual(self.server.metric("dcformer_serving"), 1)
        self.assertEqual(self.server.check_health(), h.SERVING)

    def test_slow_clients_do_not_blind_scrapes(self):
        # Connections that drip-feed a request, and ones that send half a request and stop.
        sockets = []
        for i in range(16):
            s = socket.create_connection(("127.0.0.1", self.server.metrics_port), timeout=30)
            s.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n")
            sockets.append(s)
        stop = threading.Event()

        def drip():
            while not stop.is_set():
                for s in sockets[:8]:
                    try:
                        s.sendall(b"X")
                    except OSError:
                        pass
                stop.wait(0.3)

        dripper = threading.Thread(target=drip)
        dripper.start()
        try:
            # Every scrape meanwhile is served at once (the budget is generous for a loaded
            # machine; the old exposer blocked each for ~30 s).
            for _ in range(8):
                start = time.monotonic()
                self.assertGreater(len(self.server.metrics()), 10)
                self.assertLess(time.monotonic() - start, 5.0)
        finally:
            stop.set()
            dripper.join()
        # The server closes each of them once its request deadline passes (10 s).
        for s in sockets:
            s.settimeout(60)
            try:
                self.assertEqual(s.recv(4096), b"")
            except ConnectionResetError:
                pass
            s.close()


class CompressedRequestTest(unittest.TestCase):
    """Item 2: a gzip bomb is refused before it is inflated, key or no key."""

    def test_gzip_bombs_are_refused_unread(self):
        tmp = tempfile.mkdtemp()
        self.addCleanup(shutil.rmtree, tmp)
        key_file = os.path.join(tmp, "keys")
        with open(key_file, "w") as f:
            f.write("the-key\n")
        bomb = hp.grpc_message(hp.gzip_bomb(256 << 20), compressed=True)  # 256 KB -> 256 MiB
        with h.Server(args=[f"--api-key-file={key_file}"]) as server:
            pid = server.proc.pid
            peak_before, cpu_before = h.rss_mib(pid, peak=True), h.cpu_seconds(pid)
            with hp.H2Client(server.port) as client:
                for metadata in ([], [("authorization", "Bearer the-key")]) * 2:
                    client.start_call(GENERATE, bomb,
                                      metadata=[("grpc-encoding", "gzip")] + metadata)
                client.pump_until(client.all_ended, 60, "the compressed calls ended")
                for call in client.calls.values():
                    self.assertEqual(call.status, GRPC_UNIMPLEMENTED, call.message)
                    self.assertIn("gzip", call.message)
            # Nothing was inflated: the peak grew by far less than one bomb.
            self.assertLess(h.rss_mib(pid, peak=True) - peak_before, 64 + h.RSS_SLACK_MIB)
            self.assertLess(h.cpu_seconds(pid) - cpu_before, 1.0 * h.CPU_FACTOR)
            stub = server.stub()
            tokens, _ = h.collect(stub.Generate(h.ids_request(PROMPT, 2), timeout=30,
                                                metadata=[("authorization", "Bearer the-key")]))
            self.assertEqual(len(tokens), 2)


class StreamBoundsTest(unittest.TestCase):
    """Item 3: reflection is off unless asked for and costs a bounded number of threads;
    health Watch streams and streams per connection are bounded."""

    def test_reflection_is_off_by_default(self):
        with h.Server() as server, hp.H2Client(server.port) as client:
            client.start_call(REFLECTION, hp.grpc_message(b"\x3a\x00"))
            client.pump_until(client.all_ended, 30, "the reflection call ended")
            self.assertEqual(next(iter(client.calls.values())).status, GRPC_UNIMPLEMENTED)
            self.assertEqual(client.conn.remote_settings.max_concurrent_streams, 256)

    def test_reflection_streams_cost_bounded_threads(self):
        with h.Server(args=["--reflection"]) as server:
            pid = server.proc.pid
            threads_before = h.thread_count(pid)
            clients = [hp.H2Client(server.port) for _ in range(8)]
            try:
                for c in clients:
                    for _ in range(200):  # open reflection streams that never end
                        c.start_call(REFLECTION, hp.grpc_message(b"\x3a\x00"), end_stream=False)
                refused = lambda: sum(x.status == GRPC_RESOURCE_EXHAUSTED
                                      for c in clients for x in c.calls.values())
                deadline = time.monotonic() + 60
                while refused() < 1000 and time.monotonic() < deadline:
                    for c in clients:
                        c.pump(0.05)
                # 1,600 streams: the few that got a thread of the capped pool are open, the
                # rest were refused (the old server made a thread for each).
                self.assertGreaterEqual(refused(), 1000)
                self.assertLess(h.thread_count(pid), threads_before + 40)
            finally:
                for c in clients:
                    c.close()
            self.assertEqual(server.check_health(), h.SERVING)

    def test_health_watch_streams_are_bounded(self):
        with h.Server() as server:
            pid = server.proc.pid
            rss_before = h.rss_mib(pid)
            clients = [hp.H2Client(server.port) for _ in range(10)]
            try:
                for c in clients:
                    for _ in range(200):
                        c.start_call(WATCH, hp.grpc_message(b""))
                calls = [x for c in clients for x in c.calls.values()]
                # 2,000 streams from one address: at most 1024 stay open; each newer one
                # closed the address's oldest, with UNIMPLEMENTED (client-side health checking
                # reads that as "treat the server as healthy").
                pump_all_until(clients, lambda: sum(x.ended for x in calls) >= 2000 - 1024
                               and all(x.ended or x.headers for x in calls),
                               60, "the oldest Watch streams closed")
                still_open = [x for x in calls if not x.ended]
                self.assertEqual(len(still_open), MAX_WATCHERS_PER_ADDRESS)
                for x in calls:
                    if x.ended:
                        self.assertEqual(x.status, GRPC_UNIMPLEMENTED, x.message)
                        self.assertIn("health Check still answers", x.message)
                self.assertLess(h.rss_mib(pid) - rss_before, 64 + h.RSS_SLACK_MIB)
                self.assertEqual(server.check_health(), h.SERVING)
            finally:
                for c in clients:
                    c.close()

    def test_one_connection_keeps_all_its_watch_streams(self):
        # Behind a proxy many clients share one upstream connection (the old bound, 16 per
        # connection, refused the 17th client's health check): a connection's 256 streams
        # (--max-concurrent-streams) are all served.
        with h.Server() as server, hp.H2Client(server.port) as client:
            for _ in range(256):
                client.start_call(WATCH, hp.grpc_message(b""))
            client.pump_until(lambda: all(x.headers for x in client.calls.values()), 60,
                              "every Watch stream answered")
            client.pump(0.2)
            self.assertEqual([x.status for x in client.calls.values() if x.ended], [])
            self.assertEqual(sum(x.data > 0 for x in client.calls.values()), 256)

    def test_watch_flood_does_not_fail_client_health_checks(self):
        # 260 connections from five addresses, 16 Watch streams each: more than the 4096 the
        # server keeps. A client with the documented service config (round_robin +
        # healthCheckConfig) then connects: its health check stream gets in (the heaviest
        # address made room), so its calls go through instead of failing UNAVAILABLE "health
        # check call failed" (as with the old bound, which refused the newcomer).
        with open(os.path.join(h.SOURCE_DIR, "deploy", "client", "service-config.json")) as f:
            config = f.read()
        with h.Server() as server:
            clients = [hp.H2Client(server.port, source=f"127.0.0.{1 + i % 5}")
                       for i in range(260)]
            try:
                for c in clients:
                    for _ in range(16):
                        c.start_call(WATCH, hp.grpc_message(b""))
                calls = [x for c in clients for x in c.calls.values()]
                pump_all_until(clients, lambda: all(x.ended or x.headers for x in calls)
                               and sum(x.ended for x in calls) >= len(calls) - MAX_WATCHERS,
                               120, "the flood trimmed to the bound")
                with grpc.insecure_channel(server.target, options=[
                        ("grpc.service_config", config)] + OWN_CONNECTION) as ch:
                    stub = h.pb_grpc.TextGenerationStub(ch)
                    for _ in range(3):
                        tokens, _ = h.collect(stub.Generate(h.ids_request(PROMPT, 4),
                                                            timeout=30))
                        self.assertEqual(len(tokens), 4)
                    # Its stream took the place of the oldest of one flooding address.
                    pump_all_until(clients,
                                   lambda: sum(not x.ended for x in calls) <= MAX_WATCHERS - 1,
                                   30, "a flood stream closed for the client's")
                    self.assertEqual(sum(not x.ended for x in calls), MAX_WATCHERS - 1)
                self.assertTrue(all(x.status == GRPC_UNIMPLEMENTED for x in calls if x.ended))
            finally:
                for c in clients:
                    c.close()


class HeaderFloodTest(unittest.TestCase):
    """Item 4: a header block that never ends. gRPC 1.51 bounds it by nothing (docs/API.md,
    "Security": put an HTTP/2-terminating proxy in front); what the server itself guarantees
    is that the flood's connection does not stop the others."""

    def test_continuation_flood_does_not_stop_other_clients(self):
        import hpack
        with h.Server() as server:
            flood = hp.H2Client(server.port)
            block = hpack.Encoder().encode([(":method", "POST"), (":scheme", "http"),
                                            (":path", GENERATE), (":authority", "x"),
                                            ("content-type", "application/grpc")])
            # A literal header whose 64 MiB value never arrives: 4 MiB of it is sent.
            flood.sock.sendall(hp.raw_frame(hp.HEADERS, 0, 1, block + b"\x00\x07x-flood\x7f"
                                            + bytes([0x81, 0x80, 0x80, 0x20])))
            for _ in range(256):
                flood.sock.sendall(hp.raw_frame(hp.CONTINUATION, 0, 1, b"a" * 16384))
            stub = server.stub(options=OWN_CONNECTION)
            for _ in range(3):
                tokens, final = h.collect(stub.Generate(h.ids_request(PROMPT, 8), timeout=60))
                self.assertEqual(len(tokens), 8)
            self.assertEqual(server.check_health(), h.SERVING)
            flood.close()

    def test_the_proxy_example_bounds_header_floods(self):
        # What docs/API.md tells internet-facing deployments to put in front (deploy/proxy/).
        import yaml
        with open(os.path.join(h.SOURCE_DIR, "deploy", "proxy", "envoy.yaml")) as f:
            objects = {o["kind"]: o for o in yaml.safe_load_all(f)}
        envoy = yaml.safe_load(objects["ConfigMap"]["data"]["envoy.yaml"])
        listener = envoy["static_resources"]["listeners"][0]
        hcm = listener["filter_chains"][0]["filters"][0]["typed_config"]
        self.assertLessEqual(hcm["max_request_headers_kb"], 64)
        self.assertEqual(hcm["http2_protocol_options"]["max_concurrent_streams"], 256)
        self.assertIn("stream_idle_timeout", hcm)
        monitors = envoy["overload_manager"]["resource_monitors"]
        self.assertGreater(monitors[0]["typed_config"]["max_active_downstream_connections"], 0)
        prefixes = [r["match"]["prefix"] for r in hcm["route_config"]["virtual_hosts"][0]["routes"]]
        self.assertNotIn("/grpc.reflection.v1alpha.ServerReflection/", prefixes)
        pod = objects["Deployment"]["spec"]["template"]["metadata"]["labels"]
        self.assertEqual(pod["dcformer.io/client"], "true")  # admitted by the NetworkPolicy


class FileDescriptorTest(unittest.TestCase):
    """Item 5: the open-file limit is raised to the hard limit; when gRPC's listener stops
    accepting anyway, health says so and the process exits non-zero (to be restarted)."""

    def start(self, soft, hard, args=()):
        port, metrics_port = h.free_ports(2)
        log = tempfile.NamedTemporaryFile(prefix="dcformer-server-fd-", suffix=".log",
                                          delete=False)
        self.addCleanup(os.unlink, log.name)
        proc = subprocess.Popen(
            [h.SERVER, f"--model={h.SHORT_MODEL}", "--host=127.0.0.1", f"--port={port}",
             f"--metrics-port={metrics_port}", "--kv-cache-bytes=16000000", *args],
            stdout=log, stderr=subprocess.STDOUT,
            env=dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1"),
            preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard)))
        log.close()  # the server has its own descriptor

        def stop():
            if proc.poll() is None:
                proc.kill()
            proc.wait()
        self.addCleanup(stop)
        server = h.Server.__new__(h.Server)
        server.port, server.metrics_port, server.proc, server.tls_ca = port, metrics_port, proc, None
        server.log = log  # Server.read_log reads the file by its name
        server.wait_serving()
        return server

    def flood(self, server, n):
        sockets = []
        for _ in range(n):
            try:
                sockets.append(socket.create_connection(("127.0.0.1", server.port), timeout=10))
            except OSError:
                break
        return sockets

    def test_soft_limit_is_raised(self):
        server = self.start(200, 4096)
        with open(f"/proc/{server.proc.pid}/limits") as f:
            limits = [line for line in f if line.startswith("Max open files")][0].split()
        self.assertEqual(limits[3:5], ["4096", "4096"])
        sockets = self.flood(server, 400)
        try:
            self.assertEqual(len(h.collect(server.stub(options=OWN_CONNECTION).Generate(
                h.ids_request(PROMPT, 2), timeout=30))[0]), 2)
        finally:
            for s in sockets:
                s.close()

    def test_idle_http_clients_cannot_take_every_descriptor(self):
        # Probe 4: with 1,024 descriptors, 1,000 idle keep-alive clients of the OpenAI port
        # (whose cap, --max-open-streams + 256, lay past the limit) left none for the
        # self-check's own socket, which then ended the process. The HTTP listeners' caps now
        # fit the limit: idle clients are evicted, gRPC and the self-check keep theirs.
        http_port = h.free_port()
        server = self.start(200, 200, [f"--http-port={http_port}", "--self-check-interval=300ms"])
        held = []
        try:
            for port in [http_port] * 300 + [server.metrics_port] * 100:
                try:
                    s = socket.create_connection(("127.0.0.1", port), timeout=10)
                    s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n" if port == http_port
                              else b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
                    s.recv(64)
                    held.append(s)
                except OSError:
                    pass  # closed to make room: what the cap does
            time.sleep(2)  # six self-checks
            self.assertIsNone(server.proc.poll(), server.read_log()[-3000:])
            self.assertEqual(len(h.collect(server.stub(options=OWN_CONNECTION).Generate(
                h.ids_request(PROMPT, 2), timeout=30))[0]), 2)
            self.assertEqual(server.check_health(), h.SERVING)
            log = server.read_log()
            self.assertIn("http: at most 18 connections (not 1280)", log)
            self.assertIn("metrics: at most 4 connections (not 256)", log)
            self.assertNotIn("self-check 1/", log)
        finally:
            for s in held:
                s.close()

    # UndefinedBehaviorSanitizer's vptr check reads a vtable it has not cached through
    # IsAccessibleMemoryRange, which needs a pipe: in a process with no file descriptor left
    # the pipe fails and a valid virtual call is reported as "invalid vptr" (shown with a
    # 10-line program: fds exhausted, then a first virtual call on a new type). This test
    # exhausts the server's descriptors on purpose, so under the sanitizers an attempt that
    # ends in exactly that report, after gRPC's EMFILE, is the sanitizer's and is run again
    # (up to 3 attempts); any other report fails (scripts/sanitizers.sh: a UBSan report aborts,
    # so it cannot pass for the exit 1 this test expects).
    SANITIZER_NO_FD = re.compile(
        r"runtime error: (?:member call on|member access within|downcast of|upcast of|"
        r"cast to virtual base of|dynamic operation on) address 0x[0-9a-f]+ which does not "
        r"point to an object of type '[^']+'")

    @classmethod
    def sanitizer_without_descriptors(cls, log):
        """Whether `log` ends in the vptr check's false report for want of a descriptor."""
        return (h.SANITIZED and "Too many open files" in log and cls.SANITIZER_NO_FD.search(log)
                and "object has invalid vptr" in log and "<memory cannot be printed>" in log)

    def test_listener_that_stops_accepting_ends_the_process(self):
        for attempt in range(3):
            server = self.start(200, 200, ["--self-check-interval=500ms"])
            sockets = self.flood(server, 400)
            for s in sockets:
                s.close()
            code = server.proc.wait(timeout=60)
            log = server.read_log()
            if not self.sanitizer_without_descriptors(log):
                break
            print(f"attempt {attempt + 1}: the sanitizer's vptr check had no descriptor for "
                  f"its pipe (exit {code}); again", file=sys.stderr)
        # The log's end says why when the exit is not the one expected (a sanitizer's report).
        self.assertEqual(code, 1, log[-6000:])
        self.assertIn("NOT_SERVING", log)
        self.assertIn("accepts no new connections", log)


class RequestIdLogTest(unittest.TestCase):
    """Item 6: only validated request ids reach the log, quoted when they hold more than
    [A-Za-z0-9._:/@+-]."""

    def test_request_ids_cannot_forge_log_lines(self):
        with h.Server() as server:
            stub = server.stub()
            forged = "x\n2026-01-01T00:00:00.000Z INFO generate_reactor.cc:1] request id=forged " \
                     "outcome=length\x1b[31m"
            for request_id in (forged, "z" * 200_000):
                with self.assertRaises(grpc.RpcError) as ctx:
                    h.collect(stub.Generate(h.ids_request(PROMPT, 2, request_id=request_id),
                                            timeout=30))
                self.assertEqual(ctx.exception.code(), grpc.StatusCode.INVALID_ARGUMENT)
            tokens, _ = h.collect(stub.Generate(
                h.ids_request(PROMPT, 2, request_id='my"id=x'), timeout=30))
            self.assertEqual(len(tokens), 2)
            h.wait_until(lambda: server.read_log().count("request id=") >= 3, what="log lines")
            log = server.read_log()
        self.assertNotIn("forged", log)
        self.assertNotIn("\x1b", log)
        self.assertLess(max(len(line) for line in log.splitlines()), 2000)
        self.assertEqual(log.count("request id=- outcome=invalid_argument"), 2)
        self.assertIn('request id="my\\"id=x" outcome=length', log)


class GrpcLogTest(unittest.TestCase):
    """gRPC 1.51 logs an invalid header value verbatim ("Error parsing metadata ... value=..."):
    through the server's gRPC log sink (proto/rpc/grpc_log.h) such a line is escaped, so a client can
    neither forge a log line nor send escape codes, and rate-limited per call site, so a flood
    of such calls cannot flood the log."""

    FORGED = (b"X\n2026-01-01T00:00:00.000Z INFO generate_reactor.cc:372] request id=FORGED "
              b"outcome=eos \x1b[31m")

    def test_forged_header_values_stay_escaped_and_floods_are_rate_limited(self):
        with h.Server() as server:
            calls = 0
            for i in range(100):  # gRPC ends a connection after a few such calls: one each
                with hp.H2Client(server.port) as c:
                    c.conn.config.validate_outbound_headers = False
                    c.conn.config.normalize_outbound_headers = False
                    header = ("grpc-timeout", "te", "content-type")[i % 3]
                    c.start_call(CHECK, hp.grpc_message(b""),
                                 metadata=[(header.encode(), self.FORGED)])
                    c.pump_until(lambda: c.closed or c.all_ended(), 30, "the call ending")
                    calls += 1
            self.assertEqual(server.check_health(), h.SERVING)
            log = server.read_log()
        parse_errors = [line for line in log.splitlines()
                        if "] gRPC: Error parsing metadata" in line]
        # The header's value is in the line, escaped: \x0a for the newline, \x1b for ESC.
        self.assertIn("value=X\\x0a2026-01-01T00:00:00.000Z INFO generate_reactor.cc:372] "
                      "request id=FORGED outcome=eos \\x1b[31m", parse_errors[0])
        self.assertNotIn("\x1b", log)
        for line in log.splitlines():  # every line is one the server wrote
            self.assertRegex(line, r"^\d{4}-\d\d-\d\dT[\d:.]+Z [A-Z]+ \S+:\d+\] ")
        # A burst of 10 from the parser's call site, then one per 6 s, however many calls.
        self.assertEqual(calls, 100)
        self.assertGreaterEqual(len(parse_errors), 10)
        self.assertLess(len(parse_errors), 20, "\n".join(parse_errors))


class NeverReadingClientTest(unittest.TestCase):
    """Item 7: a client with a zero flow-control window that never opens it: its calls end
    (RESOURCE_EXHAUSTED) by the write-stall timeout or the stream-buffer bound, and the
    number of open streams is capped."""

    def test_stalled_writes_end_the_calls(self):
        with h.Server(args=["--write-stall-timeout=2s"]) as server:
            with hp.H2Client(server.port, initial_window=0, read_data=False) as client:
                for _ in range(100):
                    client.start_call(GENERATE, generate_body(PROMPT, 16))
                client.pump_until(client.all_ended, 60, "every stalled call ended")
                for call in client.calls.values():
                    self.assertEqual(call.status, GRPC_RESOURCE_EXHAUSTED, call.message)
                    self.assertIn("--write-stall-timeout", call.message)
                    self.assertEqual(call.data, 0)
            h.wait_until(lambda: server.metric("dcformer_requests_total",
                                               outcome="resource_exhausted") == 100,
                         what="the stalled calls counted")
            h.wait_until(lambda: idle(server), what="nothing left in the engine")

    def test_overflow_ends_the_call_at_once(self):
        with h.Server(args=["--max-stream-buffer-bytes=2048", "--write-stall-timeout=600s"]) \
                as server:
            with hp.H2Client(server.port, initial_window=0, read_data=False) as client:
                request = h.ids_request(PROMPT, 200)
                request.output.top_logprobs = 20
                client.start_call(GENERATE, hp.grpc_message(request.SerializeToString()))
                client.pump_until(client.all_ended, 60, "the overflowed call ended")
                call = next(iter(client.calls.values()))
                self.assertEqual(call.status, GRPC_RESOURCE_EXHAUSTED)
                self.assertIn("--max-stream-buffer-bytes", call.message)
            h.wait_until(lambda: idle(server), what="nothing left in the engine")

    def test_open_streams_are_capped(self):
        with h.Server(args=["--max-open-streams=20", "--write-stall-timeout=600s"]) as server:
            with hp.H2Client(server.port, initial_window=0, read_data=False) as client:
                for _ in range(30):
                    client.start_call(GENERATE, generate_body(PROMPT, 4))
                client.pump_until(
                    lambda: sum(c.ended for c in client.calls.values()) >= 10, 60,
                    "the calls past the cap refused")
                refused = [c for c in client.calls.values() if c.ended]
                self.assertEqual(len(refused), 10)
                for call in refused:
                    self.assertEqual(call.status, GRPC_RESOURCE_EXHAUSTED)
                    self.assertIn("--max-open-streams", call.message)


class StreamShareTest(unittest.TestCase):
    """Review finding 6: streams of clients that never open their window cannot lock others
    out: one address holds at most --max-open-streams-per-peer (256) of --max-open-streams
    (1024), a stream whose first message cannot leave ends after --first-write-timeout (5 s),
    and only admitted calls take a slot."""

    def test_one_address_cannot_take_every_stream(self):
        with h.Server(args=["--max-queued-requests=2048"]) as server:
            attackers = [hp.H2Client(server.port, initial_window=0, read_data=False)
                         for _ in range(5)]
            try:
                for c in attackers:
                    for _ in range(256):
                        c.start_call(GENERATE, generate_body(PROMPT, 1))
                calls = [x for c in attackers for x in c.calls.values()]
                pump_all_until(attackers, lambda: sum(x.ended for x in calls) >= 1280 - 256, 60,
                               "the streams past the address's share refused")
                refused = [x for x in calls if x.ended]
                self.assertEqual(len(refused), 1280 - 256)
                for x in refused:
                    self.assertEqual(x.status, GRPC_RESOURCE_EXHAUSTED, x.message)
                    self.assertIn("--max-open-streams-per-peer", x.message)
                # Another address is served meanwhile.
                with hp.H2Client(server.port, source="127.0.0.2") as client:
                    for _ in range(10):
                        client.start_call(GENERATE, generate_body(PROMPT, 4))
                    client.pump_until(client.all_ended, 60, "the other address's calls")
                    for x in client.calls.values():
                        self.assertEqual(x.status, 0, x.message)
                        self.assertEqual(response_tokens(x), self.expected4)
                # The address's own streams end once their first message could not leave.
                admitted = [x for x in calls if not x.ended]
                pump_all_until(attackers, lambda: all(x.ended for x in admitted), 60,
                               "the never-reading streams ended")
                for x in admitted:
                    self.assertEqual(x.status, GRPC_RESOURCE_EXHAUSTED, x.message)
                    self.assertIn("its first message was not sent within 5s "
                                  "(--first-write-timeout)", x.message)
            finally:
                for c in attackers:
                    c.close()

    def test_streams_at_the_cap_free_their_slots_soon(self):
        # Five addresses fill --max-open-streams (1024) with never-reading streams: new calls
        # are refused while it is full, but only until the first-write timeout ends them
        # (the old server kept the slots for --write-stall-timeout, 30 s).
        with h.Server(args=["--max-queued-requests=2048"]) as server:
            attackers = [hp.H2Client(server.port, initial_window=0, read_data=False,
                                     source=f"127.0.0.{1 + i}") for i in range(5)]
            try:
                for c in attackers:
                    for _ in range(256):
                        c.start_call(GENERATE, generate_body(PROMPT, 1))
                calls = [x for c in attackers for x in c.calls.values()]
                pump_all_until(attackers, lambda: sum(x.ended for x in calls) >= 1280 - 1024,
                               60, "the streams past the cap refused")
                for x in calls:
                    if x.ended:
                        self.assertEqual(x.status, GRPC_RESOURCE_EXHAUSTED, x.message)
                        self.assertIn("1024 Generate streams are open", x.message)
                admitted = [x for x in calls if not x.ended]
                pump_all_until(attackers, lambda: all(x.ended for x in calls), 60,
                               "the never-reading streams ended")
                for x in admitted:
                    self.assertIn("(--first-write-timeout)", x.message)
                stub = server.stub(options=OWN_CONNECTION)
                tokens, _ = h.collect(stub.Generate(h.ids_request(PROMPT, 4), timeout=30))
                self.assertEqual(tokens, self.expected4)
                h.wait_until(lambda: server.metric("dcformer_requests_total",
                                                   outcome="resource_exhausted") == 1280, 30,
                             "every refused and ended stream counted")
            finally:
                for c in attackers:
                    c.close()

    @classmethod
    def setUpClass(cls):
        with h.Server() as server:
            cls.expected4 = h.collect(server.stub().Generate(h.ids_request(PROMPT, 4),
                                                             timeout=60))[0]


def response_tokens(call):
    """The token ids of every complete GenerateResponse a raw call received."""
    out = []
    for m in call.messages():
        out.extend(h.pb.GenerateResponse.FromString(m).token_ids)
    return out


def log_line(server, request_id):
    lines = [x for x in server.read_log().splitlines() if f"request id={request_id} " in x]
    return lines[-1] if lines else None


class SlowReaderTest(unittest.TestCase):
    """Review findings 7 and 8: --write-stall-timeout is a minimum reading rate (messages are
    at most 16 KiB), tokens count when the client was sent them, and a call the client
    cancels while its final message waits is counted as cancelled."""

    def read_paced(self, client, sid, rate, stop_after=None, timeout=120):
        """Acknowledges what arrives on `sid` at `rate` bytes/s (in 50 ms steps) until the
        call ends; with `stop_after`, stops acknowledging after that many bytes."""
        call = client.calls[sid]
        acked = 0
        step = rate // 20
        next_ack = time.monotonic()
        deadline = next_ack + timeout
        while not call.ended:
            self.assertLess(time.monotonic(), deadline, "the paced call never ended")
            client.pump(0.01)
            if time.monotonic() < next_ack:
                continue
            next_ack += 0.05  # the client's pace, not synchronisation
            n = min(step, call.data - acked)
            if stop_after is not None:
                n = min(n, stop_after - acked)
            if n > 0:
                try:
                    client.conn.acknowledge_received_data(n, sid)
                    client.flush()
                except Exception:  # the stream closed meanwhile
                    pass
                acked += n
        return call

    def test_a_slow_steady_reader_is_served_in_full(self):
        # 200 tokens with 20 alternatives each (~50 KB) to a client that takes 8 KB/s, with a
        # 3 s stall bound: each message (<= 16 KiB) leaves within it. The old server put
        # everything generated meanwhile into its second message (~50 KB, 6 s at that rate)
        # and cut the client off.
        with h.Server(args=["--write-stall-timeout=3s"]) as server:
            request = h.ids_request(PROMPT, 200, request_id="steady")
            request.output.top_logprobs = 20
            with hp.H2Client(server.port, initial_window=4096, read_data=False) as client:
                sid = client.start_call(GENERATE, hp.grpc_message(request.SerializeToString()))
                call = self.read_paced(client, sid, rate=8000)
            self.assertEqual(call.status, 0, call.message)
            messages = call.messages()
            self.assertEqual(len(response_tokens(call)), 200)
            self.assertLessEqual(max(len(m) for m in messages), 16384 + 512)
            h.wait_until(lambda: log_line(server, "steady"), 30, "the call's log line")
            self.assertIn("outcome=length", log_line(server, "steady"))
            self.assertIn("generated_tokens=200 ", log_line(server, "steady"))

    def test_tokens_count_when_the_client_was_sent_them(self):
        # The client reads 20 KB and then stops: the call ends at the stall bound, and the
        # tokens it counts and logs are the ones of the messages that reached the client.
        with h.Server(args=["--write-stall-timeout=2s"]) as server:
            request = h.ids_request(PROMPT, 200, request_id="stopped")
            request.output.top_logprobs = 20
            with hp.H2Client(server.port, initial_window=4096, read_data=False) as client:
                sid = client.start_call(GENERATE, hp.grpc_message(request.SerializeToString()))
                call = self.read_paced(client, sid, rate=20000, stop_after=20000)
            self.assertEqual(call.status, GRPC_RESOURCE_EXHAUSTED, call.message)
            received = len(response_tokens(call))
            self.assertGreater(received, 0)
            self.assertLess(received, 200)
            h.wait_until(lambda: log_line(server, "stopped"), 30, "the call's log line")
            self.assertIn(f"generated_tokens={received} ", log_line(server, "stopped"))
            self.assertEqual(server.metric("dcformer_generation_tokens_total"), received)

    def test_cancel_while_the_final_message_waits_counts_as_cancelled(self):
        # One-token calls whose only (final) message waits for a window the client never
        # opens; the client cancels them. They count as cancelled with 0 tokens sent, not as
        # finished (the old server counted each as outcome="length").
        with h.Server(args=["--write-stall-timeout=600s"]) as server:
            with hp.H2Client(server.port, initial_window=0, read_data=False) as client:
                sids = [client.start_call(GENERATE,
                                          generate_body(PROMPT, 1, request_id=f"final-{i}"))
                        for i in range(10)]
                # The final message's write has started once the response headers arrive:
                # HEADERS are not flow-controlled, its DATA waits for the window.
                client.pump_until(lambda: all(client.calls[s].headers for s in sids), 60,
                                  "the final writes started")
                self.assertEqual(sum(client.calls[s].data for s in sids), 0)
                for s in sids:
                    client.reset(s)
                h.wait_until(lambda: server.metric("dcformer_requests_total",
                                                   outcome="cancelled") == 10, 30,
                             "the cancelled calls counted")
            self.assertEqual(server.metric("dcformer_requests_total", outcome="length"), 0)
            self.assertEqual(server.metric("dcformer_generation_tokens_total"), 0)
            for i in range(10):
                line = log_line(server, f"final-{i}")
                self.assertIn("outcome=cancelled", line)
                self.assertIn("generated_tokens=0 ", line)


class UnauthenticatedMessageTest(unittest.TestCase):
    """Review finding 2: gRPC 1.51 holds a request message in full before any check (the API
    key's included), whatever length it declares: --grpc-memory-limit-bytes (gRPC's resource
    quota) bounds what unauthenticated clients can make it hold."""

    def test_messages_that_never_end_are_bounded(self):
        tmp = tempfile.mkdtemp()
        self.addCleanup(shutil.rmtree, tmp)
        key_file = os.path.join(tmp, "keys")
        with open(key_file, "w") as f:
            f.write("the-key\n")
        limit_mib = 128
        with h.Server(args=[f"--api-key-file={key_file}",
                            f"--grpc-memory-limit-bytes={limit_mib << 20}"]) as server:
            pid = server.proc.pid
            peak_before = h.rss_mib(pid, peak=True)
            declared = 16 << 20
            body = hp.grpc_message(bytes(declared))[:-1]  # all of it but the last byte
            clients = [hp.H2Client(server.port) for _ in range(4)]
            try:
                streams = []
                for c in clients:
                    for _ in range(16):
                        streams.append([c, c.start_call(GENERATE, b"", end_stream=False), 0])
                # 1 GiB declared, no key: send what the server's windows allow until it takes
                # no more for 2 s.
                last_progress = time.monotonic()
                while time.monotonic() - last_progress < 2:
                    for st in streams:
                        n = st[0].send_while_allowed(st[1], body[st[2]:st[2] + (1 << 20)])
                        st[2] += n
                        if n:
                            last_progress = time.monotonic()
                    for c in clients:
                        c.pump(0.005)
                grown = h.rss_mib(pid, peak=True) - peak_before
                ended = sum(st[0].calls[st[1]].ended for st in streams)
                sent = sum(st[2] for st in streams)
                seen = (f"peak RSS grew {grown:.0f} MiB, {ended} of {len(streams)} streams "
                        f"ended, {sent / 2**20:.0f} MiB sent")
                # Measured: 141-206 MiB (1.1-1.6 times the limit; the quota is enforced by
                # cancelling streams, which lags the reads), 390-430 MiB sent, 57 streams
                # ended. The old server held all that was sent (1 GiB declared).
                if not h.RSS_SLACK_MIB:
                    # Under ASan the quarantine and redzones of gRPC's buffers grow with the
                    # bytes received (680 MiB measured): the plain build's run holds the bound.
                    self.assertLess(grown, 3 * limit_mib + 64, seen)
                self.assertGreater(ended, 0, seen)
                self.assertGreater(sent, 2 * (limit_mib << 20), seen)
                # Calls with the key are served meanwhile. While the flood keeps the quota
                # full, gRPC 1.51 reclaims memory by cancelling a random stream of a
                # connection ("Buffers full", RESOURCE_EXHAUSTED), which can be the keyed
                # one: a client retries RESOURCE_EXHAUSTED, and so does this one (twice).
                stub = server.stub(options=OWN_CONNECTION)
                for attempt in range(3):
                    try:
                        tokens, _ = h.collect(stub.Generate(
                            h.ids_request(PROMPT, 4), timeout=30,
                            metadata=[("authorization", "Bearer the-key")]))
                        break
                    except grpc.RpcError as e:
                        if e.code() != grpc.StatusCode.RESOURCE_EXHAUSTED or attempt == 2:
                            raise AssertionError(f"keyed call failed: {e.code()} "
                                                 f"{e.details()} ({seen})") from e
                        time.sleep(0.2)
                self.assertEqual(len(tokens), 4, seen)
            finally:
                for c in clients:
                    c.close()


class TextPromptTest(unittest.TestCase):
    """Item 9: a text prompt far over the prompt limit is refused without being encoded."""

    def test_megabyte_prompts_cost_little(self):
        with h.Server(model=KJV) as server:
            stub = server.stub()
            pid = server.proc.pid
            cpu_before = h.cpu_seconds(pid)
            for text in ("a" * ((1 << 20) - 100), ("And God said, Let there be light. " * 40000)
                         [:(1 << 20) - 100]):
                for _ in range(20):
                    request = h.pb.GenerateRequest(text=text)
                    request.stopping.max_new_tokens = 4
                    with self.assertRaises(grpc.RpcError) as ctx:
                        h.collect(stub.Generate(request, timeout=60))
                    self.assertEqual(ctx.exception.code(), grpc.StatusCode.OUT_OF_RANGE)
                    self.assertIn("prompt.text: encodes to more than", ctx.exception.details())
            # 40 prompts: well under 20 ms of server CPU each (encoding one took ~50 ms).
            self.assertLess(h.cpu_seconds(pid) - cpu_before, 0.8 * h.CPU_FACTOR)
            # A prompt within the limit is still encoded exactly as Tokenize does.
            ids = stub.Tokenize(h.pb.TokenizeRequest(text="And God said"), timeout=30).token_ids
            request = h.pb.GenerateRequest(text="And God said")
            request.stopping.max_new_tokens = 1
            _, final = h.collect(stub.Generate(request, timeout=60))
            self.assertEqual(final.usage.prompt_tokens, len(ids))


class CountsTest(unittest.TestCase):
    """Item 11: calls are counted with the status their client saw."""

    def test_oversized_responses_and_requests_are_counted(self):
        with h.Server(model=KJV, args=["--max-send-message-bytes=65536",
                                       "--max-stream-buffer-bytes=16384"]) as server:
            stub = server.stub()
            with self.assertRaises(grpc.RpcError) as ctx:
                stub.Detokenize(h.pb.DetokenizeRequest(token_ids=[300] * 40000), timeout=30)
            self.assertEqual(ctx.exception.code(), grpc.StatusCode.RESOURCE_EXHAUSTED)
            self.assertIn("--max-send-message-bytes", ctx.exception.details())
            self.assertEqual(server.metric("dcformer_unary_requests_total", method="Detokenize",
                                           outcome="resource_exhausted"), 1)
            self.assertEqual(server.metric("dcformer_unary_requests_total", method="Detokenize",
                                           outcome="ok"), 0)
            # Just over the 1 MiB limit (within gRPC's 64 KiB margin): the service refuses,
            # counts and logs it.
            big = h.ids_request([300] * 530_000, 1)
            self.assertGreater(big.ByteSize(), 1_048_576)
            self.assertLess(big.ByteSize(), 1_048_576 + 65_536)
            with self.assertRaises(grpc.RpcError) as ctx:
                h.collect(stub.Generate(big, timeout=30))
            self.assertEqual(ctx.exception.code(), grpc.StatusCode.RESOURCE_EXHAUSTED)
            self.assertIn("--max-receive-message-bytes", ctx.exception.details())
            h.wait_until(lambda: server.metric("dcformer_requests_total",
                                               outcome="resource_exhausted") == 1,
                         what="the oversized request counted")
            self.assertIn("outcome=resource_exhausted", server.read_log())
            # Past the margin gRPC refuses it itself (it never holds more than limit + 64 KiB
            # of one message), unseen by the service.
            with self.assertRaises(grpc.RpcError) as ctx:
                h.collect(stub.Generate(h.ids_request([300] * 600_000, 1), timeout=30))
            self.assertEqual(ctx.exception.code(), grpc.StatusCode.RESOURCE_EXHAUSTED)


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
