"""S5: Smith, Warrington and Linderman, 2023, "Simplified State Space Layers for Sequence
Modeling" (ICLR 2023). Reference code: lindermanlab/S5 ``s5/ssm.py`` (``S5SSM``,
``apply_ssm``), ``s5/ssm_init.py`` (HiPPO initialisation), ``s5/layers.py`` (the layer's
activation and gating) and ``s5/train.py`` (the block-diagonal initialisation).

One multi-input multi-output diagonal SSM over all H = ``dim`` channels, with P =
``state_size`` states kept as P/2 complex states (conjugate symmetry, ``conj_sym``):

    x_t = Lambda_bar x_{t-1} + B_bar u_t,   y_t = 2 Re C x_t + D u_t
    Lambda complex[P/2], B complex[P/2, H], C complex[H, P/2], D float[H]

discretised by zero-order hold with one step Delta_p per state (``log_step`` [P/2],
log-uniform in [dt_min, dt_max]):

    Lambda_bar = exp(Delta Lambda),   B_bar = (Lambda_bar - 1) / Lambda * B

(``discretization: bilinear``: Lambda_bar = (1 + Delta Lambda/2)/(1 - Delta Lambda/2),
B_bar = Delta/(1 - Delta Lambda/2) B), and run with ``jax.lax.associative_scan``
(:func:`lra.models.ssm.common.linear_recurrence`).

Initialisation (``blocks`` = J): Lambda is the HiPPO-N eigenvalues (the normal part of
HiPPO-LegS of size P/J, the P/(2J) with negative imaginary part, real part -1/2) repeated
on J blocks; with V the block-diagonal matrix of the matching eigenvectors [P, P/2],
B = V^* B_0 with B_0 real [P, H] ~ lecun normal, and C = C_0 V with C_0 complex [H, P]
drawn per ``c_init`` (``lecun_normal``: lecun normal over the shape [H, P, 2], as the
reference does; ``trunc_standard_normal``: each row lecun normal over [1, P, 2];
``complex_normal``: C drawn directly, variance 1/2 per part, without V); D ~ N(0, 1).

Bidirectional (``bidirectional``, default True as in every S5 LRA script): a second scan
with the same Lambda_bar and B_bar runs backward from each row's LAST REAL token (over the
real tokens reversed with :func:`lra.models.ssm.common.reverse_real`, then reversed back)
and has its own C (``c2``): y_t = 2 Re (C1 x_t + C2 x'_t) + D u_t with
x'_t = Lambda_bar x'_{t+1} + B_bar u_t. Padded inputs are zeroed before the scans.

Causal mode (``causal=True``, for next-token pretraining, issue 28): only the forward (causal)
direction runs; the backward scan and its ``c2`` are skipped. The parameters are those of
``bidirectional`` (the backward direction's stay, unused and untrained, so a causal-pretrained
encoder loads into a bidirectional classifier with the same parameter tree). With
``bidirectional=False`` the layer is causal already and ``causal`` changes nothing.

Layer output (``activation``, the reference's ``activation_fn``):

    gelu:       out = GELU(y)
    half_glu1:  g = GELU(y);  out = g * sigmoid(W2 g)
    half_glu2:  out = y * sigmoid(W2 GELU(y))              (the LRA scripts' choice)
    full_glu:   g = GELU(y);  out = (W1 g) * sigmoid(W2 g)

with dropout after GELU as in ``layers.py``; GELU is the tanh approximation (flax's
``nn.gelu`` default, which the reference calls). The encoder block around the mixer adds the
norm, the residual and the MLP. ``num_heads`` and ``qkv_dim`` are accepted (the contract)
and unused.

Departures: the reference's separate SSM learning rate (``ssm_lr_base``) and BatchNorm are
not applied here (later parts of issue 27).

Shapes: x float[B, L, D] (D = H = dim), mask bool[B, L] (a prefix mask), out float[B, L, D].
The SSM runs in float32 / complex64 whatever the input dtype; the output has x's dtype.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from lra.models.attention.common import check_call, check_dropout, check_int
from lra.models.registry import register
from lra.models.ssm.common import hippo_legs_normal, linear_recurrence, reverse_real, zero_padded
from lra.models.ssm.s4d import DISCRETISATIONS, discretize

__all__ = ["S5", "s5_init"]

C_INITS = ("lecun_normal", "trunc_standard_normal", "complex_normal")
ACTIVATIONS = ("gelu", "half_glu1", "half_glu2", "full_glu")


def s5_init(state_size: int, blocks: int) -> tuple[np.ndarray, np.ndarray]:
    """(Lambda complex128[P/2], V complex128[P, P/2]): HiPPO-N eigenvalues and eigenvectors of
    size P/J on J diagonal blocks."""
    lam, v, _ = hippo_legs_normal(state_size // blocks)
    return np.tile(lam, blocks), np.kron(np.eye(blocks), v)


def _complex(pair: jax.Array) -> jax.Array:
    pair = pair.astype(jnp.float32)
    return jax.lax.complex(pair[..., 0], pair[..., 1])


def _pair(z: jax.Array) -> jax.Array:
    """complex[...] -> float32[..., 2] (real and imaginary parts)."""
    return jnp.stack([z.real, z.imag], axis=-1).astype(jnp.float32)


@register("s5")
class S5(nnx.Module):
    """S5 mixer (see the module docstring). x float[B, L, D], mask bool[B, L] -> [B, L, D]."""

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
        state_size: int = 256,
        blocks: int = 8,
        c_init: str = "lecun_normal",
        discretization: str = "zoh",
        dt_min: float = 0.001,
        dt_max: float = 0.1,
        bidirectional: bool = True,
        activation: str = "half_glu2",
        causal: bool = False,
    ):
        label = "s5"
        self.causal = bool(causal)
        check_int(label, "dim", dim)
        check_int(label, "state_size", state_size, minimum=2)
        check_int(label, "blocks", blocks)
        if state_size % blocks or (state_size // blocks) % 2:
            raise ValueError(
                f"{label}: state_size / blocks must be an even integer (conjugate pairs), got "
                f"{state_size} / {blocks}"
            )
        check_dropout(label, dropout_rate)
        for name, value, allowed in (
            ("c_init", c_init, C_INITS),
            ("discretization", discretization, DISCRETISATIONS),
            ("activation", activation, ACTIVATIONS),
        ):
            if value not in allowed:
                raise ValueError(f"{label}: {name} must be one of {allowed}, got {value!r}")
        if not 0.0 < dt_min <= dt_max:
            raise ValueError(f"{label}: need 0 < dt_min <= dt_max, got {dt_min}, {dt_max}")
        self.dim, self.state_size = dim, state_size
        self.discretization, self.bidirectional = discretization, bool(bidirectional)
        self.activation = activation
        h, p = dim, state_size

        lam, v = s5_init(state_size, blocks)
        k_b, k_c1, k_c2, k_d, k_dt = jax.random.split(rngs.params(), 5)
        self.lambda_re = nnx.Param(jnp.asarray(lam.real, jnp.float32))
        self.lambda_im = nnx.Param(jnp.asarray(lam.imag, jnp.float32))
        b0 = jax.nn.initializers.lecun_normal()(k_b, (p, h), jnp.float32)
        self.b = nnx.Param(_pair(jnp.asarray(v.conj().T, jnp.complex64) @ b0))  # [P/2, H, 2]
        self.c1 = nnx.Param(self._draw_c(k_c1, c_init, h, v))  # [H, P/2, 2]
        if self.bidirectional:
            self.c2 = nnx.Param(self._draw_c(k_c2, c_init, h, v))
        self.d = nnx.Param(jax.random.normal(k_d, (h,), jnp.float32))
        self.log_step = nnx.Param(
            jax.random.uniform(k_dt, (p // 2,), jnp.float32, math.log(dt_min), math.log(dt_max))
        )
        self.dropout = nnx.Dropout(dropout_rate)
        if activation in ("half_glu1", "half_glu2", "full_glu"):
            self.out2 = nnx.Linear(h, h, rngs=rngs)
        if activation == "full_glu":
            self.out1 = nnx.Linear(h, h, rngs=rngs)

    @staticmethod
    def _draw_c(key: jax.Array, c_init: str, h: int, v: np.ndarray) -> jax.Array:
        """C as float32[H, P/2, 2] (real and imaginary parts)."""
        p, half = v.shape
        if c_init == "complex_normal":
            return jax.random.normal(key, (h, half, 2), jnp.float32) * math.sqrt(0.5)
        if c_init == "lecun_normal":
            c0 = jax.nn.initializers.lecun_normal()(key, (h, p, 2), jnp.float32)
        else:  # trunc_standard_normal: one lecun-normal [1, P, 2] draw per row
            keys = jax.random.split(key, h)
            init = jax.nn.initializers.lecun_normal()
            c0 = jnp.concatenate([init(k, (1, p, 2), jnp.float32) for k in keys])
        return _pair(jax.lax.complex(c0[..., 0], c0[..., 1]) @ jnp.asarray(v, jnp.complex64))

    def ssm(self):
        """(Lambda_bar complex64[P/2], B_bar complex64[P/2, H])."""
        lam = jax.lax.complex(
            self.lambda_re[...].astype(jnp.float32), self.lambda_im[...].astype(jnp.float32)
        )
        step = jnp.exp(self.log_step[...].astype(jnp.float32))
        log_lambda_bar, b_bar = discretize(
            lam[:, None], _complex(self.b[...]), step[:, None], self.discretization
        )
        return jnp.exp(log_lambda_bar[:, 0]), b_bar

    def scan(self, u: jax.Array, mask: jax.Array) -> jax.Array:
        """y = 2 Re C x (+ the backward direction) + D u: u float32[B, L, H], padding zeroed."""
        lambda_bar, b_bar = self.ssm()
        bu = jnp.einsum("blh,ph->blp", u.astype(jnp.complex64), b_bar)  # [B, L, P/2]
        xs = linear_recurrence(lambda_bar[None, None, :], bu)
        y = jnp.einsum("blp,hp->blh", xs, _complex(self.c1[...])).real
        if self.bidirectional and not self.causal:
            back = reverse_real(
                linear_recurrence(lambda_bar[None, None, :], reverse_real(bu, mask)), mask
            )
            y = y + jnp.einsum("blp,hp->blh", back, _complex(self.c2[...])).real
        return 2.0 * y + u * self.d[...].astype(jnp.float32)

    def __call__(
        self,
        x: jax.Array,
        *,
        mask: jax.Array,
        deterministic: bool = True,
        rngs: nnx.Rngs | None = None,
    ) -> jax.Array:
        check_call("s5", x, mask, deterministic, rngs, needs="dropout")
        u = zero_padded(x.astype(jnp.float32), mask)
        y = self.scan(u, mask).astype(x.dtype)

        def drop(z):
            return self.dropout(z, deterministic=deterministic, rngs=rngs)

        if self.activation == "gelu":
            out = drop(jax.nn.gelu(y, approximate=True))
        elif self.activation == "half_glu1":
            g = drop(jax.nn.gelu(y, approximate=True))
            out = drop(g * jax.nn.sigmoid(self.out2(g)))
        elif self.activation == "half_glu2":
            g = drop(jax.nn.gelu(y, approximate=True))
            out = drop(y * jax.nn.sigmoid(self.out2(g)))
        else:
            g = drop(jax.nn.gelu(y, approximate=True))
            out = drop(self.out1(g) * jax.nn.sigmoid(self.out2(g)))
        return zero_padded(out, mask)
