"""Trains models/dcformer-kjv: a small DCFormer on the King James Bible, on the CPU.

    nice -n 10 /usr/bin/python3 models/train/train.py --data models/train/data \
        --out models/dcformer-kjv

Builds the model with bench/baseline/dcformer_torch.py (DCMHA with pre/post compose, qk-norm,
sliding-window layers: exactly what the engine serves), trains it for a fixed number of steps
with AdamW on random windows of the training split (DATA/train.bin from train_tokenizer.js),
evaluates the held-out split (DATA/heldout.bin) as it goes, and writes into OUT:
config.json + model.safetensors (bf16), train_log.csv (one row per logged step) and
loss.png (the loss curve). Seeded: the same command on the same machine and PyTorch build
gives the same weights (CPU kernels are deterministic here; another build or thread count
may differ in the last bits).
"""

import argparse
import csv
import json
import math
import os
import sys
import time

# OpenBLAS's own threads fight torch's OpenMP threads for the same cores (a GEMM ran 25%
# slower with both on 2 cores here, and 5x slower on a busy machine): one BLAS thread per
# call, torch parallelises the rest. Must be set before torch loads OpenBLAS.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "bench", "baseline"))
import dcformer_torch as dct  # noqa: E402

# The model: 3.4M parameters (1.6M of them in the embedding and output tables). Small on
# purpose: at this compute budget (minutes of CPU) a smaller model reaches a lower loss.
MODEL = dict(
    model_type="dcformer", dim=192, n_layer=4, n_head=6, intermediate_size=512,
    vocab_size=4096, block_size=256, rope_base=10000.0, norm_eps=1e-6, use_qk_norm=True,
    window_size=64, window_type=None,  # layers 0 and 2 local (64 keys), 1 and 3 global
    bos_token_id=0, eos_token_id=0,  # <|endoftext|>
)
SEQ_LEN = 256  # tokens per training sequence (= block_size)
# --copy-fraction: copy windows hold a passage of COPY_MIN_LEN..SEQ_LEN/2 tokens, starting at
# a line, repeated to the window's end (dcformer-bench --copy_text prompts are a passage of the
# held-out text from a line, then its first eighth again, and the answer repeats the rest;
# with this model's 256 positions a passage there is 84-112 tokens).
COPY_MIN_LEN = 32
COPY_MAX_LEN = SEQ_LEN // 2
NEWLINE_ID = 11  # "\n" (byte 10 + 1); no other token of the tokenizer holds a newline


def read_ids(path):
    """uint16 little-endian ids -> int64 tensor [n]."""
    with open(path, "rb") as f:
        raw = bytearray(f.read())
    return torch.frombuffer(raw, dtype=torch.int16).to(torch.int64) & 0xFFFF


def plain_batch(ids, gen, batch):
    """`batch` random windows of the stream: x [batch, SEQ_LEN] and y, x shifted by one."""
    starts = torch.randint(0, len(ids) - SEQ_LEN - 1, (batch,), generator=gen)
    x = torch.stack([ids[s:s + SEQ_LEN] for s in starts.tolist()])  # [B,T]
    y = torch.stack([ids[s + 1:s + SEQ_LEN + 1] for s in starts.tolist()])  # [B,T]
    return x, y


def line_starts(ids):
    """Positions where a line begins: 0 and every position after a newline or EOS."""
    ends = ((ids == NEWLINE_ID) | (ids == MODEL["eos_token_id"])).nonzero().flatten() + 1
    return torch.cat([torch.zeros(1, dtype=torch.int64), ends[ends < len(ids)]])


class CopyWindows:
    """Turns a fraction of a batch's windows into copy examples: a passage of the stream
    (COPY_MIN_LEN to COPY_MAX_LEN tokens from a line start) followed by itself again, repeated
    to the window's end, so the model learns to repeat text it was shown. Draws from its own
    generator, so the ordinary windows are the ones a run without copies draws."""

    def __init__(self, ids, fraction, seed):
        self.ids = ids
        self.fraction = fraction
        self.gen = torch.Generator().manual_seed(seed)
        starts = line_starts(ids)
        self.starts = starts[starts + COPY_MAX_LEN <= len(ids)]

    def apply(self, x, y):
        for i in range(x.shape[0]):
            if torch.rand((), generator=self.gen).item() >= self.fraction:
                continue
            n = int(torch.randint(COPY_MIN_LEN, COPY_MAX_LEN + 1, (), generator=self.gen))
            s = int(self.starts[int(torch.randint(len(self.starts), (), generator=self.gen))])
            window = self.ids[s:s + n].repeat(SEQ_LEN // n + 1)[:SEQ_LEN + 1]
            x[i], y[i] = window[:-1], window[1:]
        return x, y


def lr_at(step, args):
    """Linear warm-up, then cosine decay to 10% of the peak."""
    if step < args.warmup:
        return args.lr * (step + 1) / args.warmup
    progress = (step - args.warmup) / max(1, args.steps - args.warmup)
    return args.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))


@torch.no_grad()
def heldout_loss(model, ids, window):
    """Mean next-token cross-entropy (nats) over `ids` cut into consecutive windows of
    `window` tokens, each scored on its own: every token after a window's first is predicted
    from the tokens before it in its window. `dcformer-generate --score` computes the same."""
    was_training = model.training
    model.eval()
    starts = list(range(0, len(ids) - 1, window))
    total, count = 0.0, 0
    full = [s for s in starts if s + window <= len(ids)]
    rest = [s for s in starts if s + window > len(ids)]
    for i in range(0, len(full), 8):
        x = torch.stack([ids[s:s + window] for s in full[i:i + 8]])  # [b, window]
        logits = model(x[:, :-1])
        total += F.cross_entropy(logits.flatten(0, 1), x[:, 1:].flatten(),
                                 reduction="sum").item()
        count += x[:, 1:].numel()
    for s in rest:
        x = ids[s:][None]  # [1, < window]
        total += F.cross_entropy(model(x[:, :-1])[0], x[0, 1:], reduction="sum").item()
        count += x.shape[1] - 1
    model.train(was_training)
    return total / count


def param_groups(model, weight_decay):
    decay, no_decay = [], []
    for name, p in model.named_parameters():
        (decay if p.dim() >= 2 and "norm" not in name else no_decay).append(p)
    return [{"params": decay, "weight_decay": weight_decay},
            {"params": no_decay, "weight_decay": 0.0}]


def plot(log_rows, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    steps = [r["step"] for r in log_rows]
    fig, ax = plt.subplots(figsize=(7, 4.2), dpi=100)
    ax.plot(steps, [r["train_loss"] for r in log_rows], label="train (mean over interval)")
    held = [(r["step"], r["heldout_loss"]) for r in log_rows if r["heldout_loss"] != ""]
    ax.plot([s for s, _ in held], [l for _, l in held], "o-", label="held-out")
    ax.set_xlabel("step")
    ax.set_ylabel("cross-entropy (nats/token)")
    ax.set_title("dcformer-kjv training loss")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", default=os.path.join(ROOT, "models", "train", "data"))
    ap.add_argument("--out", default=os.path.join(ROOT, "models", "dcformer-kjv"))
    ap.add_argument("--steps", type=int, default=360,
                    help="length of the learning-rate schedule")
    # The committed model is the whole 360-step schedule (models/dcformer-kjv/README.md).
    ap.add_argument("--stop-after", type=int, default=None,
                    help="stop after this many steps of the --steps schedule (the weights are "
                         "then exactly that step's of a full run)")
    ap.add_argument("--batch", type=int, default=8, help="sequences per step")
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--warmup", type=int, default=30)
    ap.add_argument("--weight-decay", type=float, default=0.1)
    ap.add_argument("--seed", type=int, default=1611)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--log-every", type=int, default=10)
    ap.add_argument("--eval-every", type=int, default=60)
    ap.add_argument("--copy-fraction", type=float, default=0.0,
                    help="fraction of the training windows that are copy examples (a passage, "
                         "then the same passage again); 0 (the committed model) draws none")
    args = ap.parse_args()
    run_steps = args.steps if args.stop_after is None else min(args.steps, args.stop_after)

    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    torch.use_deterministic_algorithms(True)
    train_ids = read_ids(os.path.join(args.data, "train.bin"))
    held_ids = read_ids(os.path.join(args.data, "heldout.bin"))

    cfg = dct.DCFormerConfig(**MODEL)
    model = dct.DCFormer(cfg)
    model.init_weights(args.seed)
    n_params = sum(p.numel() for p in model.parameters())
    print(f"train: {n_params / 1e6:.2f}M parameters, {len(train_ids)} training tokens, "
          f"{len(held_ids)} held-out, {run_steps} of {args.steps} steps x {args.batch} x "
          f"{SEQ_LEN} tokens, {args.threads} threads", flush=True)
    opt = torch.optim.AdamW(param_groups(model, args.weight_decay), lr=args.lr,
                            betas=(0.9, 0.95), eps=1e-8)
    gen = torch.Generator().manual_seed(args.seed)
    copies = None
    if args.copy_fraction > 0:
        copies = CopyWindows(train_ids, args.copy_fraction, args.seed + 1)

    os.makedirs(args.out, exist_ok=True)
    rows, interval_loss, interval_n = [], 0.0, 0
    start = time.time()
    for step in range(run_steps):
        for group in opt.param_groups:
            group["lr"] = lr_at(step, args)
        x, y = plain_batch(train_ids, gen, args.batch)
        if copies is not None:
            x, y = copies.apply(x, y)
        loss = F.cross_entropy(model(x).flatten(0, 1), y.flatten())
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        interval_loss += loss.item()
        interval_n += 1
        last = step + 1 == run_steps
        if (step + 1) % args.log_every == 0 or last:
            elapsed = time.time() - start
            held = ""
            if (step + 1) % args.eval_every == 0 or last:
                held = heldout_loss(model, held_ids, SEQ_LEN)
            tokens = (step + 1) * args.batch * SEQ_LEN
            rows.append({"step": step + 1, "tokens": tokens,
                         "train_loss": interval_loss / interval_n, "heldout_loss": held,
                         "lr": lr_at(step, args), "elapsed_s": round(elapsed, 1)})
            print(f"step {step + 1:5d}  loss {interval_loss / interval_n:.4f}"
                  + (f"  held-out {held:.4f}" if held != "" else "")
                  + f"  {tokens / elapsed:.0f} tok/s  {elapsed:.0f}s", flush=True)
            interval_loss, interval_n = 0.0, 0

    wall = time.time() - start
    dct.save_model(model, args.out, torch.bfloat16)
    shipped = dct.load_model(args.out)  # the bf16 weights as served, computed in fp32
    final_held = heldout_loss(shipped, held_ids, SEQ_LEN)
    with open(os.path.join(args.out, "train_log.csv"), "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    plot(rows, os.path.join(args.out, "loss.png"))
    summary = {"parameters": n_params, "steps": run_steps, "schedule_steps": args.steps,
               "batch": args.batch, "seq_len": SEQ_LEN,
               "tokens_seen": run_steps * args.batch * SEQ_LEN,
               "train_tokens": len(train_ids), "heldout_tokens": len(held_ids),
               "wall_s": round(wall, 1),
               "tokens_per_s": round(run_steps * args.batch * SEQ_LEN / wall),
               "threads": args.threads, "seed": args.seed,
               "final_train_loss": rows[-1]["train_loss"],
               "final_heldout_loss_bf16": final_held,
               "heldout_perplexity_bf16": math.exp(final_held), "torch": torch.__version__,
               "command": f"bash models/train/retrain.sh (train.py --steps {args.steps} "
                          f"--stop-after {run_steps})"}
    if copies is not None:
        summary["copy_fraction"] = args.copy_fraction
        summary["command"] = (f"bash models/train/train_copy.sh OUT (train.py --steps "
                              f"{args.steps} --stop-after {run_steps} --copy-fraction "
                              f"{args.copy_fraction})")
    with open(os.path.join(args.out, "training.json"), "w") as f:
        json.dump(summary, f, indent=2)
        f.write("\n")
    print("train: " + json.dumps(summary), flush=True)


if __name__ == "__main__":
    main()
