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

Padding: phi(k_j) is multiplied by the mask after the feature map (elu(0) + 1 = 1, so masking
raw keys would not do) and before both phi(K)^T V and the normaliser sum, so padded keys
contribute exactly nothing. Nothing depends on L, so appending padding leaves the outputs at
real positions unchanged. A row with no real key gets a zero context (0 / eps), not NaN.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from models.registry import register

__all__ = ["LinearAttention"]

EPS = 1e-6


def elu_feature_map(x: jax.Array) -> jax.Array:
    """phi(x) = elu(x) + 1 > 0."""
    return jax.nn.elu(x) + jnp.asarray(1, x.dtype)


@register("linear")
class LinearAttention(nnx.Module):
    """Multi-head linear attention with the elu + 1 feature map and a key padding mask."""

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
    ):
        qkv_dim = dim if qkv_dim is None else qkv_dim
        if num_heads < 1 or qkv_dim % num_heads:
            raise ValueError(
                f"linear attention: qkv_dim={qkv_dim} must be divisible by "
                f"num_heads={num_heads}; change one of them"
            )
        if not 0.0 <= dropout_rate < 1.0:
            raise ValueError(
                f"linear attention: dropout_rate must be in [0, 1), got {dropout_rate}"
            )
        self.dim = dim
        self.num_heads = num_heads
        self.head_dim = qkv_dim // num_heads
        self.max_len = max_len
        self.query = nnx.Linear(dim, qkv_dim, rngs=rngs)
        self.key = nnx.Linear(dim, qkv_dim, rngs=rngs)
        self.value = nnx.Linear(dim, qkv_dim, rngs=rngs)
        self.out = nnx.Linear(qkv_dim, dim, rngs=rngs)
        self.dropout = nnx.Dropout(dropout_rate)

    def _heads(self, y: jax.Array) -> jax.Array:
        b, n, _ = y.shape
        return y.reshape(b, n, self.num_heads, self.head_dim)

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
                "linear attention: deterministic=False needs rngs (an nnx.Rngs with a "
                "'dropout' stream) for attention dropout"
            )
        b, n, _ = x.shape
        if mask.shape != (b, n):
            raise ValueError(f"linear attention: mask shape {mask.shape} != (B, L) = {(b, n)}")
        q = elu_feature_map(self._heads(self.query(x)))
        k = elu_feature_map(self._heads(self.key(x)))
        v = self._heads(self.value(x))
        dtype = q.dtype
        k = k * mask.astype(dtype)[:, :, None, None]
        kv = jnp.einsum("bkhd,bkhe->bhde", k, v)
        numerator = jnp.einsum("bqhd,bhde->bqhe", q, kv)
        denominator = jnp.einsum("bqhd,bhd->bqh", q, jnp.sum(k, axis=1))
        y = numerator / (denominator + jnp.asarray(EPS, dtype))[..., None]
        y = y.reshape(b, n, self.num_heads * self.head_dim)
        y = self.dropout(y, deterministic=deterministic, rngs=rngs)
        return self.out(y)
