"""Linformer attention: Wang, Li, Khabsa, Fang and Ma, 2020, "Linformer: Self-Attention with
Linear Complexity".

Keys and values are projected along the sequence axis to k slots by learned matrices E and F,
then ordinary softmax attention runs over the k slots:

    K' = E[:, :L] (K * mask)      V' = F[:, :L] (V * mask)          float[B, k, H, d_h]
    out = concat_h( softmax(Q_h K'_h^T / sqrt(d_h)) V'_h ) W_o

Shapes (B batch, L length <= max_len, D model dim, H heads, E = qkv_dim, d_h = E / H):

    x:        float[B, L, D]
    mask:     bool[B, L]               True = real token
    Q, K, V:  float[B, L, H, d_h]      from Dense D -> E
    E, F:     float[k, max_len]        sliced to their first L columns; shared by all heads
    weights:  float[B, H, L, k]        softmax over the k slots, then dropout
    out:      float[B, L, D]

Options and their sources:

- ``k=256``: the projected length. The Nystromformer authors' PyTorch LRA code
  (mlpen/Nystromformer, LRA/code/lra_config.py, "linformer-256"), a common source of the
  efficient-attention baselines in later LRA comparisons, uses 256; the paper's experiments use
  k = 128 and 256 at n = 512. (The original JAX LRA code defaulted to
  ``low_rank_features=16``.)
- ``share_kv=False``: separate E and F, as in the paper's main formulation; True uses E for
  both (the paper's "key-value sharing"; both the JAX LRA and the Nystromformer LRA code share).

E and F are shared across heads ("headwise sharing", as in the authors' fairseq
implementation, which also inits them Glorot-uniform with gain 1/sqrt(2), as here); each layer
has its own.

Padding: K and V are multiplied by the mask BEFORE the projection, so padded tokens contribute
nothing to any slot and changing their values changes nothing. The projection is a sum over
positions, so the extra columns of E, F that appended padding brings in multiply zeros:
appending padding also leaves the output unchanged (the only length dependence is which
columns of E, F are used, and those are fixed by position). Queries are not masked; a fully
padded sequence gives all-zero slots, a uniform softmax and a zero output before W_o.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from lra.models.attention.common import MultiHeadAttention, check_int, zero_padded
from lra.models.registry import register

__all__ = ["LinformerAttention"]


@register("linformer")
class LinformerAttention(MultiHeadAttention):
    """Multi-head attention over k learned sequence projections of the keys and values."""

    kind = "linformer"
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
        k: int = 256,
        share_kv: bool = False,
    ):
        self._init_heads(dim, num_heads, max_len, qkv_dim, dropout_rate)
        check_int(self.label, "k", k)
        if max_len < 1:
            raise ValueError(f"linformer attention: max_len must be >= 1, got {max_len}")
        self.k = k
        self._init_projections(rngs)
        # Glorot uniform with gain 1/sqrt(2): bound sqrt(3 / (k + max_len)).
        init = nnx.initializers.variance_scaling(0.5, "fan_avg", "uniform")
        self.key_projection = nnx.Param(init(rngs.params(), (k, max_len), jnp.float32))
        self.value_projection = (
            None if share_kv else nnx.Param(init(rngs.params(), (k, max_len), jnp.float32))
        )

    def __call__(
        self,
        x: jax.Array,
        *,
        mask: jax.Array,
        deterministic: bool = True,
        rngs: nnx.Rngs | None = None,
    ) -> jax.Array:
        _, n = self._check_call(x, mask, deterministic, rngs)
        self._check_length(n, "E and F have one column per position")
        q, keys, values = self._qkv(x)
        dtype = q.dtype
        e = self.key_projection[:, :n].astype(dtype)
        f = e if self.value_projection is None else self.value_projection[:, :n].astype(dtype)
        keys = jnp.einsum("kl,blhd->bkhd", e, zero_padded(keys, mask))
        values = jnp.einsum("kl,blhd->bkhd", f, zero_padded(values, mask))

        q = q * jnp.asarray(self.head_dim**-0.5, dtype)
        logits = jnp.einsum("bqhd,bkhd->bhqk", q, keys)
        return self.out(self._merge(self._attend(logits, values, None, deterministic, rngs)))
