"""The PyTorch reference model (bench/baseline/dcformer_torch.py) against tests/data/golden.

Every golden case: all logits within 1e-4 fed whole, token by token and in chunks of 5 with
the KV cache; the greedy continuation equal; plus the other weight layouts (sharded
safetensors, split wq/wk/wv, sharded .bin, bf16 save/load) and static batches.
Run with /usr/bin/python3 (Debian's python3-torch).
"""

import json
import os
import sys
import tempfile
import unittest

import torch

SOURCE_DIR = os.environ.get(
    "DCF_SOURCE_DIR", os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..")))
sys.path.insert(0, os.path.join(SOURCE_DIR, "bench", "baseline"))
import dcformer_torch as dct  # noqa: E402

GOLDEN_DIR = os.path.join(SOURCE_DIR, "tests", "data", "golden")
CASES = ["dcformer-f32-short-prompt", "dcformer-f32-long-prompt", "dcpythia-f16-bin"]
TOLERANCE = 1e-4


def load_golden(name):
    with open(os.path.join(GOLDEN_DIR, name, "golden.json")) as f:
        return json.load(f)


class GoldenTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        torch.set_num_threads(1)
        cls.models = {name: dct.load_model(os.path.join(GOLDEN_DIR, name)) for name in CASES}
        cls.golden = {name: load_golden(name) for name in CASES}

    def assert_logits(self, got, want, what):
        err = (got.double() - want).abs().max().item()
        self.assertLessEqual(err, TOLERANCE, f"{what}: max |logit error| {err}")

    def test_full_sequence_logits(self):
        for name in CASES:
            g = self.golden[name]
            with torch.no_grad():
                logits = self.models[name](torch.tensor([g["sequence"]]))[0]  # [T,V]
            self.assert_logits(logits, torch.tensor(g["logits"], dtype=torch.float64), name)

    def test_incremental_logits(self):
        for name in CASES:
            g = self.golden[name]
            seq = g["sequence"]
            want = torch.tensor(g["logits"], dtype=torch.float64)
            for chunk in (1, 5):
                model = self.models[name]
                cache = dct.KVCache(model, 1, len(seq))
                rows = []
                with torch.no_grad():
                    for start in range(0, len(seq), chunk):
                        part = torch.tensor([seq[start:start + chunk]])
                        rows.append(model(part, start, cache)[0])
                self.assert_logits(torch.cat(rows), want, f"{name} chunk {chunk}")

    def test_greedy_continuation(self):
        for name in CASES:
            g = self.golden[name]
            new = dct.generate(self.models[name], [g["prompt"]], len(g["greedy"]))
            self.assertEqual(new[0], g["greedy"], name)

    def test_static_batch_matches_batch_one(self):
        name = "dcformer-f32-long-prompt"
        g = self.golden[name]
        p = g["prompt"]
        other = p[::-1]
        batch = dct.generate(self.models[name], [p, other], len(g["greedy"]))
        self.assertEqual(batch[0], g["greedy"])
        self.assertEqual(batch[1], dct.generate(self.models[name], [other], len(g["greedy"]))[0])

    def test_sampling_is_seeded(self):
        model = self.models["dcformer-f32-short-prompt"]
        prompt = self.golden["dcformer-f32-short-prompt"]["prompt"]
        a = dct.generate(model, [prompt], 12, temperature=1.0, top_p=0.9, seed=7)
        b = dct.generate(model, [prompt], 12, temperature=1.0, top_p=0.9, seed=7)
        self.assertEqual(a, b)
        self.assertEqual(len(a[0]), 12)

    def test_eos_stops_generation(self):
        name = "dcformer-f32-short-prompt"
        g = self.golden[name]
        eos = g["greedy"][2]
        new = dct.generate(self.models[name], [g["prompt"]], 20, eos_id=eos)
        self.assertEqual(new[0], g["greedy"][:g["greedy"].index(eos) + 1])


    def test_query_chunks_do_not_change_logits(self):
        name = "dcformer-f32-long-prompt"  # 60 tokens, window 16: chunks cross the window
        g = self.golden[name]
        want = torch.tensor(g["logits"], dtype=torch.float64)
        saved = dct.Attention.query_chunk
        try:
            for chunk in (1, 7, 16):
                dct.Attention.query_chunk = chunk
                with torch.no_grad():
                    got = self.models[name](torch.tensor([g["sequence"]]))[0]
                self.assert_logits(got, want, f"query chunk {chunk}")
        finally:
            dct.Attention.query_chunk = saved


class TrainingTest(unittest.TestCase):
    """What the training code relies on: correct, deterministic gradients."""

    def tiny(self):
        cfg = dct.DCFormerConfig(dim=16, n_layer=2, n_head=2, intermediate_size=32,
                                 vocab_size=20, block_size=16, window_size=3)
        model = dct.DCFormer(cfg).double()
        model.init_weights(1)
        with torch.no_grad():  # larger dynamic weights than at init, so compose matters
            for name, p in model.named_parameters():
                if "dyn_w_proj" in name:
                    p.normal_(0, 0.3)
        return model

    def test_attention_gradients_match_finite_differences(self):
        model = self.tiny()
        a = torch.randn(1, 7, 16, dtype=torch.float64, requires_grad=True)
        for layer in model.layers:  # a local and a global layer
            self.assertTrue(torch.autograd.gradcheck(
                lambda x: layer.attention(x, 0, None), (a,), eps=1e-6, atol=1e-5))

    def test_backward_is_deterministic(self):
        # Debian's torch 1.13 F.gelu backward read non-contiguous gradients wrongly: the same
        # backward pass gave different (huge) gradients run to run.
        cfg = dct.DCFormerConfig(dim=64, n_layer=2, n_head=4, intermediate_size=128,
                                 vocab_size=50, block_size=32, window_size=8)
        tokens = torch.randint(0, 50, (2, 32), generator=torch.Generator().manual_seed(3))
        grads = []
        for _ in range(3):
            model = dct.DCFormer(cfg)
            model.init_weights(5)
            logits = model(tokens[:, :-1])
            torch.nn.functional.cross_entropy(logits.flatten(0, 1),
                                              tokens[:, 1:].flatten()).backward()
            grads.append(torch.cat([p.grad.flatten() for p in model.parameters()]))
        for g in grads[1:]:
            self.assertTrue(torch.equal(g, grads[0]))
        self.assertLess(grads[0].abs().max().item(), 10.0)


class LayoutTest(unittest.TestCase):
    """The same weights in the other layouts give the same logits."""

    def reference(self, name):
        g = load_golden(name)
        return g["sequence"], torch.tensor(g["logits"], dtype=torch.float64)

    def check_dir(self, model_dir, name, dtype=torch.float32, tol=TOLERANCE):
        seq, want = self.reference(name)
        model = dct.load_model(model_dir, dtype)
        with torch.no_grad():
            got = model(torch.tensor([seq]))[0].double()
        err = (got - want).abs().max().item()
        self.assertLessEqual(err, tol, f"{model_dir}: max |logit error| {err}")

    def copy_config(self, name, out):
        with open(os.path.join(GOLDEN_DIR, name, "config.json")) as f:
            text = f.read()
        with open(os.path.join(out, "config.json"), "w") as f:
            f.write(text)

    def test_sharded_safetensors_with_split_qkv(self):
        name = "dcformer-f32-short-prompt"
        sd = dct.read_checkpoint(os.path.join(GOLDEN_DIR, name))
        E = 128
        split = {}
        for k, v in sd.items():
            if k.endswith("attention.wqkv.weight"):
                prefix = k[:-len("wqkv.weight")]
                for i, w in enumerate(("wq", "wk", "wv")):
                    split[f"{prefix}{w}.weight"] = v[i * E:(i + 1) * E]
            else:
                split[k] = v
        names = sorted(split)
        with tempfile.TemporaryDirectory() as out:
            self.copy_config(name, out)
            shards = [names[: len(names) // 2], names[len(names) // 2:]]
            weight_map = {}
            for i, part in enumerate(shards):
                fname = f"model-0000{i + 1}-of-00002.safetensors"
                dct.write_safetensors(os.path.join(out, fname), {k: split[k] for k in part})
                weight_map.update({k: fname for k in part})
            with open(os.path.join(out, "model.safetensors.index.json"), "w") as f:
                json.dump({"weight_map": weight_map}, f)
            self.check_dir(out, name)

    def test_sharded_bin(self):
        name = "dcpythia-f16-bin"
        sd = dct.read_checkpoint(os.path.join(GOLDEN_DIR, name))
        names = sorted(sd)
        with tempfile.TemporaryDirectory() as out:
            self.copy_config(name, out)
            weight_map = {}
            for i, part in enumerate((names[::2], names[1::2])):
                fname = f"pytorch_model-0000{i + 1}-of-00002.bin"
                torch.save({k: sd[k] for k in part}, os.path.join(out, fname))
                weight_map.update({k: fname for k in part})
            with open(os.path.join(out, "pytorch_model.bin.index.json"), "w") as f:
                json.dump({"weight_map": weight_map}, f)
            self.check_dir(out, name)

    def test_save_and_reload(self):
        name = "dcformer-f32-long-prompt"
        model = dct.load_model(os.path.join(GOLDEN_DIR, name))
        with tempfile.TemporaryDirectory() as out:
            dct.save_model(model, out, torch.float32)
            self.check_dir(out, name)
            dct.save_model(model, out, torch.bfloat16)
            with open(os.path.join(out, "config.json")) as f:
                self.assertEqual(json.load(f)["torch_dtype"], "bfloat16")
            self.check_dir(out, name, tol=0.5)  # bf16 weights: close, not golden-exact

    def test_bad_config_names_the_key(self):
        for patch, key in (({"model_type": "llama"}, "model_type"),
                           ({"window_type": "XYZ"}, "window_type"),
                           ({"dim": 100}, "dim")):
            with open(os.path.join(GOLDEN_DIR, "dcformer-f32-short-prompt", "config.json")) as f:
                d = json.load(f)
            d.update(patch)
            with self.assertRaises(dct.ConfigError) as ctx:
                dct.DCFormerConfig.from_dict(d)
            self.assertIn(key, str(ctx.exception))


class WindowRuleTest(unittest.TestCase):
    def test_window_patterns(self):
        cfg = dct.DCFormerConfig(n_layer=8, window_size=4)
        self.assertEqual([cfg.is_local_layer(l) for l in range(4)], [True, False, True, False])
        cfg.window_type = "LGLL"
        self.assertEqual([cfg.is_local_layer(l) for l in range(4)], [True, False, True, True])
        cfg.window_type = "LGL6"
        self.assertEqual([cfg.is_local_layer(l) for l in range(8)],
                         [True, False] + [True] * 6)
        cfg.window_size = None
        self.assertFalse(any(cfg.is_local_layer(l) for l in range(8)))

    def test_mask_sees_w_keys_itself_included(self):
        mask = dct.attention_mask(torch.arange(10), torch.arange(10), 4)
        self.assertEqual(mask[9].nonzero().flatten().tolist(), [6, 7, 8, 9])
        self.assertEqual(mask[2].nonzero().flatten().tolist(), [0, 1, 2])


if __name__ == "__main__":
    unittest.main()
