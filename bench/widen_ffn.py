#!/usr/bin/python3
"""Widens the FFN of a dcformer checkpoint with zero weights: a model that computes exactly
what the original computes but reads as many weight bytes per token as a much larger one.

  bench/widen_ffn.py MODEL_DIR OUT_DIR --ffn 16384

The added hidden units have w1 = w3 = 0 rows and w2 = 0 columns, so each adds
silu(0) * 0 = 0 to w2's sum: the outputs are the original model's, bit for bit on the CPU
backend (its kernels add a row's columns in blocks in order, and the added blocks sum to
zero). bench/README.md uses it to price speculative decoding at batch 1 where a step is bound
by reading the weights, with the trained default model's copying behaviour (no weight-bound
model here copies otherwise). Standard library only; the other files of MODEL_DIR (tokenizer,
chat template) are copied. Holds the checkpoint in memory (a small model is the point).
"""
import argparse
import json
import os
import shutil
import struct
import sys

SIZES = {"F32": 4, "F16": 2, "BF16": 2}


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("model_dir")
    p.add_argument("out_dir")
    p.add_argument("--ffn", type=int, required=True, help="the new intermediate size")
    a = p.parse_args()
    with open(os.path.join(a.model_dir, "config.json")) as f:
        config = json.load(f)
    if config.get("model_type") != "dcformer" or config.get("quantization_config"):
        sys.exit("widen_ffn.py: only float dcformer checkpoints (w1, w3, w2)")
    old = config["intermediate_size"]
    if a.ffn < old:
        sys.exit(f"widen_ffn.py: --ffn {a.ffn} is below the model's {old}")
    if os.path.realpath(a.out_dir) == os.path.realpath(a.model_dir):
        sys.exit("widen_ffn.py: OUT_DIR must differ from MODEL_DIR")
    src = os.path.join(a.model_dir, "model.safetensors")
    if not os.path.isfile(src) or any(
            e.endswith(".index.json") or e.endswith(".bin") or
            (e.endswith(".safetensors") and e != "model.safetensors")
            for e in os.listdir(a.model_dir)):
        sys.exit("widen_ffn.py: only a checkpoint of one model.safetensors (no shards, no "
                 "index, no pytorch_model.bin)")
    with open(src, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    tensors = []  # (name, dtype, shape, bytes)
    padded = 0
    for name, info in header.items():
        if name == "__metadata__":
            continue
        begin, end = info["data_offsets"]
        raw, shape, dtype = data[begin:end], list(info["shape"]), info["dtype"]
        if dtype not in SIZES:
            sys.exit(f"widen_ffn.py: {name} is {dtype}; only F32, F16 and BF16")
        size = SIZES[dtype]
        if name.endswith(("feed_forward.w1.weight", "feed_forward.w3.weight")):
            if shape[0] != old:
                sys.exit(f"widen_ffn.py: {name} has shape {shape}, not [{old}, E]")
            raw += bytes((a.ffn - old) * shape[1] * size)  # zero rows
            shape[0] = a.ffn
            padded += 1
        elif name.endswith("feed_forward.w2.weight"):
            if shape[1] != old:
                sys.exit(f"widen_ffn.py: {name} has shape {shape}, not [E, {old}]")
            row, pad = old * size, bytes((a.ffn - old) * size)
            raw = b"".join(raw[r * row:(r + 1) * row] + pad for r in range(shape[0]))
            shape[1] = a.ffn
            padded += 1
        tensors.append((name, dtype, shape, raw))
    if padded != 3 * config["n_layer"]:
        sys.exit(f"widen_ffn.py: found {padded} FFN matrices, not w1, w3 and w2 of each of "
                 f"{config['n_layer']} layers")
    out_header, offset = {}, 0
    if "__metadata__" in header:
        out_header["__metadata__"] = header["__metadata__"]
    for name, dtype, shape, raw in tensors:
        out_header[name] = {"dtype": dtype, "shape": shape,
                            "data_offsets": [offset, offset + len(raw)]}
        offset += len(raw)
    blob = json.dumps(out_header, separators=(",", ":")).encode()
    blob += b" " * (-len(blob) % 8)
    os.makedirs(a.out_dir, exist_ok=True)
    for entry in os.listdir(a.model_dir):
        path = os.path.join(a.model_dir, entry)
        if entry not in ("config.json", "model.safetensors") and os.path.isfile(path):
            shutil.copy(path, a.out_dir)
    with open(os.path.join(a.out_dir, "model.safetensors"), "wb") as f:
        f.write(struct.pack("<Q", len(blob)))
        f.write(blob)
        for _, _, _, raw in tensors:
            f.write(raw)
    config["intermediate_size"] = a.ffn
    with open(os.path.join(a.out_dir, "config.json"), "w") as f:
        json.dump(config, f, indent=2)
        f.write("\n")
    print(f"{a.out_dir}: intermediate_size {old} -> {a.ffn}, {8 + len(blob) + offset} bytes")


if __name__ == "__main__":
    main()
