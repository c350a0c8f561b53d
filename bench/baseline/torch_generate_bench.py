#!/usr/bin/python3
"""The PyTorch baseline's generation speed: the loop a user would write around the reference
model (bench/baseline/dcformer_torch.py), eager fp32, on the same workload the server gets
from dcformer-loadgen.

Requests are grouped into static batches of equal-length prompts (at most --batch-size each,
in file order within a length); each batch is one prefill over its prompts and then one
decode step per token with the model's KV cache, greedy, until its longest request has all
its tokens (EOS ignored, as dcformer-loadgen asks the server). Batches run one after the
other, as a script would run them.

    /usr/bin/python3 bench/baseline/torch_generate_bench.py --model DIR \\
        [--num-requests 32 --input-tokens 128 --output-tokens 32 | --prompts-file F.jsonl] \\
        [--batch-size 32 --threads N --json-out FILE]

A prompts file has dcformer-loadgen's format: one JSON object per line with "token_ids" and
optionally "max_new_tokens" (text prompts need a tokenizer and are refused).

Prints and (--json-out) writes: output tokens/s over the whole run, prefill and decode time,
the median decode step per batch size, and TTFT (from the start of the run, as for requests
that all arrive at once) percentiles. Needs only torch (Debian's python3-torch).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import time
from typing import Dict, List, Tuple

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch  # noqa: E402

import dcformer_torch as dt  # noqa: E402


def parse_range(text: str, flag: str) -> Tuple[int, int]:
    """'128' -> (128, 128); '64:512' -> (64, 512)."""
    try:
        parts = [int(x) for x in text.split(":")]
    except ValueError:
        raise SystemExit(f"{flag}: '{text}' is not N or MIN:MAX")
    if len(parts) == 1:
        parts.append(parts[0])
    if len(parts) != 2 or parts[0] < 1 or parts[1] < parts[0]:
        raise SystemExit(f"{flag}: '{text}' is not N or MIN:MAX with 1 <= MIN <= MAX")
    return parts[0], parts[1]


def load_requests(args, vocab: int) -> List[Tuple[List[int], int]]:
    """[(prompt ids, max_new_tokens)] in request order."""
    out_lo, out_hi = parse_range(args.output_tokens, "--output-tokens")
    rng = random.Random(args.seed)
    if args.prompts_file:
        reqs = []
        with open(args.prompts_file) as f:
            for n, line in enumerate(f, 1):
                if not line.strip():
                    continue
                obj = json.loads(line)
                if "token_ids" not in obj:
                    raise SystemExit(f"{args.prompts_file}:{n}: needs \"token_ids\" (text prompts "
                                     "need a tokenizer the baseline does not have)")
                new = int(obj.get("max_new_tokens", rng.randint(out_lo, out_hi)))
                reqs.append(([int(t) for t in obj["token_ids"]], new))
        if args.num_requests:
            reqs = [reqs[i % len(reqs)] for i in range(args.num_requests)]
        return reqs
    in_lo, in_hi = parse_range(args.input_tokens, "--input-tokens")
    return [([rng.randrange(vocab) for _ in range(rng.randint(in_lo, in_hi))],
             rng.randint(out_lo, out_hi)) for _ in range(args.num_requests or 32)]


def make_batches(reqs, batch_size: int) -> List[List[int]]:
    """Request indices grouped by prompt length (first appearance order), <= batch_size each."""
    by_len: Dict[int, List[int]] = {}
    for i, (prompt, _) in enumerate(reqs):
        by_len.setdefault(len(prompt), []).append(i)
    batches = []
    for idx in by_len.values():
        for b in range(0, len(idx), batch_size):
            batches.append(idx[b:b + batch_size])
    return batches


@torch.no_grad()
def run_batch(model, prompts: List[List[int]], max_new: int):
    """Greedy static-batch generation as dcformer_torch.generate does it, timed: returns
    (new ids per row, prefill seconds, [seconds of each decode step])."""
    B, P = len(prompts), len(prompts[0])
    cache = dt.KVCache(model, B, min(P + max_new - 1, model.config.block_size))
    t0 = time.perf_counter()
    logits = model(torch.tensor(prompts, dtype=torch.long), 0, cache)[:, -1]
    nxt = dt.sample_next(logits)
    prefill_s = time.perf_counter() - t0
    out = [[int(t)] for t in nxt]
    steps = []
    pos = P
    for _ in range(1, max_new):
        if pos >= cache.max_len:
            break
        t0 = time.perf_counter()
        logits = model(nxt[:, None], pos, cache)[:, -1]
        nxt = dt.sample_next(logits)
        steps.append(time.perf_counter() - t0)
        for b in range(B):
            out[b].append(int(nxt[b]))
        pos += 1
    return out, prefill_s, steps


def percentiles(xs: List[float]) -> Dict[str, float]:
    if not xs:
        return {"count": 0}
    s = sorted(xs)

    def q(p):  # linear interpolation between closest ranks, as dcformer-loadgen reports
        h = (len(s) - 1) * p
        lo = int(h)
        return s[lo] + (s[min(lo + 1, len(s) - 1)] - s[lo]) * (h - lo)

    return {"count": len(s), "mean": statistics.fmean(s), "p50": q(0.5), "p90": q(0.9),
            "p99": q(0.99), "max": s[-1]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", required=True, help="model directory")
    ap.add_argument("--prompts-file", help="JSONL prompts (dcformer-loadgen's format)")
    ap.add_argument("--num-requests", type=int, default=0,
                    help="requests (default 32; with a file: cycle it to this many)")
    ap.add_argument("--input-tokens", default="128", help="prompt length N or MIN:MAX")
    ap.add_argument("--output-tokens", default="32", help="new tokens N or MIN:MAX")
    ap.add_argument("--batch-size", type=int, default=32, help="largest static batch")
    ap.add_argument("--threads", type=int, default=0,
                    help="torch.set_num_threads (0: every core; Debian's torch starts with 1)")
    ap.add_argument("--seed", type=int, default=1, help="seed of random prompts and lengths")
    ap.add_argument("--json-out", help="write the results as JSON here")
    args = ap.parse_args()
    if args.batch_size < 1:
        raise SystemExit("--batch-size must be >= 1")
    torch.set_num_threads(args.threads or len(os.sched_getaffinity(0)))

    t_load = time.perf_counter()
    model = dt.load_model(args.model)
    load_s = time.perf_counter() - t_load
    cfg = model.config
    reqs = load_requests(args, cfg.vocab_size)
    for i, (prompt, new) in enumerate(reqs):
        if not prompt or new < 1 or len(prompt) + new - 1 > cfg.block_size:
            raise SystemExit(f"request {i}: {len(prompt)} prompt + {new} new tokens do not fit "
                             f"the context {cfg.block_size}")
        if any(t < 0 or t >= cfg.vocab_size for t in prompt):
            raise SystemExit(f"request {i}: a token id is outside the vocabulary")

    batches = make_batches(reqs, args.batch_size)
    ttft_ms, prefill_s, decode_s = [], 0.0, 0.0
    steps_by_batch: Dict[int, List[float]] = {}
    tokens_out = 0
    t_run = time.perf_counter()
    for idx in batches:
        prompts = [reqs[i][0] for i in idx]
        max_new = max(reqs[i][1] for i in idx)
        t_batch = time.perf_counter()
        out, pre, steps = run_batch(model, prompts, max_new)
        first_token_at = t_batch + pre - t_run
        ttft_ms += [1e3 * first_token_at] * len(idx)
        prefill_s += pre
        decode_s += sum(steps)
        steps_by_batch.setdefault(len(idx), []).extend(steps)
        # Each request receives its own max_new_tokens; a static batch computes the longest.
        tokens_out += sum(min(reqs[i][1], len(o)) for i, o in zip(idx, out))
    run_s = time.perf_counter() - t_run

    result = {
        "tool": "torch-baseline",
        "model": {"dir": args.model, "dim": cfg.dim, "n_layer": cfg.n_layer,
                  "n_head": cfg.n_head, "vocab_size": cfg.vocab_size},
        "torch": {"version": torch.__version__, "threads": torch.get_num_threads(),
                  "dtype": "float32"},
        "workload": {"prompts_file": args.prompts_file, "requests": len(reqs),
                     "input_tokens": sum(len(p) for p, _ in reqs),
                     "requested_output": sum(n for _, n in reqs), "batches": len(batches),
                     "batch_sizes": [len(b) for b in batches]},
        "load_s": load_s,
        "duration_s": run_s,
        "prefill_s": prefill_s,
        "decode_s": decode_s,
        "tokens": {"input": sum(len(p) for p, _ in reqs), "output": tokens_out},
        "throughput": {"output_tokens_per_s": tokens_out / run_s,
                       "prefill_tokens_per_s": sum(len(p) for p, _ in reqs) / prefill_s},
        "decode_ms_per_step": {str(b): 1e3 * statistics.median(s)
                               for b, s in sorted(steps_by_batch.items()) if s},
        "latency_ms": {"ttft": percentiles(ttft_ms)},
    }
    print(f"torch baseline: {len(reqs)} requests in {len(batches)} static batches "
          f"({result['torch']['threads']} threads, fp32 eager), {run_s:.2f} s")
    print(f"  {tokens_out / run_s:.1f} output tokens/s; prefill {prefill_s:.2f} s "
          f"({result['throughput']['prefill_tokens_per_s']:.1f} tokens/s), decode {decode_s:.2f} s")
    for b, ms in result["decode_ms_per_step"].items():
        print(f"  decode step at batch {b}: {ms:.1f} ms (median)")
    t = result["latency_ms"]["ttft"]
    print(f"  TTFT ms p50 {t['p50']:.0f} p90 {t['p90']:.0f} max {t['max']:.0f}")
    if args.json_out:
        with open(args.json_out, "w") as f:
            json.dump(result, f, indent=2)
            f.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
