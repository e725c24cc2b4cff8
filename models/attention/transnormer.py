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
norm_type (used with score="relu" only); both take ``lrpe`` (bool, False). Departures from
the authors' code: their Diag layer ignores the key padding mask (the padded keys of the last
block take part in its softmax); their NormAttention has no attention dropout; their LRA
layers always use LRPE (``use_lrpe: true``), here an option (False under the LRA-official
protocol, switched on by the transnormer protocol).

LRPE (``lrpe=True``): Qin et al., "Linearized Relative Positional Encoding" (2023), in the
variant the TransNormer authors' LRA layers use:
OpenNLPLab/lra src/models/sequence/x_attention/lrpe.py with its defaults (core_matrix 1 =
rotation, p_matrix 1 = identity, theta_type "a", theta_learned False), called from
norm_linear_attention.py and norm_local_attention.py. That is a rotary (unitary) transform
of each head's query and key: channel pairs (2p, 2p + 1) of the vector at position m are
rotated by the angle m * theta_p, with FIXED (not learned) theta_p = 10000^(-2p / e) for
p < e / 2, e = d rounded down to even (an odd last channel is left as it is). A query at i
and a key at j then score q_i^T R((j - i) theta) k_j: only the offset counts.

    Norm: positions m = 0 .. L-1, rotation AFTER the kernel (phi(Q), phi(K) rotated), then
          phi(K) masked and the linear product as before: O = Norm(R phi(Q) (R phi(K))^T V)
    Diag: positions m = 0 .. C-1 inside each block (the authors rotate the blocked tensors),
          rotation of the scaled Q and of K before the block scores

Rotated features can be negative; NormAttention has no denominator, so nothing divides by
them. Appending padding leaves every real position (and so every rotation) unchanged.

Dropout: Diag drops the block weights (as the authors do). Norm has no weight matrix; its
``dropout_rate`` is applied to the normalised output before the output projection.

Causal mode (``causal=True``, both mechanisms; the causal TransNormer of the paper's
language models): Norm's product becomes the prefix sum O_i = Norm(phi(q_i) sum_{j<=i}
phi(k_j) v_j^T) (:func:`lra.models.attention.common.causal_linear_context`; LRPE rotations
depend on positions only, so they stay causal); Diag's block attention keeps only the keys
j <= i of the query's own block (a lower-triangular mask inside each block). The parameters do
not depend on it.

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
import numpy as np
from flax import nnx

from lra.models.attention.common import (
    MultiHeadAttention,
    causal_keep,
    causal_linear_context,
    from_blocks,
    linear_context,
    mask_logits,
    to_blocks,
    zero_padded,
)
from lra.models.registry import register

__all__ = ["DiagAttention", "NormAttention", "lrpe_rotate"]

KERNELS = {
    "1+elu": lambda x: jax.nn.elu(x) + jnp.asarray(1, x.dtype),
    "elu": jax.nn.elu,
    "relu": jax.nn.relu,
}
NORM_TYPES = ("layernorm", "rmsnorm")
SCORES = ("softmax", "relu")


def lrpe_rotate(y: jax.Array) -> jax.Array:
    """LRPE's rotation (the authors' LRA variant: rotary, fixed theta, interleaved pairs).

    y float[..., M, H, d] with positions 0 .. M-1 along axis -3 -> the same shape: channel
    pair (2p, 2p + 1) at position m rotated by m * theta_p, theta_p = 10000^(-2p / e),
    e = d rounded down to even (an odd last channel stays as it is).
    """
    m, d = y.shape[-3], y.shape[-1]
    e = d - d % 2
    if e == 0:
        return y
    theta = 10000.0 ** (-2.0 * np.arange(e // 2) / e)
    angle = np.arange(m)[:, None, None] * theta  # [M, 1, e/2], float64 then cast
    cos, sin = jnp.asarray(np.cos(angle), y.dtype), jnp.asarray(np.sin(angle), y.dtype)
    pairs = y[..., :e].reshape(*y.shape[:-1], e // 2, 2)
    even, odd = pairs[..., 0], pairs[..., 1]
    rotated = jnp.stack([even * cos - odd * sin, odd * cos + even * sin], axis=-1)
    return jnp.concatenate([rotated.reshape(*y.shape[:-1], e), y[..., e:]], axis=-1)


def _check_bool(label: str, name: str, value) -> None:
    if not isinstance(value, bool):
        raise ValueError(f"{label}: {name} must be true or false, got {value!r}")


def _output_norm(label: str, norm_type: str, width: int, rngs: nnx.Rngs) -> nnx.Module:
    if norm_type == "layernorm":
        return nnx.LayerNorm(width, rngs=rngs)
    if norm_type == "rmsnorm":
        return nnx.RMSNorm(width, rngs=rngs)
    raise ValueError(f"{label}: norm_type must be one of {NORM_TYPES}, got {norm_type!r}")


@register("transnormer_norm")
class NormAttention(MultiHeadAttention):
    """TransNormer NormAttention: Norm(phi(Q) (phi(K)^T V)), no scaling, no denominator."""

    kind = "transnormer_norm"
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
        kernel: str = "1+elu",
        norm_type: str = "layernorm",
        lrpe: bool = False,
        causal: bool = False,
    ):
        qkv_dim = self._init_heads(dim, num_heads, max_len, qkv_dim, dropout_rate)
        _check_bool(self.label, "lrpe", lrpe)
        self.causal = bool(causal)
        if kernel not in KERNELS:
            raise ValueError(
                f"{self.label}: kernel must be one of {tuple(KERNELS)}, got {kernel!r}"
            )
        self._init_projections(rngs)
        self.kernel = kernel
        self.lrpe = lrpe
        self.norm = _output_norm(self.label, norm_type, qkv_dim, rngs)

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
        phi = KERNELS[self.kernel]
        q, k = phi(q), phi(k)
        if self.lrpe:
            q, k = lrpe_rotate(q), lrpe_rotate(k)
        k = zero_padded(k, mask)
        if self.causal:
            y = self._merge(causal_linear_context(q, k, v)[0])
        else:
            y = self._merge(linear_context(q, k, v))
        y = self.dropout(self.norm(y), deterministic=deterministic, rngs=rngs)
        return self.out(y)


@register("transnormer_diag")
class DiagAttention(MultiHeadAttention):
    """TransNormer DiagAttention: softmax or ReLU attention inside non-overlapping blocks."""

    kind = "transnormer_diag"
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
        score: str = "softmax",
        block_size: int = 64,
        norm_type: str = "layernorm",
        lrpe: bool = False,
        causal: bool = False,
    ):
        qkv_dim = self._init_heads(dim, num_heads, max_len, qkv_dim, dropout_rate)
        _check_bool(self.label, "lrpe", lrpe)
        self.causal = bool(causal)
        if score not in SCORES:
            raise ValueError(f"{self.label}: score must be one of {SCORES}, got {score!r}")
        if not isinstance(block_size, int) or block_size < 1:
            raise ValueError(f"{self.label}: block_size must be a positive int, got {block_size!r}")
        self._init_projections(rngs)
        self.score = score
        self.block_size = block_size
        self.lrpe = lrpe
        # The norm replaces the softmax's normalisation; T2 (softmax) has none.
        self.norm = _output_norm(self.label, norm_type, qkv_dim, rngs) if score == "relu" else None

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
        dtype = q.dtype
        c = self.block_size
        q = to_blocks(q * jnp.asarray(self.head_dim**-0.5, dtype), c)
        k, v = to_blocks(k, c), to_blocks(v, c)
        if self.lrpe:  # positions 0 .. C-1 inside each block, as the authors rotate blocks
            q, k = lrpe_rotate(q), lrpe_rotate(k)
        real_key = to_blocks(mask.astype(bool), c)[:, None, :, None, :]  # [B, 1, G, 1, C]
        if self.causal:  # [B, 1, G, C, C]: key j <= query i inside the block
            real_key = real_key & jnp.asarray(causal_keep(c))

        logits = jnp.einsum("bgqhd,bgkhd->bhgqk", q, k)
        if self.score == "softmax":
            weights = jax.nn.softmax(mask_logits(logits, real_key), axis=-1)
        else:
            weights = jax.nn.relu(logits) * real_key.astype(dtype)
        weights = self.dropout(weights, deterministic=deterministic, rngs=rngs)
        y = self._merge(from_blocks(jnp.einsum("bhgqk,bgkhd->bgqhd", weights, v), n))
        if self.norm is not None:
            y = self.norm(y)
        return self.out(y)
