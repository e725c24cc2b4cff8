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

from models.registry import register

__all__ = ["LinformerAttention"]


@register("linformer")
class LinformerAttention(nnx.Module):
    """Multi-head attention over k learned sequence projections of the keys and values."""

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
        k: int = 256,
        share_kv: bool = False,
    ):
        qkv_dim = dim if qkv_dim is None else qkv_dim
        if num_heads < 1 or qkv_dim % num_heads:
            raise ValueError(
                f"linformer attention: qkv_dim={qkv_dim} must be divisible by "
                f"num_heads={num_heads}; change one of them"
            )
        if not 0.0 <= dropout_rate < 1.0:
            raise ValueError(
                f"linformer attention: dropout_rate must be in [0, 1), got {dropout_rate}"
            )
        if isinstance(k, bool) or not isinstance(k, int) or k < 1:
            raise ValueError(f"linformer attention: k must be an integer >= 1, got {k!r}")
        if max_len < 1:
            raise ValueError(f"linformer attention: max_len must be >= 1, got {max_len}")
        self.dim = dim
        self.num_heads = num_heads
        self.head_dim = qkv_dim // num_heads
        self.max_len = max_len
        self.k = k
        self.query = nnx.Linear(dim, qkv_dim, rngs=rngs)
        self.key = nnx.Linear(dim, qkv_dim, rngs=rngs)
        self.value = nnx.Linear(dim, qkv_dim, rngs=rngs)
        self.out = nnx.Linear(qkv_dim, dim, rngs=rngs)
        # Glorot uniform with gain 1/sqrt(2): bound sqrt(3 / (k + max_len)).
        init = nnx.initializers.variance_scaling(0.5, "fan_avg", "uniform")
        self.key_projection = nnx.Param(init(rngs.params(), (k, max_len), jnp.float32))
        self.value_projection = (
            None if share_kv else nnx.Param(init(rngs.params(), (k, max_len), jnp.float32))
        )
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
                "linformer attention: deterministic=False needs rngs (an nnx.Rngs with a "
                "'dropout' stream) for attention dropout"
            )
        b, n, _ = x.shape
        if mask.shape != (b, n):
            raise ValueError(f"linformer attention: mask shape {mask.shape} != (B, L) = {(b, n)}")
        if n > self.max_len:
            raise ValueError(
                f"linformer attention: sequence length {n} exceeds max_len={self.max_len}; "
                "E and F have one column per position"
            )
        q = self._heads(self.query(x))
        dtype = q.dtype
        real = mask.astype(dtype)[:, :, None, None]
        keys = self._heads(self.key(x)) * real
        values = self._heads(self.value(x)) * real
        e = self.key_projection[:, :n].astype(dtype)
        f = e if self.value_projection is None else self.value_projection[:, :n].astype(dtype)
        keys = jnp.einsum("kl,blhd->bkhd", e, keys)
        values = jnp.einsum("kl,blhd->bkhd", f, values)

        q = q * jnp.asarray(self.head_dim**-0.5, dtype)
        logits = jnp.einsum("bqhd,bkhd->bhqk", q, keys)
        weights = jax.nn.softmax(logits, axis=-1)
        weights = self.dropout(weights, deterministic=deterministic, rngs=rngs)
        y = jnp.einsum("bhqk,bkhd->bqhd", weights, values)
        return self.out(y.reshape(b, n, self.num_heads * self.head_dim))
