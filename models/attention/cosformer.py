"""cosFormer attention: Qin, Sun, Deng, Li, Wei, Lv, Yan, Kong and Zhong, 2022, "cosFormer:
Rethinking Softmax in Attention" (ICLR 2022).

Per head, with ReLU feature maps and a cos re-weighting that favours nearby tokens:

    w_ij  = relu(q_i)^T relu(k_j) * cos(pi/2 * (i - j) / M)
    out_i = sum_j w_ij v_j / max(sum_j w_ij, eps)

Since cos(a - b) = cos a cos b + sin a sin b with a = pi/2 * i / M, b = pi/2 * j / M, the
weights split into a cos half and a sin half, each a plain linear attention:

    q_i' = [relu(q_i) cos a_i, relu(q_i) sin a_i]        (feature dim 2d)
    k_j' = [relu(k_j) cos b_j, relu(k_j) sin b_j]
    out_i = q_i'^T (sum_j k_j' v_j^T) / max(q_i'^T sum_j k_j', eps)

computed in O(L d^2). No 1/sqrt(d) scaling (as in the paper and the authors' code).
eps = 1e-6 as in the authors' cosformer.py (a clamp of the denominator, as there).

Shapes (B batch, L length, D model dim, H heads, E = qkv_dim, d = E / H):

    x:         float[B, L, D]
    mask:      bool[B, L]             True = real token
    Q, K, V:   float[B, L, H, d]      from Dense D -> E (as in softmax.py)
    M:         float[B]               per row, see below
    Q', K':    float[B, L, H, 2d]
    K'^T V:    float[B, H, 2d, d]
    out:       float[B, L, D]         heads concatenated, dropout, Dense E -> D

M (the re-weighting horizon). The paper sets M to the sequence length; the authors' code
(OpenNLPLab/cosFormer and their LRA fork) uses the length of the padded tensor, so appending
padding there shrinks every angle and changes every output. Here M is per row: one plus the
index of the row's last real token (the row's length for the encoder's prefix masks), at least
1. Then |i - j| < M for any two real tokens, so every real weight keeps cos > 0 as the paper
requires, and appending padding (or changing padded values) leaves outputs at real positions
unchanged. Only differences of positions enter, so counting from 0 (here) or 1 (the authors'
code) gives the same weights.

Causal mode (``causal=True``; the paper's causal (autoregressive) form: the sums over j
become prefix sums over j <= i, computed chunk by chunk by
:func:`lra.models.attention.common.causal_linear_context`). M is then the layer's
``max_len`` (the longest sequence it is built for, as the authors' code takes the tensor
length) rather than the row's length: the row's length would tell position i how many
tokens follow it. |i - j| < max_len keeps every cos > 0, and M does not depend on padding.
The parameters do not depend on ``causal``.

Options: ``causal``, and none besides the common ``qkv_dim`` and ``dropout_rate``. There is no
L x L weight matrix to drop, so ``dropout_rate`` is applied to the per-head outputs (the
concatenated context vectors) before the output projection; the authors' code has no attention
dropout.

Padding: k_j' is multiplied by the mask after the feature map and re-weighting and before
both K'^T V and the normaliser sum, so padded keys contribute nothing. A query whose weights
are all zero (relu features all zero, or no real key) gets a zero context (0 / eps), not NaN.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from flax import nnx

from lra.models.attention.common import (
    MultiHeadAttention,
    causal_linear_context,
    linear_context,
    linear_normaliser,
    zero_padded,
)
from lra.models.registry import register

__all__ = ["CosformerAttention", "reweighting_horizon"]

EPS = 1e-6


def reweighting_horizon(mask: jax.Array) -> jax.Array:
    """M per row: float32[B], 1 + the index of the last real token, at least 1."""
    positions = jnp.arange(1, mask.shape[1] + 1, dtype=jnp.int32)
    extent = jnp.max(jnp.where(mask.astype(bool), positions[None, :], 0), axis=1)
    return jnp.maximum(extent, 1).astype(jnp.float32)


@register("cosformer")
class CosformerAttention(MultiHeadAttention):
    """Multi-head cosFormer attention (ReLU features, cos re-weighting) with a key padding mask."""

    kind = "cosformer"
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
        causal: bool = False,
    ):
        self._init_heads(dim, num_heads, max_len, qkv_dim, dropout_rate)
        self.causal = bool(causal)
        self._init_projections(rngs)

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
        q, k = jax.nn.relu(q), jax.nn.relu(k)
        dtype = q.dtype

        # Angles in float32 (positions up to L), then cast: float[B, L, 1, 1].
        angle = (math.pi / 2) * jnp.arange(n, dtype=jnp.float32)[None, :]
        if self.causal:
            horizon = jnp.full((x.shape[0],), max(self.max_len, n), jnp.float32)
        else:
            horizon = reweighting_horizon(mask)
        angle = (angle / horizon[:, None])[:, :, None, None]
        cos, sin = jnp.cos(angle).astype(dtype), jnp.sin(angle).astype(dtype)
        q = jnp.concatenate([q * cos, q * sin], axis=-1)
        k = zero_padded(jnp.concatenate([k * cos, k * sin], axis=-1), mask)

        eps = jnp.asarray(EPS, dtype)
        if self.causal:
            num, den = causal_linear_context(q, k, v)
        else:
            num, den = linear_context(q, k, v), linear_normaliser(q, k)
        y = num / jnp.maximum(den, eps)[..., None]
        y = self.dropout(self._merge(y), deterministic=deterministic, rngs=rngs)
        return self.out(y)
