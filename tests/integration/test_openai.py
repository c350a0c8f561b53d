"""The OpenAI-compatible HTTP front (--http-port) driven by real clients over loopback: Python's
standard-library http.client, curl -N for the SSE framing byte for byte, and the example client
client/examples/python/openai_http.py. The default model (models/dcformer-kjv) has a tokenizer
and a chat template."""
import http.client
import json
import os
import re
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
import unittest

import harness as h

KJV = os.path.join(h.SOURCE_DIR, "models", "dcformer-kjv")
MODEL = "dcformer-kjv"
EXAMPLE = os.path.join(h.SOURCE_DIR, "client", "examples", "python", "openai_http.py")
SDK_DIR = os.path.join(h.SOURCE_DIR, "client", "examples", "openai-node")
SDK_CHECK = os.path.join(os.path.dirname(os.path.abspath(__file__)), "openai_sdk_check.js")


def sdk_missing():
    """Why the openai SDK cannot run (None when it can): scripts/setup.sh installs it from the
    package-lock; tests never download anything."""
    if shutil.which("node") is None:
        return "node not installed"
    if not os.path.isdir(os.path.join(SDK_DIR, "node_modules", "openai")):
        return "client/examples/openai-node/node_modules missing: run scripts/setup.sh"
    return None


class HttpServer(h.Server):
    """A dcformer-server with the HTTP front on a free port."""

    def __init__(self, args=(), model=KJV, **kw):
        self.http_port = h.free_port()
        super().__init__(model=model, args=[f"--http-port={self.http_port}", *args], **kw)

    def request(self, method, path, body=None, headers=None, timeout=60):
        """(status, headers dict, body bytes) of one request on a new connection."""
        conn = http.client.HTTPConnection("127.0.0.1", self.http_port, timeout=timeout)
        try:
            data = json.dumps(body).encode() if isinstance(body, (dict, list)) else body
            hdrs = {"Content-Type": "application/json", **(headers or {})}
            conn.request(method, path, body=data, headers=hdrs)
            r = conn.getresponse()
            return r.status, {k.lower(): v for k, v in r.getheaders()}, r.read()
        finally:
            conn.close()

    def post(self, path, body, **kw):
        status, headers, data = self.request("POST", path, body, **kw)
        return status, headers, json.loads(data) if data.startswith(b"{") else data


def dechunk(raw):
    """The payload of an HTTP/1.1 chunked body (asserts its framing and its last chunk)."""
    out, rest = b"", raw
    while True:
        size, sep, rest = rest.partition(b"\r\n")
        assert sep, rest[:100]
        n = int(size, 16)
        if n == 0:
            assert rest == b"\r\n", rest[:100]
            return out
        out += rest[:n]
        assert rest[n:n + 2] == b"\r\n", rest[n:n + 100]
        rest = rest[n + 2:]


def sse_events(raw):
    """The data payloads of an SSE body; asserts the framing (data: ...\\n\\n only)."""
    text = raw.decode()
    assert text.endswith("data: [DONE]\n\n"), text[-200:]
    events = text.split("\n\n")
    assert events[-1] == "", events[-1]
    out = []
    for e in events[:-1]:
        assert e.startswith("data: ") and "\n" not in e, repr(e)
        out.append(e[len("data: "):])
    assert out[-1] == "[DONE]"
    return [json.loads(e) for e in out[:-1]]


class OpenAiTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.server = HttpServer().__enter__()

    @classmethod
    def tearDownClass(cls):
        cls.server.__exit__(None, None, None)

    def test_models_and_health(self):
        status, headers, data = self.server.request("GET", "/v1/models")
        self.assertEqual(status, 200)
        self.assertEqual(headers["content-type"], "application/json")
        models = json.loads(data)
        self.assertEqual(models["object"], "list")
        self.assertEqual([m["id"] for m in models["data"]], [MODEL])
        status, _, data = self.server.request("GET", "/health")
        self.assertEqual((status, data), (200, b"SERVING\n"))

    def test_completion_matches_grpc_greedy(self):
        prompt = "In the beginning God created"
        status, _, body = self.server.post("/v1/completions", {
            "model": MODEL, "prompt": prompt, "max_tokens": 12, "temperature": 0,
            "ignore_eos": True})
        self.assertEqual(status, 200, body)
        self.assertEqual(body["object"], "text_completion")
        self.assertTrue(body["id"].startswith("cmpl-"))
        (choice,) = body["choices"]
        self.assertEqual(choice["finish_reason"], "length")
        self.assertEqual(body["usage"]["completion_tokens"], 12)
        self.assertEqual(body["usage"]["total_tokens"],
                         body["usage"]["prompt_tokens"] + 12)
        # The same greedy request over gRPC gives the same text.
        req = h.pb.GenerateRequest(text=prompt)
        req.sampling.temperature = 0
        req.stopping.max_new_tokens = 12
        req.stopping.ignore_eos = True
        with self.server.channel() as ch:
            stream = h.pb_grpc.TextGenerationStub(ch).Generate(req, timeout=60)
            text = "".join(m.text for m in stream)
        self.assertEqual(choice["text"], text)
        self.assertGreater(len(text), 0)

    def test_token_id_prompts_echo_and_n(self):
        status, _, body = self.server.post("/v1/completions", {
            "model": MODEL, "prompt": [[10, 20, 30], "And"], "max_tokens": 3,
            "temperature": 0.8, "seed": 7, "n": 2, "echo": True})
        self.assertEqual(status, 200, body)
        self.assertEqual([c["index"] for c in body["choices"]], [0, 1, 2, 3])
        self.assertTrue(body["choices"][2]["text"].startswith("And"))
        self.assertTrue(body["choices"][3]["text"].startswith("And"))
        # Seeded: the same request again gives the same choices.
        status, _, again = self.server.post("/v1/completions", {
            "model": MODEL, "prompt": [[10, 20, 30], "And"], "max_tokens": 3,
            "temperature": 0.8, "seed": 7, "n": 2, "echo": True})
        self.assertEqual([c["text"] for c in again["choices"]],
                         [c["text"] for c in body["choices"]])

    def test_stop_strings(self):
        status, _, body = self.server.post("/v1/completions", {
            "model": MODEL, "prompt": "And the LORD said unto", "max_tokens": 40,
            "temperature": 0, "stop": ["LORD"], "ignore_eos": True})
        self.assertEqual(status, 200, body)
        choice = body["choices"][0]
        if choice["finish_reason"] == "stop":
            self.assertNotIn("LORD", choice["text"])
        # Greedy on this model writes LORD within 40 tokens (the free run shows it).
        status, _, free = self.server.post("/v1/completions", {
            "model": MODEL, "prompt": "And the LORD said unto", "max_tokens": 40,
            "temperature": 0, "ignore_eos": True})
        if "LORD" in free["choices"][0]["text"]:
            self.assertEqual(choice["finish_reason"], "stop")
            self.assertTrue(free["choices"][0]["text"].startswith(choice["text"]))

    def test_logprobs_shapes(self):
        status, _, body = self.server.post("/v1/completions", {
            "model": MODEL, "prompt": "And", "max_tokens": 4, "temperature": 0,
            "logprobs": 2, "ignore_eos": True})
        self.assertEqual(status, 200, body)
        lp = body["choices"][0]["logprobs"]
        self.assertEqual(len(lp["tokens"]), 4)
        self.assertEqual(len(lp["token_logprobs"]), 4)
        self.assertTrue(all(len(t) == 2 for t in lp["top_logprobs"]))
        self.assertEqual(lp["text_offset"][0], 0)
        self.assertTrue(all(x <= 0 for x in lp["token_logprobs"]))
        # Greedy: the chosen token is the most likely one.
        for tok, lp_, top in zip(lp["tokens"], lp["token_logprobs"], lp["top_logprobs"]):
            self.assertAlmostEqual(max(top.values()), lp_, places=5)
        status, _, chat = self.server.post("/v1/chat/completions", {
            "model": MODEL, "messages": [{"role": "user", "content": "And God said"}],
            "max_completion_tokens": 3, "temperature": 0, "logprobs": True,
            "top_logprobs": 3, "ignore_eos": True})
        self.assertEqual(status, 200, chat)
        content = chat["choices"][0]["logprobs"]["content"]
        self.assertEqual(len(content), 3)
        for entry in content:
            self.assertEqual(set(entry), {"token", "logprob", "bytes", "top_logprobs"})
            self.assertEqual(len(entry["top_logprobs"]), 3)
            self.assertEqual(bytes(entry["bytes"]).decode(errors="replace"), entry["token"])

    def test_chat(self):
        status, _, body = self.server.post("/v1/chat/completions", {
            "model": MODEL, "messages": [
                {"role": "system", "content": "The book of Genesis."},
                {"role": "user", "content": [{"type": "text", "text": "In the beginning"}]}],
            "max_tokens": 6, "temperature": 0, "ignore_eos": True})
        self.assertEqual(status, 200, body)
        self.assertEqual(body["object"], "chat.completion")
        msg = body["choices"][0]["message"]
        self.assertEqual(msg["role"], "assistant")
        self.assertGreater(len(msg["content"]), 0)
        # The template renders "<system>\n\n<user>\n\n": the prompt's tokens are those.
        status, _, same = self.server.post("/v1/completions", {
            "model": MODEL, "prompt": "The book of Genesis.\n\nIn the beginning\n\n",
            "max_tokens": 6, "temperature": 0, "ignore_eos": True})
        self.assertEqual(same["choices"][0]["text"], msg["content"])
        self.assertEqual(same["usage"]["prompt_tokens"], body["usage"]["prompt_tokens"])

    def test_streaming_sse_with_curl(self):
        curl = shutil.which("curl")
        if curl is None:
            self.skipTest("curl not installed")
        body = json.dumps({"model": MODEL, "stream": True,
                           "stream_options": {"include_usage": True}, "n": 2,
                           "messages": [{"role": "user", "content": "And God said"}],
                           "max_tokens": 5, "temperature": 0, "ignore_eos": True})
        out = subprocess.run([curl, "-sSN", "-D", "-", "-H", "Content-Type: application/json",
                              "-d", body,
                              f"http://127.0.0.1:{self.server.http_port}/v1/chat/completions"],
                             check=True, capture_output=True, timeout=60).stdout
        head, _, raw = out.partition(b"\r\n\r\n")
        self.assertIn(b"HTTP/1.1 200 OK", head)
        self.assertIn(b"Content-Type: text/event-stream", head)
        self.assertIn(b"Transfer-Encoding: chunked", head)
        events = sse_events(raw)
        usage = events[-1]
        self.assertEqual(usage["choices"], [])
        self.assertEqual(usage["usage"]["completion_tokens"], 10)
        texts = {0: "", 1: ""}
        finishes = {}
        roles = set()
        for e in events[:-1]:
            self.assertEqual(e["object"], "chat.completion.chunk")
            self.assertIsNone(e["usage"])
            (c,) = e["choices"]
            if "role" in c["delta"]:
                roles.add(c["index"])
            texts[c["index"]] += c["delta"].get("content", "")
            if c["finish_reason"] is not None:
                finishes[c["index"]] = c["finish_reason"]
        self.assertEqual(roles, {0, 1})
        self.assertEqual(finishes, {0: "length", 1: "length"})
        self.assertEqual(texts[0], texts[1])  # greedy: both choices alike
        # The non-streamed answer has the same text.
        status, _, whole = self.server.post("/v1/chat/completions", {
            "model": MODEL, "messages": [{"role": "user", "content": "And God said"}],
            "max_tokens": 5, "temperature": 0, "ignore_eos": True})
        self.assertEqual(whole["choices"][0]["message"]["content"], texts[0])

    def test_streamed_completion_without_usage(self):
        conn = http.client.HTTPConnection("127.0.0.1", self.server.http_port, timeout=60)
        conn.request("POST", "/v1/completions", body=json.dumps({
            "model": MODEL, "prompt": "And", "max_tokens": 4, "stream": True,
            "temperature": 0, "ignore_eos": True}))
        r = conn.getresponse()
        self.assertEqual(r.status, 200)
        events = sse_events(r.read())
        conn.close()
        self.assertTrue(all("usage" not in e for e in events))
        self.assertEqual(events[-1]["choices"][0]["finish_reason"], "length")
        self.assertTrue(all(e["choices"][0]["finish_reason"] is None for e in events[:-1]))

    def test_errors(self):
        cases = [
            ({"model": MODEL, "prompt": "a", "temperature": "hot"}, 400, "temperature"),
            ({"model": MODEL, "prompt": "a", "tools": [{"type": "function"}]}, 400, "tools"),
            ({"model": MODEL, "prompt": "a", "logit_bias": {"1": 2}}, 400, "logit_bias"),
            ({"model": MODEL, "prompt": [1, -2]}, 400, "prompt[1]"),
            ({"model": MODEL, "prompt": [1, 999999]}, 400, "prompt[1]"),
            ({"model": MODEL, "prompt": "a", "max_tokens": 100000}, 400, "max_tokens"),
            ({"model": "gpt-4", "prompt": "a"}, 404, "model"),
            ({"prompt": "a"}, 400, "model"),
            ({"model": MODEL, "prompt": "a", "unknown_field": 1, "max_tokens": 1}, 200, None),
        ]
        for body, want, param in cases:
            status, headers, got = self.server.post("/v1/completions", body)
            self.assertEqual(status, want, (body, got))
            if want != 200:
                self.assertEqual(headers["content-type"], "application/json")
                self.assertEqual(got["error"]["param"], param, got)
                self.assertIn(param, got["error"]["message"])
                self.assertIn(got["error"]["type"], ("invalid_request_error", "not_found_error"))
        status, _, got = self.server.post("/v1/completions", b'{"model": "x", "prompt": [1,')
        self.assertEqual(status, 400)
        self.assertIn("not valid JSON", got["error"]["message"])
        status, _, got = self.server.post("/v1/chat/completions",
                                          b'{"model": "dcformer-kjv", "messages": '
                                          b'[{"role": "user", "content": "\xff"}]}')
        self.assertEqual(status, 400)
        self.assertIn("UTF-8", got["error"]["message"])
        self.assertEqual(got["error"]["param"], "messages[0].content")
        status, _, got = self.server.request("GET", "/v1/nothing")
        self.assertEqual(status, 404)
        self.assertEqual(json.loads(got)["error"]["type"], "not_found_error")
        status, headers, got = self.server.request("GET", "/v1/completions")
        self.assertEqual(status, 405)
        self.assertIn("POST", headers["allow"])
        # A body over --max-receive-message-bytes (1 MiB by default): 413, JSON.
        status, _, got = self.server.request("POST", "/v1/completions", b"x" * (2 << 20))
        self.assertEqual(status, 413)
        self.assertEqual(json.loads(got)["error"]["code"], "payload_too_large")
        # Nothing changed: the server still answers.
        status, _, body = self.server.post("/v1/completions", {
            "model": MODEL, "prompt": "a", "max_tokens": 1})
        self.assertEqual(status, 200)
        # Each refused generation request has its log line, as a refused Generate call has
        # (it had none, only its count), without the message (which may quote the request).
        log = self.server.read_log()
        self.assertIn("protocol=http outcome=invalid_argument status=400", log)
        self.assertIn("protocol=http outcome=not_found status=404", log)
        self.assertNotIn("gpt-4", log)

    def test_cache_salt_isolates_the_prefix_cache(self):
        # It was ignored over HTTP: a salted request hit the unsalted request's blocks (and a
        # wrong type passed), though API.md tells operators to salt each tenant.
        prompt = [5 + (i * 41) % 240 for i in range(40)]  # 2 full blocks of 16, unlike others'
        def hits_after(extra):
            before = self.server.metric("dcformer_prefix_cache_hits_total")
            status, _, got = self.server.post("/v1/completions", {
                "model": MODEL, "prompt": prompt, "max_tokens": 1, **extra})
            self.assertEqual(status, 200, got)
            return self.server.metric("dcformer_prefix_cache_hits_total") - before
        self.assertEqual(hits_after({}), 0)
        self.assertEqual(hits_after({}), 32)
        self.assertEqual(hits_after({"cache_salt": "tenant-x"}), 0)
        self.assertEqual(hits_after({"cache_salt": "tenant-x"}), 32)
        self.assertEqual(hits_after({"cache_salt": "tenant-y"}), 0)
        for salt, what in ((5, "a string"), ("s" * 257, "longer than 256 bytes")):
            status, _, got = self.server.post("/v1/completions", {
                "model": MODEL, "prompt": prompt, "max_tokens": 1, "cache_salt": salt})
            self.assertEqual(status, 400, got)
            self.assertEqual(got["error"]["param"], "cache_salt", got)
            self.assertIn(what, got["error"]["message"])

    def test_disconnect_cancels_and_metrics_label(self):
        before = self.server.metric("dcformer_requests_total", outcome="cancelled",
                                    protocol="http")
        s = socket.create_connection(("127.0.0.1", self.server.http_port), timeout=30)
        body = json.dumps({"model": MODEL, "prompt": "And", "max_tokens": 200, "stream": True,
                           "ignore_eos": True}).encode()
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json"
                  b"\r\nContent-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
        got = b""
        while b"data: " not in got:
            got += s.recv(4096)
        s.close()
        h.wait_until(lambda: self.server.metric("dcformer_requests_total", outcome="cancelled",
                                                protocol="http") == before + 1,
                     what="the HTTP request counted cancelled")
        h.wait_until(lambda: self.server.kv_blocks_used() == 0, what="KV blocks freed")
        self.assertGreater(self.server.metric("dcformer_generation_tokens_total",
                                              protocol="http"), 0)
        self.assertGreater(self.server.metric("dcformer_time_to_first_token_seconds_count",
                                              protocol="http"), 0)

    def test_python_example_client(self):
        out = subprocess.run([sys.executable, EXAMPLE, f"--url=http://127.0.0.1:"
                              f"{self.server.http_port}", "--max-tokens=5", "--stream",
                              "And God said"], check=True, capture_output=True, text=True,
                             timeout=60)
        self.assertIn("finish_reason=length", out.stdout)
        self.assertGreater(len(out.stdout.splitlines()[0]), 0)


class OpenAiSdkTest(unittest.TestCase):
    def test_official_openai_sdk(self):
        reason = sdk_missing()
        if reason:
            self.skipTest(reason)
        with tempfile.NamedTemporaryFile("w", suffix=".keys", delete=False) as f:
            f.write("sdk-key\n")
        try:
            with HttpServer(args=[f"--api-key-file={f.name}"]) as server:
                out = subprocess.run(["node", SDK_CHECK, f"http://127.0.0.1:{server.http_port}/v1",
                                      "sdk-key"], capture_output=True, text=True, timeout=120)
                self.assertEqual(out.returncode, 0, out.stderr)
                got = json.loads(out.stdout)
                example = subprocess.run(
                    ["node", os.path.join(SDK_DIR, "chat.js"), "--url",
                     f"http://127.0.0.1:{server.http_port}/v1", "--api-key", "sdk-key",
                     "--max-tokens", "4", "And God said"],
                    capture_output=True, text=True, timeout=60)
                self.assertEqual(example.returncode, 0, example.stderr)
                self.assertIn("finish_reason=", example.stdout)
        finally:
            os.unlink(f.name)
        self.assertEqual(got["models"], [MODEL])
        c = got["completion"]["choices"][0]
        self.assertEqual(c["finish_reason"], "length")
        self.assertEqual(len(c["logprobs"]["tokens"]), got["completion"]["usage"]["completion_tokens"])
        self.assertTrue(all(len(t) == 2 for t in c["logprobs"]["top_logprobs"]))
        chat = got["chat"]
        self.assertEqual([x["index"] for x in chat["choices"]], [0, 1])
        self.assertEqual(chat["choices"][0]["message"]["content"],
                         chat["choices"][1]["message"]["content"])  # greedy
        self.assertTrue(all(len(e["top_logprobs"]) == 2
                            for e in chat["choices"][0]["logprobs"]["content"]))
        stream = got["stream"]
        self.assertEqual(stream[-1]["choices"], [])
        self.assertEqual(stream[-1]["usage"]["completion_tokens"], 5)
        text = "".join(e["choices"][0]["delta"].get("content", "") for e in stream[:-1])
        self.assertEqual(text, chat["choices"][0]["message"]["content"])
        self.assertEqual(stream[-2]["choices"][0]["finish_reason"], "length")
        stop = got["stop"]["choices"][0]
        self.assertNotIn("LORD", stop["text"])
        self.assertEqual(got["seeded"][0], got["seeded"][1])
        self.assertEqual(got["errors"]["model"]["status"], 404)
        self.assertEqual(got["errors"]["type"], {"status": 400, "type": "invalid_request_error",
                                                 "param": "temperature"})
        self.assertEqual(got["errors"]["tools"]["status"], 400)
        self.assertEqual(got["errors"]["tools"]["param"], "tools")
        self.assertEqual(got["errors"]["key"]["status"], 401)


class OpenAiQueueLimitsTest(unittest.TestCase):
    def test_choices_that_can_never_be_queued_are_a_400(self):
        """Every choice waits in the engine's queue, so a request whose choices together
        exceed its limits cannot succeed: 400 naming the field, not the 429 "retry later"
        that OpenAI's SDKs retry."""
        with HttpServer(args=["--max-queued-requests=4",
                              "--max-queued-prompt-tokens=100"]) as server:
            cases = [({"prompt": "a", "n": 5}, 400, "n"),
                     ({"prompt": [[5] * 60, [6] * 60]}, 400, "prompt"),
                     ({"prompt": [5] * 60, "n": 2}, 400, "n"),
                     ({"prompt": "a", "n": 4}, 200, None),
                     ({"prompt": [5] * 101, "n": 2}, 400, "prompt"),  # the engine's
                     ({"prompt": [[5, 5], [5] * 101]}, 400, "prompt[1]"),
                     ({"prompt": [[5] * 40, [6] * 40]}, 200, None)]
            for body, want, param in cases:
                status, _, got = server.post("/v1/completions",
                                             {"model": MODEL, "max_tokens": 1, **body})
                self.assertEqual(status, want, (body, got))
                if param is not None:
                    self.assertEqual(got["error"]["param"], param, got)
                    self.assertEqual(got["error"]["code"], "out_of_range", got)
                    self.assertIn("can never be queued", got["error"]["message"])
            status, _, got = server.post("/v1/chat/completions", {
                "model": MODEL, "max_tokens": 1, "n": 1,
                "messages": [{"role": "user", "content": "a"}] * 2})
            self.assertEqual(status, 200, got)
            status, _, got = server.post("/v1/chat/completions", {
                "model": MODEL, "max_tokens": 1, "n": 5,
                "messages": [{"role": "user", "content": "a"}]})
            self.assertEqual((status, got["error"]["param"]), (400, "n"), got)
            # prompt_tokens_total counts each prompt once whatever n, as usage does.
            before = server.metric("dcformer_prompt_tokens_total", protocol="http")
            status, _, got = server.post("/v1/completions", {
                "model": MODEL, "max_tokens": 1, "prompt": [[5, 6, 7], [8, 9]], "n": 2})
            self.assertEqual((status, got["usage"]["prompt_tokens"]), (200, 5), got)
            self.assertEqual(server.metric("dcformer_prompt_tokens_total", protocol="http"),
                             before + 5)


class OpenAiResponseLimitTest(unittest.TestCase):
    """--max-send-message-bytes bounds a non-streamed body (the outside probe: one small request
    with n=128, top_logprobs 20 made a 42 MB body and 790 MB of server memory)."""

    LIMIT = 4096

    def test_a_response_over_the_send_limit_is_a_400_and_cancels_its_choices(self):
        with HttpServer(args=[f"--max-send-message-bytes={self.LIMIT}",
                              "--max-stream-buffer-bytes=2048"]) as server:
            def served_normally():
                status, _, got = server.post("/v1/completions", {
                    "model": MODEL, "prompt": "And", "max_tokens": 2})
                self.assertEqual(status, 200, got)

            def refused(path, body):
                status, _, got = server.post(path, body)
                self.assertEqual(status, 400, str(got)[:300])
                err = got["error"]
                self.assertEqual((err["type"], err["param"]), ("invalid_request_error", None))
                self.assertIn("--max-send-message-bytes", err["message"])
                self.assertIn('"stream": true', err["message"])
                self.assertIn(str(self.LIMIT), err["message"])

            def engine_idle():
                m = server.metrics()
                return all(h.sum_series(m, name) == 0 for name in (
                    "dcformer_kv_cache_blocks_used", "dcformer_num_requests_running",
                    "dcformer_num_requests_waiting"))

            def count(outcome):
                return server.metric("dcformer_requests_total", outcome=outcome, protocol="http")

            def sent_tokens():
                return server.metric("dcformer_generation_tokens_total", protocol="http")

            # Past the limit while generating: every choice is cancelled in the engine well
            # before its 200 tokens, and each counts out_of_range; no token was sent, so none
            # counts as generated and sent.
            tokens = sent_tokens()
            before = count("out_of_range")
            refused("/v1/completions", {"model": MODEL, "prompt": "And", "n": 16, "logprobs": 20,
                                        "max_tokens": 200, "ignore_eos": True})
            h.wait_until(engine_idle, what="no sequence or KV block left in the engine")
            self.assertEqual(count("out_of_range"), before + 16)
            self.assertEqual(sent_tokens(), tokens)
            served_normally()
            self.assertGreater(sent_tokens(), tokens)  # a 200's tokens count
            # Chat's logprobs, the same way.
            tokens = sent_tokens()
            refused("/v1/chat/completions", {
                "model": MODEL, "messages": [{"role": "user", "content": "And"}], "n": 4,
                "logprobs": True, "top_logprobs": 20, "max_tokens": 200, "ignore_eos": True})
            h.wait_until(engine_idle, what="no sequence or KV block left in the engine")
            self.assertEqual(sent_tokens(), tokens)
            served_normally()
            # Past it only once the body is built (each choice's own text is tiny; its JSON is
            # not): refused too, not one choice counted as finished, no token as sent.
            before, length = count("out_of_range"), count("length")
            tokens = sent_tokens()
            refused("/v1/completions", {"model": MODEL, "prompt": "And", "n": 64, "max_tokens": 1})
            self.assertEqual(count("out_of_range"), before + 64)
            self.assertEqual(count("length"), length)
            self.assertEqual(sent_tokens(), tokens)
            self.assertTrue(engine_idle())
            served_normally()

            # Under the limit: the response is what it always was, and the same as streamed.
            for path, body in [
                    ("/v1/completions", {"prompt": "In the beginning", "logprobs": 2}),
                    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "And"}],
                                              "logprobs": True, "top_logprobs": 2})]:
                body = {"model": MODEL, "max_tokens": 8, "temperature": 0, "ignore_eos": True,
                        **body}
                status, _, raw = server.request("POST", path, body)
                self.assertEqual(status, 200, raw)
                self.assertLess(len(raw), self.LIMIT)
                got = json.loads(raw)
                # nlohmann's form: keys sorted, no spaces, UTF-8 as is, one newline (numbers
                # with a fraction masked: its shortest digits and Python's may differ at the
                # last one).
                floats = re.compile(r"-?\d+(\.\d+)?e[-+]?\d+|-?\d+\.\d+")
                self.assertEqual(floats.sub("F", raw.decode()), floats.sub("F", json.dumps(
                    got, sort_keys=True, ensure_ascii=False, separators=(",", ":")) + "\n"))
                choice = got["choices"][0]
                self.assertEqual(choice["finish_reason"], "length")
                self.assertEqual(got["usage"]["completion_tokens"], 8)
                status, _, sse = server.request("POST", path, {**body, "stream": True})
                self.assertEqual(status, 200, sse)
                events = [e["choices"][0] for e in sse_events(sse)]
                if path == "/v1/completions":
                    self.assertEqual("".join(e["text"] for e in events), choice["text"])
                    lp = choice["logprobs"]
                    self.assertEqual(len(lp["tokens"]), 8)
                    for key in ("tokens", "token_logprobs", "top_logprobs", "text_offset"):
                        self.assertEqual(sum((e["logprobs"][key] for e in events if e["logprobs"]),
                                             []), lp[key], key)
                else:
                    self.assertEqual("".join(e["delta"].get("content", "") for e in events),
                                     choice["message"]["content"])
                    self.assertEqual(sum((e["logprobs"]["content"] for e in events
                                          if e["logprobs"]), []),
                                     choice["logprobs"]["content"])
                    self.assertEqual(len(choice["logprobs"]["content"]), 8)
            self.assertTrue(engine_idle())


class OpenAiAuthAndDrainTest(unittest.TestCase):
    def test_api_key_and_drain(self):
        with tempfile.NamedTemporaryFile("w", suffix=".keys", delete=False) as f:
            f.write("s3cret-key\n")
        try:
            with HttpServer(args=[f"--api-key-file={f.name}", "--drain-timeout=20s"]) as server:
                status, headers, got = server.post("/v1/completions", {
                    "model": MODEL, "prompt": "a", "max_tokens": 1})
                self.assertEqual(status, 401)
                self.assertEqual(got["error"]["type"], "authentication_error")
                self.assertEqual(headers["www-authenticate"], "Bearer")
                status, _, got = server.post("/v1/completions", {
                    "model": MODEL, "prompt": "a", "max_tokens": 1},
                    headers={"Authorization": "Bearer wrong"})
                self.assertEqual(status, 401)
                self.assertNotIn("wrong", json.dumps(got))
                status, _, _ = server.request("GET", "/v1/models")  # not a generation request
                self.assertEqual(status, 401)
                self.assertEqual(server.metric("dcformer_requests_total", protocol="http",
                                               outcome="unauthenticated"), 2)
                auth = {"Authorization": "Bearer s3cret-key"}
                status, _, _ = server.post("/v1/completions", {
                    "model": MODEL, "prompt": "a", "max_tokens": 1}, headers=auth)
                self.assertEqual(status, 200)
                status, _, _ = server.request("GET", "/health")  # no key needed
                self.assertEqual(status, 200)
                # A stream running when SIGTERM arrives finishes; new requests get 503.
                conn = http.client.HTTPConnection("127.0.0.1", server.http_port, timeout=60)
                conn.request("POST", "/v1/completions", body=json.dumps({
                    "model": MODEL, "prompt": "And", "max_tokens": 150, "stream": True,
                    "ignore_eos": True}), headers=auth)
                r = conn.getresponse()
                first = r.readline()
                self.assertTrue(first.startswith(b"data: "), first)
                server.proc.send_signal(signal.SIGTERM)
                # "draining N stream(s)": logged once the HTTP front refuses new requests
                # ("received SIGTERM: draining" comes before, while it may still accept one).
                h.wait_until(lambda: re.search(r"draining \d+ stream", server.read_log()),
                             what="drain")
                status = None
                try:
                    status, _, got = server.post("/v1/completions", {
                        "model": MODEL, "prompt": "a", "max_tokens": 1}, headers=auth)
                except (ConnectionError, http.client.HTTPException):
                    pass
                if status is not None:
                    self.assertEqual(status, 503)
                    self.assertEqual(got["error"]["type"], "service_unavailable_error")
                rest = first + r.read()
                conn.close()
                self.assertTrue(rest.endswith(b"data: [DONE]\n\n"), rest[-200:])
                self.assertIn(b'"finish_reason":"length"', rest)
                self.assertEqual(server.proc.wait(timeout=30), 0)
        finally:
            os.unlink(f.name)


class OpenAiDrainRefusalTest(unittest.TestCase):
    """While a drain waits on a stream (held here by a step that stalls until released,
    dcformer-server-faults), a new generation request gets 503 and counts in requests_total as
    `unavailable` (as a Generate call refused then does), and /health answers NOT_SERVING as
    it does whenever the server is not serving; before, the HTTP layer answered every request
    with its own JSON 503 and counted none."""

    def test_requests_during_a_drain(self):
        tmp = tempfile.mkdtemp()
        self.addCleanup(shutil.rmtree, tmp)
        release = os.path.join(tmp, "release")
        stall = 8
        args = [f"--fault-stall-token={stall}", f"--fault-release-file={release}",
                "--drain-timeout=60s", "--engine-stall-timeout=300ms"]
        with HttpServer(binary=h.SERVER_FAULTS, args=args) as server:
            stalled = server.stub().Generate(h.ids_request([stall, 5, 9], 4), timeout=120)
            h.wait_until(lambda: "engine loop stalled" in server.read_log(),
                         what="the step to stall")
            server.proc.send_signal(signal.SIGTERM)
            h.wait_until(lambda: re.search(r"draining 1 stream", server.read_log()),
                         what="drain")
            refused = lambda: server.metric("dcformer_requests_total", protocol="http",
                                            outcome="unavailable")
            self.assertEqual(refused(), 0)
            for path in ("/v1/completions", "/v1/chat/completions"):
                body = {"model": MODEL, "max_tokens": 1, "prompt": "a"} \
                    if path == "/v1/completions" else \
                    {"model": MODEL, "max_tokens": 1, "messages": [{"role": "user",
                                                                     "content": "a"}]}
                status, headers, got = server.post(path, body)
                self.assertEqual(status, 503, got)
                self.assertEqual(got["error"]["type"], "service_unavailable_error")
                self.assertEqual(headers.get("connection"), "close")
            self.assertEqual(refused(), 2)
            status, _, got = server.request("GET", "/health")
            self.assertEqual((status, got), (503, b"NOT_SERVING\n"))
            status, _, got = server.request("GET", "/v1/models")  # refused, not a request
            self.assertEqual(status, 503)
            self.assertEqual(refused(), 2)
            open(release, "w").close()
            tokens, final = h.collect(stalled)
            self.assertEqual(len(tokens), 4)
            self.assertEqual(server.proc.wait(timeout=30), 0, server.read_log()[-3000:])


class OpenAiGroupAdmissionTest(unittest.TestCase):
    """A request's choices are queued whole or not at all (Engine::EnqueueAll). With a step
    stalled (dcformer-server-faults) and room in the waiting queue for fewer choices than an
    n-choice request has, it gets 429 and none of its choices waits; the front used to queue
    choices one by one, so the first ones waited (and held queue room) until the refusal of
    a later one cancelled them."""

    def test_a_group_that_fits_only_partly_is_refused_whole(self):
        tmp = tempfile.mkdtemp()
        self.addCleanup(shutil.rmtree, tmp)
        release = os.path.join(tmp, "release")
        stall, limit = 8, 4
        args = [f"--fault-stall-token={stall}", f"--fault-release-file={release}",
                "--engine-stall-timeout=300ms", "--max-num-seqs=1",
                f"--max-queued-requests={limit}"]
        with HttpServer(binary=h.SERVER_FAULTS, args=args) as server:
            stalled = server.stub().Generate(h.ids_request([stall, 5, 9], 4), timeout=120)
            h.wait_until(lambda: "engine loop stalled" in server.read_log(),
                         what="the step to stall")
            waiting = lambda: int(server.metric("dcformer_num_requests_waiting"))
            before = waiting()
            one = {}
            t = threading.Thread(target=lambda: one.update(r=server.post(
                "/v1/completions", {"model": MODEL, "max_tokens": 1, "prompt": [1, 2]},
                timeout=120)))
            t.start()
            h.wait_until(lambda: waiting() == before + 1, what="one more request waiting")
            # While the loop is stalled, the gauge counts what the queue's limit counts.
            room = limit - waiting()
            self.assertGreaterEqual(room, 1)
            status, _, got = server.post("/v1/completions", {"model": MODEL, "max_tokens": 1,
                                                             "prompt": [3, 4], "n": room + 1})
            self.assertEqual(status, 429, got)
            self.assertEqual(got["error"]["code"], "resource_exhausted", got)
            self.assertEqual(waiting(), limit - room)  # none of its choices waits
            # A group that fits whole waits, then runs.
            fits = threading.Thread(target=lambda: one.update(group=server.post(
                "/v1/completions", {"model": MODEL, "max_tokens": 1, "prompt": [3, 4],
                                    "n": room}, timeout=120)))
            fits.start()
            h.wait_until(lambda: waiting() == limit, what="the fitting group waiting")
            open(release, "w").close()
            tokens, _ = h.collect(stalled)
            self.assertEqual(len(tokens), 4)
            t.join(timeout=120)
            fits.join(timeout=120)
            self.assertEqual(one["r"][0], 200, one)
            self.assertEqual(one["group"][0], 200, one)
            self.assertEqual(len(one["group"][2]["choices"]), room)
            self.assertEqual(server.metric("dcformer_requests_total", protocol="http",
                                           outcome="resource_exhausted"), 1)
            self.assertEqual(server.metric("dcformer_requests_total", protocol="http",
                                           outcome="cancelled"), 0)


class OpenAiDrainSlowReaderTest(unittest.TestCase):
    """A stream drained while its client reads slowly (a 4 KiB receive buffer, ~50 KB/s):
    the client gets all of it, [DONE] and the last chunk, and the process exits 0. The
    drain's stream count drops when the connection takes the last events, before it has
    written them; the server used to close every HTTP connection right after
    (HttpServer::Stop), which cut such a stream's end (seen once under the full suite's
    load, test_api_key_and_drain); it now waits for the connections to write out. This
    test passes against the server before that change too: on a quiet machine its last
    write finished before Stop() ran, so it checks the drain, not that race."""

    def test_a_slow_reader_gets_the_whole_stream_through_a_drain(self):
        with HttpServer(args=["--drain-timeout=20s"]) as server:
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            self.addCleanup(s.close)
            s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # before the connect
            s.settimeout(60)
            s.connect(("127.0.0.1", server.http_port))
            body = json.dumps({"model": MODEL, "prompt": "And", "max_tokens": 200,
                               "stream": True, "ignore_eos": True, "logprobs": 5,
                               "n": 4, "seed": 7}).encode()
            s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n"
                      b"Content-Type: application/json\r\nContent-Length: " +
                      str(len(body)).encode() + b"\r\n\r\n" + body)
            got = s.recv(256)  # the response has begun: drain it
            server.proc.send_signal(signal.SIGTERM)
            h.wait_until(lambda: re.search(r"draining 1 stream", server.read_log()),
                         what="drain")
            while True:
                chunk = s.recv(256)
                if not chunk:
                    break
                got += chunk
                time.sleep(0.005)  # ~50 KB/s: the server's last writes wait on the reader
            self.assertTrue(got.startswith(b"HTTP/1.1 200"), got[:200])
            self.assertTrue(got.endswith(b"data: [DONE]\n\n\r\n0\r\n\r\n"), got[-200:])
            # Every token of the 4 x 200 arrived (the byte count is no measure: how many
            # tokens share an event depends on how fast the reader takes them).
            head, _, body = got.partition(b"\r\n\r\n")
            tokens = {}
            for e in sse_events(dechunk(body)):
                for c in e["choices"]:
                    tokens[c["index"]] = tokens.get(c["index"], 0) + len(c["logprobs"]["tokens"])
            self.assertEqual(tokens, {0: 200, 1: 200, 2: 200, 3: 200})
            self.assertEqual(server.proc.wait(timeout=30), 0, server.read_log()[-3000:])


def poisoned_token_copy(model_dir, out_dir, token):
    """A copy of a BF16 safetensors model whose embedding row of `token` is NaN: a prompt
    holding it gets non-finite logits, the other sequences of its batch do not."""
    shutil.copytree(model_dir, out_dir, dirs_exist_ok=True)
    path = os.path.join(out_dir, "model.safetensors")
    with open(path, "r+b") as f:
        (header_len,) = struct.unpack("<Q", f.read(8))
        info = json.loads(f.read(header_len))["tok_embeddings.weight"]
        assert info["dtype"] == "BF16", info
        dim = info["shape"][1]
        f.seek(8 + header_len + info["data_offsets"][0] + 2 * dim * token)
        f.write(struct.pack("<H", 0x7FC0) * dim)
    return out_dir


class OpenAiFailedChoiceTest(unittest.TestCase):
    """A non-streamed request answers its 500 as soon as one choice fails: the other choices
    are cancelled in the engine (their output could not be sent), not run to max_tokens."""

    POISON = 7

    def test_one_failed_choice_ends_the_request_and_cancels_the_others(self):
        with tempfile.TemporaryDirectory() as tmp:
            model = poisoned_token_copy(KJV, os.path.join(tmp, MODEL), self.POISON)
            with HttpServer(model=model, args=["--nowarmup"]) as server:
                def count(outcome):
                    return server.metric("dcformer_requests_total", outcome=outcome,
                                         protocol="http")

                def engine_idle():
                    m = server.metrics()
                    return all(h.sum_series(m, name) == 0 for name in (
                        "dcformer_kv_cache_blocks_used", "dcformer_num_requests_running",
                        "dcformer_num_requests_waiting"))

                before = {o: count(o) for o in ("error", "cancelled", "length")}
                status, _, got = server.post("/v1/completions", {
                    "model": MODEL, "prompt": [[self.POISON, 5], [5, 6]], "max_tokens": 200,
                    "ignore_eos": True, "temperature": 0})
                self.assertEqual(status, 500, got)
                self.assertIn("not finite", got["error"]["message"])
                self.assertEqual(count("error"), before["error"] + 1)
                self.assertEqual(count("cancelled"), before["cancelled"] + 1)
                self.assertEqual(count("length"), before["length"])
                # Nothing was sent: no token counts as generated and sent.
                self.assertEqual(server.metric("dcformer_generation_tokens_total",
                                               protocol="http"), 0)
                h.wait_until(engine_idle, what="the cancelled choice left the engine")
                # A prompt without the poisoned token is served.
                status, _, got = server.post("/v1/completions", {
                    "model": MODEL, "prompt": [5, 6], "max_tokens": 3, "ignore_eos": True})
                self.assertEqual(status, 200, got)
                self.assertEqual(got["usage"]["completion_tokens"], 3)

def gpt2_byte_chars():
    """GPT-2's byte-level BPE alphabet: the vocabulary string of each byte."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + \
        list(range(0xAE, 0x100))
    chars, extra = {}, 0
    for b in range(256):
        if b in keep:
            chars[b] = chr(b)
        else:
            chars[b] = chr(256 + extra)
            extra += 1
    return chars


class OpenAiTextOffsetTest(unittest.TestCase):
    """Completions' text_offset indexes `text` in characters, as OpenAI's and vLLM's do, also
    when a character comes one byte token at a time (those tokens all sit at its start) or
    bytes never become one (the next token sits after their U+FFFD). (The offsets counted
    token bytes: the bytes of a split character each, and ran past the end.)"""

    def test_offsets_of_characters_split_across_tokens(self):
        prompt = [11, 12, 13]
        with tempfile.TemporaryDirectory() as tmp:
            model = os.path.join(tmp, "split")
            subprocess.run([os.path.join(h.BIN_DIR, "dcformer-make-model"), "--out", model,
                            "--vocab", "4096", "--context", "256", "--dim", "64", "--n-layer",
                            "2", "--n-head", "4", "--ffn", "128", "--window", "64", "--seed",
                            "3"], check=True, capture_output=True)
            out = subprocess.run([os.path.join(h.BIN_DIR, "dcformer-generate"), "--model", model,
                                  "--backend", "cpu", "--prompt-ids",
                                  ",".join(map(str, prompt)), "--max-new-tokens", "10", "--json"],
                                 check=True, capture_output=True, text=True).stdout
            ids = json.loads(out)["tokens"]
            chars = gpt2_byte_chars()
            decode = {c: b for b, c in chars.items()}

            def serve(spelled):
                """(text, offsets) streamed and not, with the tokenizer's vocabulary permuted
                so that the model's first greedy tokens are the bytes of `spelled`, one byte
                token each; and every token's bytes."""
                with open(os.path.join(KJV, "tokenizer.json")) as f:
                    tok = json.load(f)
                vocab = tok["model"]["vocab"]
                by_id = {i: s for s, i in vocab.items()}
                byte_ids = [vocab[chars[b]] for b in spelled]
                n = len(spelled)
                self.assertEqual(len(set(ids[:n]) | set(byte_ids)), 2 * n, (ids, byte_ids))
                for picked, wanted in zip(ids[:n], byte_ids):
                    a, b = by_id[picked], by_id[wanted]
                    vocab[a], vocab[b] = wanted, picked
                    by_id[picked], by_id[wanted] = b, a
                with open(os.path.join(model, "tokenizer.json"), "w") as f:
                    json.dump(tok, f)
                token_bytes = [bytes(decode[c] for c in by_id[i]) for i in ids]
                results = []
                with HttpServer(model=model) as server:
                    for stream in (False, True):
                        body = {"model": "split", "prompt": prompt, "max_tokens": len(ids),
                                "temperature": 0, "logprobs": 0, "stream": stream,
                                "ignore_eos": True}
                        if stream:
                            status, _, raw = server.request("POST", "/v1/completions", body)
                            events = [json.loads(line[6:]) for line in raw.decode()
                                      .split("\n") if line.startswith("data: {")]
                            text = "".join(e["choices"][0]["text"] for e in events)
                            offsets = [o for e in events if e["choices"][0]["logprobs"]
                                       for o in e["choices"][0]["logprobs"]["text_offset"]]
                        else:
                            status, _, got = server.post("/v1/completions", body)
                            text = got["choices"][0]["text"]
                            offsets = got["choices"][0]["logprobs"]["text_offset"]
                        self.assertEqual(status, 200)
                        results.append((text, offsets))
                return results, token_bytes

            # A character split across byte tokens.
            results, token_bytes = serve("😀中".encode())
            for text, offsets in results:
                self.assertTrue(text.startswith("😀中"), text)
                # Each token at the characters before it that are complete (all valid here).
                want = [len(b"".join(token_bytes[:i]).decode("utf-8", errors="ignore"))
                        for i in range(len(ids))]
                self.assertEqual(offsets, want, text)
                self.assertEqual(offsets[:8], [0, 0, 0, 0, 1, 1, 1, 2])
                self.assertTrue(all(o <= len(text) for o in offsets), (offsets, text))
                self.assertTrue(text[offsets[7]:].startswith(token_bytes[7].decode()),
                                (offsets, text))
            # A lead byte that never becomes a character: U+FFFD, and the next token after it.
            results, token_bytes = serve(b"\xf0" + "中".encode())
            for text, offsets in results:
                self.assertTrue(text.startswith("\ufffd中"), text)
                self.assertEqual(offsets[:5], [0, 1, 1, 1, 2], text)
                self.assertTrue(text[offsets[4]:].startswith(token_bytes[4].decode()),
                                (offsets, text))


if __name__ == "__main__":
    unittest.main()
