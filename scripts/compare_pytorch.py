"""Side-by-side train speed of the harness and a plain PyTorch twin of the same classifier.

The harness's config is the source of truth. For each model (``--models``) and length the
script composes ``configs/bench.yaml`` with Hydra's compose API (``model=<name>``, the extra
``KEY=VALUE`` overrides of the command line, ``task.max_length`` and ``batch_size`` from the
options), builds the harness classifier (``lra.train.steps.build_model``) and a PyTorch twin of it
(the classes below: what a competent researcher would write in eager PyTorch, mirroring
``models/encoder.py`` and the attention files, dropout placement included), and copies the
harness's initial weights (``nnx.state`` -> numpy) into the twin by a name mapping per module.
A harness weight the twin cannot place, or a twin weight left without a harness value, is an
error.

1. Equality check (always, before any timing): on ``lra.measure.bench.synthetic_batch`` in eval mode
   (no dropout) the twin's logits must equal the harness's within float32 tolerance,
   max |diff| <= tolerance * max(1, max |logit|). Any model that differs: exit 1, nothing
   timed. ``--check-only`` stops after the check.
2. Timing: train steps/sec (forward + backward + AdamW update) of the harness's compiled
   train step (``lra.train.steps.compile_steps``, the step lra-bench times, with the trainer's
   optimizer) and of the twin (``torch.optim.AdamW`` with the trainer's b1, b2, eps and
   weight decay at a constant learning rate), round-robin: for each round, for each length,
   for each model, for each attention-dropout value: the harness (warm-up steps awaited,
   then ``--steps`` timed steps awaited), then the twin (warm-up, then ``--steps`` timed
   steps). The table gives min-max over rounds, the harness's achieved FLOP/s (XLA's
   FLOPs per train step, ``lra.train.steps.train_step_flops``, times its steps/sec) and the most
   CPU other processes took during any of the cell's timings (``lra.device.machine_load``, in
   cores: 0 on a quiet machine). As lra-bench does, the script sets XLA's CPU flag of
   ``lra.device.measure.configure_cpu_memory_analysis`` (``--xla-flags default`` leaves XLA's
   defaults) and uses JAX's persistent compilation cache (``compile_cache.*``).

PyTorch is not a dependency of the harness; install it with the ``compare`` extra::

    pip install -e '.[compare]'
    python scripts/compare_pytorch.py --check-only --lengths 1024 --check-batch-size 2
    python scripts/compare_pytorch.py --models transformer,performer --lengths 1024,2048 \\
        --rounds 3 --out results/compare_pytorch.json
    python scripts/compare_pytorch.py --check-only --lengths 64 task.arch.num_layers=2 \\
        protocol=transnormer                  # any lra-bench override after the options

Exit status: 0 done, 1 the equality check failed (nothing timed), 2 a usage or set-up error
(PyTorch missing, a config the twin does not implement, a weight it cannot place).

What the twin does not do: bfloat16 (``trainer.precision=bf16``) and gradient accumulation
(``trainer.grad_accum > 1``) are refused, and mechanisms other than those in
``TWIN_ATTENTION`` (softmax, transnormer_diag, transnormer_norm, performer, cosformer,
flash, flash_quad) are refused with the model that uses them.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

try:  # the ``compare`` extra; only this script imports PyTorch
    import torch
    import torch.nn.functional as F
    import torch.utils.checkpoint
    from torch import nn

    TORCH_IMPORT_ERROR: str | None = None
    _Module: Any = nn.Module
except ImportError as _err:  # the classes below are then defined but unusable
    torch = F = nn = None
    TORCH_IMPORT_ERROR = f"{type(_err).__name__}: {_err}"
    _Module = object

INSTALL_HINT = "pip install -e '.[compare]'"
DEFAULT_MODELS = (
    "transformer",
    "transnormer_t1",
    "transnormer_t2",
    "performer",
    "cosformer",
    "flash",
)


class SetupError(Exception):
    """A config or weight the twin cannot mirror: reported as one line, exit status 2."""


# --------------------------------------------------------------------------------------------
# The PyTorch twin. Names of modules and weights follow the harness's, so the weight mapping
# is the module path plus a per-module rename (nn.Linear kernel -> weight transposed; norm
# scale -> weight). Shapes as in the harness files: B batch, L length, D dim, H heads, d head
# dim, E = qkv_dim.
# --------------------------------------------------------------------------------------------

_TABLES: dict[tuple, Any] = {}


def _cached(key: tuple, build):
    """A constant tensor (position tables, offsets) built once per shape, device and dtype."""
    if key not in _TABLES:
        _TABLES[key] = build()
    return _TABLES[key]


def sinusoidal_table(length: int, dim: int) -> np.ndarray:
    """float32[length, dim], interleaved sin/cos, the harness's ``sinusoidal_positions``."""
    pos = np.arange(length, dtype=np.float64)[:, None]
    channel = np.arange(dim)
    inv_freq = np.power(10000.0, -(2 * (channel // 2)) / dim)
    angles = pos * inv_freq[None, :]
    return np.where(channel % 2 == 0, np.sin(angles), np.cos(angles)).astype(np.float32)


class RMSNorm(_Module):
    """x / sqrt(mean(x^2) + eps) * weight (flax nnx.RMSNorm, eps 1e-6)."""

    HARNESS_NAMES = {"scale": ("weight", False)}

    def __init__(self, dim: int, eps: float = 1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        return x * torch.rsqrt(x.square().mean(-1, keepdim=True) + self.eps) * self.weight


def layer_norm(dim: int):
    return nn.LayerNorm(dim, eps=1e-6)  # flax's epsilon


def output_norm(norm_type: str, dim: int):
    if norm_type == "layernorm":
        return layer_norm(dim)
    if norm_type == "rmsnorm":
        return RMSNorm(dim)
    raise SetupError(f"twin: unknown norm_type {norm_type!r}")


def to_blocks(y, size: int):
    """[B, L, ...] -> [B, ceil(L / size), size, ...], zero (False) padded at the end."""
    pad = -y.shape[1] % size
    if pad:
        y = torch.cat([y, y.new_zeros((y.shape[0], pad, *y.shape[2:]))], dim=1)
    return y.reshape(y.shape[0], -1, size, *y.shape[2:])


def linear_context(q, k, v):
    """q [B, L, H, f], k [B, L, H, f] (padded keys zeroed), v [B, L, H, e] -> [B, L, H, e]."""
    kv = torch.einsum("bkhf,bkhe->bhfe", k, v)
    return torch.einsum("bqhf,bhfe->bqhe", q, kv)


def linear_normaliser(q, k):
    return torch.einsum("bqhf,bhf->bqh", q, k.sum(dim=1))


def lrpe_rotate(y):
    """LRPE (TransNormer): channel pairs (2p, 2p+1) at position m (axis -3) rotated by
    m * 10000^(-2p / e), e = d rounded down to even."""
    m, d = y.shape[-3], y.shape[-1]
    e = d - d % 2
    if e == 0:
        return y

    def build():
        theta = 10000.0 ** (-2.0 * np.arange(e // 2) / e)
        angle = np.arange(m)[:, None, None] * theta
        return tuple(
            torch.tensor(f(angle), dtype=y.dtype, device=y.device) for f in (np.cos, np.sin)
        )

    cos, sin = _cached(("lrpe", m, e, y.device, y.dtype), build)
    pairs = y[..., :e].reshape(*y.shape[:-1], e // 2, 2)
    even, odd = pairs[..., 0], pairs[..., 1]
    rotated = torch.stack([even * cos - odd * sin, odd * cos + even * sin], dim=-1)
    return torch.cat([rotated.flatten(-2), y[..., e:]], dim=-1)


def rope_rotate(y):
    """RoPE, FLASH ports' half-split layout: y [B, L, s], channels p and p + s/2 rotated by
    m * 10000^(-p / (s/2))."""
    n, half = y.shape[1], y.shape[-1] // 2

    def build():
        theta = 10000.0 ** (-np.arange(half) / half)
        angle = np.arange(n)[:, None] * theta
        return tuple(
            torch.tensor(f(angle), dtype=y.dtype, device=y.device) for f in (np.cos, np.sin)
        )

    cos, sin = _cached(("rope", n, half, y.device, y.dtype), build)
    first, second = y[..., :half], y[..., half:]
    return torch.cat([first * cos - second * sin, second * cos + first * sin], dim=-1)


class MultiHead(_Module):
    """Q, K, V (D -> E), out (E -> D), heads, attention dropout: models/attention/common.py."""

    replaces_mlp = False

    def __init__(self, *, dim, num_heads, max_len, qkv_dim=None, dropout_rate=0.0):
        super().__init__()
        qkv_dim = dim if qkv_dim is None else qkv_dim
        self.num_heads, self.head_dim, self.max_len = num_heads, qkv_dim // num_heads, max_len
        self.query = nn.Linear(dim, qkv_dim)
        self.key = nn.Linear(dim, qkv_dim)
        self.value = nn.Linear(dim, qkv_dim)
        self.out = nn.Linear(qkv_dim, dim)
        self.dropout = nn.Dropout(dropout_rate)

    def qkv(self, x):
        b, n, _ = x.shape
        return tuple(
            proj(x).view(b, n, self.num_heads, self.head_dim)
            for proj in (self.query, self.key, self.value)
        )


class SoftmaxAttention(MultiHead):
    """softmax(Q K^T / sqrt(d) + key mask) V, written out; "fused" uses
    F.scaled_dot_product_attention. The harness's "auto" is its plain path in float32 (cuDNN
    only for bf16/fp16 on a GPU), and the twin runs float32 only, so "auto" is plain here."""

    def __init__(self, *, implementation="auto", **common):
        super().__init__(**common)
        if implementation not in ("auto", "plain", "fused"):
            raise SetupError(f"twin softmax: unknown implementation {implementation!r}")
        self.implementation = implementation

    def forward(self, x, mask):
        q, k, v = self.qkv(x)
        if self.implementation == "fused":
            y = F.scaled_dot_product_attention(
                q.transpose(1, 2),
                k.transpose(1, 2),
                v.transpose(1, 2),
                attn_mask=mask[:, None, None, :],
                dropout_p=self.dropout.p if self.training else 0.0,
            )
            return self.out(y.transpose(1, 2).flatten(2))
        q = q * self.head_dim**-0.5
        logits = torch.einsum("bqhd,bkhd->bhqk", q, k)
        logits = logits.masked_fill(~mask[:, None, None, :], torch.finfo(logits.dtype).min)
        weights = self.dropout(logits.softmax(dim=-1))
        return self.out(torch.einsum("bhqk,bkhd->bqhd", weights, v).flatten(2))


KERNELS = {
    "1+elu": lambda x: F.elu(x) + 1,
    "elu": lambda x: F.elu(x),
    "relu": lambda x: F.relu(x),
}


class NormAttention(MultiHead):
    """TransNormer NormAttention: Norm(phi(Q) (phi(K)^T V)), then dropout, out."""

    def __init__(self, *, kernel="1+elu", norm_type="layernorm", lrpe=False, **common):
        super().__init__(**common)
        self.phi, self.lrpe = KERNELS[kernel], lrpe
        self.norm = output_norm(norm_type, self.num_heads * self.head_dim)

    def forward(self, x, mask):
        q, k, v = self.qkv(x)
        q, k = self.phi(q), self.phi(k)
        if self.lrpe:
            q, k = lrpe_rotate(q), lrpe_rotate(k)
        y = linear_context(q, k * mask[:, :, None, None], v).flatten(2)
        return self.out(self.dropout(self.norm(y)))


class DiagAttention(MultiHead):
    """TransNormer DiagAttention: softmax (or relu + norm) attention inside blocks of C."""

    def __init__(
        self, *, score="softmax", block_size=64, norm_type="layernorm", lrpe=False, **common
    ):
        super().__init__(**common)
        self.score, self.block_size, self.lrpe = score, block_size, lrpe
        width = self.num_heads * self.head_dim
        self.norm = output_norm(norm_type, width) if score == "relu" else None

    def forward(self, x, mask):
        b, n, _ = x.shape
        q, k, v = self.qkv(x)
        c = self.block_size
        q = to_blocks(q * self.head_dim**-0.5, c)  # [B, G, C, H, d]
        k, v = to_blocks(k, c), to_blocks(v, c)
        if self.lrpe:
            q, k = lrpe_rotate(q), lrpe_rotate(k)
        real_key = to_blocks(mask, c)[:, None, :, None, :]  # [B, 1, G, 1, C]
        logits = torch.einsum("bgqhd,bgkhd->bhgqk", q, k)
        if self.score == "softmax":
            low = torch.finfo(logits.dtype).min
            weights = logits.masked_fill(~real_key, low).softmax(dim=-1)
        else:
            weights = F.relu(logits) * real_key
        weights = self.dropout(weights)
        y = torch.einsum("bhgqk,bgkhd->bgqhd", weights, v)
        y = y.reshape(b, -1, self.num_heads * self.head_dim)[:, :n]
        if self.norm is not None:
            y = self.norm(y)
        return self.out(y)


def orthogonal_random_features(num_features: int, dim: int, device=None):
    """float32[m, d]: blocks of orthonormal rows (Haar Q of a Gaussian), chi-norm rows."""
    blocks = -(-num_features // dim)
    q, r = torch.linalg.qr(torch.randn(blocks, dim, dim, device=device))
    signs = torch.sign(torch.diagonal(r, dim1=-2, dim2=-1))
    q = q * torch.where(signs == 0, torch.ones_like(signs), signs)[:, None, :]
    rows = q.transpose(-1, -2).reshape(blocks * dim, dim)[:num_features]
    return rows * torch.randn(num_features, dim, device=device).norm(dim=-1, keepdim=True)


def positive_features(x, features, valid=None):
    """FAVOR+ phi(x) * exp(-max): x [B, L, H, d] (scaled) -> [B, L, H, m]."""
    ratio = features.shape[0] ** -0.5
    exponent = torch.einsum("blhd,md->blhm", x, features) - 0.5 * x.square().sum(-1, keepdim=True)
    if valid is None:  # queries: one max per position over the features
        return torch.exp(exponent - exponent.amax(-1, keepdim=True).detach()) * ratio
    low = torch.finfo(x.dtype).min
    real = valid[:, :, None, None]
    shift = exponent.masked_fill(~real, low).amax(dim=(1, 3), keepdim=True)
    shift = torch.where(shift > low, shift, torch.zeros_like(shift))
    exponent = (exponent - shift.detach()).masked_fill(~real, low)
    return torch.exp(exponent) * ratio * real


class PerformerAttention(MultiHead):
    """FAVOR+ with positive orthogonal random features (a buffer copied from the harness)."""

    def __init__(self, *, num_features=256, redraw="fixed", **common):
        super().__init__(**common)
        self.num_features, self.redraw = num_features, redraw
        self.register_buffer("features", torch.zeros(num_features, self.head_dim))

    def forward(self, x, mask):
        features = self.features
        if self.redraw == "every_call" and self.training:
            features = orthogonal_random_features(self.num_features, self.head_dim, x.device)
        q, k, v = self.qkv(x)
        scale = self.head_dim**-0.25
        phi_q = positive_features(q * scale, features)
        phi_k = positive_features(k * scale, features, mask)
        floor = math.sqrt(torch.finfo(x.dtype).tiny)
        denominator = linear_normaliser(phi_q, phi_k).clamp(min=floor)
        y = linear_context(phi_q, phi_k, v) / denominator[..., None]
        return self.out(self.dropout(y.flatten(2)))


class CosformerAttention(MultiHead):
    """cosFormer: relu features with cos re-weighting over M = 1 + last real index."""

    def forward(self, x, mask):
        n = x.shape[1]
        q, k, v = self.qkv(x)
        q, k = F.relu(q), F.relu(k)
        positions = torch.arange(1, n + 1, device=x.device)
        horizon = torch.where(mask, positions, 0).amax(dim=1).clamp(min=1).float()
        angle = (math.pi / 2) * torch.arange(n, device=x.device, dtype=torch.float32)[None, :]
        angle = (angle / horizon[:, None])[:, :, None, None].to(x.dtype)
        cos, sin = angle.cos(), angle.sin()
        q = torch.cat([q * cos, q * sin], dim=-1)
        k = torch.cat([k * cos, k * sin], dim=-1) * mask[:, :, None, None]
        y = linear_context(q, k, v) / linear_normaliser(q, k).clamp(min=1e-6)[..., None]
        return self.out(self.dropout(y.flatten(2)))


class RelativePositionBias(_Module):
    """A learned scalar per offset j - i, clipped to +-(span - 1)."""

    def __init__(self, span: int):
        super().__init__()
        self.span = span
        self.table = nn.Parameter(torch.zeros(2 * span - 1))

    def forward(self, length: int):
        def build():
            pos = torch.arange(length, device=self.table.device)
            offset = (pos[None, :] - pos[:, None]).clamp(-(self.span - 1), self.span - 1)
            return offset + self.span - 1

        return self.table[_cached(("offsets", length, self.span, self.table.device), build)]


class GatedAttentionUnit(_Module):
    """FLASH's GAU projections: U, V = SiLU(x W_u), SiLU(x W_v); Z = SiLU(x W_z) offset and
    scaled ``num_offsets`` times (gamma, beta); out = (U * Vhat) W_o."""

    replaces_mlp = True

    def __init__(
        self, dim, max_len, dropout_rate, expansion_factor, shared_dim, num_offsets, span, rope
    ):
        super().__init__()
        expanded = int(expansion_factor * dim)
        self.rope = rope
        self.hidden = nn.Linear(dim, 2 * expanded)
        self.shared = nn.Linear(dim, shared_dim)
        self.gamma = nn.Parameter(torch.zeros(num_offsets, shared_dim))
        self.beta = nn.Parameter(torch.zeros(num_offsets, shared_dim))
        self.rel_bias = RelativePositionBias(min(span, max_len))
        self.out = nn.Linear(expanded, dim)
        self.dropout = nn.Dropout(dropout_rate)

    def project(self, x):
        u, v = F.silu(self.hidden(x)).chunk(2, dim=-1)
        z = F.silu(self.shared(x))
        parts = (z[..., None, :] * self.gamma + self.beta).unbind(dim=-2)
        if self.rope:
            parts = [rope_rotate(p) for p in parts]
        return u, v, parts


class FlashQuadAttention(GatedAttentionUnit):
    """GAU with relu^2 attention over the whole sequence, scaled by 1 / (real tokens)."""

    def __init__(
        self,
        *,
        dim,
        num_heads,
        max_len,
        qkv_dim=None,
        dropout_rate=0.0,
        expansion_factor=2.0,
        shared_dim=128,
        rope=False,
    ):
        del num_heads, qkv_dim
        super().__init__(dim, max_len, dropout_rate, expansion_factor, shared_dim, 2, max_len, rope)

    def forward(self, x, mask):
        n = x.shape[1]
        u, v, (q, k) = self.project(x)
        count = mask.sum(-1).clamp(min=1).to(x.dtype)[:, None, None]
        logits = torch.einsum("bis,bjs->bij", q, k) / count + self.rel_bias(n)
        weights = self.dropout(F.relu(logits).square() * mask[:, None, :])
        return self.out(u * torch.einsum("bij,bje->bie", weights, v))


class FlashAttention(GatedAttentionUnit):
    """GAU with mixed chunk attention: relu^2 inside chunks (1/g) + global linear (1/n)."""

    def __init__(
        self,
        *,
        dim,
        num_heads,
        max_len,
        qkv_dim=None,
        dropout_rate=0.0,
        expansion_factor=2.0,
        shared_dim=128,
        chunk_size=256,
        rope=False,
    ):
        del num_heads, qkv_dim
        super().__init__(
            dim, max_len, dropout_rate, expansion_factor, shared_dim, 4, chunk_size, rope
        )
        self.chunk_size = chunk_size

    def forward(self, x, mask):
        b, n, _ = x.shape
        u, v, (quad_q, quad_k, lin_q, lin_k) = self.project(x)
        count = mask.sum(-1).clamp(min=1).to(x.dtype)
        lin_kv = torch.einsum("bns,bne->bse", lin_k * mask[..., None], v) / count[:, None, None]
        linear = torch.einsum("bns,bse->bne", lin_q, lin_kv)
        g = min(self.chunk_size, n)  # a sequence shorter than a chunk is one chunk
        qq, qk, vc, mc = (to_blocks(y, g) for y in (quad_q, quad_k, v, mask))
        logits = torch.einsum("bcis,bcjs->bcij", qq, qk) * (1.0 / self.chunk_size)
        logits = logits + self.rel_bias(g)
        weights = self.dropout(F.relu(logits).square() * mc[:, :, None, :])
        quadratic = torch.einsum("bcij,bcje->bcie", weights, vc).reshape(b, -1, v.shape[-1])
        return self.out(u * (quadratic[:, :n] + linear))


TWIN_ATTENTION = {
    "softmax": SoftmaxAttention,
    "transnormer_norm": NormAttention,
    "transnormer_diag": DiagAttention,
    "performer": PerformerAttention,
    "cosformer": CosformerAttention,
    "flash": FlashAttention,
    "flash_quad": FlashQuadAttention,
}


class Embedder(_Module):
    """Token embedding (+ CLS vector prepended) + positions, then dropout."""

    HARNESS_NAMES = {"embedding": ("embedding.weight", False)}

    def __init__(self, *, vocab_size, dim, max_len, positions, cls_token, dropout):
        super().__init__()
        self.dim = dim
        self.embedding = nn.Embedding(vocab_size, dim)
        self.cls = nn.Parameter(torch.zeros(dim)) if cls_token else None
        learned = positions == "learned"
        self.pos = nn.Parameter(torch.zeros(max_len + int(cls_token), dim)) if learned else None
        self.dropout = nn.Dropout(dropout)

    def forward(self, tokens, mask):
        b = tokens.shape[0]
        x = self.embedding(tokens)
        if self.cls is not None:
            x = torch.cat([self.cls.expand(b, 1, self.dim), x], dim=1)
            mask = torch.cat([mask.new_ones(b, 1), mask], dim=1)
        n = x.shape[1]
        if self.pos is not None:
            pos = self.pos[:n]
        else:
            pos = _cached(
                ("sinusoidal", n, self.dim, x.device, x.dtype),
                lambda: torch.tensor(sinusoidal_table(n, self.dim), device=x.device),
            )
        return self.dropout(x + pos), mask


class MLP(_Module):
    """Dense(D -> mlp_dim), GELU (tanh approximation, as jax.nn.gelu), dropout, Dense."""

    def __init__(self, *, dim, mlp_dim, dropout):
        super().__init__()
        self.fc1 = nn.Linear(dim, mlp_dim)
        self.fc2 = nn.Linear(mlp_dim, dim)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x):
        return self.fc2(self.dropout(F.gelu(self.fc1(x), approximate="tanh")))


class Block(_Module):
    """Pre-LayerNorm: x + drop(attn(LN x)), then x + drop(mlp(LN x)) unless a GAU."""

    def __init__(
        self,
        *,
        attention,
        options,
        dim,
        qkv_dim,
        num_heads,
        mlp_dim,
        max_len,
        dropout,
        attention_dropout,
    ):
        super().__init__()
        self.attention_norm = layer_norm(dim)
        try:
            self.attention = TWIN_ATTENTION[attention](
                dim=dim,
                num_heads=num_heads,
                max_len=max_len,
                qkv_dim=qkv_dim,
                dropout_rate=attention_dropout,
                **options,
            )
        except TypeError as err:
            raise SetupError(f"twin {attention}: options {options} not mirrored: {err}") from err
        self.attention_dropout = nn.Dropout(dropout)
        self.has_mlp = not self.attention.replaces_mlp
        if self.has_mlp:
            self.mlp_norm = layer_norm(dim)
            self.mlp = MLP(dim=dim, mlp_dim=mlp_dim, dropout=dropout)
            self.mlp_dropout = nn.Dropout(dropout)

    def forward(self, x, mask):
        x = x + self.attention_dropout(self.attention(self.attention_norm(x), mask))
        if self.has_mlp:
            x = x + self.mlp_dropout(self.mlp(self.mlp_norm(x)))
        return x


class Encoder(_Module):
    """Embedder, blocks (per the harness's layer schedule), final LayerNorm."""

    def __init__(
        self,
        *,
        vocab_size,
        max_len,
        num_layers,
        dim,
        qkv_dim,
        num_heads,
        mlp_dim,
        dropout,
        attention_dropout,
        positions,
        cls_token,
        schedule,
        options,
        remat,
    ):
        super().__init__()
        self.remat = remat
        self.embedder = Embedder(
            vocab_size=vocab_size,
            dim=dim,
            max_len=max_len,
            positions=positions,
            cls_token=cls_token,
            dropout=dropout,
        )
        self.blocks = nn.ModuleList(
            Block(
                attention=name,
                options=options[name],
                dim=dim,
                qkv_dim=dim if qkv_dim is None else qkv_dim,
                num_heads=num_heads,
                mlp_dim=mlp_dim,
                max_len=max_len + int(cls_token),
                dropout=dropout,
                attention_dropout=attention_dropout,
            )
            for name in schedule
        )
        self.final_norm = layer_norm(dim)

    def forward(self, tokens, lengths):
        mask = torch.arange(tokens.shape[1], device=tokens.device)[None, :] < lengths[:, None]
        x, mask = self.embedder(tokens, mask)
        for block in self.blocks:
            if self.remat and self.training:
                x = torch.utils.checkpoint.checkpoint(block, x, mask, use_reentrant=False)
            else:
                x = block(x, mask)
        return self.final_norm(x), mask


def pool(h, mask, pooling: str):
    if pooling == "cls":
        return h[:, 0]
    if pooling == "mean":
        m = mask[..., None]
        return (h * m).sum(1) / m.sum(1).clamp(min=1)
    count = mask.sum(1)  # "last": the last real position
    last = h[torch.arange(h.shape[0], device=h.device), (count - 1).clamp(min=0)]
    return torch.where((count > 0)[:, None], last, torch.zeros_like(last))


class Classifier(_Module):
    """tokens [B, L], lengths [B] -> logits [B, C]: pool, Dense(mlp_dim), ReLU, Dense(C)."""

    def __init__(self, *, num_classes, pooling, **encoder):
        super().__init__()
        self.pooling = pooling
        self.encoder = Encoder(cls_token=pooling == "cls", **encoder)
        self.hidden = nn.Linear(encoder["dim"], encoder["mlp_dim"])
        self.logits = nn.Linear(encoder["mlp_dim"], num_classes)

    def forward(self, tokens, lengths):
        u = pool(*self.encoder(tokens, lengths), self.pooling)
        return self.logits(F.relu(self.hidden(u)))


class DualClassifier(_Module):
    """Retrieval: shared encoder, [u, v, u*v, u-v] -> Dense ReLU Dense ReLU Dense."""

    def __init__(self, *, num_classes, pooling, **encoder):
        super().__init__()
        self.pooling = pooling
        self.encoder = Encoder(cls_token=pooling == "cls", **encoder)
        dim, mlp_dim = encoder["dim"], encoder["mlp_dim"]
        self.hidden1 = nn.Linear(4 * dim, mlp_dim)
        self.hidden2 = nn.Linear(mlp_dim, mlp_dim // 2)
        self.logits = nn.Linear(mlp_dim // 2, num_classes)

    def forward(self, tokens1, lengths1, tokens2, lengths2):
        u = pool(*self.encoder(tokens1, lengths1), self.pooling)
        v = pool(*self.encoder(tokens2, lengths2), self.pooling)
        z = F.relu(self.hidden1(torch.cat([u, v, u * v, u - v], dim=-1)))
        return self.logits(F.relu(self.hidden2(z)))


# --------------------------------------------------------------------------------------------
# Config -> harness model and twin; weight export.
# --------------------------------------------------------------------------------------------


def compose_config(model, length, batch_size, overrides=(), attention_dropout=None):
    """configs/bench.yaml with ``model=<model>``, the overrides, then ``task.max_length``,
    ``batch_size`` and ``task.arch.attention_dropout`` (each left as configured if None)."""
    from hydra.errors import HydraException

    from lra.config import schema
    from lra.config.compose import compose_config as compose

    for text in overrides:
        key = text.split("=", 1)[0].lstrip("+~")
        if key in ("model", "models", "rounds", "task.max_length", "batch_size", "lengths"):
            raise SetupError(
                f"override {text!r}: set this with --models, --rounds, --lengths or "
                "--batch-size instead"
            )
    extra = [] if length is None else [f"task.max_length={int(length)}"]
    extra += [] if batch_size is None else [f"batch_size={int(batch_size)}"]
    if attention_dropout is not None:
        extra.append(f"task.arch.attention_dropout={float(attention_dropout)}")
    try:
        cfg = compose("bench", [f"model={model}", *overrides, *extra])
    except HydraException as err:
        raise SetupError(f"model={model}: {' '.join(str(err).split())}") from err
    try:
        schema.validate(cfg, "bench")
    except Exception as err:
        raise SetupError(f"model={model}: {err}") from err
    return cfg


def twin_kwargs(cfg) -> dict:
    """The twin's constructor arguments: the harness's ``model_kwargs`` with the layer
    schedule resolved; a setting the twin cannot mirror is a SetupError."""
    from lra.models.encoder import resolve_options, resolve_schedule

    from lra.train.steps import model_kwargs

    if cfg.trainer.precision != "fp32":
        raise SetupError(
            f"model={cfg.model.name}: the PyTorch twin runs in float32 only; "
            f"got trainer.precision={cfg.trainer.precision}"
        )
    if int(cfg.trainer.get("grad_accum", 1)) != 1:
        raise SetupError(f"model={cfg.model.name}: the twin has no gradient accumulation")
    kwargs = model_kwargs(cfg)
    schedule = resolve_schedule(kwargs.pop("attention"), int(kwargs["num_layers"]))
    missing = sorted(set(schedule) - set(TWIN_ATTENTION))
    if missing:
        raise SetupError(
            f"model={cfg.model.name} uses {missing}, which the PyTorch twin does not implement "
            f"(it has: {', '.join(TWIN_ATTENTION)})"
        )
    kwargs["options"] = resolve_options(kwargs.pop("attention_options"), schedule)
    kwargs["schedule"] = schedule
    return kwargs


def harness_weights(model) -> dict[tuple, np.ndarray]:
    """Every variable of the harness model (params and state such as Performer's features)."""
    from flax import nnx

    return {
        tuple(path): np.asarray(var.get_value())
        for path, var in nnx.to_flat_state(nnx.state(model))
    }


def _rename(module) -> dict:
    """Harness leaf name -> (twin attribute, transpose?) for one twin module."""
    if isinstance(module, nn.Linear):  # flax kernel [in, out]; torch weight [out, in]
        return {"kernel": ("weight", True), "bias": ("bias", False)}
    if isinstance(module, nn.LayerNorm):
        return {"scale": ("weight", False), "bias": ("bias", False)}
    return getattr(module, "HARNESS_NAMES", {})


def load_harness_weights(twin, weights: dict[tuple, np.ndarray]) -> None:
    """Copy harness weights into the twin; any weight without a place is a SetupError."""
    targets = dict(twin.state_dict(keep_vars=True))
    placed = set()
    for path, value in weights.items():
        shown = "/".join(map(str, path))
        owner = ".".join(map(str, path[:-1]))
        try:
            module = twin.get_submodule(owner)
        except AttributeError as err:
            raise SetupError(f"harness weight {shown}: the twin has no module {owner!r}") from err
        name, transpose = _rename(module).get(path[-1], (str(path[-1]), False))
        full = f"{owner}.{name}" if owner else name
        if full not in targets:
            raise SetupError(f"harness weight {shown}: the twin has no weight {full!r}")
        if transpose:
            value = value.T
        if tuple(targets[full].shape) != value.shape:
            raise SetupError(
                f"harness weight {shown} {value.shape} does not fit twin {full} "
                f"{tuple(targets[full].shape)}"
            )
        with torch.no_grad():
            targets[full].copy_(torch.from_numpy(np.array(value, copy=True)))
        placed.add(full)
    left = sorted(set(targets) - placed)
    if left:
        raise SetupError(f"twin weights with no harness value: {', '.join(left)}")


def build_harness(cfg):
    """The harness classifier as lra.train.steps.compile_steps initialises it (seed cfg.seed)."""
    import jax
    from flax import nnx

    from lra.train.steps import build_model

    return build_model(cfg, nnx.Rngs(params=jax.random.key(int(cfg.seed))))


def build_twin(cfg, harness_model):
    """The twin of ``cfg``'s classifier with ``harness_model``'s weights (on the CPU)."""
    kwargs = twin_kwargs(cfg)
    twin = (DualClassifier if kwargs.pop("dual") else Classifier)(**kwargs)
    load_harness_weights(twin, harness_weights(harness_model))
    return twin


def harness_logits(model, batch) -> np.ndarray:
    """Eval-mode logits of the harness model, jitted, at full float32 matmul precision."""
    import jax
    from flax import nnx

    graphdef, state = nnx.split(model)

    def forward(state, tokens, lengths):
        args = [a for pair in zip(tokens, lengths, strict=True) for a in pair]
        return nnx.merge(graphdef, state)(*args, deterministic=True)

    with jax.default_matmul_precision("float32"):
        return np.asarray(jax.jit(forward)(state, batch["tokens"], batch["lengths"]))


def torch_inputs(batch, device) -> list:
    args = []
    for tokens, lengths in zip(batch["tokens"], batch["lengths"], strict=True):
        args.append(torch.as_tensor(np.asarray(tokens), dtype=torch.long, device=device))
        args.append(torch.as_tensor(np.asarray(lengths), dtype=torch.long, device=device))
    return args


def twin_logits(twin, batch, device) -> np.ndarray:
    twin.eval()
    tf32 = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    try:
        with torch.no_grad():
            return twin(*torch_inputs(batch, device)).float().cpu().numpy()
    finally:
        torch.backends.cuda.matmul.allow_tf32 = tf32


def check_model(model, length, batch_size, overrides, tolerance, device) -> dict:
    """Twin logits against harness logits on one synthetic batch, eval mode."""
    from lra.measure.bench import synthetic_batch

    cfg = compose_config(model, length, batch_size, overrides)
    harness = build_harness(cfg)
    twin = build_twin(cfg, harness).to(device)
    batch = synthetic_batch(cfg.task, batch_size, length)
    expected = harness_logits(harness, batch)
    got = twin_logits(twin, batch, device)
    diff = float(np.max(np.abs(got - expected)))
    scale = float(np.max(np.abs(expected)))
    limit = tolerance * max(1.0, scale)
    return {
        "model": model,
        "length": int(length),
        "batch_size": int(batch_size),
        "max_abs_diff": diff,
        "max_abs_logit": scale,
        "limit": limit,
        "ok": bool(np.isfinite(diff) and diff <= limit),
    }


# --------------------------------------------------------------------------------------------
# Timing.
# --------------------------------------------------------------------------------------------


class Cell:
    """One (model, length, attention dropout): the compiled harness step and its state, and
    the twin with its optimizer, both on the same synthetic batch."""

    def __init__(self, model, length, batch_size, dropout, overrides, device):
        import jax

        from lra.measure.bench import synthetic_batch
        from lra.train.optim import make_schedule
        from lra.train.steps import abstract_batch, compile_steps

        self.model, self.length, self.attention_dropout = model, int(length), float(dropout)
        self.device = device
        cfg = compose_config(model, length, batch_size, overrides, attention_dropout=dropout)
        twin_kwargs(cfg)  # refuse what the twin cannot mirror before compiling
        batch = synthetic_batch(cfg.task, batch_size, length)
        self.compiled = compile_steps(cfg, abstract_batch(cfg.task, batch_size), evaluate=False)
        self.flops_per_step = self.compiled.flops_per_step
        self.state = self.compiled.state
        self.batch = jax.device_put(batch)
        self.twin = build_twin(cfg, build_harness(cfg)).to(device).train()
        t = cfg.trainer
        peak = make_schedule(
            t.schedule, t.learning_rate, t.warmup_steps, t.num_steps, t.get("decay_steps")
        )(max(int(t.warmup_steps), 1))
        self.learning_rate = float(peak)
        self.grad_clip = float(t.grad_clip or 0.0)
        self.optimizer = torch.optim.AdamW(
            self.twin.parameters(),
            lr=self.learning_rate,
            betas=(float(t.b1), float(t.b2)),
            eps=float(t.eps),
            weight_decay=float(t.weight_decay),
        )
        self.inputs = torch_inputs(batch, device)
        self.labels = torch.as_tensor(batch["labels"], dtype=torch.long, device=device)
        self.weights = torch.as_tensor(batch["weights"], device=device)

    def harness_steps(self, n: int):
        metrics = None
        for _ in range(n):
            self.state, metrics = self.compiled.train_step(
                self.state, self.batch, self.compiled.dropout_key
            )
        return self.state, metrics

    def twin_step(self):
        self.optimizer.zero_grad(set_to_none=True)
        logits = self.twin(*self.inputs)
        losses = F.cross_entropy(logits, self.labels, reduction="none")
        loss = (losses * self.weights).sum() / self.weights.sum()
        loss.backward()
        if self.grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(self.twin.parameters(), self.grad_clip)
        self.optimizer.step()
        return loss

    def _sync(self):
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def time_harness(self, warmup: int, steps: int) -> tuple[float, float | None]:
        """(steps/sec, cores other processes kept busy meanwhile)."""
        import jax

        from lra.device.machine_load import LoadProbe

        jax.block_until_ready(self.harness_steps(warmup))
        probe = LoadProbe()
        probe.start()
        start = time.perf_counter()
        jax.block_until_ready(self.harness_steps(steps))
        rate = steps / (time.perf_counter() - start)
        return rate, probe.stop()["other_cores"]

    def time_twin(self, warmup: int, steps: int) -> tuple[float, float | None]:
        from lra.device.machine_load import LoadProbe

        for _ in range(warmup):
            self.twin_step()
        self._sync()
        probe = LoadProbe()
        probe.start()
        start = time.perf_counter()
        for _ in range(steps):
            self.twin_step()
        self._sync()
        rate = steps / (time.perf_counter() - start)
        return rate, probe.stop()["other_cores"]


def time_cells(models, lengths, dropouts, args, device) -> list[dict]:
    """Round-robin timing; returns one raw row per cell with per-round rates."""
    cells: dict[tuple, Cell] = {}
    rows: dict[tuple, dict] = {}
    for round_index in range(args.rounds):
        for length in lengths:
            for model in models:
                for dropout in dropouts:
                    key = (model, length, dropout)
                    if key not in cells:
                        cells[key] = Cell(
                            model, length, args.batch_size, dropout, args.overrides, device
                        )
                        rows[key] = {
                            "model": model,
                            "length": length,
                            "attention_dropout": dropout,
                            "batch_size": args.batch_size,
                            "flops_per_step": cells[key].flops_per_step,
                            "torch_learning_rate": cells[key].learning_rate,
                            "harness_steps_per_sec": [],
                            "torch_steps_per_sec": [],
                            "harness_other_cores": [],
                            "torch_other_cores": [],
                        }
                    cell, row = cells[key], rows[key]
                    harness, harness_load = cell.time_harness(args.warmup, args.steps)
                    twin, twin_load = cell.time_twin(args.warmup, args.steps)
                    row["harness_steps_per_sec"].append(harness)
                    row["torch_steps_per_sec"].append(twin)
                    row["harness_other_cores"].append(harness_load)
                    row["torch_other_cores"].append(twin_load)
                    print(
                        f"round {round_index + 1}/{args.rounds} {model} L={length} "
                        f"attention_dropout={dropout}: harness {harness:.3g} steps/s, "
                        f"PyTorch {twin:.3g} steps/s (other processes: "
                        f"{_cores(harness_load)} / {_cores(twin_load)} cores busy)",
                        flush=True,
                    )
    out = []
    for row in rows.values():
        row["ratio"] = [
            h / t
            for h, t in zip(row["harness_steps_per_sec"], row["torch_steps_per_sec"], strict=True)
        ]
        flops = row["flops_per_step"]
        row["harness_flops_per_sec"] = (
            None if flops is None else [flops * h for h in row["harness_steps_per_sec"]]
        )
        out.append(row)
    return out


def _cores(value) -> str:
    return "?" if value is None else f"{value:.2f}"


def _span(values, scale=1.0) -> str:
    if not values:
        return "n/a"
    lo, hi = min(values) / scale, max(values) / scale
    return f"{lo:.3g}" if f"{lo:.3g}" == f"{hi:.3g}" else f"{lo:.3g}-{hi:.3g}"


def markdown_table(rows) -> str:
    lines = [
        "| model | length | attention dropout | harness steps/s | PyTorch steps/s "
        "| ratio harness/PyTorch | harness GFLOP/s | other cores busy (max) |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for row in rows:
        flops = row["harness_flops_per_sec"]
        loads = [c for c in row["harness_other_cores"] + row["torch_other_cores"] if c is not None]
        lines.append(
            f"| {row['model']} | {row['length']} | {row['attention_dropout']:g} "
            f"| {_span(row['harness_steps_per_sec'])} | {_span(row['torch_steps_per_sec'])} "
            f"| {_span(row['ratio'])} | {'n/a' if flops is None else _span(flops, 1e9)} "
            f"| {_cores(max(loads) if loads else None)} |"
        )
    return "\n".join(lines) + "\n"


# --------------------------------------------------------------------------------------------
# Command line.
# --------------------------------------------------------------------------------------------


def _ints(text: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        values = []
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"expected comma-separated positive ints, got {text!r}")
    return values


def _rates(text: str) -> list[float]:
    try:
        values = [float(v) for v in text.split(",") if v.strip()]
    except ValueError:
        values = []
    if not values or any(not 0.0 <= v < 1.0 for v in values):
        raise argparse.ArgumentTypeError(f"expected comma-separated rates in [0, 1), got {text!r}")
    return values


def parse_args(argv=None):
    parser = argparse.ArgumentParser(
        prog="compare_pytorch.py",
        description="Check a PyTorch twin of the harness's classifier against it, then time "
        "both train steps side by side.",
        epilog=f"needs PyTorch: {INSTALL_HINT}",
    )
    parser.add_argument(
        "--models",
        default=",".join(DEFAULT_MODELS),
        help="comma-separated configs/model names (default: %(default)s)",
    )
    parser.add_argument(
        "--lengths",
        type=_ints,
        default=None,
        help="comma-separated lengths (default: bench.yaml's lengths)",
    )
    parser.add_argument(
        "--batch-size",
        type=int,
        default=None,
        help="timing batch size (default: bench.yaml's batch_size)",
    )
    parser.add_argument(
        "--check-batch-size",
        type=int,
        default=2,
        help="batch size of the equality check (default: %(default)s)",
    )
    parser.add_argument(
        "--check-lengths",
        type=_ints,
        default=None,
        help="lengths of the equality check (default: --lengths)",
    )
    parser.add_argument(
        "--tolerance",
        type=float,
        default=1e-4,
        help="max |diff| allowed per unit of max(1, max |logit|)",
    )
    parser.add_argument("--check-only", action="store_true", help="stop after the check")
    parser.add_argument(
        "--attention-dropout",
        type=_rates,
        default=[0.1, 0.0],
        help="comma-separated task.arch.attention_dropout values timed",
    )
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=5, help="timed steps per round and side")
    parser.add_argument("--warmup", type=int, default=2, help="untimed steps before each timing")
    parser.add_argument(
        "--threads",
        type=int,
        default=None,
        help="PyTorch CPU threads (default: the cores JAX's CPU backend uses)",
    )
    parser.add_argument(
        "--torch-device",
        default="auto",
        choices=("auto", "cpu", "cuda"),
        help="auto: cuda when JAX runs on a GPU, else cpu",
    )
    parser.add_argument(
        "--torch-tf32",
        default="auto",
        choices=("auto", "on", "off"),
        help="TF32 matmuls in PyTorch on CUDA while timing (auto: on, like "
        "JAX's default float32 matmul precision on GPUs); the check uses full "
        "float32 on both sides",
    )
    parser.add_argument(
        "--xla-flags",
        default="lra-bench",
        choices=("lra-bench", "default"),
        help="lra-bench: the CPU XLA flag lra-bench sets (measure."
        "configure_cpu_memory_analysis), so the harness runs as lra-bench "
        "times it; default: XLA's own defaults",
    )
    parser.add_argument(
        "--out", type=Path, default=None, help="write the table, check and raw numbers here as JSON"
    )
    parser.add_argument(
        "overrides",
        nargs="*",
        metavar="KEY=VALUE",
        help="lra-bench config overrides, e.g. protocol=transnormer task.arch.num_layers=2",
    )
    args = parser.parse_args(argv)
    for name in ("rounds", "steps", "check_batch_size"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1")
    if args.warmup < 0:
        parser.error("--warmup must be at least 0")
    if args.batch_size is not None and args.batch_size < 1:
        parser.error("--batch-size must be at least 1")
    args.models = [m.strip() for m in args.models.split(",") if m.strip()]
    return args


def _write_json(path: Path, payload: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(payload, f, indent=2)
            f.write("\n")
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _torch_device(choice: str):
    import jax

    on_gpu = jax.default_backend() == "gpu"
    if choice == "auto":
        choice = "cuda" if on_gpu else "cpu"
    if choice == "cuda" and not torch.cuda.is_available():
        raise SetupError(
            "PyTorch cannot see a CUDA device (a CPU-only build?); use --torch-device cpu"
        )
    return torch.device(choice)


def main(argv=None) -> int:
    args = parse_args(argv)
    if TORCH_IMPORT_ERROR is not None:
        print(
            f"error: compare_pytorch.py needs PyTorch, which the harness does not install; "
            f"run {INSTALL_HINT} ({TORCH_IMPORT_ERROR})",
            file=sys.stderr,
        )
        return 2
    if args.xla_flags == "lra-bench":
        from lra.device import measure

        measure.configure_cpu_memory_analysis()  # before JAX starts a backend
    try:
        return _run(args)
    except SetupError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2


def _run(args) -> int:
    import jax

    from lra.config.compose import CONFIG_DIR
    from lra.device.compile_cache import configure_compile_cache

    known = sorted(p.stem for p in (Path(CONFIG_DIR) / "model").glob("*.yaml"))
    unknown = [m for m in args.models if m not in known]
    if unknown or not args.models:
        raise SetupError(f"unknown --models {unknown}; choose from {', '.join(known)}")
    defaults = compose_config(args.models[0], None, None, args.overrides)
    configure_compile_cache(defaults.get("compile_cache"))  # as lra-bench, before compiling
    lengths = args.lengths or [int(n) for n in defaults.lengths]
    args.batch_size = args.batch_size or int(defaults.batch_size)
    check_lengths = args.check_lengths or lengths
    device = _torch_device(args.torch_device)
    threads = args.threads or len(os.sched_getaffinity(0))
    torch.set_num_threads(threads)
    environment = {
        "jax": jax.__version__,
        "jax_backend": jax.default_backend(),
        "jax_device": jax.devices()[0].device_kind,
        "torch": torch.__version__,
        "torch_device": str(device),
        "torch_threads": threads,
        "xla_flags": os.environ.get("XLA_FLAGS", ""),
        "overrides": list(args.overrides),
    }
    print("setting: " + ", ".join(f"{k}={v}" for k, v in environment.items()), flush=True)

    checks = []
    for model in args.models:
        for length in check_lengths:
            result = check_model(
                model, length, args.check_batch_size, args.overrides, args.tolerance, device
            )
            checks.append(result)
            print(
                f"check {model} L={length} B={args.check_batch_size}: max |diff| = "
                f"{result['max_abs_diff']:.3e} (max |logit| {result['max_abs_logit']:.3g}, "
                f"limit {result['limit']:.3e}) {'ok' if result['ok'] else 'DIFFERS'}",
                flush=True,
            )
    payload: dict[str, Any] = {"environment": environment, "check": checks}
    failed = sorted({f"{c['model']} (L={c['length']})" for c in checks if not c["ok"]})
    if failed:
        print(
            f"error: the PyTorch twin's logits differ from the harness's for {', '.join(failed)}; "
            "nothing timed",
            file=sys.stderr,
        )
        if args.out:
            _write_json(args.out, payload)
        return 1
    if args.check_only:
        if args.out:
            _write_json(args.out, payload)
        return 0

    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = args.torch_tf32 != "off"
    rows = time_cells(args.models, lengths, args.attention_dropout, args, device)
    table = markdown_table(rows)
    print()
    print(
        f"train steps/s, batch {args.batch_size}, min-max over {args.rounds} round(s) of "
        f"{args.steps} steps; ratio > 1: the harness is faster; other cores busy: CPU "
        "that other processes took while timing (lra.device.machine_load)"
    )
    print(table, end="")
    if args.out:
        payload.update(
            table=table,
            cells=rows,
            options={
                "rounds": args.rounds,
                "steps": args.steps,
                "warmup": args.warmup,
                "batch_size": args.batch_size,
                "lengths": lengths,
                "attention_dropout": args.attention_dropout,
                "models": args.models,
            },
        )
        _write_json(args.out, payload)
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
