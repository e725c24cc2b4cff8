"""Linear Transformer attention: Katharopoulos, Vyas, Pappas and Fleuret, 2020, "Transformers
are RNNs: Fast Autoregressive Transformers with Linear Attention" (ICML 2020).

Per head, with the feature map phi(x) = elu(x) + 1 (positive, so the weights are too):

    out_i = phi(q_i)^T (sum_j phi(k_j) v_j^T) / (phi(q_i)^T sum_j phi(k_j) + eps)

which is the row-normalised kernel attention sum_j w_ij v_j / sum_j w_ij with
w_ij = phi(q_i)^T phi(k_j), computed in O(L d^2) instead of O(L^2 d). There is no 1/sqrt(d)
scaling (the paper applies phi to Q and K directly). eps = 1e-6 as in the authors' library
(fast-transformers, ``LinearAttention(eps=1e-6)``).

Shapes (B batch, L length, D model dim, H heads, E = qkv_dim, d = E / H):

    x:              float[B, L, D]
    mask:           bool[B, L]          True = real token
    Q, K, V:        float[B, L, H, d]   from Dense D -> E (as in softmax.py)
    phi(K)^T V:     float[B, H, d, d]
    sum_j phi(k_j): float[B, H, d]
    out:            float[B, L, D]      heads concatenated, dropout, Dense E -> D

Options: none besides the common ``qkv_dim`` and ``dropout_rate``. There is no L x L weight
matrix to drop, so ``dropout_rate`` is applied to the per-head outputs (the concatenated
context vectors) before the output projection; the authors' code has no attention dropout.

Causal mode (``causal=True``; the paper's autoregressive form, eq. 8-9): the sums run over
j <= i only, S_i = sum_{j<=i} phi(k_j) v_j^T and z_i = sum_{j<=i} phi(k_j), computed as
prefix sums chunk by chunk (:func:`lra.models.attention.common.causal_linear_context`). The
parameters do not depend on it.

Padding: phi(k_j) is multiplied by the mask after the feature map (elu(0) + 1 = 1, so masking
raw keys would not do) and before both phi(K)^T V and the normaliser sum, so padded keys
contribute exactly nothing. Nothing depends on L, so appending padding leaves the outputs at
real positions unchanged. A row with no real key gets a zero context (0 / eps), not NaN.
"""

from __future__ import annotations

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

__all__ = ["LinearAttention"]

EPS = 1e-6


def elu_feature_map(x: jax.Array) -> jax.Array:
    """phi(x) = elu(x) + 1 > 0."""
    return jax.nn.elu(x) + jnp.asarray(1, x.dtype)


@register("linear")
class LinearAttention(MultiHeadAttention):
    """Multi-head linear attention with the elu + 1 feature map and a key padding mask."""

    kind = "linear"
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
        self._check_call(x, mask, deterministic, rngs)
        q, k, v = self._qkv(x)
        q = elu_feature_map(q)
        k = zero_padded(elu_feature_map(k), mask)
        eps = jnp.asarray(EPS, q.dtype)
        if self.causal:
            num, den = causal_linear_context(q, k, v)
        else:
            num, den = linear_context(q, k, v), linear_normaliser(q, k)
        y = num / (den + eps)[..., None]
        y = self.dropout(self._merge(y), deterministic=deterministic, rngs=rngs)
        return self.out(y)
