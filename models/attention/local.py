"""Local attention: softmax attention restricted to a block or a sliding window.

Local attention is the simplest sparse baseline of Long-Range Arena (Tay et al., 2021, "Long
Range Arena: A Benchmark for Efficient Transformers"): ordinary scaled dot-product attention in
which query i only sees keys j in a neighbourhood N(i):

    out_i = sum_{j in N(i), mask_j} softmax_j(q_i . k_j / sqrt(d_h)) v_j,   then Dense E -> D

Modes (``window`` = w):

    "block"    N(i) = { j : floor(i / w) == floor(j / w) }   non-overlapping blocks of w tokens
               counted from position 0 (the last block may be shorter).
    "sliding"  N(i) = { j : |i - j| <= w // 2 }              a centred band of w // 2 keys on
               each side (w + 1 keys for even w, w for odd w), clipped at the sequence ends.

Shapes (B batch, L length, D model dim, H heads, E = qkv_dim, d_h = E / H, c chunk size):

    x:          float[B, L, D]
    mask:       bool[B, L]                 True = real token; padded KEYS are excluded
    Q, K, V:    float[B, L, H, d_h]        from Dense D -> E
    chunks:     float[B, L/c, c, H, d_h]   queries in chunks of c (L padded up to a multiple)
    keys seen:  block: the chunk itself (c = min(w, L)); sliding: the chunk and its two
                neighbours, 3c keys (c = min(w // 2, L), at least 1), cut to the exact band by a
                static [c, 3c] mask
    weights:    float[B, L/c, H, c, c or 3c]   softmax over keys, then dropout
    out:        float[B, L, D]

Memory and time are O(L * w), never O(L^2).

Defaults: ``mode="block"``, ``window=50``. The official LRA local attention
(google-research/long-range-arena, models/local) is block-local with ``block_size=50`` (the
encoder default; no LRA config overrides it), which produced the "Local Attention" column of
the LRA tables that TransNormer compares against. Deviation: the official code reshapes
[B, L] to [B, block_size, L / block_size] and attends along the block_size axis, so its
"blocks" are strided sets of tokens L / block_size apart rather than contiguous runs; this
module uses contiguous blocks, which is what the paper describes. "sliding" is the
Longformer-style band, for short-range layers in per-layer schedules (Rae and Razavi, 2020).

Causal mode (``causal=True``): the neighbourhood is cut to the keys j <= i, N_causal(i) =
{j in N(i) : j <= i}: block mode sees its own block up to itself, sliding mode the w // 2 keys
before it and itself. Same chunks, one more static mask; the parameters do not depend on it.

Padding: padded keys get the most negative finite logit of the compute dtype, so their weight
is exactly 0, and positions beyond L (chunk padding) are treated the same way. A real query
always sees itself, so its softmax is never empty; a fully padded row gives finite (uniform)
weights. Neighbourhoods are anchored at position 0 and defined by positions only, so appending
padding leaves the outputs at real positions unchanged.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from lra.models.attention.common import (
    MultiHeadAttention,
    band,
    check_int,
    from_blocks,
    mask_logits,
    to_blocks,
    with_neighbours,
)
from lra.models.registry import register

__all__ = ["LocalAttention"]

MODES = ("block", "sliding")


@register("local")
class LocalAttention(MultiHeadAttention):
    """Multi-head softmax attention inside blocks or a sliding band, O(L * window) memory."""

    kind = "local"
    memory_class = "linear"
    same_without_padding = True

    def __init__(
        self,
        *,
        dim: int,
        num_heads: int,
        max_len: int,
        rngs: nnx.Rngs,
        qkv_dim: int | None = None,
        dropout_rate: float = 0.0,
        window: int = 50,
        mode: str = "block",
        causal: bool = False,
    ):
        self._init_heads(dim, num_heads, max_len, qkv_dim, dropout_rate)
        self.causal = bool(causal)
        if mode not in MODES:
            raise ValueError(f"local attention: mode must be one of {MODES}, got {mode!r}")
        check_int(self.label, "window", window)
        self.window = window
        self.mode = mode
        self._init_projections(rngs)

    def _chunk_size(self, n: int) -> int:
        """Query chunk length c: the block itself, or the band radius (>= 1) for sliding."""
        if self.mode == "block":
            return max(1, min(self.window, n))
        return max(1, min(self.window // 2, n))

    def _band(self, c: int) -> np.ndarray:
        """bool[c, keys per chunk]: which gathered keys lie in each query's neighbourhood."""
        if self.mode == "block":
            keep = np.ones((c, c), bool)
            return np.tril(keep) if self.causal else keep
        keep = band(c, self.window // 2)
        if self.causal:  # gathered key s sits at offset s - c - p from query p
            keep &= (np.arange(3 * c)[None, :] - c) <= np.arange(c)[:, None]
        return keep

    def __call__(
        self,
        x: jax.Array,
        *,
        mask: jax.Array,
        deterministic: bool = True,
        rngs: nnx.Rngs | None = None,
    ) -> jax.Array:
        _, n = self._check_call(x, mask, deterministic, rngs)
        q, k, v = self._qkv(x)
        q = q * jnp.asarray(self.head_dim**-0.5, q.dtype)

        c = self._chunk_size(n)
        q, k, v = (to_blocks(t, c) for t in (q, k, v))
        key_mask = to_blocks(mask.astype(bool), c)
        if self.mode == "sliding":
            k, v, key_mask = (with_neighbours(t) for t in (k, v, key_mask))

        logits = jnp.einsum("btqhd,btkhd->bthqk", q, k)
        logits = mask_logits(logits, key_mask[:, :, None, None, :] & jnp.asarray(self._band(c)))
        weights = jax.nn.softmax(logits, axis=-1)
        weights = self.dropout(weights, deterministic=deterministic, rngs=rngs)
        y = jnp.einsum("bthqk,btkhd->btqhd", weights, v)
        return self.out(self._merge(from_blocks(y, n)))
