"""Performer attention (FAVOR+): Choromanski, Likhosherstov, Dohan, Song, Gane, Sarlos, Hawkins,
Davis, Mohiuddin, Kaiser, Belanger, Colwell and Weller, 2021, "Rethinking Attention with
Performers" (ICLR 2021).

Softmax attention softmax(Q K^T / sqrt(d)) V is estimated with positive random features. With
x' = x * d^(-1/4) (so that q'.k' = q.k / sqrt(d)) and m rows w_r of a random matrix W:

    phi(x) = exp(W x' - |x'|^2 / 2) / sqrt(m)                   float[m], positive
    out    = D^-1 phi(Q) (phi(K)^T V),   D = diag(phi(Q) phi(K)^T 1_L)

E[phi(q)^T phi(k)] = exp(q.k / sqrt(d)) for Gaussian w_r, so out estimates softmax attention;
the error shrinks as m grows. The rows of W are orthogonal within blocks of d ("positive
orthogonal random features"): each block is the Q factor of the QR decomposition of a d x d
Gaussian matrix, transposed, and row r is rescaled by the norm of an independent d-dim
Gaussian vector (chi-distributed with d degrees of freedom), so each row is marginally
Gaussian as in the paper. One W is shared by all heads of a layer (as in the authors' JAX
code, google-research/performer fast_attention.py).

Departure from the authors' code in the draw: they use the Q factor exactly as QR returns it.
Householder QR fixes the signs of R's diagonal, which ties the signs of Q's columns to the
input, so the rows are not uniformly distributed directions and the estimate is biased; here
each column is multiplied by sign(R_jj), which makes Q Haar-distributed (Mezzadri 2007). In
this project's test set-up without that correction the error against exact softmax stopped
improving past m ~ 1024 (i.i.d. features kept improving); with it, it keeps shrinking.

Stabilisation (exact: every subtracted term cancels in D^-1): queries subtract, per query, the
max over features of the exponent W x' - |x'|^2/2; keys subtract one max per (row, head) over
all REAL keys and all features (masked keys are excluded from that max). Both maxima are held
constant for gradients (stop_gradient, as the PyTorch ports do with detach; the authors' JAX
code maximises only W x', which differs by terms that cancel as well). The authors also add
1e-6 inside every feature and lift denominators below 1e-6 by 2e-6; neither is done here:
after the max subtraction legitimate denominators reach 1e-9 for inputs of scale 3, so such a
floor would bias the output. The denominator is floored at sqrt(smallest normal number)
instead (about 1e-19 in float32 and bfloat16): a row with no real key (0 / floor = 0) then has
finite gradients, since floor^2 is still a normal number.

Shapes (B batch, L length, D model dim, H heads, E = qkv_dim, d = E / H, m = num_features):

    x:                 float[B, L, D]
    mask:              bool[B, L]          True = real token
    Q, K, V:           float[B, L, H, d]   from Dense D -> E (as in softmax.py)
    W (features):      float32[m, d]       a non-trainable ``RandomFeatures`` variable
    phi(Q), phi(K):    float[B, L, H, m]
    phi(K)^T V:        float[B, H, m, d]
    out:               float[B, L, D]      heads concatenated, dropout, Dense E -> D

Options:
- ``num_features`` (m, default 256): the default of ``make_fast_softmax_attention`` in the
  authors' code (google-research/performer fast_attention/jax, and its fork in
  google-research/long-range-arena lra_benchmarks/models/performer/performer_attention.py).
- ``redraw`` (default "fixed"): "fixed" draws W once at init from the init ``rngs`` (its
  "params" stream) and keeps it; "every_call" draws a fresh W from the call-time ``rngs``
  (its "dropout" stream, the one the encoder threads) on every call with
  deterministic=False and uses the fixed W when deterministic=True. Either way
  deterministic=True is a pure function of params, the stored W and the inputs. (The
  authors' LRA code redrew W from a seed computed from the sum of the queries; the LRA
  Performer results themselves came from a deterministic ReLU kernel, see REFERENCE.md.)

There is no L x L weight matrix to drop, so ``dropout_rate`` is applied to the per-head
outputs (the concatenated context vectors) before the output projection; the authors' code
ignores attention dropout.

Padding: the exponent of a masked key is replaced by the most negative finite value before
exp (its feature is exactly 0, and no huge padded value can overflow or reach the gradient),
and the features are then multiplied by the mask, before both phi(K)^T V and the normaliser
sum. The key maximum runs over real keys only. With fixed features nothing depends on L, so
appending padding leaves outputs at real positions unchanged. A row with no real key gets a
zero context, not NaN.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from flax import nnx

from lra.models.attention.common import MultiHeadAttention, lowest
from lra.models.registry import register

__all__ = ["PerformerAttention", "RandomFeatures", "orthogonal_random_features"]

REDRAW_POLICIES = ("fixed", "every_call")


class RandomFeatures(nnx.Variable):
    """The random projection W of a Performer layer: state, not a trainable parameter."""


@functools.partial(jax.jit, static_argnums=(1, 2))
def orthogonal_random_features(key: jax.Array, num_features: int, dim: int) -> jax.Array:
    """float32[num_features, dim]: rows orthogonal within blocks of ``dim``, chi-distributed norms.

    ceil(num_features / dim) independent d x d Gaussian matrices are QR-decomposed; the rows of
    each transposed Q factor are orthonormal; they are stacked, cut to ``num_features`` rows,
    and row r is scaled by the norm of an independent standard Gaussian vector in R^dim.
    """
    num_blocks = -(-num_features // dim)
    block_key, norm_key = jax.random.split(key)
    gaussian = jax.random.normal(block_key, (num_blocks, dim, dim), jnp.float32)
    q_factor, r_factor = jnp.linalg.qr(gaussian)
    # Column j times sign(R_jj): Q becomes Haar-distributed (see the module docstring).
    signs = jnp.sign(jnp.diagonal(r_factor, axis1=-2, axis2=-1))
    q_factor = q_factor * jnp.where(signs == 0, 1.0, signs)[:, None, :]
    rows = jnp.swapaxes(q_factor, -1, -2).reshape(num_blocks * dim, dim)[:num_features]
    norms = jnp.linalg.norm(jax.random.normal(norm_key, (num_features, dim), jnp.float32), axis=-1)
    return rows * norms[:, None]


def positive_features(x: jax.Array, features: jax.Array, valid: jax.Array | None) -> jax.Array:
    """phi(x) * exp(-max): float[B, H, L, m] from x float[B, H, L, d] (already scaled).

    Head-major, so the features come out in the layout their products over L use (XLA
    otherwise writes these, the largest tensors of the layer, transposed: about a quarter
    of the train step on CPU). ``valid`` None (queries): one max per (row, head, position)
    over the features. Otherwise ``valid`` is bool[B, L] (keys): one max per (row, head)
    over the real keys and all features, and masked keys get feature 0.
    """
    dtype = x.dtype
    ratio = jnp.asarray(features.shape[0] ** -0.5, dtype)
    exponent = jnp.einsum("bhld,md->bhlm", x, features) - 0.5 * jnp.sum(
        jnp.square(x), axis=-1, keepdims=True
    )
    if valid is None:
        shift = jnp.max(exponent, axis=-1, keepdims=True)
        return jnp.exp(exponent - jax.lax.stop_gradient(shift)) * ratio
    low = lowest(dtype)
    real = valid.astype(bool)[:, None, :, None]
    shift = jnp.max(jnp.where(real, exponent, low), axis=(2, 3), keepdims=True)
    shift = jnp.where(shift > low, shift, jnp.asarray(0, dtype))  # rows with no real key
    exponent = jnp.where(real, exponent - jax.lax.stop_gradient(shift), low)
    return jnp.exp(exponent) * ratio * real.astype(dtype)


@register("performer")
class PerformerAttention(MultiHeadAttention):
    """Multi-head FAVOR+ attention with positive orthogonal random features."""

    kind = "performer"
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
        num_features: int = 256,
        redraw: str = "fixed",
    ):
        self._init_heads(dim, num_heads, max_len, qkv_dim, dropout_rate)
        if not isinstance(num_features, int) or num_features < 1:
            raise ValueError(
                f"performer attention: num_features must be a positive int, got {num_features!r}"
            )
        if redraw not in REDRAW_POLICIES:
            raise ValueError(
                f"performer attention: redraw must be one of {REDRAW_POLICIES}, got {redraw!r}"
            )
        self.num_features = num_features
        self.redraw = redraw
        self._init_projections(rngs)
        self.features = RandomFeatures(
            orthogonal_random_features(rngs.params(), num_features, self.head_dim)
        )

    def __call__(
        self,
        x: jax.Array,
        *,
        mask: jax.Array,
        deterministic: bool = True,
        rngs: nnx.Rngs | None = None,
    ) -> jax.Array:
        self._check_call(
            x, mask, deterministic, rngs, needs="attention dropout and feature redraws"
        )
        if self.redraw == "every_call" and not deterministic:
            features = orthogonal_random_features(rngs.dropout(), self.num_features, self.head_dim)
        else:
            features = self.features[...]
        q, k, v = (jnp.swapaxes(t, 1, 2) for t in self._qkv(x))  # [B, H, L, d]
        dtype = q.dtype
        features = features.astype(dtype)
        scale = jnp.asarray(self.head_dim**-0.25, dtype)
        phi_q = positive_features(q * scale, features, None)  # [B, H, L, m]
        phi_k = positive_features(k * scale, features, mask)

        floor = jnp.asarray(jnp.sqrt(jnp.finfo(dtype).tiny), dtype)
        kv = jnp.einsum("bhkm,bhke->bhme", phi_k, v)
        normaliser = jnp.einsum("bhqm,bhm->bhq", phi_q, jnp.sum(phi_k, axis=2))
        y = jnp.einsum("bhqm,bhme->bhqe", phi_q, kv) / jnp.maximum(normaliser, floor)[..., None]
        y = jnp.swapaxes(y, 1, 2)  # [B, L, H, e]
        y = self.dropout(self._merge(y), deterministic=deterministic, rngs=rngs)
        return self.out(y)
