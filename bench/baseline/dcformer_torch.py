"""DCFormer in plain PyTorch: the reference implementation a user would write.

Written from docs/DCFORMER.md (the shared model specification) alone. Eager PyTorch, no
custom kernels; fp32 by default. It is the project's second oracle (tests/baseline checks it
against tests/data/golden), the baseline the benchmarks compare the server with, and the
model the training code in models/train builds.

API (keep it stable; other tools import it):

    model = load_model("models/dcformer-kjv")          # config.json + weights, eval mode
    logits = model(tokens)                              # tokens [B, T] int64 -> [B, T, V]
    new = generate(model, [[1, 2, 3]], max_new_tokens=16)           # greedy, batch 1
    new = generate(model, prompts, 32, temperature=0.8, top_p=0.9, seed=1)  # sampled

Incremental decoding: cache = KVCache(model, batch, max_len); then
model(prompt, start_pos=0, cache=cache) and model(next_tokens, start_pos=p, cache=cache).
Every row of a batch has the same length (static batches of equal-length prompts).

Run directly for a command-line check:
    /usr/bin/python3 bench/baseline/dcformer_torch.py --model DIR --prompt-ids 1,2,3 \
        --max-new-tokens 16 [--temperature 0.8 --seed 1]
Needs only torch (Debian's python3-torch with /usr/bin/python3). On a CPU, set
OPENBLAS_NUM_THREADS=1 before torch loads: OpenBLAS's own threads otherwise fight torch's
OpenMP threads for the same cores (measured: a GEMM 25% slower on 2 idle cores, 5x slower on
a busy machine).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import struct
import sys
from typing import Dict, Iterable, List, Optional, Sequence

import torch
import torch.nn.functional as F
from torch import nn

# DCMHA constants fixed by the architecture (DCFORMER.md section 4).
COMPOSE_BRANCHES = 4  # C: 0 pre-query, 1 pre-key, 2 post-query, 3 post-key
RANK = 2  # I
QK_NORM_EPS = 1e-6  # qk-norm eps, whatever norm_eps says
W1_NORM_EPS = 1e-6

_WINDOW_TYPES = (None, "LG", "LGLL", "LGL6")


class ConfigError(ValueError):
    """A config.json value this model does not support; the message names the key."""


@dataclasses.dataclass
class DCFormerConfig:
    """Hyper-parameters parsed from a Hugging Face style config.json (DCFORMER.md section 1)."""

    model_type: str = "dcformer"  # "dcformer" or "dcpythia"
    dim: int = 256  # E
    n_layer: int = 4
    n_head: int = 8  # N
    intermediate_size: int = 512  # F
    vocab_size: int = 300  # V
    block_size: int = 256  # max positions
    rope_base: float = 10000.0
    norm_eps: float = 1e-6
    use_qk_norm: bool = True
    window_size: Optional[int] = None  # W; None: every layer global
    window_type: Optional[str] = None  # None/"LG", "LGLL", "LGL6"
    rotary_pct: float = 1.0  # dcpythia only
    use_parallel_residual: bool = False  # dcpythia only
    use_linear_bias: bool = False  # dcpythia only
    bos_token_id: Optional[int] = None
    eos_token_id: Optional[int] = None

    @property
    def head_dim(self) -> int:
        return self.dim // self.n_head

    @property
    def dynamic_hidden(self) -> int:  # K = 4N
        return 4 * self.n_head

    @property
    def rotary_dim(self) -> int:  # r
        return int(self.head_dim * self.rotary_pct)

    def is_local_layer(self, layer: int) -> bool:
        """Whether `layer` attends within the sliding window (DCFORMER.md section 5)."""
        if self.window_size is None:
            return False
        if self.window_type in (None, "LG"):
            return layer % 2 == 0
        if self.window_type == "LGLL":
            return layer % 4 in (0, 2, 3)
        return layer % 8 != 1  # LGL6

    @classmethod
    def from_dict(cls, d: dict) -> "DCFormerConfig":
        model_type = d.get("model_type")
        if model_type not in ("dcformer", "dcpythia"):
            raise ConfigError(f"config.json: 'model_type' {model_type!r} is not supported "
                              "(dcformer, dcpythia)")
        c = cls(model_type=model_type)
        for key in ("dim", "n_layer", "n_head", "intermediate_size", "vocab_size", "block_size"):
            v = d.get(key)
            if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
                raise ConfigError(f"config.json: '{key}' must be a positive integer, got {v!r}")
            setattr(c, key, v)
        if c.dim % c.n_head:
            raise ConfigError(f"config.json: 'dim' {c.dim} is not divisible by n_head {c.n_head}")
        if d.get("n_local_heads", c.n_head) not in (None, c.n_head):
            raise ConfigError("config.json: 'n_local_heads' must equal n_head")
        if d.get("use_dcmha") is False:
            raise ConfigError("config.json: 'use_dcmha' false is not supported")
        if d.get("query_wise") is True:
            raise ConfigError("config.json: 'query_wise' true is not supported")
        if d.get("tie_word_embeddings") is True:
            raise ConfigError("config.json: 'tie_word_embeddings' true is not supported")
        c.rope_base = float(d.get("rope_base") or 10000.0)
        c.norm_eps = float(d.get("norm_eps") or 1e-6)
        c.use_qk_norm = bool(d.get("use_qk_norm", False))
        c.window_size = d.get("window_size")
        if c.window_size is not None and (not isinstance(c.window_size, int) or
                                          c.window_size <= 0):
            raise ConfigError(f"config.json: 'window_size' has bad value {c.window_size!r}")
        c.window_type = d.get("window_type")
        if c.window_type not in _WINDOW_TYPES:
            raise ConfigError(f"config.json: 'window_type' {c.window_type!r} is not supported "
                              "(null, LG, LGLL, LGL6)")
        if model_type == "dcpythia":
            c.rotary_pct = float(d.get("rotary_pct", 0.25))
            c.use_parallel_residual = bool(d.get("use_parallel_residual", True))
            c.use_linear_bias = bool(d.get("use_linear_bias", True))
            if not c.use_parallel_residual:
                raise ConfigError("config.json: 'use_parallel_residual' false is not supported "
                                  "for dcpythia")
        else:
            for key in ("use_parallel_residual", "use_linear_bias"):
                if d.get(key):
                    raise ConfigError(f"config.json: '{key}' true is not supported for dcformer")
        if c.rotary_dim <= 0 or c.rotary_dim % 2:
            raise ConfigError(f"config.json: 'rotary_pct' gives rotary dims {c.rotary_dim}, "
                              "which must be even and positive")
        for key in ("bos_token_id", "eos_token_id"):
            v = d.get(key)
            setattr(c, key, v[0] if isinstance(v, list) and v else v)
        return c

    def to_dict(self, torch_dtype: str = "float32") -> dict:
        """The config.json the engine and load_model read back."""
        d = {
            "architectures": ["DCFormer" if self.model_type == "dcformer" else "DCPythia"],
            "model_type": self.model_type,
            "dim": self.dim,
            "n_layer": self.n_layer,
            "n_head": self.n_head,
            "n_local_heads": self.n_head,
            "head_dim": self.head_dim,
            "intermediate_size": self.intermediate_size,
            "vocab_size": self.vocab_size,
            "block_size": self.block_size,
            "rope_base": self.rope_base,
            "norm_eps": self.norm_eps,
            "use_qk_norm": self.use_qk_norm,
            "window_size": self.window_size,
            "window_type": self.window_type,
            "use_dcmha": True,
            "query_wise": False,
            "tie_word_embeddings": False,
            "torch_dtype": torch_dtype,
            "bos_token_id": self.bos_token_id,
            "eos_token_id": self.eos_token_id,
        }
        if self.model_type == "dcpythia":
            d.update(rotary_pct=self.rotary_pct, use_parallel_residual=True,
                     use_linear_bias=self.use_linear_bias)
        return d


# ----------------------------------------------------------------------------------------
# Layers


class RMSNorm(nn.Module):
    """x / sqrt(mean(x^2) + eps) * weight over the last axis."""

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


class QKNorm(nn.Module):
    """RMS norm over head_dim with a learned `scale` and eps 1e-6 (applied before RoPE)."""

    def __init__(self, head_dim: int):
        super().__init__()
        self.scale = nn.Parameter(torch.ones(head_dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + QK_NORM_EPS) * self.scale


def rope_tables(cfg: DCFormerConfig, positions: torch.Tensor, dtype: torch.dtype):
    """cos, sin for `positions` [T] (int64): [T, r/2] each, angles computed in float64."""
    r = cfg.rotary_dim
    j = torch.arange(r // 2, dtype=torch.float64)
    inv_freq = cfg.rope_base ** (-2.0 * j / r)  # [r/2]
    angle = positions.to(torch.float64)[:, None] * inv_freq[None, :]  # [T, r/2]
    return angle.cos().to(dtype), angle.sin().to(dtype)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Half pairing: dims j and j + r/2 rotate together; dims >= r pass through.

    x [B, N, T, hd], cos/sin [T, r/2].
    """
    half = cos.shape[-1]
    x1, x2, rest = x[..., :half], x[..., half:2 * half], x[..., 2 * half:]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin, rest], dim=-1)


class DynamicWeightProjection(nn.Module):
    """The DCMHA dynamic weights of every token, computed from the normed attention input.

    Parameters keep the checkpoints' names and shapes: dw1 [E,1,C,K], qkw [1,C,K,2I,N],
    dd [E,1,C*N] (last axis c-major).
    """

    def __init__(self, cfg: DCFormerConfig):
        super().__init__()
        E, N, K, C = cfg.dim, cfg.n_head, cfg.dynamic_hidden, COMPOSE_BRANCHES
        self.n_head = N
        self.dw1 = nn.Parameter(torch.zeros(E, 1, C, K))
        self.qkw = nn.Parameter(torch.zeros(1, C, K, 2 * RANK, N))
        self.dd = nn.Parameter(torch.zeros(E, 1, C * N))

    def forward(self, a: torch.Tensor):
        """a [B,T,E] -> W1 [B,T,C,I,N] (normalised over heads), W2 [B,T,C,I,N], G [B,T,C,N]."""
        B, T, _ = a.shape
        u = gelu_erf(torch.einsum("bte,eck->btck", a, self.dw1[:, 0]))  # [B,T,C,K]
        w = torch.einsum("btck,ckrn->btcrn", u, self.qkw[0])  # [B,T,C,2I,N]
        w1, w2 = w[..., :RANK, :], w[..., RANK:, :]  # [B,T,C,I,N] each
        w1 = w1 * torch.rsqrt(w1.pow(2).mean(-1, keepdim=True) + W1_NORM_EPS)
        g = torch.tanh(a @ self.dd[:, 0]).view(B, T, COMPOSE_BRANCHES, self.n_head)  # [B,T,C,N]
        return w1, w2, g


def compose(s: torch.Tensor, q_terms, k_terms) -> torch.Tensor:
    """Mixes the heads of s [B,N,T,S] at each (t, p) (DCFORMER.md section 4).

    q_terms = (W1 [B,T,I,N], W2 [B,T,I,N], G [B,T,N]) of the query-side branch,
    k_terms = (W1 [B,S,I,N], W2 [B,S,I,N], G [B,S,N]) of the key-side branch.
    out[n] = s[n] (1 + Gq[n] + Gk[n]) + sum_i W2q[i,n] <W1q[i,:], s> + sum_i W2k[i,n] <W1k[i,:], s>
    computed as out = (Mq[t] + Mk[p]) s with one N x N matrix per query and one per key,
    Mq[n,m] = (1 + Gq[n]) [n == m] + sum_i W2q[i,n] W1q[i,m] (Mk likewise, without the 1):
    a few large batched matmuls, which CPUs run much faster than rank-1 einsums.
    """
    w1q, w2q, gq = q_terms
    w1k, w2k, gk = k_terms
    mq = torch.einsum("btin,btim->btnm", w2q, w1q) + torch.diag_embed(1 + gq)  # [B,T,N,N]
    mk = torch.einsum("bsin,bsim->bsnm", w2k, w1k) + torch.diag_embed(gk)  # [B,S,N,N]
    out_q = s.permute(0, 2, 3, 1) @ mq.transpose(-1, -2)  # [B,T,S,N]
    out_k = s.permute(0, 3, 2, 1) @ mk.transpose(-1, -2)  # [B,S,T,N]
    return out_q.permute(0, 3, 1, 2) + out_k.permute(0, 3, 2, 1)


def gelu_erf(x: torch.Tensor) -> torch.Tensor:
    """Exact (erf) GELU. Written out because F.gelu's backward in Debian's torch 1.13.1 reads
    non-contiguous incoming gradients wrongly (garbage gradients when training)."""
    return 0.5 * x * (1.0 + torch.erf(x * (1.0 / math.sqrt(2.0))))


class KVCache:
    """Static per-layer cache for a batch of `batch` sequences up to `max_len` tokens.

    Per layer and position: k, v [B,N,L,hd] (k after qk-norm and RoPE) and the key-side DCMHA
    terms of the pre (1) and post (3) compose branches: W1k, W2k [B,L,2,I,N], Gk [B,L,2,N].
    Window layers keep every position too (masked); this is the simple cache, not a paged one.
    """

    def __init__(self, model: "DCFormer", batch: int, max_len: int,
                 dtype: Optional[torch.dtype] = None):
        cfg = model.config
        if max_len > cfg.block_size:
            raise ValueError(f"max_len {max_len} exceeds the model context {cfg.block_size}")
        dtype = dtype or model.tok_embeddings.weight.dtype
        N, hd = cfg.n_head, cfg.head_dim
        self.max_len = max_len
        self.layers = []
        for _ in range(cfg.n_layer):
            self.layers.append({
                "k": torch.zeros(batch, N, max_len, hd, dtype=dtype),
                "v": torch.zeros(batch, N, max_len, hd, dtype=dtype),
                "w1": torch.zeros(batch, max_len, 2, RANK, N, dtype=dtype),
                "w2": torch.zeros(batch, max_len, 2, RANK, N, dtype=dtype),
                "g": torch.zeros(batch, max_len, 2, N, dtype=dtype),
            })


def attention_mask(q_pos: torch.Tensor, k_pos: torch.Tensor, window: Optional[int]):
    """[T, S] bool: query at t sees key p when p <= t and, in a window layer, t - W < p."""
    t, p = q_pos[:, None], k_pos[None, :]
    visible = p <= t
    if window is not None:
        visible = visible & (p > t - window)
    return visible


class Attention(nn.Module):
    """DCMHA: multi-head attention whose scores and probabilities are composed across heads."""

    def __init__(self, cfg: DCFormerConfig, layer: int):
        super().__init__()
        E, bias = cfg.dim, cfg.use_linear_bias
        self.cfg = cfg
        self.window = cfg.window_size if cfg.is_local_layer(layer) else None
        self.wqkv = nn.Linear(E, 3 * E, bias=bias)
        self.wo = nn.Linear(E, E, bias=bias)
        if cfg.use_qk_norm:
            self.q_norm = QKNorm(cfg.head_dim)
            self.k_norm = QKNorm(cfg.head_dim)
        self.dyn_w_proj = DynamicWeightProjection(cfg)

    def forward(self, a: torch.Tensor, start_pos: int, cache: Optional[dict]) -> torch.Tensor:
        """a [B,T,E] (normed) at positions start_pos.. -> [B,T,E]."""
        cfg = self.cfg
        B, T, E = a.shape
        N, hd = cfg.n_head, cfg.head_dim
        q, k, v = self.wqkv(a).split(E, dim=-1)  # [B,T,E] each, head-major
        q, k, v = (x.view(B, T, N, hd).transpose(1, 2) for x in (q, k, v))  # [B,N,T,hd]
        if cfg.use_qk_norm:
            q, k = self.q_norm(q), self.k_norm(k)
        q_pos = torch.arange(start_pos, start_pos + T)
        cos, sin = rope_tables(cfg, q_pos, a.dtype)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        w1, w2, g = self.dyn_w_proj(a)  # [B,T,C,I,N], [B,T,C,I,N], [B,T,C,N]
        kw1, kw2, kg = w1[:, :, 1::2], w2[:, :, 1::2], g[:, :, 1::2]  # key side: branches 1, 3

        if cache is not None:
            end = start_pos + T
            if end > cache["k"].shape[2]:
                raise ValueError(f"position {end - 1} is beyond the cache ({cache['k'].shape[2]})")
            cache["k"][:, :, start_pos:end] = k
            cache["v"][:, :, start_pos:end] = v
            cache["w1"][:, start_pos:end] = kw1
            cache["w2"][:, start_pos:end] = kw2
            cache["g"][:, start_pos:end] = kg
            k, v = cache["k"][:, :, :end], cache["v"][:, :, :end]
            kw1, kw2, kg = cache["w1"][:, :end], cache["w2"][:, :end], cache["g"][:, :end]

        # Queries in chunks: each chunk attends only to the keys it can see (causal, and the
        # window in local layers), which skips most masked work and keeps the [B,N,t,s]
        # tensors small. The result is the same as one pass over all keys.
        q = q / math.sqrt(hd)
        outs = []
        for c0 in range(0, T, self.query_chunk):
            c1 = min(T, c0 + self.query_chunk)
            first, last = start_pos + c0, start_pos + c1 - 1  # absolute query positions
            lo = 0 if self.window is None else max(0, first - self.window + 1)
            hi = last + 1
            q_terms = (w1[:, c0:c1], w2[:, c0:c1], g[:, c0:c1])  # [B,t,C,I,N] ...
            k_terms = (kw1[:, lo:hi], kw2[:, lo:hi], kg[:, lo:hi])  # [B,s,2,I,N] ...
            mask = attention_mask(q_pos[c0:c1], torch.arange(lo, hi), self.window)  # [t,s]
            outs.append(self._attend(q[:, :, c0:c1], k[:, :, lo:hi], v[:, :, lo:hi], q_terms,
                                     k_terms, mask))
        out = torch.cat(outs, dim=2)  # [B,N,T,hd]
        return self.wo(out.transpose(1, 2).reshape(B, T, E))

    # Queries per attention chunk (any value gives the same result; see forward).
    query_chunk = 128

    @staticmethod
    def _attend(q, k, v, q_terms, k_terms, mask):
        """One query chunk: q [B,N,t,hd] (pre-scaled), k, v [B,N,s,hd], the query-side terms of
        all 4 branches (W1, W2 [B,t,C,I,N], G [B,t,C,N]), the key-side terms of branches 1
        and 3 (W1, W2 [B,s,2,I,N], G [B,s,2,N]), mask [t,s] -> [B,N,t,hd]."""
        w1, w2, g = q_terms
        kw1, kw2, kg = k_terms
        scores = q @ k.transpose(-1, -2)  # [B,N,t,s]
        scores = compose(scores, (w1[:, :, 0], w2[:, :, 0], g[:, :, 0]),
                         (kw1[:, :, 0], kw2[:, :, 0], kg[:, :, 0]))
        scores = scores.masked_fill(~mask, float("-inf"))
        # Masked keys get probability 0. Half-precision scores are normalised in fp32.
        if scores.dtype in (torch.float16, torch.bfloat16):
            probs = torch.softmax(scores.float(), dim=-1).to(scores.dtype)
        else:
            probs = torch.softmax(scores, dim=-1)
        probs = compose(probs, (w1[:, :, 2], w2[:, :, 2], g[:, :, 2]),
                        (kw1[:, :, 1], kw2[:, :, 1], kg[:, :, 1]))
        return probs @ v


class FeedForward(nn.Module):
    """dcformer: w2(silu(w1 h) * w3 h).  dcpythia: w2(gelu_erf(w1 h + b1)) + b2."""

    def __init__(self, cfg: DCFormerConfig):
        super().__init__()
        E, Fd = cfg.dim, cfg.intermediate_size
        self.gated = cfg.model_type == "dcformer"
        self.w1 = nn.Linear(E, Fd, bias=cfg.use_linear_bias)
        if self.gated:
            self.w3 = nn.Linear(E, Fd, bias=False)
        self.w2 = nn.Linear(Fd, E, bias=cfg.use_linear_bias)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        if self.gated:
            return self.w2(F.silu(self.w1(h)) * self.w3(h))
        return self.w2(gelu_erf(self.w1(h)))


def make_norm(cfg: DCFormerConfig) -> nn.Module:
    if cfg.model_type == "dcpythia":
        return nn.LayerNorm(cfg.dim, eps=cfg.norm_eps)
    return RMSNorm(cfg.dim, cfg.norm_eps)


class TransformerBlock(nn.Module):
    def __init__(self, cfg: DCFormerConfig, layer: int):
        super().__init__()
        self.parallel = cfg.use_parallel_residual
        self.attention = Attention(cfg, layer)
        self.feed_forward = FeedForward(cfg)
        self.attention_norm = make_norm(cfg)
        self.ffn_norm = make_norm(cfg)

    def forward(self, x: torch.Tensor, start_pos: int, cache: Optional[dict]) -> torch.Tensor:
        if self.parallel:
            return (x + self.attention(self.attention_norm(x), start_pos, cache) +
                    self.feed_forward(self.ffn_norm(x)))
        x = x + self.attention(self.attention_norm(x), start_pos, cache)
        return x + self.feed_forward(self.ffn_norm(x))


class DCFormer(nn.Module):
    """The whole model; parameter names are the checkpoints' (DCFORMER.md section 2)."""

    def __init__(self, cfg: DCFormerConfig):
        super().__init__()
        self.config = cfg
        self.tok_embeddings = nn.Embedding(cfg.vocab_size, cfg.dim)
        self.layers = nn.ModuleList(TransformerBlock(cfg, l) for l in range(cfg.n_layer))
        self.norm = make_norm(cfg)
        self.output = nn.Linear(cfg.dim, cfg.vocab_size, bias=False)

    def forward(self, tokens: torch.Tensor, start_pos: int = 0,
                cache: Optional[KVCache] = None) -> torch.Tensor:
        """tokens [B,T] int64 at positions start_pos.. -> logits [B,T,V] (model dtype).

        Without a cache the tokens are the whole sequence (start_pos must be 0). With one,
        the cache holds positions [0, start_pos) and receives these T.
        """
        B, T = tokens.shape
        if cache is None and start_pos != 0:
            raise ValueError("start_pos > 0 needs a cache")
        if start_pos + T > self.config.block_size:
            raise ValueError(f"{start_pos + T} positions exceed block_size "
                             f"{self.config.block_size}")
        x = self.tok_embeddings(tokens)  # [B,T,E]
        for i, layer in enumerate(self.layers):
            x = layer(x, start_pos, cache.layers[i] if cache is not None else None)
        return self.output(self.norm(x))

    def init_weights(self, seed: int) -> None:
        """Random initialisation for training (GPT-2 style; small dynamic weights)."""
        cfg = self.config
        gen = torch.Generator().manual_seed(seed)
        std = 0.02
        resid_std = std / math.sqrt(2 * cfg.n_layer)
        with torch.no_grad():
            for name, p in self.named_parameters():
                if name.endswith(("norm.weight", "norm.scale")):
                    p.fill_(1.0)
                elif name.endswith("bias"):
                    p.zero_()
                elif name.endswith(("wo.weight", "w2.weight")):
                    p.normal_(0.0, resid_std, generator=gen)
                elif name.endswith("dyn_w_proj.dw1"):
                    K = cfg.dynamic_hidden
                    p.normal_(0.0, math.sqrt(2.0 / (cfg.dim + K)), generator=gen)
                elif name.endswith("dyn_w_proj.qkw"):
                    # Tiny: compose starts as the identity (W2 ~ 0, G ~ 0) and grows.
                    K = cfg.dynamic_hidden
                    p.normal_(0.0, math.sqrt(1.0 / K) * 2 / (cfg.n_head + RANK) * 0.01,
                              generator=gen)
                elif name.endswith("dyn_w_proj.dd"):
                    p.normal_(0.0, math.sqrt(2.0 / (cfg.dim + cfg.n_head)) * 0.005,
                              generator=gen)
                else:
                    p.normal_(0.0, std, generator=gen)


# ----------------------------------------------------------------------------------------
# Weights: safetensors (single or sharded) and PyTorch .bin (single or sharded)

# Keys that published files carry but that are derived or dead (DCFORMER.md section 2).
_IGNORED_SUFFIXES = ("dyn_w_proj.dw_m", "dyn_w_proj.qkw_m", "dyn_w_proj.pre_proj.w",
                     "dyn_w_proj.post_proj.w")
_SAFETENSORS_DTYPES = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
                       "F64": torch.float64}
_SAFETENSORS_NAMES = {v: k for k, v in _SAFETENSORS_DTYPES.items()}


def read_safetensors(path: str) -> Dict[str, torch.Tensor]:
    """Every tensor of one .safetensors file (8-byte header length, JSON header, data)."""
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n))
        data = bytearray(f.read())
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        dtype = _SAFETENSORS_DTYPES.get(info["dtype"])
        if dtype is None:
            raise ValueError(f"{path}: tensor {name} has unsupported dtype {info['dtype']}")
        begin, end = info["data_offsets"]
        raw = torch.frombuffer(data, dtype=torch.uint8, count=end - begin, offset=begin)
        out[name] = raw.view(dtype).reshape(info["shape"]).clone()
    return out


def write_safetensors(path: str, tensors: Dict[str, torch.Tensor],
                      metadata: Optional[Dict[str, str]] = None) -> None:
    """Writes `tensors` (contiguous little-endian copies, names sorted) as one file."""
    header: Dict[str, object] = {"__metadata__": metadata or {"format": "pt"}}
    blobs, offset = [], 0
    for name in sorted(tensors):
        t = tensors[name].detach().contiguous().cpu()
        raw = t.view(torch.uint8).numpy().tobytes() if t.numel() else b""
        header[name] = {"dtype": _SAFETENSORS_NAMES[t.dtype], "shape": list(t.shape),
                        "data_offsets": [offset, offset + len(raw)]}
        blobs.append(raw)
        offset += len(raw)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)  # align the data to 8 bytes
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for raw in blobs:
            f.write(raw)


def read_checkpoint(model_dir: str) -> Dict[str, torch.Tensor]:
    """The state dict stored in `model_dir`, in whichever published layout it uses."""
    def sharded(index_name: str, reader):
        with open(os.path.join(model_dir, index_name)) as f:
            files = sorted(set(json.load(f)["weight_map"].values()))
        sd = {}
        for name in files:
            sd.update(reader(os.path.join(model_dir, name)))
        return sd

    def read_bin(path: str):
        return torch.load(path, map_location="cpu", weights_only=True)

    if os.path.exists(os.path.join(model_dir, "model.safetensors")):
        return read_safetensors(os.path.join(model_dir, "model.safetensors"))
    if os.path.exists(os.path.join(model_dir, "model.safetensors.index.json")):
        return sharded("model.safetensors.index.json", read_safetensors)
    if os.path.exists(os.path.join(model_dir, "pytorch_model.bin")):
        return read_bin(os.path.join(model_dir, "pytorch_model.bin"))
    if os.path.exists(os.path.join(model_dir, "pytorch_model.bin.index.json")):
        return sharded("pytorch_model.bin.index.json", read_bin)
    raise FileNotFoundError(f"{model_dir}: no model.safetensors, pytorch_model.bin or index")


def canonical_state_dict(sd: Dict[str, torch.Tensor]) -> Dict[str, torch.Tensor]:
    """Drops the ignored keys and joins split wq/wk/wv into wqkv."""
    out = {}
    for name, t in sd.items():
        if name.endswith(_IGNORED_SUFFIXES) or ".attention.kv_cache." in name:
            continue
        out[name] = t
    for name in [n for n in out if n.endswith(".attention.wq.weight") or
                 n.endswith(".attention.wq.bias")]:
        prefix, kind = name.rsplit(".wq.", 1)
        parts = [out.pop(f"{prefix}.{w}.{kind}") for w in ("wq", "wk", "wv")]
        out[f"{prefix}.wqkv.{kind}"] = torch.cat(parts, dim=0)
    return out


def load_model(model_dir: str, dtype: torch.dtype = torch.float32) -> DCFormer:
    """Builds the model of `model_dir`/config.json and loads its weights (cast to `dtype`).

    Missing or unexpected tensors and shape mismatches raise with the tensor's name.
    The model is returned in eval mode with gradients off.
    """
    with open(os.path.join(model_dir, "config.json")) as f:
        cfg = DCFormerConfig.from_dict(json.load(f))
    model = DCFormer(cfg)
    sd = canonical_state_dict(read_checkpoint(model_dir))
    expected = model.state_dict()
    missing = sorted(set(expected) - set(sd))
    unexpected = sorted(set(sd) - set(expected))
    if missing or unexpected:
        raise ValueError(f"{model_dir}: missing tensors {missing[:5]}, unexpected {unexpected[:5]}")
    for name, t in sd.items():
        if tuple(t.shape) != tuple(expected[name].shape):
            raise ValueError(f"{model_dir}: tensor {name} has shape {tuple(t.shape)}, expected "
                             f"{tuple(expected[name].shape)}")
    model.load_state_dict({k: v.to(torch.float32) for k, v in sd.items()})
    model = model.to(dtype).eval()
    model.requires_grad_(False)
    return model


def save_model(model: DCFormer, out_dir: str, dtype: torch.dtype = torch.bfloat16) -> None:
    """Writes config.json and model.safetensors (weights cast to `dtype`) into `out_dir`."""
    os.makedirs(out_dir, exist_ok=True)
    names = {torch.float32: "float32", torch.float16: "float16", torch.bfloat16: "bfloat16"}
    with open(os.path.join(out_dir, "config.json"), "w") as f:
        json.dump(model.config.to_dict(names[dtype]), f, indent=2)
        f.write("\n")
    write_safetensors(os.path.join(out_dir, "model.safetensors"),
                      {k: v.to(dtype) for k, v in model.state_dict().items()})


# ----------------------------------------------------------------------------------------
# Generation


def sample_next(logits: torch.Tensor, temperature: float = 0.0, top_k: Optional[int] = None,
                top_p: Optional[float] = None,
                generator: Optional[torch.Generator] = None) -> torch.Tensor:
    """logits [B,V] -> next ids [B]. temperature 0 is greedy (lowest id on ties)."""
    logits = logits.float()
    if temperature <= 0:
        return logits.argmax(dim=-1)
    logits = logits / temperature
    if top_k is not None and top_k > 0:
        kth = torch.topk(logits, min(top_k, logits.shape[-1]), dim=-1).values[:, -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p is not None and 0 < top_p < 1:
        sorted_logits, order = torch.sort(logits, dim=-1, descending=True)
        cum = torch.softmax(sorted_logits, dim=-1).cumsum(dim=-1)
        drop = cum - torch.softmax(sorted_logits, dim=-1) >= top_p  # keep the first over p
        sorted_logits = sorted_logits.masked_fill(drop, float("-inf"))
        logits = torch.full_like(logits, float("-inf")).scatter(-1, order, sorted_logits)
    probs = torch.softmax(logits, dim=-1)
    return torch.multinomial(probs, 1, generator=generator)[:, 0]


@torch.no_grad()
def generate(model: DCFormer, prompts: Sequence[Sequence[int]], max_new_tokens: int,
             temperature: float = 0.0, top_k: Optional[int] = None,
             top_p: Optional[float] = None, seed: Optional[int] = None,
             eos_id: Optional[int] = None) -> List[List[int]]:
    """Generates up to `max_new_tokens` after each prompt; returns the new ids per prompt.

    All prompts must have the same length (a static batch). One prefill over the prompts,
    then one decode step per token with the KV cache. A row stops after emitting `eos_id`
    (included); the loop ends when every row has stopped or the context is full.
    """
    lengths = {len(p) for p in prompts}
    if len(lengths) != 1 or 0 in lengths:
        raise ValueError("prompts must be non-empty and all of the same length")
    (P,) = lengths
    B = len(prompts)
    if P > model.config.block_size:
        raise ValueError(f"prompt of {P} tokens exceeds block_size {model.config.block_size}")
    if max_new_tokens <= 0:
        return [[] for _ in range(B)]
    gen = torch.Generator().manual_seed(seed) if seed is not None else None
    # The last generated token is never fed back, so P + max_new_tokens - 1 positions suffice.
    cache = KVCache(model, B, min(P + max_new_tokens - 1, model.config.block_size))
    logits = model(torch.tensor(prompts, dtype=torch.long), 0, cache)[:, -1]  # [B,V]
    out: List[List[int]] = [[] for _ in range(B)]
    done = [False] * B
    pos = P
    for step in range(1, max_new_tokens + 1):
        nxt = sample_next(logits, temperature, top_k, top_p, gen)  # [B]
        for b in range(B):
            if not done[b]:
                out[b].append(int(nxt[b]))
                done[b] = eos_id is not None and int(nxt[b]) == eos_id
        if all(done) or step == max_new_tokens or pos >= cache.max_len:
            break
        logits = model(nxt[:, None], pos, cache)[:, -1]
        pos += 1
    return out


def _main(argv: Optional[Iterable[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", required=True, help="model directory")
    ap.add_argument("--prompt-ids", required=True, help="comma-separated token ids")
    ap.add_argument("--max-new-tokens", type=int, default=16)
    ap.add_argument("--temperature", type=float, default=0.0)
    ap.add_argument("--top-k", type=int)
    ap.add_argument("--top-p", type=float)
    ap.add_argument("--seed", type=int)
    ap.add_argument("--eos-id", type=int)
    ap.add_argument("--threads", type=int, help="torch.set_num_threads")
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    prompt = [int(x) for x in args.prompt_ids.split(",")]
    model = load_model(args.model)
    new = generate(model, [prompt], args.max_new_tokens, args.temperature, args.top_k,
                   args.top_p, args.seed, args.eos_id)
    print(",".join(map(str, new[0])))
    return 0


if __name__ == "__main__":
    sys.exit(_main())
