"""TransNormer attentions: Qin, Han, Sun, Li, Kong, Barnes and Zhong, 2022, "The Devil in Linear
Transformer" (EMNLP 2022). Two mechanisms of one model, registered under two names:

"transnormer_norm", NormAttention: linear attention with no scaling and no denominator; a
normalisation of the output replaces the row normalisation (which the paper shows gives
unbounded gradients):

    O = Norm( phi(Q) (phi(K)^T V) )         per head, then heads concatenated

"transnormer_diag", DiagAttention: attention only inside non-overlapping blocks of
``block_size`` tokens along the sequence (block i // block_size), which counters the
"attention dilution" of linear attention in the lower layers:

    score "softmax":  O_block = softmax(Q_b K_b^T / sqrt(d) + mask bias) V_b
    score "relu":     O_block = relu(Q_b K_b^T / sqrt(d)) V_b, then O = Norm(O)

The paper's model puts Diag layers first and Norm layers after (the first half of the layers
Diag); build that with the encoder's per-layer schedule, e.g. ["transnormer_diag"] * 2 +
["transnormer_norm"] * 2. The two published variants (REFERENCE.md section 6, and the
authors' LRA scripts, OpenNLPLab/Transnormer script_lra.py with OpenNLPLab/lra):

    T1: transnormer_diag score="relu" (ReLU scores + output norm), transnormer_norm kernel="elu"
    T2: transnormer_diag score="softmax" (no output norm), transnormer_norm kernel="1+elu"

The defaults are T2 (score="softmax", kernel="1+elu"): the defaults of the authors' LRA model
config (OpenNLPLab/lra configs/model/transnormer.yaml: use_softmax true, act_fun 1+elu) and
the variant with the best reported LRA average. block_size = 64 as in the paper and that
config (lg_local_chunk_size 64).

Norm: over the concatenated heads (E = qkv_dim channels, learned affine), as in the authors'
code (NormLinearAttention / NormLocalAttention normalise the [L, B, E] output before the
output projection). norm_type "layernorm" (default; the authors' LRA configs use LayerNorm,
``norm: layer``) or "rmsnorm" (RMSNorm with a learned scale, the RMS-style norm of the paper's
language models). nnx's epsilon 1e-6 in both.

Shapes (B batch, L length, D model dim, H heads, E = qkv_dim, d = E / H, C = block_size,
G = ceil(L / C) blocks):

    x:                   float[B, L, D]
    mask:                bool[B, L]               True = real token
    Q, K, V:             float[B, L, H, d]        from Dense D -> E (as in softmax.py)
    Norm: phi(K)^T V     float[B, H, d, d]
    Diag: weights        float[B, H, G, C, C]     L padded up to G * C internally, sliced back
    out:                 float[B, L, D]           Dense E -> D

Options and defaults: transnormer_norm kernel ("1+elu" | "elu" | "relu"; "1+elu") and
norm_type; transnormer_diag score ("softmax" | "relu"; "softmax"), block_size (64) and
norm_type (used with score="relu" only). Departures from the authors' code: their LRA layers
also add LRPE relative position encodings (use_lrpe true), left out here; their Diag layer
ignores the key padding mask (the padded keys of the last block take part in its softmax);
their NormAttention has no attention dropout.

Dropout: Diag drops the block weights (as the authors do). Norm has no weight matrix; its
``dropout_rate`` is applied to the normalised output before the output projection.

Padding: Norm multiplies phi(K) by the mask after the feature map (elu(0) + 1 = 1) and before
phi(K)^T V; nothing depends on L. Diag excludes padded keys inside each block (finite
large-negative logits for softmax, zeroed weights for relu), and blocks start at position 0,
so appending padding adds only padded keys to the last real block and new all-padding blocks:
outputs at real positions do not change. A real query always sees at least itself; a
padded query in an all-padding block gets a finite (uniform or zero) output.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from models.registry import register

__all__ = ["DiagAttention", "NormAttention"]

KERNELS = {
    "1+elu": lambda x: jax.nn.elu(x) + jnp.asarray(1, x.dtype),
    "elu": jax.nn.elu,
    "relu": jax.nn.relu,
}
NORM_TYPES = ("layernorm", "rmsnorm")
SCORES = ("softmax", "relu")


def _check_common(name: str, qkv_dim: int, num_heads: int, dropout_rate: float) -> None:
    if num_heads < 1 or qkv_dim % num_heads:
        raise ValueError(
            f"{name} attention: qkv_dim={qkv_dim} must be divisible by "
            f"num_heads={num_heads}; change one of them"
        )
    if not 0.0 <= dropout_rate < 1.0:
        raise ValueError(f"{name} attention: dropout_rate must be in [0, 1), got {dropout_rate}")


def _output_norm(name: str, norm_type: str, width: int, rngs: nnx.Rngs) -> nnx.Module:
    if norm_type == "layernorm":
        return nnx.LayerNorm(width, rngs=rngs)
    if norm_type == "rmsnorm":
        return nnx.RMSNorm(width, rngs=rngs)
    raise ValueError(f"{name} attention: norm_type must be one of {NORM_TYPES}, got {norm_type!r}")


class _Projections(nnx.Module):
    """Q/K/V/out projections, head split and call checks shared by both mechanisms."""

    replaces_mlp = False

    def __init__(self, name: str, dim: int, num_heads: int, qkv_dim: int, rngs: nnx.Rngs):
        self.name = name
        self.dim = dim
        self.num_heads = num_heads
        self.head_dim = qkv_dim // num_heads
        self.query = nnx.Linear(dim, qkv_dim, rngs=rngs)
        self.key = nnx.Linear(dim, qkv_dim, rngs=rngs)
        self.value = nnx.Linear(dim, qkv_dim, rngs=rngs)
        self.out = nnx.Linear(qkv_dim, dim, rngs=rngs)

    def _heads(self, y: jax.Array) -> jax.Array:
        b, n, _ = y.shape
        return y.reshape(b, n, self.num_heads, self.head_dim)

    def _qkv(self, x, mask, deterministic, rngs):
        if not deterministic and rngs is None:
            raise ValueError(
                f"{self.name} attention: deterministic=False needs rngs (an nnx.Rngs with a "
                "'dropout' stream) for attention dropout"
            )
        b, n, _ = x.shape
        if mask.shape != (b, n):
            raise ValueError(f"{self.name} attention: mask shape {mask.shape} != (B, L) = {(b, n)}")
        return self._heads(self.query(x)), self._heads(self.key(x)), self._heads(self.value(x))


@register("transnormer_norm")
class NormAttention(_Projections):
    """TransNormer NormAttention: Norm(phi(Q) (phi(K)^T V)), no scaling, no denominator."""

    def __init__(
        self,
        *,
        dim: int,
        num_heads: int,
        max_len: int,
        rngs: nnx.Rngs,
        qkv_dim: int | None = None,
        dropout_rate: float = 0.0,
        kernel: str = "1+elu",
        norm_type: str = "layernorm",
    ):
        name = "transnormer_norm"
        qkv_dim = dim if qkv_dim is None else qkv_dim
        _check_common(name, qkv_dim, num_heads, dropout_rate)
        if kernel not in KERNELS:
            raise ValueError(
                f"{name} attention: kernel must be one of {tuple(KERNELS)}, got {kernel!r}"
            )
        super().__init__(name, dim, num_heads, qkv_dim, rngs)
        self.max_len = max_len
        self.kernel = kernel
        self.norm = _output_norm(name, norm_type, qkv_dim, rngs)
        self.dropout = nnx.Dropout(dropout_rate)

    def __call__(
        self,
        x: jax.Array,
        *,
        mask: jax.Array,
        deterministic: bool = True,
        rngs: nnx.Rngs | None = None,
    ) -> jax.Array:
        q, k, v = self._qkv(x, mask, deterministic, rngs)
        b, n, h, d = q.shape
        phi = KERNELS[self.kernel]
        q = phi(q)
        k = phi(k) * mask.astype(q.dtype)[:, :, None, None]
        kv = jnp.einsum("bkhd,bkhe->bhde", k, v)
        y = jnp.einsum("bqhd,bhde->bqhe", q, kv).reshape(b, n, h * d)
        y = self.dropout(self.norm(y), deterministic=deterministic, rngs=rngs)
        return self.out(y)


@register("transnormer_diag")
class DiagAttention(_Projections):
    """TransNormer DiagAttention: softmax or ReLU attention inside non-overlapping blocks."""

    def __init__(
        self,
        *,
        dim: int,
        num_heads: int,
        max_len: int,
        rngs: nnx.Rngs,
        qkv_dim: int | None = None,
        dropout_rate: float = 0.0,
        score: str = "softmax",
        block_size: int = 64,
        norm_type: str = "layernorm",
    ):
        name = "transnormer_diag"
        qkv_dim = dim if qkv_dim is None else qkv_dim
        _check_common(name, qkv_dim, num_heads, dropout_rate)
        if score not in SCORES:
            raise ValueError(f"{name} attention: score must be one of {SCORES}, got {score!r}")
        if not isinstance(block_size, int) or block_size < 1:
            raise ValueError(
                f"{name} attention: block_size must be a positive int, got {block_size!r}"
            )
        super().__init__(name, dim, num_heads, qkv_dim, rngs)
        self.max_len = max_len
        self.score = score
        self.block_size = block_size
        # The norm replaces the softmax's normalisation; T2 (softmax) has none.
        self.norm = _output_norm(name, norm_type, qkv_dim, rngs) if score == "relu" else None
        self.dropout = nnx.Dropout(dropout_rate)

    def _blocks(self, y: jax.Array, pad: int) -> jax.Array:
        """[B, L, ...] -> [B, G, C, ...], zero-padded at the end."""
        y = jnp.pad(y, [(0, 0), (0, pad)] + [(0, 0)] * (y.ndim - 2))
        return y.reshape(y.shape[0], -1, self.block_size, *y.shape[2:])

    def __call__(
        self,
        x: jax.Array,
        *,
        mask: jax.Array,
        deterministic: bool = True,
        rngs: nnx.Rngs | None = None,
    ) -> jax.Array:
        q, k, v = self._qkv(x, mask, deterministic, rngs)
        b, n, h, d = q.shape
        dtype = q.dtype
        pad = -n % self.block_size
        q = self._blocks(q * jnp.asarray(d**-0.5, dtype), pad)
        k, v = self._blocks(k, pad), self._blocks(v, pad)
        real_key = self._blocks(mask.astype(bool), pad)[:, None, :, None, :]  # [B, 1, G, 1, C]

        logits = jnp.einsum("bgqhd,bgkhd->bhgqk", q, k)
        if self.score == "softmax":
            lowest = jnp.asarray(jnp.finfo(dtype).min, dtype)
            weights = jax.nn.softmax(jnp.where(real_key, logits, lowest), axis=-1)
        else:
            weights = jax.nn.relu(logits) * real_key.astype(dtype)
        weights = self.dropout(weights, deterministic=deterministic, rngs=rngs)
        y = jnp.einsum("bhgqk,bgkhd->bgqhd", weights, v).reshape(b, -1, h * d)[:, :n]
        if self.norm is not None:
            y = self.norm(y)
        return self.out(y)
