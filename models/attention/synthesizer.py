"""Synthesizer attention: Tay, Bahri, Metzler, Juan, Zhao and Zheng, ICML 2021,
"Synthesizer: Rethinking Self-Attention in Transformer Models".

The attention weights are synthesized instead of computed from query-key products:

    out = concat_h( softmax(S_h + [Q_h K_h^T / sqrt(d_h)] + mask bias) V_h ) W_o

with synthetic logits S_h float[L, L] per head (the bracketed term only when
``mix_dot_product=True``, the paper's "+ Vanilla" mixtures):

    "synthesizer_dense"       S_h[i, :] = W2 relu(W1 x_i + b1)_h + b2, sliced to the first L
                              of max_len outputs. W1: D -> E (split into H heads of d_h),
                              W2: d_h -> max_len shared by the heads (the JAX LRA code's layout).
                              Each query's row depends on that token alone.
    "synthesizer_random"      S_h = R_h[:L, :L], R float[H, max_len, max_len], input-independent.
    "synthesizer_factorized"  S_h = R1_h[:L] R2_h[:L]^T, R1, R2 float[H, max_len, rank]: the
                              paper's factorized random synthesizer (low rank, ``rank=32`` as
                              in the JAX LRA code's ``k=32``).

The paper's factorized DENSE variant (two projections to a and b logits with a * b = L, tiled)
is not provided: it needs L = a * b for every length, and the LRA code that the reported
Synthesizer numbers come from only factorizes the random variant.

Shapes (B batch, L length <= max_len, D model dim, H heads, E = qkv_dim, d_h = E / H):

    x:        float[B, L, D]
    mask:     bool[B, L]          True = real token; padded KEYS are excluded
    V:        float[B, L, H, d_h] from Dense D -> E (Q, K likewise when mixing)
    weights:  float[B, H, L, L]   softmax over keys, then dropout
    out:      float[B, L, D]

Options and their sources:

- ``mix_dot_product=False``: pure synthetic weights, the paper's basic variants. Note that the
  JAX LRA Synthesizer block calls its attention with ``ignore_dot_product=False``, i.e. its
  reported LRA runs mixed the dot product in; set True to match them.
- ``trainable_random=True`` (random, factorized): R is learned ("Random" in the paper);
  False keeps it fixed at its initial draw ("Fixed Random"), stored as a ``FixedRandom``
  variable rather than an ``nnx.Param`` so optimisers over ``nnx.Param`` leave it alone.
- ``rank=32`` (factorized): the JAX LRA default.

Random tables are Glorot-uniform per head (bound sqrt(6 / (fan_in + fan_out)) over one head's
matrix); the JAX LRA code applies Glorot-uniform to the whole [H, n, n] array, which also
counts the heads into the fans. Either way the initial weights are nearly uniform.

Padding: padded keys get the most negative finite logit, so their weight is exactly 0; a fully
padded row gives finite (uniform) weights. The synthetic logits of a real query never read
the values at other positions (dense: its own token; random: parameters only), so changing
padded inputs leaves real outputs unchanged. The L x L logits are the top-left block of a
max_len x max_len table fixed by position, so appending padding adds only excluded key
columns and leaves real outputs unchanged too; what depends on max_len is the parameter shape.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from lra.models.attention.common import MultiHeadAttention, check_int
from lra.models.registry import register

__all__ = [
    "DenseSynthesizerAttention",
    "FactorizedSynthesizerAttention",
    "FixedRandom",
    "RandomSynthesizerAttention",
]


class FixedRandom(nnx.Variable):
    """A random synthesizer table that is not trained (not an ``nnx.Param``)."""


class _SynthesizerAttention(MultiHeadAttention):
    """Shared body: value/output projections, optional dot-product logits, masked softmax.

    Subclasses set ``kind`` (the registered name) and implement ``_synthetic_logits``.
    """

    kind = "synthesizer"

    def __init__(
        self,
        dim: int,
        num_heads: int,
        max_len: int,
        rngs: nnx.Rngs,
        qkv_dim: int | None,
        dropout_rate: float,
        mix_dot_product: bool,
    ):
        self._init_heads(dim, num_heads, max_len, qkv_dim, dropout_rate)
        if max_len < 1:
            raise ValueError(f"{self.label}: max_len must be >= 1, got {max_len}")
        if not isinstance(mix_dot_product, bool):
            raise ValueError(
                f"{self.label}: mix_dot_product must be a bool, got {mix_dot_product!r}"
            )
        if mix_dot_product:
            self.query = self._dense_in(rngs)
            self.key = self._dense_in(rngs)
        else:
            self.query = self.key = None
        self.value = self._dense_in(rngs)
        self.out = self._dense_out(rngs)

    def _random_table(self, rngs: nnx.Rngs, shape: tuple[int, ...], trainable: bool):
        """A per-head Glorot-uniform table, learned or fixed."""
        if not isinstance(trainable, bool):
            raise ValueError(f"{self.label}: trainable_random must be a bool, got {trainable!r}")
        init = nnx.initializers.glorot_uniform(batch_axis=(0,))
        value = init(rngs.params(), shape, jnp.float32)
        return nnx.Param(value) if trainable else FixedRandom(value)

    def _synthetic_logits(self, x: jax.Array) -> jax.Array:
        """float[B or 1, H, L, L] logits for x float[B, L, D]."""
        raise NotImplementedError

    def __call__(
        self,
        x: jax.Array,
        *,
        mask: jax.Array,
        deterministic: bool = True,
        rngs: nnx.Rngs | None = None,
    ) -> jax.Array:
        _, n = self._check_call(x, mask, deterministic, rngs)
        self._check_length(n, "the synthetic logits have max_len key positions")
        v = self._heads(self.value(x))
        dtype = v.dtype
        logits = self._synthetic_logits(x).astype(dtype)
        if self.query is not None:
            q = self._heads(self.query(x)) * jnp.asarray(self.head_dim**-0.5, dtype)
            k = self._heads(self.key(x))
            logits = logits + jnp.einsum("bqhd,bkhd->bhqk", q, k)
        return self.out(self._merge(self._attend(logits, v, mask, deterministic, rngs)))


@register("synthesizer_dense")
class DenseSynthesizerAttention(_SynthesizerAttention):
    """Dense Synthesizer: each token predicts its own row of logits with a 2-layer MLP."""

    kind = "synthesizer_dense"
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
        mix_dot_product: bool = False,
    ):
        super().__init__(dim, num_heads, max_len, rngs, qkv_dim, dropout_rate, mix_dot_product)
        self.hidden = self._dense_in(rngs)
        self.to_logits = nnx.Linear(self.head_dim, max_len, rngs=rngs)

    def _synthetic_logits(self, x: jax.Array) -> jax.Array:
        n = x.shape[1]
        h = self._heads(jax.nn.relu(self.hidden(x))).transpose(0, 2, 1, 3)  # [B, H, L, d_h]
        kernel = self.to_logits.kernel[:, :n].astype(h.dtype)
        bias = self.to_logits.bias[:n].astype(h.dtype)
        return h @ kernel + bias


@register("synthesizer_random")
class RandomSynthesizerAttention(_SynthesizerAttention):
    """Random Synthesizer: one max_len x max_len logit table per head."""

    kind = "synthesizer_random"
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
        trainable_random: bool = True,
        mix_dot_product: bool = False,
    ):
        super().__init__(dim, num_heads, max_len, rngs, qkv_dim, dropout_rate, mix_dot_product)
        self.random_logits = self._random_table(
            rngs, (num_heads, max_len, max_len), trainable_random
        )

    def _synthetic_logits(self, x: jax.Array) -> jax.Array:
        n = x.shape[1]
        return self.random_logits[:, :n, :n][None]


@register("synthesizer_factorized")
class FactorizedSynthesizerAttention(_SynthesizerAttention):
    """Factorized Random Synthesizer: per-head logits R1 R2^T of rank ``rank``."""

    kind = "synthesizer_factorized"
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
        rank: int = 32,
        trainable_random: bool = True,
        mix_dot_product: bool = False,
    ):
        super().__init__(dim, num_heads, max_len, rngs, qkv_dim, dropout_rate, mix_dot_product)
        check_int(self.label, "rank", rank)
        shape = (num_heads, max_len, rank)
        self.random_left = self._random_table(rngs, shape, trainable_random)
        self.random_right = self._random_table(rngs, shape, trainable_random)

    def _synthetic_logits(self, x: jax.Array) -> jax.Array:
        n = x.shape[1]
        left, right = self.random_left[:, :n], self.random_right[:, :n]
        return jnp.einsum("hqr,hkr->hqk", left, right)[None]
