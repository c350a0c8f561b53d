"""dcformer-loadgen against a real dcformer-server on loopback (the default model,
models/dcformer-tiny): closed loop, an open-loop sweep with its plot, errors counted by status
code, and the exit codes of bad flags and unreachable targets."""
import json
import os
import shutil
import subprocess
import tempfile
import unittest

import harness as h
import test_security

LOADGEN = os.path.join(h.BIN_DIR, "dcformer-loadgen")
TINY_MODEL = os.path.join(h.SOURCE_DIR, "models", "dcformer-tiny")
STATS = ("count", "mean", "min", "p50", "p90", "p99", "max")


def run_loadgen(*args, timeout=120):
    return subprocess.run([LOADGEN, *args], capture_output=True, text=True, timeout=timeout)


class LoadgenTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="loadgen-test-")
        cls.server = h.Server(model=TINY_MODEL).__enter__()

    @classmethod
    def tearDownClass(cls):
        cls.server.__exit__(None, None, None)
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def path(self, name):
        return os.path.join(self.tmp, name)

    def run_json(self, *args, returncode=0):
        """Runs the load generator with --json-out; returns (document, completed process)."""
        out_file = self.path(f"{self.id().split('.')[-1]}.json")
        p = run_loadgen(f"--target={self.server.target}", f"--json-out={out_file}", *args)
        self.assertEqual(p.returncode, returncode, p.stdout + p.stderr)
        # Pipes never get the progress bar.
        self.assertNotIn("\r", p.stderr)
        self.assertNotIn("in flight", p.stderr)
        with open(out_file) as f:
            return json.load(f), p

    def check_latencies(self, run, ok, tokens_per_request):
        lat = run["latency_ms"]
        self.assertEqual(set(lat), {"ttft", "itl", "tpot", "e2e", "ttft_prefix_hit",
                                    "ttft_prefix_miss"})
        for name, summary in lat.items():
            self.assertEqual(set(summary), set(STATS), name)
            values = [summary[k] for k in ("min", "p50", "p90", "p99", "max")]
            self.assertEqual(values, sorted(values), f"{name} percentiles out of order")
            self.assertLessEqual(summary["min"], summary["mean"], name)
            self.assertLessEqual(summary["mean"], summary["max"], name)
        self.assertEqual(lat["ttft"]["count"], ok)
        # Random prompts share no block with each other: every request missed the prefix cache.
        self.assertEqual(lat["ttft_prefix_miss"]["count"], ok)
        self.assertEqual(lat["ttft_prefix_hit"]["count"], 0)
        self.assertEqual(run["tokens"]["cached"], 0)
        self.assertIsNone(run["ttft_ms_by_turn"])
        self.assertEqual(lat["e2e"]["count"], ok)
        self.assertEqual(lat["tpot"]["count"], ok)
        # One inter-token latency per token after the first, however the server coalesced.
        self.assertEqual(lat["itl"]["count"], ok * (tokens_per_request - 1))
        self.assertGreater(lat["ttft"]["min"], 0)
        self.assertGreater(lat["e2e"]["min"], 0)
        # A request ends after its first token, and its TPOT is the mean of its gaps.
        self.assertGreaterEqual(lat["e2e"]["max"], lat["ttft"]["max"])
        self.assertGreaterEqual(lat["e2e"]["mean"], lat["ttft"]["mean"])
        self.assertAlmostEqual(lat["tpot"]["mean"], lat["itl"]["mean"], delta=1e-6 +
                               1e-9 * lat["itl"]["mean"])

    def test_closed_loop(self):
        before = (self.server.metric("dcformer_prompt_tokens_total"),
                  self.server.metric("dcformer_generation_tokens_total"),
                  self.server.metric("dcformer_requests_total", outcome="length"))
        doc, p = self.run_json("--concurrency=4", "--num-requests=16", "--warmup-requests=2",
                               "--input-tokens=8:24", "--output-tokens=6", "--temperature=0")
        self.assertEqual(doc["schema_version"], 1)
        self.assertEqual(doc["tool"], "dcformer-loadgen")
        self.assertEqual(doc["target"], self.server.target)
        self.assertEqual(doc["model"]["name"], "dcformer-tiny")
        self.assertEqual(doc["model"]["vocab_size"], 50257)
        w = doc["workload"]
        self.assertEqual(w["prompts"], "random")
        self.assertEqual(w["input_tokens"], {"min": 8, "max": 24})
        self.assertEqual(w["output_tokens"], {"min": 6, "max": 6})
        self.assertEqual(w["sampling"], {"temperature": 0})
        self.assertEqual((w["num_requests"], w["duration_s"], w["warmup_requests"]),
                         (16, None, 2))
        self.assertEqual(len(doc["runs"]), 1)
        run = doc["runs"][0]
        self.assertEqual((run["mode"], run["concurrency"], run["rate"], run["label"]),
                         ("closed", 4, None, "c=4"))
        self.assertFalse(run["interrupted"])
        self.assertEqual(run["requests"], {"warmup": 2, "sent": 16, "ok": 16, "failed": 0})
        self.assertEqual(run["errors"], {})
        self.assertEqual(run["finish_reasons"], {"LENGTH": 16})
        self.assertEqual(run["tokens"]["output"], 16 * 6)
        self.assertEqual(run["tokens"]["requested_output"], 16 * 6)
        self.assertGreaterEqual(run["tokens"]["input"], 16 * 8)
        self.assertLessEqual(run["tokens"]["input"], 16 * 24)
        self.check_latencies(run, ok=16, tokens_per_request=6)
        t = run["throughput"]
        self.assertGreater(run["duration_s"], 0)
        self.assertAlmostEqual(t["requests_per_s"], 16 / run["duration_s"], places=6)
        self.assertAlmostEqual(t["output_tokens_per_s"], 96 / run["duration_s"], places=6)
        self.assertAlmostEqual(t["input_tokens_per_s"],
                               run["tokens"]["input"] / run["duration_s"], places=6)
        # The server saw the same requests (the 2 warm-up ones too): 18 x 6 tokens generated.
        after = (self.server.metric("dcformer_prompt_tokens_total"),
                 self.server.metric("dcformer_generation_tokens_total"),
                 self.server.metric("dcformer_requests_total", outcome="length"))
        self.assertEqual(after[1] - before[1], 18 * 6)
        self.assertEqual(after[2] - before[2], 18)
        self.assertGreaterEqual(after[0] - before[0], run["tokens"]["input"] + 2 * 8)
        # The table.
        self.assertIn("closed loop, concurrency 4: 16 requests (2 warm-up excluded), 16 OK",
                      p.stdout)
        for row in ("TTFT", "ITL", "TPOT", "E2E"):
            self.assertIn(f"  {row} ", p.stdout)

    def test_openai_protocol(self):
        """--protocol openai: the same workload as streamed /v1/completions on the HTTP front,
        counted by the server under protocol="http"."""
        http_port = h.free_port()
        with h.Server(model=TINY_MODEL, args=[f"--http-port={http_port}"]) as server:
            out_file = self.path("openai.json")
            p = run_loadgen(f"--target={server.target}", "--protocol=openai",
                            f"--http-target=127.0.0.1:{http_port}", f"--json-out={out_file}",
                            "--concurrency=4", "--num-requests=16", "--warmup-requests=2",
                            "--input-tokens=8:24", "--output-tokens=6", "--temperature=0")
            self.assertEqual(p.returncode, 0, p.stdout + p.stderr)
            with open(out_file) as f:
                run = json.load(f)["runs"][0]
            self.assertEqual(run["requests"], {"warmup": 2, "sent": 16, "ok": 16, "failed": 0})
            self.assertEqual(run["finish_reasons"], {"LENGTH": 16})
            self.assertEqual(run["tokens"]["output"], 16 * 6)
            self.assertGreaterEqual(run["tokens"]["input"], 16 * 8)
            self.assertLessEqual(run["tokens"]["input"], 16 * 24)
            self.assertEqual(run["latency_ms"]["ttft"]["count"], 16)
            self.assertEqual(server.metric("dcformer_generation_tokens_total", protocol="http"),
                             18 * 6)
            self.assertEqual(server.metric("dcformer_generation_tokens_total", protocol="grpc"),
                             0)
            self.assertEqual(server.metric("dcformer_requests_total", outcome="length",
                                           protocol="http"), 18)
        p = run_loadgen(f"--target={self.server.target}", "--protocol=openai",
                        "--concurrency=1", "--num-requests=1")
        self.assertEqual(p.returncode, 2, p.stderr)
        self.assertIn("--http-target", p.stderr)

    def test_open_loop_sweep_and_plot(self):
        png = self.path("sweep.png")
        doc, p = self.run_json("--rate=20,40,80", "--num-requests=8", "--input-tokens=16",
                               "--output-tokens=4", f"--plot-out={png}")
        self.assertEqual([r["label"] for r in doc["runs"]], ["20/s", "40/s", "80/s"])
        for run, rate in zip(doc["runs"], (20, 40, 80)):
            with self.subTest(rate=rate):
                self.assertEqual((run["mode"], run["rate"], run["concurrency"]),
                                 ("open", rate, None))
                self.assertEqual(run["requests"], {"warmup": 0, "sent": 8, "ok": 8, "failed": 0})
                self.assertEqual(run["tokens"], {"input": 8 * 16, "cached": 0, "output": 8 * 4,
                                                 "requested_output": 8 * 4, "draft": 0,
                                                 "accepted_draft": 0})
                self.assertEqual(run["acceptance_rate"], 0)
                self.assertGreater(run["sent_per_s"], 0)
                self.assertGreaterEqual(run["max_send_lag_ms"], 0)
                self.check_latencies(run, ok=8, tokens_per_request=4)
        self.assertIn("ITL p99", p.stdout)  # the sweep summary
        with open(png, "rb") as f:
            data = f.read()
        self.assertTrue(data.startswith(b"\x89PNG\r\n\x1a\n"))
        self.assertGreater(len(data), 5000)

    def test_shared_prefix_and_chat_workloads_hit_the_prefix_cache(self):
        # One group of a 40-token shared prefix (2 full 16-token blocks): the first request
        # misses, the other 5 (one at a time) take the 32 tokens of its 2 blocks.
        doc, p = self.run_json("--concurrency=1", "--num-requests=6",
                               "--shared-prefix-tokens=40", "--prefix-groups=1",
                               "--input-tokens=4", "--output-tokens=3", "--temperature=0",
                               "--cache-salt=loadgen-test-shared")
        w = doc["workload"]
        self.assertEqual((w["shared_prefix_tokens"], w["prefix_groups"], w["chat_turns"],
                          w["cache_salt"]), (40, 1, None, True))
        run = doc["runs"][0]
        self.assertEqual(run["requests"]["ok"], 6)
        self.assertEqual(run["tokens"]["input"], 6 * 44)
        self.assertEqual(run["tokens"]["cached"], 5 * 32)
        lat = run["latency_ms"]
        self.assertEqual((lat["ttft_prefix_hit"]["count"], lat["ttft_prefix_miss"]["count"]),
                         (5, 1))
        self.assertIn("prefix-cached", p.stdout)
        # Chats of 3 turns: turn k + 1 resends turn k's prompt and its 3 tokens, then 20 new
        # ones. Turn 1 (20 tokens) holds no full block; turn 2 (43) reuses 1 block of turn 1's
        # 23 computed tokens; turn 3 (66) the 2 full blocks of turn 2's 46.
        doc, p = self.run_json("--concurrency=1", "--num-requests=3", "--chat-turns=3",
                               "--input-tokens=20", "--output-tokens=3", "--temperature=0",
                               "--cache-salt=loadgen-test-chat")
        run = doc["runs"][0]
        self.assertEqual(doc["workload"]["chat_turns"], 3)
        self.assertEqual(run["requests"]["ok"], 3)
        self.assertEqual(run["tokens"]["input"], 20 + 43 + 66)
        self.assertEqual(run["tokens"]["cached"], 16 + 32)
        self.assertEqual(sorted(run["ttft_ms_by_turn"]), ["1", "2", "3"])
        for turn in ("1", "2", "3"):
            self.assertEqual(run["ttft_ms_by_turn"][turn]["count"], 1, turn)

    def test_duration_bound_run(self):
        doc, _ = self.run_json("--concurrency=2", "--duration=1s", "--input-tokens=8",
                               "--output-tokens=4")
        run = doc["runs"][0]
        self.assertIsNone(doc["workload"]["num_requests"])
        self.assertEqual(doc["workload"]["duration_s"], 1.0)
        self.assertGreater(run["requests"]["ok"], 0)
        self.assertEqual(run["requests"]["failed"], 0)
        # Sending stops after 1 s; the calls then in flight finish.
        self.assertGreater(run["duration_s"], 0.9)

    def test_errors_counted_by_code(self):
        prompts = self.path("prompts.jsonl")
        with open(prompts, "w") as f:
            f.write(json.dumps({"token_ids": [5, 6, 7]}) + "\n")
            f.write(json.dumps({"token_ids": [5] * 1100}) + "\n")  # over the 1024 context
            f.write(json.dumps({"token_ids": [5, 60000]}) + "\n")  # outside the vocabulary
            f.write(json.dumps({"text": "Hello world", "max_new_tokens": 3}) + "\n")
        # Half of the requests fail: above the default --max-error-rate (0), so exit 3 with the
        # reports written all the same; at 0.5 the run passes.
        doc, p = self.run_json("--concurrency=3", "--num-requests=12",
                               f"--prompts-file={prompts}", "--output-tokens=5", returncode=3)
        self.assertIn("dcformer-loadgen: run c=3: 6 of 12 requests failed, more than "
                      "--max-error-rate 0 allows", p.stderr)
        self.assertIn("4 prompts from", p.stdout)
        same, passed = self.run_json("--concurrency=3", "--num-requests=12",
                                     f"--prompts-file={prompts}", "--output-tokens=5",
                                     "--max-error-rate=0.5")
        self.assertNotIn("failed, more than", passed.stderr)
        self.assertEqual(same["runs"][0]["requests"], doc["runs"][0]["requests"])
        run = doc["runs"][0]
        self.assertEqual(doc["workload"]["prompts"], "file")
        self.assertEqual(run["requests"], {"warmup": 0, "sent": 12, "ok": 6, "failed": 6})
        self.assertEqual(run["errors"], {"OUT_OF_RANGE": 3, "INVALID_ARGUMENT": 3})
        self.assertIn("prompt_tokens[1]", run["error_examples"]["INVALID_ARGUMENT"])
        self.assertEqual(run["tokens"]["output"], 3 * 5 + 3 * 3)
        self.assertEqual(run["tokens"]["requested_output"], 3 * 5 + 3 * 3)
        self.assertIn("errors: INVALID_ARGUMENT 3, OUT_OF_RANGE 3", p.stdout)

    def test_bad_flags_exit_2(self):
        prompts = self.path("bad.jsonl")
        with open(prompts, "w") as f:
            f.write('{"text": "ok"}\n{"token_ids": "nope"}\n')
        cases = [
            ([], "give --concurrency N"),
            (["--concurrency=2", "--rate=1"], "not both"),
            (["--concurrency=0"], "--concurrency: '0'"),
            (["--rate=1,-2"], "--rate: '-2'"),
            (["--concurrency=1", "--input-tokens=9:3"], "--input-tokens"),
            (["--concurrency=1", "--output-tokens=abc"], "--output-tokens"),
            (["--concurrency=1", "--num-requests=5", "--duration=2s"], "not both"),
            (["--concurrency=1", "--num-requests=0"], "--num-requests"),
            (["--concurrency=1", "--prompts-file=/nonexistent.jsonl"], "--prompts-file"),
            (["--concurrency=1", f"--prompts-file={prompts}"], "bad.jsonl:2"),
            (["--concurrency=1", "--api-key-file=/nonexistent"], "--api-key-file"),
            (["--concurrency=1", "--json-out=/nonexistent/dir/x.json"], "--json-out"),
            (["--concurrency=1", "--no-such-flag"], "unknown flag --no-such-flag"),
            (["--concurrency=1", "--max-error-rate=2"], "--max-error-rate must be in [0, 1]"),
        ]
        for args, needle in cases:
            with self.subTest(args=args):
                p = run_loadgen(f"--target={self.server.target}", *args, timeout=30)
                self.assertEqual(p.returncode, 2, p.stdout + p.stderr)
                self.assertIn(needle, p.stderr)

    def test_unreachable_target_exits_1(self):
        p = run_loadgen(f"--target=127.0.0.1:{h.free_port()}", "--concurrency=1",
                        "--connect-timeout=1s", timeout=30)
        self.assertEqual(p.returncode, 1, p.stdout + p.stderr)
        self.assertIn("cannot connect to 127.0.0.1:", p.stderr)


class LoadgenApiKeyTest(unittest.TestCase):
    def test_wrong_key_is_counted_as_unauthenticated(self):
        tmp = tempfile.mkdtemp(prefix="loadgen-key-")
        try:
            good, bad, prompts = (os.path.join(tmp, n) for n in ("good", "bad", "p.jsonl"))
            with open(good, "w") as f:
                f.write("secret-key-456\n")
            with open(bad, "w") as f:
                f.write("wrong-key\n")
            with open(prompts, "w") as f:
                f.write(json.dumps({"token_ids": [1, 2, 3]}) + "\n")
            with h.Server(model=TINY_MODEL, args=[f"--api-key-file={good}"]) as server:
                base = [LOADGEN, f"--target={server.target}", "--concurrency=2",
                        "--num-requests=6", "--output-tokens=2"]
                # Random prompts need GetModelInfo's vocabulary: a wrong key ends the run.
                p = subprocess.run(base + [f"--api-key-file={bad}"], capture_output=True,
                                   text=True, timeout=60)
                self.assertEqual(p.returncode, 1, p.stdout + p.stderr)
                self.assertIn("GetModelInfo", p.stderr)
                self.assertIn("UNAUTHENTICATED", p.stderr)
                # With prompts from a file the run goes ahead and counts the rejections.
                out = os.path.join(tmp, "bad.json")
                p = subprocess.run(base + [f"--api-key-file={bad}", f"--prompts-file={prompts}",
                                           f"--json-out={out}"],
                                   capture_output=True, text=True, timeout=60)
                # Every request failed: exit 3 (issue 24), the report still written.
                self.assertEqual(p.returncode, 3, p.stdout + p.stderr)
                self.assertIn("6 of 6 requests failed", p.stderr)
                self.assertIn("1 prompt from", p.stdout)
                with open(out) as f:
                    doc = json.load(f)
                self.assertIsNone(doc["model"])
                run = doc["runs"][0]
                self.assertEqual(run["requests"], {"warmup": 0, "sent": 6, "ok": 0, "failed": 6})
                self.assertEqual(run["errors"], {"UNAUTHENTICATED": 6})
                self.assertEqual(run["latency_ms"]["e2e"]["count"], 0)
                # The right key: every request succeeds.
                out = os.path.join(tmp, "good.json")
                p = subprocess.run(base + [f"--api-key-file={good}", f"--json-out={out}"],
                                   capture_output=True, text=True, timeout=60)
                self.assertEqual(p.returncode, 0, p.stdout + p.stderr)
                with open(out) as f:
                    run = json.load(f)["runs"][0]
                self.assertEqual(run["requests"]["ok"], 6)
                self.assertEqual(run["errors"], {})
        finally:
            shutil.rmtree(tmp, ignore_errors=True)


class LoadgenTlsTest(unittest.TestCase):
    def test_tls(self):
        tmp = tempfile.mkdtemp(prefix="loadgen-tls-")
        try:
            test_security.make_pki(tmp)
            pem = lambda name: os.path.join(tmp, name)  # noqa: E731
            with h.Server(model=TINY_MODEL, tls_ca=pem("ca.pem"),
                          args=[f"--tls-cert={pem('server.pem')}",
                                f"--tls-key={pem('server.key')}"]) as server:
                base = [LOADGEN, f"--target=localhost:{server.port}", "--concurrency=2",
                        "--num-requests=4", "--input-tokens=4", "--output-tokens=2",
                        "--connect-timeout=1s"]
                p = subprocess.run(base + [f"--tls-ca={pem('ca.pem')}"], capture_output=True,
                                   text=True, timeout=60)
                self.assertEqual(p.returncode, 0, p.stdout + p.stderr)
                self.assertIn("4 requests (0 warm-up excluded), 4 OK, 0 failed", p.stdout)
                # A server certificate from another CA, or no TLS at all: no connection.
                for extra in ([f"--tls-ca={pem('other-ca.pem')}"], []):
                    with self.subTest(extra=extra):
                        p = subprocess.run(base + extra, capture_output=True, text=True,
                                           timeout=60)
                        self.assertEqual(p.returncode, 1, p.stdout + p.stderr)
                        self.assertIn("cannot connect", p.stderr)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    unittest.main()
