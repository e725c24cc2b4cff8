"""Gated attention units: FLASH-Quad and FLASH (mixed chunk attention).

Hua, Dai, Liu, Le, "Transformer Quality in Linear Time", ICML 2022.

A gated attention unit (GAU) is a whole layer (attention + channel mixing), so both classes
set ``replaces_mlp = True`` and the encoder block has no separate MLP. Shapes (B batch,
L length, D = dim, e = expansion_factor * D, s = shared_dim, g = chunk_size, C = L / g):

    U, V  = SiLU(x W_u), SiLU(x W_v)                 float[B, L, e]
    Z     = SiLU(x W_z)                              float[B, L, s]   shared by Q and K
    Q_p   = Z * gamma_p + beta_p                     float[B, L, s]   per-"head" offset/scale
    out   = (U * Vhat) W_o                           float[B, L, D]

flash_quad (quadratic over the whole sequence)::

    A    = relu(Q K^T / n + b[j - i])^2 * key_mask   float[B, L, L]
    Vhat = A V

flash (mixed chunk attention, non-causal form; the sequence is cut into chunks of g)::

    A_c  = relu(Qq_c Kq_c^T / g + b[j - i])^2 * key_mask   float[B, C, g, g]  inside chunk c
    Vhat_c = A_c V_c  +  Ql_c (sum over all chunks h of Kl_h^T V_h) / n

with four offset/scales of Z (quadratic Q, K; linear Q, K). The linear part has no
feature map: the paper's linear attention is the plain product of the offset/scaled Z.

Scaling: ``n`` is the number of REAL tokens in the row (at least 1), so appending padding
changes nothing. The paper's GAU pseudo-code divides by the sequence length (the padded
length when a batch is padded); a public fairseq FLASH port (after JunnYu/FLASHQuad_pytorch)
divides both the quadratic part and the linear sum by the chunk size.
Here the quadratic part of flash uses 1/g (g = chunk_size, a constant) and its linear part
1/n (a mean over real tokens, which stays O(1) at any length instead of growing with L / g).

Relative position bias ``b``: one learned scalar per offset j - i (a Toeplitz matrix), as
the authors build it for sequences up to 512; offsets are clipped to +-(span - 1) with span
= max_len (flash_quad) or min(chunk_size, max_len) (flash: offsets never leave a chunk).
The paper's code builds the Toeplitz matrix from RoPE above 512 tokens; that is not done here.

RoPE (``rope=True``, default False): rotary position embedding (Su et al., RoFormer) of the
offset/scaled queries and keys, before their products, as in the TransNormer authors' LRA
code for these baselines (OpenNLPLab/lra src/models/sequence/x_attention/flash.py for
flash_quad and flash_linear.py for flash, after JunnYu/FLASHQuad_pytorch), which keep the
relative position bias as well. Every Q and K of the unit is rotated (flash_quad: Q, K;
flash: quadratic Q, K and linear Q, K) at its GLOBAL position m = 0 .. L-1 (the authors'
``rope(x, dim=[1, 2])`` numbers the chunked positions consecutively). Their layout: the s
channels split into halves x1 = Z[:s/2], x2 = Z[s/2:], rotated pairwise (x1_p, x2_p) by the
angle m * theta_p, theta_p = 10000^(-p / (s/2)) for p < s/2 (fixed, not learned):

    rope(x)_m = [x1 cos(m theta) - x2 sin(m theta),  x2 cos(m theta) + x1 sin(m theta)]

so q_i^T k_j becomes q_i^T R((j - i) theta) k_j, and the linear part sum_j (R_i q_i)^T
(R_j k_j) v_j keeps its O(L) form. ``rope`` needs an even shared_dim.

Options and defaults (from the paper): expansion_factor = 2 (e = 2D), shared_dim = s = 128,
chunk_size = 256 (the paper's group size, flash only), rope = False. ``num_heads`` and
``qkv_dim`` are accepted for the common interface but unused: the GAU is single-head with a
shared Z of size s. ``dropout_rate`` drops entries of A (the quadratic weights) in training.
Init as in the public ports: gamma and the bias table ~ N(0, 0.02), beta = 0, Dense layers as
nnx.Linear.

Padding: padded KEYS contribute nothing: A is multiplied by the key mask after the relu^2,
and the linear keys Kl are multiplied by the mask after the offset/scale (beta makes them
non-zero even for a zero Z). Appending padding leaves outputs at real positions unchanged:
chunks and RoPE positions start at 0, the 1/g and 1/n scales and the bias do not depend on
L. Outputs at padded positions are not meaningful.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from lra.models.attention.common import blockwise, check_call, check_dropout
from lra.models.registry import register

__all__ = ["FlashAttention", "FlashQuadAttention", "RelativePositionBias", "rope_rotate"]


def rope_rotate(y: jax.Array) -> jax.Array:
    """RoPE in the FLASH ports' half-split layout: y float[B, L, s] (s even) -> float[B, L, s].

    Channels p and p + s/2 at position m (axis 1, from 0) are rotated together by the angle
    m * theta_p, theta_p = 10000^(-p / (s/2)).
    """
    n, half = y.shape[1], y.shape[-1] // 2
    theta = 10000.0 ** (-np.arange(half) / half)
    angle = np.arange(n)[:, None] * theta  # [L, s/2], float64 then cast
    cos, sin = jnp.asarray(np.cos(angle), y.dtype), jnp.asarray(np.sin(angle), y.dtype)
    first, second = y[..., :half], y[..., half:]
    return jnp.concatenate([first * cos - second * sin, second * cos + first * sin], axis=-1)


class RelativePositionBias(nnx.Module):
    """A learned scalar per relative offset j - i, offsets clipped to +-(span - 1)."""

    def __init__(self, span: int, *, rngs: nnx.Rngs):
        self.span = span
        init = nnx.initializers.normal(0.02)
        self.table = nnx.Param(init(rngs.params(), (2 * span - 1,), jnp.float32))

    def __call__(self, length: int, dtype) -> jax.Array:
        """float[length, length] with entry [i, j] = b[j - i]."""
        pos = jnp.arange(length)
        offset = jnp.clip(pos[None, :] - pos[:, None], -(self.span - 1), self.span - 1)
        return self.table[...].astype(dtype)[offset + self.span - 1]


class _GatedAttentionUnit(nnx.Module):
    """Projections shared by flash_quad and flash: U, V, and offset/scales of Z."""

    replaces_mlp = True
    kind = "gau"

    def _setup(
        self,
        dim: int,
        max_len: int,
        rngs: nnx.Rngs,
        dropout_rate: float,
        expansion_factor: float,
        shared_dim: int,
        num_offsets: int,
        bias_span: int,
        rope: bool,
    ) -> None:
        if dim < 1 or max_len < 1:
            raise ValueError(f"{self.kind}: need dim >= 1 and max_len >= 1, got {dim}, {max_len}")
        check_dropout(self.kind, dropout_rate)
        if expansion_factor <= 0 or int(expansion_factor * dim) < 1:
            raise ValueError(
                f"{self.kind}: expansion_factor must be > 0 with expansion_factor * dim >= 1, "
                f"got {expansion_factor} (dim={dim})"
            )
        if shared_dim < 1:
            raise ValueError(f"{self.kind}: shared_dim must be >= 1, got {shared_dim}")
        if not isinstance(rope, bool):
            raise ValueError(f"{self.kind}: rope must be true or false, got {rope!r}")
        if rope and shared_dim % 2:
            raise ValueError(
                f"{self.kind}: rope rotates channel pairs and needs an even shared_dim, "
                f"got {shared_dim}"
            )
        self.rope = rope
        self.dim = dim
        self.max_len = max_len
        self.expanded_dim = int(expansion_factor * dim)
        self.shared_dim = shared_dim
        self.hidden = nnx.Linear(dim, 2 * self.expanded_dim, rngs=rngs)
        self.shared = nnx.Linear(dim, shared_dim, rngs=rngs)
        init = nnx.initializers.normal(0.02)
        self.gamma = nnx.Param(init(rngs.params(), (num_offsets, shared_dim), jnp.float32))
        self.beta = nnx.Param(jnp.zeros((num_offsets, shared_dim), jnp.float32))
        self.rel_bias = RelativePositionBias(min(bias_span, max_len), rngs=rngs)
        self.out = nnx.Linear(self.expanded_dim, dim, rngs=rngs)
        self.dropout = nnx.Dropout(dropout_rate)

    def _check_call(self, x, mask, deterministic, rngs) -> tuple[int, int]:
        """(B, L); see ``check_call``."""
        return check_call(self.kind, x, mask, deterministic, rngs)

    def _project(self, x: jax.Array) -> tuple[jax.Array, jax.Array, list[jax.Array]]:
        """U, V float[B, L, e] and the offset/scaled copies of Z, each float[B, L, s] (rotated
        by RoPE at their global positions when ``rope``)."""
        u, v = jnp.split(nnx.silu(self.hidden(x)), 2, axis=-1)
        z = nnx.silu(self.shared(x))
        dtype = z.dtype
        gamma, beta = self.gamma[...].astype(dtype), self.beta[...].astype(dtype)
        # One [B, L, s] product per offset/scale (not a [B, L, n, s] tensor sliced n ways).
        parts = [z * gamma[i] + beta[i] for i in range(gamma.shape[0])]
        if self.rope:
            parts = [rope_rotate(part) for part in parts]
        return u, v, parts

    @staticmethod
    def _real_count(mask: jax.Array, dtype) -> jax.Array:
        """float[B]: number of real tokens per row, at least 1."""
        return jnp.maximum(jnp.sum(mask, axis=-1), 1).astype(dtype)


@register("flash_quad")
class FlashQuadAttention(_GatedAttentionUnit):
    """GAU with quadratic relu^2 attention over the whole sequence."""

    kind = "flash_quad"
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
        expansion_factor: float = 2.0,
        shared_dim: int = 128,
        rope: bool = False,
    ):
        del num_heads, qkv_dim  # single-head GAU; sizes come from expansion_factor, shared_dim
        # Two offset/scales of Z (Q, K); the bias spans max_len.
        self._setup(
            dim, max_len, rngs, dropout_rate, expansion_factor, shared_dim, 2, max_len, rope
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
        mask = mask.astype(bool)
        u, v, (q, k) = self._project(x)
        dtype = q.dtype
        count = self._real_count(mask, dtype)[:, None, None]
        logits = jnp.einsum("bis,bjs->bij", q, k) / count + self.rel_bias(n, dtype)
        weights = jnp.square(nnx.relu(logits)) * mask[:, None, :].astype(dtype)
        weights = self.dropout(weights, deterministic=deterministic, rngs=rngs)
        return self.out(u * jnp.einsum("bij,bje->bie", weights, v))


@register("flash")
class FlashAttention(_GatedAttentionUnit):
    """GAU with mixed chunk attention: relu^2 inside chunks + global linear across chunks."""

    kind = "flash"
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
        expansion_factor: float = 2.0,
        shared_dim: int = 128,
        chunk_size: int = 256,
        rope: bool = False,
    ):
        del num_heads, qkv_dim  # single-head GAU; sizes come from expansion_factor, shared_dim
        if chunk_size < 1:
            raise ValueError(f"flash: chunk_size must be >= 1, got {chunk_size}")
        self.chunk_size = chunk_size
        # Four offset/scales of Z (quadratic Q, K; linear Q, K); the bias spans a chunk.
        self._setup(
            dim, max_len, rngs, dropout_rate, expansion_factor, shared_dim, 4, chunk_size, rope
        )

    def __call__(
        self,
        x: jax.Array,
        *,
        mask: jax.Array,
        deterministic: bool = True,
        rngs: nnx.Rngs | None = None,
    ) -> jax.Array:
        self._check_call(x, mask, deterministic, rngs)
        mask = mask.astype(bool)
        u, v, (quad_q, quad_k, lin_q, lin_k) = self._project(x)
        dtype = quad_q.dtype
        key_mask = mask[..., None].astype(dtype)

        # Global linear part: one [s, e] summary of all real tokens, shared by every chunk.
        lin_kv = jnp.einsum("bns,bne->bse", lin_k * key_mask, v)
        lin_kv = lin_kv / self._real_count(mask, dtype)[:, None, None]
        linear = jnp.einsum("bns,bse->bne", lin_q, lin_kv)

        # Local quadratic part. The last, partial chunk (and a sequence shorter than one
        # chunk) runs as a chunk of its own length: the same result as padding it (padded
        # keys are masked), for less work.
        scale = jnp.asarray(1.0 / self.chunk_size, dtype)

        def chunk_attention(qq, qk, vc, mc):  # [B, C, g, ...] for any g
            g = qq.shape[2]
            logits = jnp.einsum("bcis,bcjs->bcij", qq, qk) * scale + self.rel_bias(g, dtype)
            weights = jnp.square(nnx.relu(logits)) * mc[:, :, None, :].astype(dtype)
            weights = self.dropout(weights, deterministic=deterministic, rngs=rngs)
            return jnp.einsum("bcij,bcje->bcie", weights, vc)

        quadratic = blockwise(chunk_attention, (quad_q, quad_k, v, mask), self.chunk_size)
        return self.out(u * (quadratic + linear))
