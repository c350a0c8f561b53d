"""Streaming greedy output equals dcformer-generate's for every golden model, through the
raw gRPC API, dcformer-cli, and the Python and Node example clients."""
import json
import os
import shutil
import subprocess
import unittest

import harness as h

NODE_DIR = os.path.join(h.SOURCE_DIR, "client", "examples", "node")
PY_EXAMPLE = os.path.join(h.SOURCE_DIR, "client", "examples", "python", "generate.py")


def ensure_node_modules():
    """Returns a reason string when Node cannot run the example. scripts/setup.sh installs the
    packages; tests never download anything."""
    if shutil.which("node") is None:
        return "node not installed"
    if os.path.isdir(os.path.join(NODE_DIR, "node_modules", "@grpc", "grpc-js")):
        return None
    return "client/examples/node/node_modules missing: run scripts/setup.sh"


class GoldenGenerateTest(unittest.TestCase):
    def test_streaming_greedy_matches_dcformer_generate(self):
        for name, model_dir, golden in h.golden_models():
            with self.subTest(model=name):
                prompt, n = golden["prompt"], len(golden["greedy"])
                ref_tokens, ref_logprobs = h.reference_greedy(model_dir, prompt, n)
                self.assertEqual(ref_tokens, golden["greedy"])
                with h.Server(model=model_dir) as server:
                    req = h.ids_request(prompt, n, request_id=f"golden-{name}")
                    req.output.logprobs = True
                    messages = list(server.stub().Generate(req, timeout=120))
                    tokens = [t for m in messages for t in m.token_ids]
                    self.assertEqual(tokens, ref_tokens)
                    self.assertTrue(all(m.request_id == f"golden-{name}" for m in messages))
                    final = messages[-1]
                    self.assertEqual(final.finish_reason, h.pb.FINISH_REASON_LENGTH)
                    self.assertTrue(all(m.finish_reason == h.pb.FINISH_REASON_UNSPECIFIED
                                        for m in messages[:-1]))
                    self.assertEqual(final.usage.prompt_tokens, len(prompt))
                    self.assertEqual(final.usage.generated_tokens, n)
                    total = final.timing.total.ToTimedelta()
                    self.assertGreater(total.total_seconds(), 0)
                    self.assertLessEqual(final.timing.time_to_first_token.ToTimedelta(), total)
                    logprobs = [lp.logprob for m in messages for lp in m.logprobs]
                    self.assertEqual([lp.token_id for m in messages for lp in m.logprobs],
                                     tokens)
                    if ref_logprobs:
                        for got, want in zip(logprobs, ref_logprobs):
                            self.assertAlmostEqual(got, want, delta=1e-3)

    def test_clients_agree(self):
        _, model_dir, golden = h.golden_models()[0]
        prompt, n = golden["prompt"], 24
        expected = golden["greedy"][:n]
        ids = ",".join(map(str, prompt))
        with h.Server(model=model_dir) as server:
            with self.subTest(client="dcformer-cli"):
                out = subprocess.run([h.CLI, "generate", f"--target={server.target}",
                                      f"--prompt-ids={ids}", f"--max-new-tokens={n}",
                                      "--temperature=0", "--ignore-eos"],
                                     capture_output=True, text=True, timeout=60)
                self.assertEqual(out.returncode, 0, out.stderr)
                self.assertEqual([int(t) for t in out.stdout.strip().split(",")], expected)
                self.assertIn("FINISH_REASON_LENGTH", out.stderr)
            with self.subTest(client="dcformer-cli --json"):
                out = subprocess.run([h.CLI, "generate", f"--target={server.target}",
                                      f"--prompt-ids={ids}", f"--max-new-tokens={n}",
                                      "--temperature=0", "--ignore-eos", "--json"],
                                     capture_output=True, text=True, timeout=60)
                self.assertEqual(out.returncode, 0, out.stderr)
                lines = [json.loads(l) for l in out.stdout.splitlines()]
                self.assertEqual([t for l in lines for t in l.get("token_ids", [])], expected)
                self.assertEqual(lines[-1]["finish_reason"], "FINISH_REASON_LENGTH")
                self.assertEqual(lines[-1]["usage"]["generated_tokens"], n)
            with self.subTest(client="python example"):
                env = dict(os.environ, PYTHONPATH=h.PY_DIR)
                out = subprocess.run(["/usr/bin/python3", PY_EXAMPLE, f"--target={server.target}",
                                      f"--prompt-ids={ids}", f"--max-new-tokens={n}",
                                      "--temperature=0", "--ignore-eos", "--json"],
                                     capture_output=True, text=True, timeout=60, env=env)
                self.assertEqual(out.returncode, 0, out.stderr)
                result = json.loads(out.stdout)
                self.assertEqual(result["token_ids"], expected)
                self.assertEqual(result["finish_reason"], "FINISH_REASON_LENGTH")
            with self.subTest(client="node example"):
                reason = ensure_node_modules()
                if reason:
                    self.skipTest(f"Node example not run: {reason}")
                out = subprocess.run(["node", os.path.join(NODE_DIR, "generate.js"),
                                      f"--target={server.target}", f"--prompt-ids={ids}",
                                      f"--max-new-tokens={n}", "--temperature=0", "--ignore-eos",
                                      "--json"],
                                     capture_output=True, text=True, timeout=60)
                self.assertEqual(out.returncode, 0, out.stderr)
                result = json.loads(out.stdout)
                self.assertEqual(result["token_ids"], expected)
                self.assertEqual(result["finish_reason"], "FINISH_REASON_LENGTH")
            with self.subTest(client="info"):
                out = subprocess.run([h.CLI, "info", f"--target={server.target}", "--json"],
                                     capture_output=True, text=True, timeout=60)
                self.assertEqual(out.returncode, 0, out.stderr)
                info = json.loads(out.stdout)
                self.assertEqual(info["vocab_size"], 300)
                self.assertEqual(info["context_length"], 256)
                self.assertEqual(info["num_layers"], 4)
                self.assertEqual(info["num_heads"], 8)
                self.assertEqual(info["backend"], "cpu")
                self.assertEqual(info["dtype"], "float32")
                self.assertTrue(info["device"])
                self.assertGreater(int(info["kv_cache_bytes"]), 0)
                # No tokenizer, so no EOS: the engine never stops at config.json's
                # eos_token_id (2), and GetModelInfo reports only the EOS the engine uses.
                self.assertEqual(info.get("eos_token_ids", []), [])
                groups = {g["name"]: g for g in info["layer_groups"]}
                self.assertEqual(groups["window"]["window"], 16)
                self.assertEqual(sorted(groups["window"]["layers"] + groups["global"]["layers"]),
                                 [0, 1, 2, 3])
            with self.subTest(client="health"):
                out = subprocess.run([h.CLI, "health", f"--target={server.target}"],
                                     capture_output=True, text=True, timeout=60)
                self.assertEqual((out.returncode, out.stdout.strip()), (0, "SERVING"))

    def test_reflection_lists_services(self):
        # Off by default (test_abuse.StreamBoundsTest); --reflection turns it on.
        with h.Server(args=["--reflection"]) as server, server.channel() as ch:
            call = ch.stream_stream("/grpc.reflection.v1alpha.ServerReflection/"
                                    "ServerReflectionInfo")
            # ServerReflectionRequest{list_services: ""}, encoded by hand (field 7, length 0).
            responses = list(call(iter([b"\x3a\x00"]), timeout=30))
            self.assertEqual(len(responses), 1)
            self.assertIn(b"dcformer.v1.TextGeneration", responses[0])
            self.assertIn(b"grpc.health.v1.Health", responses[0])

    def test_default_model_with_tokenizer(self):
        # The default model (trained, with its own tokenizer), as scripts/run.sh serves it.
        model = os.path.join(h.SOURCE_DIR, "models", "dcformer-kjv")
        with h.Server(model=model) as server:
            stub = server.stub()
            # The EOS generation stops at is the tokenizer's <|endoftext|> (id 0 here).
            info = stub.GetModelInfo(h.pb.GetModelInfoRequest(), timeout=30)
            self.assertEqual(list(info.eos_token_ids), [0])
            self.assertTrue(info.has_tokenizer)
            ids = stub.Tokenize(h.pb.TokenizeRequest(text="Hello world"), timeout=30).token_ids
            self.assertGreater(len(ids), 0)
            text = stub.Detokenize(h.pb.DetokenizeRequest(token_ids=ids), timeout=30).text
            self.assertEqual(text, "Hello world")
            req = h.pb.GenerateRequest(text="Hello world")
            req.sampling.temperature = 0
            req.stopping.max_new_tokens = 8
            req.stopping.ignore_eos = True
            tokens, final = h.collect(stub.Generate(req, timeout=60))
            self.assertEqual(len(tokens), 8)
            full = stub.Detokenize(h.pb.DetokenizeRequest(token_ids=tokens), timeout=30).text
            streamed = "".join(m.text for m in stub.Generate(req, timeout=60))
            self.assertEqual(streamed, full)
            # dcformer-cli prints text only, never token ids, also while a stop string that
            # the whole output is a prefix of holds the text back until the end; with
            # --notext it prints the ids.
            cli = [h.CLI, "generate", f"--target={server.target}", "--prompt=Hello world",
                   "--max-new-tokens=8", "--temperature=0", "--ignore-eos"]
            if "," not in full:  # --stop splits at commas
                out = subprocess.run(cli + ["--stop=" + full + "\u2603"], capture_output=True,
                                     text=True, timeout=60)
                self.assertEqual(out.returncode, 0, out.stderr)
                self.assertEqual(out.stdout, full + "\n")
                self.assertIn("FINISH_REASON_LENGTH", out.stderr)
            out = subprocess.run(cli + ["--notext"], capture_output=True, text=True, timeout=60)
            self.assertEqual(out.returncode, 0, out.stderr)
            self.assertEqual([int(t) for t in out.stdout.strip().split(",")], list(tokens))
            # A stop string taken from the middle of the greedy text ends generation there.
            req.stopping.max_new_tokens = 24
            messages = list(stub.Generate(req, timeout=60))
            text = "".join(m.text for m in messages)
            stop = text[len(text) // 2:len(text) // 2 + 3]
            if stop and "\ufffd" not in stop:
                req.stopping.stop_strings.append(stop)
                messages = list(stub.Generate(req, timeout=60))
                self.assertEqual(messages[-1].finish_reason, h.pb.FINISH_REASON_STOP_STRING)
                cut = "".join(m.text for m in messages)
                self.assertEqual(cut, text[:text.index(stop)])


if __name__ == "__main__":
    unittest.main(verbosity=2)
