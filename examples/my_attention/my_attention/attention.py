"""Squared-ReLU attention: softmax replaced by relu(scores)^2 / n (So et al., "Primer", 2021,
squared ReLU; normalised by the number of real keys as in Hua et al., "Transformer Quality in
Linear Time", 2022).

    out = concat_h( (relu(Q_h K_h^T / sqrt(d_h))^2 * key_mask / n_real) V_h ) W_o

Shapes (B batch, L length, D model dim, H heads, d_h = qkv_dim / H):

    x:        float[B, L, D]
    mask:     bool[B, L]           True = real token; padded KEYS get weight 0
    Q, K, V:  float[B, L, H, d_h]
    weights:  float[B, H, L, L]    quadratic in L
    out:      float[B, L, D]

Dividing by the number of REAL keys (not by L) keeps every real token's output the same
however much padding follows: the class declares ``same_without_padding = True`` and
``lra-check-attention`` verifies it.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx


class SquaredReluAttention(nnx.Module):
    """Multi-head squared-ReLU attention with a key padding mask."""

    memory_class = "quadratic"  # it builds the [B, H, L, L] weights
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
    ):
        qkv_dim = dim if qkv_dim is None else qkv_dim
        if qkv_dim % num_heads:
            raise ValueError(f"qkv_dim={qkv_dim} must be divisible by num_heads={num_heads}")
        self.num_heads, self.head_dim = num_heads, qkv_dim // num_heads
        self.query = nnx.Linear(dim, qkv_dim, rngs=rngs)
        self.key = nnx.Linear(dim, qkv_dim, rngs=rngs)
        self.value = nnx.Linear(dim, qkv_dim, rngs=rngs)
        self.out = nnx.Linear(qkv_dim, dim, rngs=rngs)
        self.dropout = nnx.Dropout(dropout_rate)

    def _heads(self, y: jax.Array) -> jax.Array:
        return y.reshape(*y.shape[:2], self.num_heads, self.head_dim)

    def weights(self, q: jax.Array, k: jax.Array, mask: jax.Array) -> jax.Array:
        """``float[B, H, L, L]`` weights of real keys; padded keys get exactly 0."""
        scores = jnp.einsum("bqhd,bkhd->bhqk", q, k) / jnp.sqrt(self.head_dim).astype(q.dtype)
        keys = mask[:, None, None, :]
        n_real = jnp.maximum(jnp.sum(mask, axis=-1), 1)[:, None, None, None].astype(q.dtype)
        return jnp.where(keys, jax.nn.relu(scores) ** 2, 0) / n_real

    def __call__(self, x, *, mask, deterministic: bool = True, rngs: nnx.Rngs | None = None):
        q, k, v = (self._heads(f(x)) for f in (self.query, self.key, self.value))
        w = self.dropout(self.weights(q, k, mask), deterministic=deterministic, rngs=rngs)
        out = jnp.einsum("bhqk,bkhd->bqhd", w, v)
        return self.out(out.reshape(*x.shape[:2], -1))
