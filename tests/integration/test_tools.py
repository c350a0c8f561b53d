"""What a user of the command-line tools sees (issue 24): bad flags exit 2 with one line,
--help lists each tool's own flags, clients that wait for a starting server (--wait-ready),
and the noise that used to come before a clean message (gRPC's raw errors, protobuf's UTF-8
log line, "Socket closed" alone, a shutdown logged seconds before the exit, the Node example's
stray lines)."""
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import unittest

import harness as h
import test_security

LOADGEN = os.path.join(h.BIN_DIR, "dcformer-loadgen")
DECODE_BENCH = os.path.join(h.BIN_DIR, "dcformer-decode-bench")
PY_EXAMPLE = os.path.join(h.SOURCE_DIR, "client", "examples", "python", "generate.py")
NODE_EXAMPLE = os.path.join(h.SOURCE_DIR, "client", "examples", "node", "generate.js")
NODE_MODULES = os.path.join(h.SOURCE_DIR, "client", "examples", "node", "node_modules")
DEFAULT_MODEL = os.path.join(h.SOURCE_DIR, "models", "dcformer-kjv")
# (binary, a flag of its own that --help must list, one of its flags that takes a value)
TOOLS = [(h.SERVER, "--kv-cache-bytes", "--model"), (h.CLI, "--wait-ready", "--target"),
         (h.GENERATE, "--max-new-tokens", "--model"), (h.MAKE_MODEL, "--n-layer", "--out"),
         (DECODE_BENCH, "--prompt-tokens", "--model"), (LOADGEN, "--max-error-rate", "--target"),
         (os.path.join(h.BIN_DIR, "dcformer-bench"), "--num-requests", "--model-dir"),
         (os.path.join(h.BIN_DIR, "dcformer-matmul-bench"), "--min-seconds", "--rows"),
         (os.path.join(h.BIN_DIR, "dcformer-sampler-bench"), "--vocab", "--min-seconds")]
SIMT_BENCH = os.path.join(h.BIN_DIR, "dcformer-simt-bench")  # emulator builds only


def run(args, timeout=60, **kw):
    return subprocess.run(args, capture_output=True, text=True, timeout=timeout, **kw)


def example_env():
    return dict(os.environ, PYTHONPATH=h.PY_DIR)


def end_all(procs):
    """Kills the (name, process) pairs still running (a failed test's), reaping them."""
    for _, proc in procs:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()


def clients(target, *args):
    """The three clients that take --wait-ready: dcformer-cli and the two examples."""
    out = [("dcformer-cli", [h.CLI, "generate", f"--target={target}", *args])]
    out.append(("python example", ["/usr/bin/python3", PY_EXAMPLE, f"--target={target}", *args]))
    if os.path.isdir(os.path.join(NODE_MODULES, "@grpc")):
        out.append(("node example", ["node", NODE_EXAMPLE, f"--target={target}", *args]))
    return out


def start_waiting_clients(target, wait=None):
    """`dcformer-cli health` and the three clients generating 3 tokens, each with --wait-ready
    (`wait` seconds; None: the bare flag, its default)."""
    def flag(name):
        if wait is None:
            return "--wait-ready"
        return f"--wait-ready={wait}s" if name in ("health", "dcformer-cli") else \
            f"--wait-ready={wait}"
    procs = [("health", subprocess.Popen([h.CLI, "health", f"--target={target}", flag("health")],
                                         stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                         text=True))]
    for name, cmd in clients(target):
        procs.append((name, subprocess.Popen(cmd + [flag(name), "--prompt-ids=5,6,7",
                                                    "--max-new-tokens=3", "--temperature=0"],
                                             stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                             text=True, env=example_env())))
    return procs


def assert_clients_finish(test, procs):
    """Each of start_waiting_clients' processes exits 0 with what it should print."""
    for name, proc in procs:
        out, err = proc.communicate(timeout=120)
        test.assertEqual(proc.returncode, 0, f"{name}: {err}")
        if name == "health":
            test.assertEqual(out, "SERVING\n")
        else:
            test.assertEqual(len(out.strip().split(",")), 3, f"{name}: {out}")


def established_connections(port):
    """Established TCP connections to local port `port` (IPv4 and IPv6, from procfs)."""
    count = 0
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as f:
                rows = f.read().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            fields = row.split()
            if int(fields[1].rsplit(":", 1)[1], 16) == port and fields[3] == "01":
                count += 1
    return count


class FlagsTest(unittest.TestCase):
    def test_bad_flags_exit_2_with_one_line(self):
        for binary, _, value_flag in TOOLS:
            name = os.path.basename(binary)
            for args, message in ((["--bogus"], "unknown flag --bogus"),
                                  (["--bogus-flag=3"], "unknown flag --bogus-flag"),
                                  ([value_flag], f"{value_flag} needs a value")):
                with self.subTest(tool=name, args=args):
                    p = run([binary, *args])
                    self.assertEqual(p.returncode, 2, p.stderr)
                    self.assertEqual(p.stderr.count("\n"), 1, p.stderr)
                    self.assertTrue(p.stderr.startswith(f"{name}: "), p.stderr)
                    self.assertIn(message, p.stderr)
                    self.assertIn("(--help lists the flags)", p.stderr)
                    self.assertEqual(p.stdout, "")

    def test_a_bad_flagfile_line_exits_2_naming_the_file(self):
        tmp = tempfile.mkdtemp()
        self.addCleanup(shutil.rmtree, tmp)
        flags = os.path.join(tmp, "server.flags")
        with open(flags, "w") as f:
            f.write("# comment\n--port=0\n--kv-cache-bytes=1000\n--kv-cache-byts=1\n")
        p = run([h.SERVER, f"--flagfile={flags}"])
        self.assertEqual(p.returncode, 2, p.stderr)
        # Dashed names are fine in a flagfile (its lines join the command line); the typo is not.
        self.assertEqual(p.stderr, f"dcformer-server: {flags}: unknown flag --kv-cache-byts "
                                   "(--help lists the flags)\n")
        p = run([h.SERVER, "--flagfile=/nonexistent.flags"])
        self.assertEqual(p.returncode, 2, p.stderr)
        self.assertIn("--flagfile: ", p.stderr)
        self.assertIn("/nonexistent.flags", p.stderr)

    def test_undefok_lets_the_flags_it_names_through(self):
        # Review finding 2: on the command line and in a flagfile, as absl has it.
        p = run([h.SERVER, "--undefok=bogus", "--bogus", "--only_check_args"])
        self.assertEqual(p.returncode, 0, p.stderr)
        tmp = tempfile.mkdtemp()
        self.addCleanup(shutil.rmtree, tmp)
        flags = os.path.join(tmp, "server.flags")
        with open(flags, "w") as f:
            f.write("--undefok=bogus\n--bogus=1\n")
        p = run([h.SERVER, f"--flagfile={flags}", "--only_check_args"])
        self.assertEqual(p.returncode, 0, p.stderr)
        p = run([h.SERVER, "--undefok=other", "--bogus", "--only_check_args"])
        self.assertEqual(p.returncode, 2, p.stderr)

    def test_a_flagfile_is_read_once_in_its_place(self):
        # Review finding 3: a pipe flagfile (empty when read a second time) sets what it says,
        # and the last value wins: --out from the pipe, after the command line's.
        tmp = tempfile.mkdtemp()
        self.addCleanup(shutil.rmtree, tmp)
        first, second = os.path.join(tmp, "a"), os.path.join(tmp, "b")
        p = run(["bash", "-c", f'"$0" --out={first} --flagfile=<(echo --out={second}; '
                               'echo --n-layer=2) --dim=32 --n-head=2 --ffn=64 --vocab=100 '
                               '--context=64 --window=16', h.MAKE_MODEL])
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertTrue(p.stdout.startswith(f"wrote {second}/config.json"), p.stdout)
        self.assertIn(", 2 layers,", p.stdout)
        self.assertFalse(os.path.exists(first))

    def test_fromenv_values_are_checked(self):
        # Review finding 14: exit 2 and one line, naming the variable.
        p = run([h.CLI, "--fromenv=timeout", "info"], env=dict(os.environ, FLAGS_timeout="xyz"))
        self.assertEqual(p.returncode, 2, p.stderr)
        self.assertEqual(p.stderr.count("\n"), 1, p.stderr)
        self.assertTrue(p.stderr.startswith("dcformer-cli: FLAGS_timeout: --timeout: "),
                        p.stderr)

    def test_wait_ready_takes_its_value_as_the_next_word(self):
        # Review finding 6: "--wait-ready 1s health" is the flag's value and the command.
        port, = h.free_ports(1)
        p = run([h.CLI, f"--target=127.0.0.1:{port}", "--wait-ready", "1s", "health"])
        self.assertEqual(p.returncode, 1, p.stderr)
        self.assertIn("within 1s", p.stderr)

    def test_simt_bench_takes_only_quick(self):
        if not os.path.exists(SIMT_BENCH):
            self.skipTest("no emulator build")
        p = run([SIMT_BENCH, "--bogus"])
        self.assertEqual((p.returncode, p.stdout), (2, ""))
        self.assertEqual(p.stderr, "dcformer-simt-bench: unknown argument '--bogus' (it takes "
                                   "only --quick)\n")
        p = run([SIMT_BENCH, "--help"])
        self.assertEqual(p.returncode, 0)
        self.assertIn("  dcformer-simt-bench [--quick]\n", p.stdout)

    def test_help_lists_each_tools_own_flags(self):
        for binary, own_flag, _ in TOOLS:
            name = os.path.basename(binary)
            with self.subTest(tool=name):
                p = run([binary, "--help"])
                self.assertEqual(p.returncode, 0, p.stderr)
                self.assertEqual(p.stderr, "")  # no "SetProgramUsageMessage never called"
                self.assertNotIn("No flags matched", p.stdout)
                self.assertTrue(p.stdout.startswith(f"{name}: "), p.stdout[:200])
                usage = p.stdout.split("\n\n")[0]
                self.assertIn(f"  {name} ", usage)  # a usage line
                self.assertRegex(p.stdout,
                                 rf"\n  {re.escape(own_flag)} \(default [^)]*\)\n      \S")
                self.assertNotIn("--flagfile (default", p.stdout)  # Abseil's: --helpfull
                self.assertEqual(run([binary, "-h"]).stdout, p.stdout)
                # Review finding 12: absl's other help flags too (they said "No flags matched").
                for other in ("--helpshort", "--helppackage"):
                    self.assertEqual(run([binary, other]).stdout, p.stdout)
                full = run([binary, "--helpfull"])
                self.assertEqual(full.returncode, 0)
                self.assertIn("--flagfile (default", full.stdout)

    def test_make_model_says_what_it_wrote(self):
        tmp = tempfile.mkdtemp()
        self.addCleanup(shutil.rmtree, tmp)
        out = os.path.join(tmp, "m")
        p = run([h.MAKE_MODEL, f"--out={out}", "--dim=32", "--n-layer=2", "--n-head=2",
                 "--ffn=64", "--vocab=100", "--context=64", "--window=16"])
        self.assertEqual(p.returncode, 0, p.stderr)
        size_mb = os.path.getsize(os.path.join(out, "model.safetensors")) / 1e6
        self.assertEqual(p.stdout, f"wrote {out}/config.json and {out}/model.safetensors "
                                   f"({size_mb:.1f} MB, F16, normal init): dim 32, 2 layers, "
                                   "2 heads, ffn 64, vocab 100, context 64, window 16, seed 1\n")
        with open(os.path.join(out, "config.json")) as f:
            self.assertEqual(json.load(f)["torch_dtype"], "float16")
        p = run([h.MAKE_MODEL, f"--out={out}", "--dim=32", "--n-layer=1", "--n-head=2",
                 "--ffn=64", "--vocab=100", "--context=64", "--dtype=BF16"])
        self.assertEqual(p.returncode, 0, p.stderr)
        with open(os.path.join(out, "config.json")) as f:
            self.assertEqual(json.load(f)["torch_dtype"], "bfloat16")

    def test_make_model_refuses_what_it_cannot_write(self):
        # --dtype I8 wrote every tensor as I8 without scales or quantization_config (a model
        # no tool loads) and exited 0; sizes beyond host memory died of an uncaught
        # std::bad_alloc (exit 134).
        tmp = tempfile.mkdtemp()
        self.addCleanup(shutil.rmtree, tmp)
        out = os.path.join(tmp, "m")
        for dtype in ("I8", "bogus"):
            p = run([h.MAKE_MODEL, f"--out={out}", f"--dtype={dtype}"])
            self.assertEqual(p.returncode, 2, p.stderr)
            self.assertEqual(p.stderr, "dcformer-make-model: --dtype must be F32, F16 or BF16, "
                                       f"not '{dtype}' (dcformer-quantize writes int8 models)\n")
            self.assertFalse(os.path.exists(out))

        p = run([h.MAKE_MODEL, f"--out={out}", "--n-layer=1000000", "--dim=8", "--n-head=1",
                 "--ffn=8", "--vocab=8"])
        self.assertEqual(p.returncode, 2, p.stderr)
        self.assertEqual(p.stderr, "dcformer-make-model: --n-layer must be at most 10000\n")

        # Under AddressSanitizer an address-space limit stops the binary before main (its shadow
        # memory is terabytes of address space), and its allocator aborts on a failed
        # allocation instead of throwing std::bad_alloc: the plain pass checks this part.
        if "address" in os.environ.get("DCF_SANITIZE", ""):
            return

        def limit_memory():
            import resource
            resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30))

        p = run([h.MAKE_MODEL, f"--out={out}", "--n-layer=100", "--dim=100000", "--ffn=400000"],
                preexec_fn=limit_memory)
        self.assertEqual(p.returncode, 1, p.stderr)
        self.assertIn("dcformer-make-model: RESOURCE_EXHAUSTED: not enough host memory to write "
                      "a model of 100 layers, dim 100000, intermediate size 400000", p.stderr)
        self.assertNotIn("bad_alloc", p.stderr)

    def test_decode_bench_times_the_decode_steps_themselves(self):
        # --prompt-tokens 1024 --new-tokens 4 once printed 4,000,000,000 tokens/s (a separately
        # timed prefill subtracted from the whole run). Decode is timed step by step now: a
        # batch-1 step of any model takes far more than 10 us, and the --roofline probes
        # report a measured bandwidth and FMA peak.
        tmp = tempfile.mkdtemp()
        self.addCleanup(shutil.rmtree, tmp)
        model = os.path.join(tmp, "m")
        p = run([h.MAKE_MODEL, f"--out={model}", "--dim=32", "--n-layer=2", "--n-head=2",
                 "--ffn=64", "--vocab=100", "--context=2100", "--window=16"])
        self.assertEqual(p.returncode, 0, p.stderr)
        p = run([DECODE_BENCH, f"--model={model}", "--backend=cpu", "--prompt-tokens=1024",
                 "--new-tokens=4", "--repeats=1", "--roofline"], timeout=120)
        self.assertEqual(p.returncode, 0, p.stderr)
        m = re.search(r"^decode batch 1: 4 tokens after a 1024-token prompt, ([0-9.]+) tokens/s",
                      p.stdout, re.M)
        self.assertIsNotNone(m, p.stdout)
        self.assertGreater(float(m.group(1)), 0)
        self.assertLess(float(m.group(1)), 1e5, p.stdout)
        m = re.search(r"^prefill: 1024 tokens, ([0-9.]+) tokens/s", p.stdout, re.M)
        self.assertIsNotNone(m, p.stdout)
        self.assertGreater(float(m.group(1)), 0)
        m = re.search(r"^FMA peak \(fp32, (avx512|avx2|portable)\): ([0-9.]+) GFLOP/s with 1 "
                      r"thread, ([0-9.]+) GFLOP/s with \d+", p.stdout, re.M)
        self.assertIsNotNone(m, p.stdout)
        self.assertGreater(float(m.group(2)), 0.1)
        self.assertIn("of the FMA peak", p.stdout)
        # The verify cost: the runner is prepared for the drafts only when asked (a step of
        # 4 drafts is refused by a backend prepared for one sampled row).
        p = run([DECODE_BENCH, f"--model={model}", "--backend=cpu", "--prompt-tokens=8",
                 "--new-tokens=2", "--repeats=1", "--verify-tokens=4"], timeout=120)
        self.assertEqual(p.returncode, 0, p.stderr)
        m = re.search(r"^verify step: 4 drafted tokens at position 8: ([0-9.]+) ms, plain "
                      r"decode step ([0-9.]+) ms", p.stdout, re.M)
        self.assertIsNotNone(m, p.stdout)
        self.assertGreater(float(m.group(1)), 0)
        self.assertGreater(float(m.group(2)), 0)

    def test_widened_ffn_computes_what_the_model_computes(self):
        # bench/widen_ffn.py pads the FFN with zero weights (a copying model that reads many
        # more bytes per token): the same tokens and logprobs, more bytes, the rest copied.
        tmp = tempfile.mkdtemp()
        self.addCleanup(shutil.rmtree, tmp)
        wide = os.path.join(tmp, "wide")
        p = run(["/usr/bin/python3", os.path.join(h.SOURCE_DIR, "bench", "widen_ffn.py"),
                 DEFAULT_MODEL, wide, "--ffn=1500"])
        self.assertEqual(p.returncode, 0, p.stderr)
        with open(os.path.join(wide, "config.json")) as f:
            self.assertEqual(json.load(f)["intermediate_size"], 1500)
        self.assertTrue(os.path.exists(os.path.join(wide, "tokenizer.json")))
        self.assertGreater(os.path.getsize(os.path.join(wide, "model.safetensors")),
                           1.5 * os.path.getsize(os.path.join(DEFAULT_MODEL, "model.safetensors")))
        outputs = []
        for model in (DEFAULT_MODEL, wide):
            # A prompt of several tokens: its prefill runs the multi-row kernels too.
            p = run([h.GENERATE, f"--model={model}", "--json", "--max-new-tokens=24",
                     "--prompt=And God said, Let there be light: and there was light.",
                     "--ignore-eos"], timeout=120)
            self.assertEqual(p.returncode, 0, p.stderr)
            out = json.loads(p.stdout)
            outputs.append((out["tokens"], out["logprobs"]))
        self.assertEqual(len(outputs[0][0]), 24)
        self.assertEqual(outputs[0], outputs[1])
        p = run(["/usr/bin/python3", os.path.join(h.SOURCE_DIR, "bench", "widen_ffn.py"),
                 DEFAULT_MODEL, os.path.join(tmp, "narrow"), "--ffn=100"])
        self.assertNotEqual(p.returncode, 0)
        self.assertIn("is below the model's 512", p.stderr)
        p = run(["/usr/bin/python3", os.path.join(h.SOURCE_DIR, "bench", "widen_ffn.py"),
                 wide, wide, "--ffn=2000"])
        self.assertNotEqual(p.returncode, 0)
        self.assertIn("must differ", p.stderr)


class WaitReadyTest(unittest.TestCase):
    def test_clients_wait_for_a_server_not_listening_yet(self):
        port, metrics_port = h.free_ports(2)
        target = f"127.0.0.1:{port}"
        procs = [(name, subprocess.Popen(cmd + ["--wait-ready=120s" if name == "dcformer-cli"
                                                else "--wait-ready=120", "--prompt-ids=5,6,7",
                                                "--max-new-tokens=3", "--temperature=0"],
                                         stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                         text=True, env=example_env()))
                 for name, cmd in clients(target)]
        try:
            # Without --wait-ready the same call fails at once.
            p = run([h.CLI, "generate", f"--target={target}", "--prompt-ids=5,6,7"])
            self.assertEqual(p.returncode, 1)
            self.assertIn("UNAVAILABLE", p.stderr)
            for name, proc in procs:
                if proc.poll() is not None:
                    self.fail(f"{name} did not wait: {proc.communicate()}")
            server = h.Server(model=h.SHORT_MODEL, ready=False)
            server.port, server.metrics_port = port, metrics_port
            with server:
                for name, proc in procs:
                    out, err = proc.communicate(timeout=120)
                    self.assertEqual(proc.returncode, 0, f"{name}: {err}")
                    self.assertEqual(out.strip().split(","), [str(t) for t in
                                                             h.reference_greedy(h.SHORT_MODEL,
                                                                                [5, 6, 7], 3)[0]],
                                     name)
        finally:
            end_all(procs)

    def test_clients_wait_for_a_server_that_is_loading(self):
        # The server listens but holds loading its model (NOT_SERVING) until release().
        tmp = tempfile.mkdtemp()
        self.addCleanup(shutil.rmtree, tmp)
        model, release = h.held_loading_model(tmp)
        with h.Server(model=model, ready=False) as server:
            with server.channel() as ch:
                status = h.health_pb2_grpc.HealthStub(ch).Check(
                    h.health_pb2.HealthCheckRequest(), wait_for_ready=True, timeout=30).status
            self.assertEqual(status, h.NOT_SERVING)
            # A timeout that passes: exit 1 saying what was seen last.
            p = run([h.CLI, "health", f"--target={server.target}", "--wait-ready=1s"])
            self.assertEqual(p.returncode, 1)
            self.assertEqual(p.stderr, f"dcformer-cli: the server at {server.target} was not "
                                       "SERVING within 1s (last status NOT_SERVING)\n")
            self.assertEqual(p.stdout, "")
            procs = start_waiting_clients(server.target)
            try:
                for name, proc in procs:
                    if proc.poll() is not None:
                        self.fail(f"{name} did not wait: {proc.communicate()}")
                release()
                assert_clients_finish(self, procs)
            finally:
                end_all(procs)

    def test_clients_watch_again_when_the_server_restarts(self):
        # Review findings 8 and 9: a loading server killed while the clients wait, then a new
        # one on the same port: every client watches again and goes on (the examples gave up).
        tmp = tempfile.mkdtemp()
        self.addCleanup(shutil.rmtree, tmp)
        model, _ = h.held_loading_model(tmp)
        port, metrics_port = h.free_ports(2)
        target = f"127.0.0.1:{port}"
        first = h.Server(model=model, ready=False)
        first.port, first.metrics_port = port, metrics_port
        procs = []
        try:
            with first:
                with first.channel() as ch:
                    status = h.health_pb2_grpc.HealthStub(ch).Check(
                        h.health_pb2.HealthCheckRequest(), wait_for_ready=True, timeout=30).status
                self.assertEqual(status, h.NOT_SERVING)
                procs = start_waiting_clients(target, wait=120)
                # Every client is connected (and watching) before the server goes away.
                h.wait_until(lambda: established_connections(port) >= len(procs), timeout=60,
                             what="every client connected")
                first.proc.kill()
                first.proc.wait()
            time.sleep(1.0)  # the watches end UNAVAILABLE; the clients try again meanwhile
            for name, proc in procs:
                if proc.poll() is not None:
                    self.fail(f"{name} gave up when the server went away: {proc.communicate()}")
            second = h.Server(model=h.SHORT_MODEL, ready=False)
            second.port, second.metrics_port = port, metrics_port
            with second:
                assert_clients_finish(self, procs)
        finally:
            end_all(procs)

    def test_examples_refuse_a_wait_that_is_not_positive(self):
        for value in ("-5", "0", "x"):
            p = run(["/usr/bin/python3", PY_EXAMPLE, f"--wait-ready={value}", "--prompt=x"],
                    env=example_env())
            self.assertEqual(p.returncode, 2, p.stderr)
            self.assertIn("is not a number of seconds > 0", p.stderr)

    def test_no_server_at_all_times_out_with_the_connection_error(self):
        target = f"127.0.0.1:{h.free_port()}"
        p = run([h.CLI, "info", f"--target={target}", "--wait-ready=1s"])
        self.assertEqual(p.returncode, 1)
        self.assertRegex(p.stderr, rf"^dcformer-cli: the server at {re.escape(target)} was not "
                                   r"SERVING within 1s \(no connection: .+\)\n$")
        p = run([h.CLI, "info", "--wait-ready=-1s"])
        self.assertEqual(p.returncode, 2)
        p = run(["/usr/bin/python3", PY_EXAMPLE, f"--target={target}", "--wait-ready=1",
                 "--prompt=x"], env=example_env())
        self.assertEqual(p.returncode, 1)
        self.assertIn(f"the server at {target} was not SERVING within 1 s", p.stderr)


class NoiseTest(unittest.TestCase):
    def test_port_in_use_is_one_clean_line(self):
        with socket.socket() as taken:
            taken.bind(("127.0.0.1", 0))
            taken.listen()
            port = taken.getsockname()[1]
            p = run([h.SERVER, f"--model={h.SHORT_MODEL}", f"--port={port}", "--metrics-port=0"])
        self.assertEqual(p.returncode, 1)
        lines = p.stderr.splitlines()
        self.assertEqual(len(lines), 1, p.stderr)
        self.assertRegex(lines[0], rf"ERROR server_main\.cc:\d+\] cannot listen on "
                                   rf"127\.0\.0\.1:{port}: Address already in use \(another "
                                   r"process has this port: stop it or choose another --port\)$")

    def test_a_host_that_does_not_resolve_says_so(self):
        # Review finding 4: a bind error that is no OS error keeps gRPC's reason.
        p = run([h.SERVER, f"--model={h.SHORT_MODEL}", "--host=nosuch.invalid", "--port=0",
                 "--metrics-port=0"])
        self.assertEqual(p.returncode, 1)
        lines = p.stderr.splitlines()
        self.assertEqual(len(lines), 1, p.stderr)
        self.assertRegex(lines[0], r"ERROR server_main\.cc:\d+\] cannot listen on "
                                   r"nosuch\.invalid:0: \S")
        self.assertNotIn("{", lines[0])  # the description, not gRPC's status dump

    def test_shutdown_is_logged_when_the_process_exits(self):
        server = h.Server(model=h.SHORT_MODEL)
        with server:
            start = time.monotonic()
            server.proc.send_signal(signal.SIGTERM)
            self.assertEqual(server.proc.wait(timeout=60), 0)
            elapsed = time.monotonic() - start
            log = server.read_log()
        last = log.strip().splitlines()[-1]
        m = re.search(r"shut down after (\S+) s$", last)
        self.assertIsNotNone(m, log[-2000:])
        # The line comes last, after the metrics endpoint stopped (up to ~2 s): the process
        # exits right after it, not seconds later (the margin is for a loaded machine).
        self.assertLess(elapsed - float(m.group(1)), 1.0, f"{elapsed:.2f} s vs {last}")

    def test_invalid_utf8_flags_are_refused_by_the_cli(self):
        with h.Server(model=DEFAULT_MODEL) as server:
            for args, flag in ((["generate", "--prompt=ok\udcff"], "--prompt"),
                               (["generate", "--prompt=x", "--stop=a\udcc3"], "--stop"),
                               (["generate", "--prompt=x", "--request-id=\udcc3"], "--request-id"),
                               (["tokenize", "--prompt=ab\udcfe"], "--prompt")):
                with self.subTest(args=args):
                    p = subprocess.run([h.CLI, f"--target={server.target}", *args],
                                       capture_output=True, timeout=60)
                    self.assertEqual(p.returncode, 2)
                    err = p.stderr.decode()
                    self.assertEqual(err.count("\n"), 1, err)  # no [libprotobuf ERROR ...]
                    self.assertRegex(err, rf"^dcformer-cli: {flag}: is not valid UTF-8 \(byte \d\)")

    def test_tls_mismatches_say_what_is_wrong(self):
        tmp = tempfile.mkdtemp()
        self.addCleanup(shutil.rmtree, tmp)
        test_security.make_pki(tmp)
        pem = lambda name: os.path.join(tmp, name)  # noqa: E731
        with h.Server(model=h.SHORT_MODEL, tls_ca=pem("ca.pem"),
                      args=[f"--tls-cert={pem('server.pem')}",
                            f"--tls-key={pem('server.key')}"]) as tls_server, \
                h.Server(model=h.SHORT_MODEL) as plain_server:
            cases = [
                ([f"--target=127.0.0.1:{tls_server.port}"],
                 "Socket closed (the server may require TLS: try --tls or --tls-ca FILE)"),
                ([f"--target=127.0.0.1:{plain_server.port}", f"--tls-ca={pem('ca.pem')}"],
                 "(the server may not use TLS: try without --tls and --tls-ca)"),
                ([f"--target=localhost:{tls_server.port}", f"--tls-ca={pem('other-ca.pem')}"],
                 "(the server's certificate is not signed by a trusted CA or does not name the "
                 "target: check --tls-ca and --tls-server-name)"),
            ]
            for args, hint in cases:
                with self.subTest(args=args):
                    p = run([h.CLI, "info", *args])
                    self.assertEqual(p.returncode, 1)
                    # One line: the call's status and the hint, no gRPC log line before it.
                    self.assertEqual(p.stderr.count("\n"), 1, p.stderr)
                    self.assertTrue(p.stderr.startswith("dcformer-cli: RPC failed: UNAVAILABLE: "),
                                    p.stderr)
                    self.assertIn(hint, p.stderr)
            # Review finding 1: a TLS file gRPC cannot use, which the status does not explain
            # ("empty address list"): the CLI adds what gRPC logged.
            with open(pem("garbage.pem"), "w") as f:
                f.write("garbage\n")
            for args, reason in (([f"--tls-ca={pem('garbage.pem')}"],
                                  "(gRPC: Could not load any root certificate.)"),
                                 ([f"--tls-ca={pem('ca.pem')}", f"--tls-cert={pem('server.pem')}",
                                   f"--tls-key={pem('ca.key')}"], "(gRPC: Invalid private key.)")):
                with self.subTest(args=args):
                    p = run([h.CLI, "info", f"--target=localhost:{tls_server.port}", *args])
                    self.assertEqual(p.returncode, 1)
                    self.assertEqual(p.stderr.count("\n"), 1, p.stderr)
                    self.assertIn(reason, p.stderr)
            # Review finding 7: waiting for such a server ends with the same hint.
            p = run([h.CLI, "health", f"--target=127.0.0.1:{tls_server.port}",
                     "--wait-ready=1s"])
            self.assertEqual(p.returncode, 1, p.stderr)
            self.assertIn("(no connection: UNAVAILABLE: ", p.stderr)
            self.assertIn("Socket closed (the server may require TLS: try --tls or --tls-ca FILE)",
                          p.stderr)
            ok = run([h.CLI, "health", f"--target=localhost:{tls_server.port}",
                      f"--tls-ca={pem('ca.pem')}"])
            self.assertEqual((ok.returncode, ok.stdout), (0, "SERVING\n"), ok.stderr)

    def test_examples_print_one_summary_line_or_one_error_line(self):
        with h.Server(model=h.SHORT_MODEL) as server:
            expected = h.reference_greedy(h.SHORT_MODEL, [5, 6, 7], 4)[0]
            for name, cmd in clients(server.target)[1:]:
                with self.subTest(client=name):
                    p = run(cmd + ["--prompt-ids=5,6,7", "--max-new-tokens=4",
                                   "--temperature=0", "--ignore-eos"], env=example_env())
                    self.assertEqual(p.returncode, 0, p.stderr)
                    # The golden model has no tokenizer: ids, comma-separated, no trailing comma.
                    self.assertEqual(p.stdout, ",".join(map(str, expected)) + "\n")
                    self.assertEqual(p.stderr, "[FINISH_REASON_LENGTH prompt_tokens=3 "
                                               "generated_tokens=4]\n")
                    bad = run(cmd + ["--prompt-ids=5,999", "--max-new-tokens=4"],
                              env=example_env())
                    self.assertEqual(bad.returncode, 1)
                    self.assertEqual(bad.stdout, "")
                    self.assertEqual(bad.stderr, "generate failed: INVALID_ARGUMENT: "
                                                 "prompt_tokens[1]: token id 999 is outside the "
                                                 "model vocabulary [0, 300)\n")


if __name__ == "__main__":
    unittest.main(verbosity=2)
