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

from models.registry import register

__all__ = ["LocalAttention"]

MODES = ("block", "sliding")


@register("local")
class LocalAttention(nnx.Module):
    """Multi-head softmax attention inside blocks or a sliding band, O(L * window) memory."""

    replaces_mlp = False

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
    ):
        qkv_dim = dim if qkv_dim is None else qkv_dim
        if num_heads < 1 or qkv_dim % num_heads:
            raise ValueError(
                f"local attention: qkv_dim={qkv_dim} must be divisible by "
                f"num_heads={num_heads}; change one of them"
            )
        if not 0.0 <= dropout_rate < 1.0:
            raise ValueError(f"local attention: dropout_rate must be in [0, 1), got {dropout_rate}")
        if mode not in MODES:
            raise ValueError(f"local attention: mode must be one of {MODES}, got {mode!r}")
        if isinstance(window, bool) or not isinstance(window, int) or window < 1:
            raise ValueError(f"local attention: window must be an integer >= 1, got {window!r}")
        self.dim = dim
        self.num_heads = num_heads
        self.head_dim = qkv_dim // num_heads
        self.max_len = max_len
        self.window = window
        self.mode = mode
        self.query = nnx.Linear(dim, qkv_dim, rngs=rngs)
        self.key = nnx.Linear(dim, qkv_dim, rngs=rngs)
        self.value = nnx.Linear(dim, qkv_dim, rngs=rngs)
        self.out = nnx.Linear(qkv_dim, dim, rngs=rngs)
        self.dropout = nnx.Dropout(dropout_rate)

    def _heads(self, y: jax.Array) -> jax.Array:
        b, n, _ = y.shape
        return y.reshape(b, n, self.num_heads, self.head_dim)

    def _chunk_size(self, n: int) -> int:
        """Query chunk length c: the block itself, or the band radius (>= 1) for sliding."""
        if self.mode == "block":
            return max(1, min(self.window, n))
        return max(1, min(self.window // 2, n))

    def _band(self, c: int) -> np.ndarray:
        """bool[c, keys per chunk]: which gathered keys lie in each query's neighbourhood."""
        if self.mode == "block":
            return np.ones((c, c), bool)
        # Query p of chunk t sits at t*c + p; gathered key s at (t-1)*c + s.
        offset = np.arange(c)[:, None] + c - np.arange(3 * c)[None, :]
        return np.abs(offset) <= self.window // 2

    @staticmethod
    def _with_neighbours(t: jax.Array) -> jax.Array:
        """[B, T, c, ...] -> [B, T, 3c, ...]: each chunk preceded and followed by its neighbours
        (zeros / False beyond the ends)."""
        pad = [(0, 0), (1, 1)] + [(0, 0)] * (t.ndim - 2)
        padded = jnp.pad(t, pad)
        return jnp.concatenate([padded[:, :-2], padded[:, 1:-1], padded[:, 2:]], axis=2)

    def __call__(
        self,
        x: jax.Array,
        *,
        mask: jax.Array,
        deterministic: bool = True,
        rngs: nnx.Rngs | None = None,
    ) -> jax.Array:
        if not deterministic and rngs is None:
            raise ValueError(
                "local attention: deterministic=False needs rngs (an nnx.Rngs with a "
                "'dropout' stream) for attention dropout"
            )
        b, n, _ = x.shape
        if mask.shape != (b, n):
            raise ValueError(f"local attention: mask shape {mask.shape} != (B, L) = {(b, n)}")
        q = self._heads(self.query(x))
        k = self._heads(self.key(x))
        v = self._heads(self.value(x))
        dtype = q.dtype
        q = q * jnp.asarray(self.head_dim**-0.5, dtype)

        c = self._chunk_size(n)
        num_chunks = -(-n // c)
        extra = num_chunks * c - n
        seq_pad = [(0, 0), (0, extra), (0, 0), (0, 0)]
        q, k, v = (jnp.pad(t, seq_pad).reshape(b, num_chunks, c, *t.shape[2:]) for t in (q, k, v))
        key_mask = jnp.pad(mask.astype(bool), [(0, 0), (0, extra)]).reshape(b, num_chunks, c)
        if self.mode == "sliding":
            k, v, key_mask = (self._with_neighbours(t) for t in (k, v, key_mask))

        logits = jnp.einsum("btqhd,btkhd->bthqk", q, k)
        keep = key_mask[:, :, None, None, :] & jnp.asarray(self._band(c))
        logits = jnp.where(keep, logits, jnp.asarray(jnp.finfo(dtype).min, dtype))
        weights = jax.nn.softmax(logits, axis=-1)
        weights = self.dropout(weights, deterministic=deterministic, rngs=rngs)
        y = jnp.einsum("bthqk,btkhd->btqhd", weights, v)
        y = y.reshape(b, num_chunks * c, self.num_heads * self.head_dim)[:, :n]
        return self.out(y)
