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

from models.attention.common import MultiHeadAttention
from models.registry import register

__all__ = ["SoftmaxAttention"]


@register("softmax")
class SoftmaxAttention(MultiHeadAttention):
    """Full quadratic multi-head attention with a key padding mask."""

    kind = "softmax"
    memory_class = "quadratic"
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
        implementation: str = "plain",
    ):
        self._init_heads(dim, num_heads, max_len, qkv_dim, dropout_rate)
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
        if self.implementation == "fused":
            y = jax.nn.dot_product_attention(q, k, v, mask=mask.astype(bool)[:, None, None, :])
            return self.out(self._merge(y))
        q = q * jnp.asarray(self.head_dim**-0.5, q.dtype)
        logits = jnp.einsum("bqhd,bkhd->bhqk", q, k)
        return self.out(self._merge(self._attend(logits, v, mask, deterministic, rngs)))
