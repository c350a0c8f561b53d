"""Shared helpers of the integration tests: a real dcformer-server process on loopback.

Paths come from the environment CTest sets (see CMakeLists.txt): DCF_BIN_DIR (server, CLI,
dcformer-generate), DCF_PY_DIR (generated *_pb2 modules), DCF_SOURCE_DIR (repo root).

Synchronisation never sleeps for a fixed time: readiness uses the health Watch stream, and
state checks poll /metrics or the process until a condition holds or a deadline passes.
"""
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request

SOURCE_DIR = os.environ.get("DCF_SOURCE_DIR",
                            os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..")))
BIN_DIR = os.environ.get("DCF_BIN_DIR", os.path.join(SOURCE_DIR, "build", "bin"))
PY_DIR = os.environ.get("DCF_PY_DIR", os.path.join(SOURCE_DIR, "build", "python"))
sys.path.insert(0, PY_DIR)

import grpc  # noqa: E402
from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

from dcformer.v1 import dcformer_pb2 as pb  # noqa: E402,F401
from dcformer.v1 import dcformer_pb2_grpc as pb_grpc  # noqa: E402
import health_pb2  # noqa: E402
import health_pb2_grpc  # noqa: E402

GOLDEN_DIR = os.path.join(SOURCE_DIR, "tests", "data", "golden")
SHORT_MODEL = os.path.join(GOLDEN_DIR, "dcformer-f32-short-prompt")
# DCF_SERVER runs the tests against another build of the server (say, the one before a fix).
SERVER = os.environ.get("DCF_SERVER") or os.path.join(BIN_DIR, "dcformer-server")
# The same server with test-only fault injection (tests/testing/fault_injecting_backend.h).
SERVER_FAULTS = os.path.join(BIN_DIR, "dcformer-server-faults")
CLI = os.path.join(BIN_DIR, "dcformer-cli")
GENERATE = os.path.join(BIN_DIR, "dcformer-generate")
MAKE_MODEL = os.path.join(BIN_DIR, "dcformer-make-model")
SERVICE = "dcformer.v1.TextGeneration"
SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


# Under AddressSanitizer (scripts/sanitizers.sh sets DCF_SANITIZE) freed memory waits in its
# quarantine (256 MiB by default) before reuse, and code runs a few times slower: resource
# bounds of the abuse tests allow for both.
SANITIZED = bool(os.environ.get("DCF_SANITIZE"))
RSS_SLACK_MIB = 256 if "address" in os.environ.get("DCF_SANITIZE", "") else 0
CPU_FACTOR = 4 if SANITIZED else 1

# What GenerateStream logs when its GenerateCall refused an event (see Server.__exit__).
STATE_MACHINE_VIOLATION = "event(s) its state does not allow"

_ports_given = set()  # every port free_ports handed out in this process


def free_ports(n):
    """n distinct free loopback ports, none handed out before in this process: a port picked
    for a server that has not bound it yet is free again to the kernel, which may hand it out
    twice."""
    ports = []
    while len(ports) < n:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if port not in _ports_given:
            _ports_given.add(port)
            ports.append(port)
    return ports


def free_port():
    return free_ports(1)[0]


def golden_models():
    """(name, dir, golden dict) of every golden checkpoint."""
    out = []
    for name in sorted(os.listdir(GOLDEN_DIR)):
        d = os.path.join(GOLDEN_DIR, name)
        if os.path.isfile(os.path.join(d, "golden.json")):
            with open(os.path.join(d, "golden.json")) as f:
                out.append((name, d, json.load(f)))
    return out


def held_loading_model(out_dir):
    """A model directory whose config.json is a FIFO: a server given it listens but blocks
    loading the model (health NOT_SERVING, calls UNAVAILABLE) until `release()` writes the
    short golden model's config into the FIFO. Returns (directory, release)."""
    fifo = os.path.join(out_dir, "config.json")
    os.mkfifo(fifo)
    os.symlink(os.path.join(SHORT_MODEL, "model.safetensors"),
               os.path.join(out_dir, "model.safetensors"))

    def release():
        with open(os.path.join(SHORT_MODEL, "config.json")) as src, open(fifo, "w") as dst:
            dst.write(src.read())
    return out_dir, release


def make_slow_model(out_dir):
    """Writes a random model big enough that a long generation takes seconds on a CPU (~5 ms
    per token), so that tests can act deterministically while a request is still running.
    Vocabulary 1000, context 512. Returns `out_dir`."""
    subprocess.run([MAKE_MODEL, f"--out={out_dir}", "--dim=512", "--n_layer=8", "--n_head=8",
                    "--ffn=2048", "--vocab=1000", "--context=512", "--window=64",
                    "--dtype=F32", "--seed=7"], check=True, capture_output=True, timeout=300)
    return out_dir


def wait_until(predicate, timeout=30.0, what="condition"):
    """Polls `predicate` until it returns a truthy value; fails after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    delay = 0.005
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(delay)  # back-off between polls of a condition, not a synchronisation sleep
        delay = min(delay * 2, 0.1)


class Server:
    """A dcformer-server child process. Use as a context manager."""

    def __init__(self, model=SHORT_MODEL, args=(), tls_ca=None, ready=True, binary=SERVER,
                 env=None):
        self.port, self.metrics_port = free_ports(2)
        self.model = model
        self.args = list(args)
        self.tls_ca = tls_ca
        self.ready = ready
        self.binary = binary
        self.extra_env = dict(env or {})
        self.log = tempfile.NamedTemporaryFile(prefix="dcformer-server-", suffix=".log",
                                               delete=False)
        self.proc = None

    @property
    def target(self):
        return f"127.0.0.1:{self.port}"

    def __enter__(self):
        # One compute thread: the tests check the API, not throughput, and on a small shared
        # machine spinning OpenMP/BLAS pools of several servers starve each other.
        env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", **self.extra_env)
        for attempt in range(3):
            self.proc = subprocess.Popen(self._command(), stdout=self.log,
                                         stderr=subprocess.STDOUT, env=env)
            if not self.ready:
                return self
            try:
                self.wait_serving()
                return self
            except BaseException:
                if attempt < 2 and self._lost_port_race():
                    # Another process bound one of the ports between free_ports and this
                    # server's bind (the kernel may hand a closed port out again): new ports.
                    self.port, self.metrics_port = free_ports(2)
                    self.log.seek(0)
                    self.log.truncate()
                    continue
                self.__exit__(*sys.exc_info())
                raise
        return self

    def _command(self):
        return [self.binary, f"--model={self.model}", "--host=127.0.0.1", f"--port={self.port}",
                f"--metrics-port={self.metrics_port}", "--kv-cache-bytes=16000000"] + self.args

    def _lost_port_race(self):
        """The server exited because one of its own ports was taken, not for a reason of the
        test's (a test that takes a port on purpose passes it in `args`, which wins)."""
        if self.proc.poll() is None:
            return False
        return any("Address already in use" in line and
                   any(f"cannot listen on 127.0.0.1:{p}:" in line
                       for p in (self.port, self.metrics_port))
                   for line in self.read_log().splitlines())

    def __exit__(self, *exc):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()
        log = self.read_log()
        if exc[0] is not None:
            print(log[-4000:], file=sys.stderr)
        os.unlink(self.log.name)
        # A Generate call's state machine met an event its state does not allow (a bug the
        # server survives, server/generate_call.h): every test that ran a server fails on it.
        if exc[0] is None and STATE_MACHINE_VIOLATION in log:
            line = next(x for x in log.splitlines() if STATE_MACHINE_VIOLATION in x)
            raise AssertionError(f"the server logged a state-machine violation: {line}")

    def read_log(self):
        with open(self.log.name, errors="replace") as f:
            return f.read()

    def channel(self, credentials=None, options=()):
        if self.tls_ca and credentials is None:
            with open(self.tls_ca, "rb") as f:
                credentials = grpc.ssl_channel_credentials(f.read())
        if credentials is not None:
            return grpc.secure_channel(self.target, credentials, options=list(options))
        return grpc.insecure_channel(self.target, options=list(options))

    def stub(self, **kw):
        return pb_grpc.TextGenerationStub(self.channel(**kw))

    def health_stub(self):
        return health_pb2_grpc.HealthStub(self.channel())

    def wait_serving(self, timeout=60.0):
        """Blocks on the health Watch stream until the server reports SERVING; fails as soon
        as the server process exits (before it listens, too: a server that could not bind
        must not cost the whole timeout)."""
        deadline = time.monotonic() + timeout
        with self.channel() as ch:
            connected = grpc.channel_ready_future(ch)
            while not connected.done():
                try:
                    connected.result(timeout=0.25)
                except grpc.FutureTimeoutError:
                    if self.proc.poll() is not None or time.monotonic() > deadline:
                        connected.cancel()
                        break
            if connected.done() and not connected.cancelled():
                stub = health_pb2_grpc.HealthStub(ch)
                stream = stub.Watch(health_pb2.HealthCheckRequest(service=""),
                                    wait_for_ready=True,
                                    timeout=max(1.0, deadline - time.monotonic()))
                try:
                    for msg in stream:
                        if msg.status == SERVING:
                            stream.cancel()
                            return
                        if self.proc.poll() is not None:
                            break
                except grpc.RpcError:
                    pass  # the server went away or the deadline passed: reported below
        raise AssertionError("server never became SERVING:\n" + self.read_log()[-3000:])

    def check_health(self, service=""):
        with self.channel() as ch:
            return health_pb2_grpc.HealthStub(ch).Check(
                health_pb2.HealthCheckRequest(service=service), timeout=10).status

    def metrics(self):
        """{(name, frozenset(labels.items())): value} of one /metrics scrape."""
        with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics",
                                    timeout=10) as r:
            text = r.read().decode()
        out = {}
        for family in text_string_to_metric_families(text):
            for s in family.samples:
                out[(s.name, frozenset(s.labels.items()))] = s.value
        return out

    def metric(self, name, **labels):
        """The sum of the series of `name` whose labels include `labels` (0 when none): the
        request, token and latency metrics also carry `protocol` (grpc, http), summed over
        unless given."""
        return sum_series(self.metrics(), name, **labels) or 0.0

    def kv_blocks_used(self):
        m = self.metrics()
        return sum(v for (n, _), v in m.items() if n == "dcformer_kv_cache_blocks_used")

    def terminate(self, timeout=60):
        self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout=timeout)


def sum_series(scrape, name, **labels):
    """The sum of the series of `name` in `scrape` (Server.metrics()) whose labels include
    `labels`; None when there is none."""
    want = set(labels.items())
    values = [v for (n, l), v in scrape.items() if n == name and want <= l]
    return sum(values) if values else None


def ids_request(ids, max_new_tokens, greedy=True, ignore_eos=True, **kw):
    req = pb.GenerateRequest(token_ids=pb.TokenIds(ids=ids), **kw)
    req.stopping.max_new_tokens = max_new_tokens
    req.stopping.ignore_eos = ignore_eos
    if greedy:
        req.sampling.temperature = 0.0
    return req


def collect(stream):
    """(token ids, final message) of a Generate stream."""
    tokens, final = [], None
    for msg in stream:
        tokens.extend(msg.token_ids)
        if msg.finish_reason != pb.FINISH_REASON_UNSPECIFIED:
            final = msg
    return tokens, final


def reference_greedy(model_dir, prompt, n):
    """dcformer-generate's greedy ids and logprobs for `prompt`."""
    out = subprocess.run([GENERATE, f"--model={model_dir}",
                          "--prompt_ids=" + ",".join(map(str, prompt)),
                          f"--max_new_tokens={n}", "--json"],
                         check=True, capture_output=True, text=True, timeout=300,
                         env=dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1"))
    j = json.loads(out.stdout)
    return j["tokens"], j.get("logprobs", [])


class Prometheus:
    """A real Prometheus server (Debian's package) on loopback scraping `targets` every
    second. Use as a context manager; raises unittest.SkipTest when it is not installed.

    targets: [(host:port, {label: value})]; rule_files: paths of rule files to load."""

    def __init__(self, targets, job="dcformer", rule_files=()):
        import shutil
        import unittest
        self.binary = shutil.which("prometheus") or "/usr/bin/prometheus"
        if not os.path.exists(self.binary):
            raise unittest.SkipTest("prometheus binary not installed (scripts/setup.sh)")
        self.targets = targets
        self.job = job
        self.rule_files = list(rule_files)
        self.port = free_port()
        self.proc = None

    def __enter__(self):
        self.tmp = tempfile.TemporaryDirectory(prefix="prometheus-")
        config = {"global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
                  "rule_files": self.rule_files,
                  "scrape_configs": [{"job_name": self.job, "static_configs": [
                      {"targets": [t], "labels": dict(labels)} for t, labels in self.targets]}]}
        path = os.path.join(self.tmp.name, "prometheus.yml")
        with open(path, "w") as f:
            json.dump(config, f)  # JSON is YAML
        self.proc = subprocess.Popen(
            [self.binary, f"--config.file={path}", f"--storage.tsdb.path={self.tmp.name}/data",
             f"--web.listen-address=127.0.0.1:{self.port}"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            wait_until(self._ready, timeout=60, what="Prometheus to be ready")
        except BaseException:
            self.__exit__(*sys.exc_info())
            raise
        return self

    def _ready(self):
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/-/ready", timeout=5) as r:
                return r.status == 200
        except OSError:  # not listening yet, or 503 while it starts
            return False

    def __exit__(self, *exc):
        self.proc.terminate()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.tmp.cleanup()

    def api(self, path, **params):
        """The JSON answer of /api/v1/<path>. A query Prometheus rejects comes back with
        status "error" (HTTP 400/422 with a JSON body)."""
        import urllib.error
        import urllib.parse
        url = f"http://127.0.0.1:{self.port}/api/v1/{path}?" + urllib.parse.urlencode(params)
        try:
            with urllib.request.urlopen(url, timeout=10) as r:
                return json.load(r)
        except urllib.error.HTTPError as e:
            return json.load(e)

    def query(self, expr):
        """The instant vector of `expr` ([{"metric": {...}, "value": [t, "v"]}]); raises
        AssertionError when Prometheus rejects the expression."""
        answer = self.api("query", query=expr)
        if answer.get("status") != "success":
            raise AssertionError(f"query {expr!r}: {answer.get('error')}")
        return answer["data"]["result"]

    def value(self, expr):
        """The single value of `expr` as a float, or None when there is none (yet)."""
        result = self.query(expr)
        return float(result[0]["value"][1]) if result else None


def proc_status(pid):
    """{field: value} of /proc/<pid>/status (VmRSS, VmHWM in kB, Threads, ...)."""
    out = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            key, _, value = line.partition(":")
            out[key] = value.strip()
    return out


def rss_mib(pid, peak=False):
    """Resident memory of `pid` now (or its peak, VmHWM) in MiB."""
    return int(proc_status(pid)["VmHWM" if peak else "VmRSS"].split()[0]) / 1024


def thread_count(pid):
    return int(proc_status(pid)["Threads"])


def cpu_seconds(pid):
    """User + system CPU time `pid` has used."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def http_request(port, raw, timeout=10):
    """Sends `raw` bytes to 127.0.0.1:port and returns everything the server answers before
    it closes the connection (or `timeout` passes)."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        s.sendall(raw)
        chunks = []
        try:
            while True:
                data = s.recv(65536)
                if not data:
                    break
                chunks.append(data)
        except (socket.timeout, ConnectionResetError):
            pass
    return b"".join(chunks)
