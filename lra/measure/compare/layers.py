"""Building blocks of the PyTorch twin: norms, position tables and rotations, linear attention's
context and normaliser, blocking a sequence into chunks.

Names and shapes follow the harness (``models/encoder.py``, ``models/attention/``): B batch,
L length, D dim, H heads, d head dim, E = qkv_dim.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch import nn

from lra.measure.bench_config import SetupError

_TABLES: dict[tuple, Any] = {}


def cached(key: tuple, build):
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


class RMSNorm(nn.Module):
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

    cos, sin = cached(("lrpe", m, e, y.device, y.dtype), build)
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

    cos, sin = cached(("rope", n, half, y.device, y.dtype), build)
    first, second = y[..., :half], y[..., half:]
    return torch.cat([first * cos - second * sin, second * cos + first * sin], dim=-1)
