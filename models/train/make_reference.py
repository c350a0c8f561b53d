"""Writes tests/data/kjv/reference.json: what the training code computes with the committed
model, for the engine tests to reproduce (tests/unit/backends/kjv_model_test.cc).

    /usr/bin/python3 models/train/make_reference.py

With models/dcformer-kjv's bf16 weights widened to fp32 and the PyTorch model of
bench/baseline/dcformer_torch.py (the code that trained it):
- logits: the first held-out window (block_size tokens of tests/data/kjv/heldout.txt, as
  DATA/heldout.bin holds them). Storing every logit would take 2M numbers, so the file keeps,
  for every position, the logits of VOCAB_SAMPLE fixed ids, the logit of the actual next token
  and the log-sum-exp of the whole row (which every logit contributes to), plus FULL_ROWS rows
  complete.
- greedy: the greedy continuation of a fixed prompt, with the smallest gap between the best
  and second-best logit over its steps (so a reader can see the argmax is not a near-tie).
- heldout: the held-out mean NLL and perplexity (train.py's definition).
"""

import json
import math
import os
import sys

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
import torch  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "bench", "baseline"))
sys.path.insert(0, HERE)
import dcformer_torch as dct  # noqa: E402
import train  # noqa: E402

MODEL_DIR = os.path.join(ROOT, "models", "dcformer-kjv")
OUT = os.path.join(ROOT, "tests", "data", "kjv", "reference.json")
VOCAB_SAMPLE = 48
FULL_ROWS = (0, 1, 127, 128, 255, 511)
GREEDY_PROMPT = "And God said"
GREEDY_TOKENS = 48


def main():
    torch.set_num_threads(2)
    model = dct.load_model(MODEL_DIR, torch.float32)
    cfg = model.config
    held = train.read_ids(os.path.join(HERE, "data", "heldout.bin"))
    window = held[:cfg.block_size]
    with torch.no_grad():
        logits = model(window[None])[0].double()  # [T, V]
    gen = torch.Generator().manual_seed(12)
    sample = sorted(torch.randperm(cfg.vocab_size, generator=gen)[:VOCAB_SAMPLE].tolist())
    T = window.numel()
    ref = {
        "model": "models/dcformer-kjv",
        "tokens": window.tolist(),
        "vocab_sample": sample,
        "logits_at_sample": logits[:, sample].tolist(),
        "logit_of_next": [logits[t, window[t + 1]].item() for t in range(T - 1)],
        "logsumexp": torch.logsumexp(logits, dim=-1).tolist(),
        "full_rows": {str(r): logits[r].tolist() for r in FULL_ROWS if r < T},
    }

    # The prompt's ids come from the tokenizer cases, which the HF trainer encoded.
    with open(os.path.join(ROOT, "tests", "data", "kjv", "tokenizer_cases.jsonl")) as f:
        cases = {c["text"]: c["ids"] for c in map(json.loads, f)}
    prompt = cases[GREEDY_PROMPT]
    new = dct.generate(model, [prompt], GREEDY_TOKENS)[0]
    gaps = []
    with torch.no_grad():
        seq_logits = model(torch.tensor([prompt + new[:-1]]))[0]
    for t in range(len(prompt) - 1, seq_logits.shape[0]):
        top2 = torch.topk(seq_logits[t], 2).values
        gaps.append((top2[0] - top2[1]).item())
    ref["greedy"] = {"prompt": GREEDY_PROMPT, "prompt_ids": prompt, "tokens": new,
                     "min_top2_gap": min(gaps)}
    nll = train.heldout_loss(model, held, cfg.block_size)
    ref["heldout"] = {"mean_nll": nll, "perplexity": math.exp(nll), "tokens": held.numel()}
    with open(OUT, "w") as f:
        json.dump(ref, f, separators=(",", ":"))
        f.write("\n")
    print(f"make_reference: {T} positions, greedy {len(new)} tokens (min top-2 gap "
          f"{min(gaps):.4f}), held-out perplexity {math.exp(nll):.2f} -> {OUT}")


if __name__ == "__main__":
    main()
