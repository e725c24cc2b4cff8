"""Multi-head softmax (dot-product) attention: Vaswani et al., "Attention Is All You Need", 2017.

    out = concat_h( softmax(Q_h K_h^T / sqrt(d_h) + mask bias) V_h ) W_o

Shapes (B batch, L length, D model dim, H heads, E = qkv_dim, d_h = E / H):

    x:        float[B, L, D]
    mask:     bool[B, L]            True = real token; padded KEYS are excluded
    Q, K, V:  float[B, L, H, d_h]   from Dense D -> E
    weights:  float[B, H, L, L]     softmax over the key axis, then dropout
    out:      float[B, L, D]        from Dense E -> D

``implementation="plain"`` (default) is the formula above written out and is the reference;
``implementation="fused"`` calls ``jax.nn.dot_product_attention`` (cuDNN flash attention on
GPUs that support it, XLA elsewhere). The fused call has no attention-weight dropout, so it
requires ``dropout_rate=0`` (set ``task.arch.attention_dropout=0``).

Masked keys get the most negative finite value of the activation dtype instead of
``-inf``, so a row whose keys are all padding gives uniform weights, not NaN. Everything is
computed in the dtype of ``x`` and the parameters (bfloat16 works when both are bfloat16).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from models.registry import register

__all__ = ["SoftmaxAttention"]


@register("softmax")
class SoftmaxAttention(nnx.Module):
    """Full quadratic multi-head attention with a key padding mask."""

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
        implementation: str = "plain",
    ):
        qkv_dim = dim if qkv_dim is None else qkv_dim
        if num_heads < 1 or qkv_dim % num_heads:
            raise ValueError(
                f"softmax attention: qkv_dim={qkv_dim} must be divisible by "
                f"num_heads={num_heads}; change one of them"
            )
        if not 0.0 <= dropout_rate < 1.0:
            raise ValueError(
                f"softmax attention: dropout_rate must be in [0, 1), got {dropout_rate}"
            )
        if implementation not in ("plain", "fused"):
            raise ValueError(
                f"softmax attention: implementation must be 'plain' or 'fused', "
                f"got {implementation!r}"
            )
        if implementation == "fused" and dropout_rate:
            raise ValueError(
                "softmax attention: implementation='fused' has no attention dropout; "
                "set task.arch.attention_dropout=0 or use implementation='plain'"
            )
        self.implementation = implementation
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
                "softmax attention: deterministic=False needs rngs (an nnx.Rngs with a "
                "'dropout' stream) for attention dropout"
            )
        b, n, _ = x.shape
        if mask.shape != (b, n):
            raise ValueError(f"softmax attention: mask shape {mask.shape} != (B, L) = {(b, n)}")
        q = self._heads(self.query(x))
        k = self._heads(self.key(x))
        v = self._heads(self.value(x))
        if self.implementation == "fused":
            y = jax.nn.dot_product_attention(q, k, v, mask=mask.astype(bool)[:, None, None, :])
            return self.out(y.reshape(b, n, self.num_heads * self.head_dim))
        dtype = q.dtype
        q = q * jnp.asarray(self.head_dim**-0.5, dtype)
        logits = jnp.einsum("bqhd,bkhd->bhqk", q, k)
        key_mask = mask.astype(bool)[:, None, None, :]
        logits = jnp.where(key_mask, logits, jnp.asarray(jnp.finfo(dtype).min, dtype))
        weights = jax.nn.softmax(logits, axis=-1)
        weights = self.dropout(weights, deterministic=deterministic, rngs=rngs)
        y = jnp.einsum("bhqk,bkhd->bqhd", weights, v).reshape(b, n, self.num_heads * self.head_dim)
        return self.out(y)
