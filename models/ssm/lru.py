"""LRU, the Linear Recurrent Unit: Orvieto, Smith, Gu, Fernando, Gulcehre, Pascanu and De,
"Resurrecting Recurrent Neural Networks for Long Sequences" (ICML 2023). The definitions follow
the paper's Appendix A (its simplified JAX implementation); there is no official code release
(NicolasZucchet/minimal-LRU, an unofficial port of Appendix A, was read to cross-check).

A diagonal complex linear recurrence per direction, with N = ``state_size`` states:

    lambda   = exp(-exp(nu_log) + i exp(theta_log))           complex[N], |lambda| < 1
    gamma    = exp(gamma_log)                                  float[N]
    h_t      = lambda * h_{t-1} + gamma * (B x_t)              complex[N], h_{-1} = 0
    y_t      = Re(C h_t) + D * x_t                             float[D]

with B = B_re + i B_im (complex[N, D]) and C = C_re + i C_im (complex[D, N]).

Initialisation (Appendix A, "ring initialisation"): with u1, u2 ~ U[0, 1),

    nu_log    = log(-1/2 log(u1 (r_max^2 - r_min^2) + r_min^2))   so |lambda| ~ U on the ring
    theta_log = log(max_phase u2)                                  so arg(lambda) in [0, max_phase]
    gamma_log = log sqrt(1 - |lambda|^2)                           the normalisation
    B_re, B_im ~ N(0, 1 / (2D)),  C_re, C_im ~ N(0, 1 / N),  D ~ N(0, 1)

``gamma_log`` is computed as 1/2 log(-expm1(-2 exp(nu_log))), the same number written so that
|lambda| near 1 does not round 1 - |lambda|^2 to 0 in float32. u1 and u2 are drawn from
[tiny, 1) so no logarithm sees 0. ``gamma_log`` is a trained parameter, as in Appendix A.

The recurrence is evaluated by ``jax.lax.associative_scan`` (``common.linear_recurrence``), in
complex64 whatever the parameter dtype (there is no complex bfloat16), and the output is cast
back to the input dtype.

Bidirectional (``bidirectional=True``, the default): a second LRU with its own nu_log,
theta_log, gamma_log, B and C runs over each row's real tokens reversed
(``common.reverse_real``: the backward scan starts at the row's LAST REAL token, not at the
padded end), its outputs are put back in order and added: y = Re(C_f h_f) + Re(C_b h_b) + D x
(one D). The two directions are two scans: putting them side by side in one scan of 2N
states saved no compile time and took 40-60% more memory (measured on CPU). The LRU paper's
LRA models follow S5's deep-SSM set-up, whose LRA runs are bidirectional (lindermanlab/S5
``bin/run_experiments/run_lra_*.sh``: ``--bidirectional=True``). The LRU paper (Appendix D)
runs unidirectional LRUs except on Pathfinder and Path-X: ``protocol=authors`` sets the flag
per task (configs/protocol_model_task/authors_lru_*.yaml); the model default stays True.

Causal mode (``causal=True``, for next-token pretraining, issue 28): only the forward (causal)
direction runs; y = Re(C_f h_f) + D x. The parameters are those of ``bidirectional`` (the
backward direction's stay, unused and untrained, so a causal-pretrained encoder loads into a
bidirectional classifier with the same parameter tree). With ``bidirectional=False`` the layer
is causal already and ``causal`` changes nothing.

Options (defaults in configs/model/lru.yaml): ``state_size`` N, ``r_min``, ``r_max``,
``max_phase``, ``bidirectional``. ``num_heads`` and ``qkv_dim`` are accepted for the contract
and unused (the LRU has no heads). ``dropout_rate`` (the harness's attention dropout) drops the
recurrent contribution Re(C h) before the D skip is added; Appendix A has no dropout inside
the LRU (its block drops after the LRU), so set the task's attention dropout to 0 to match.

Shapes (B batch, L length, D = dim, N = state_size):

    x:        float[B, L, D]      mask: bool[B, L], True = real token (a prefix mask)
    B x_t:    complex[B, L, N]
    h:        complex[B, L, N]
    out:      float[B, L, D]

Padding: inputs at padded positions are zeroed before the scan; padding follows the real
tokens, so a forward scan's real outputs never see it, and the backward scan runs on
``reverse_real`` rows whose padding is also at the end. Outputs at real tokens are therefore
independent of padded inputs and of how much padding follows (``same_without_padding``).
Memory is O(B L N): ``memory_class = "linear"``.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from flax import nnx

from lra.models.attention.common import check_call, check_dropout, check_int
from lra.models.registry import register
from lra.models.ssm.common import linear_recurrence, reverse_real, zero_padded

__all__ = [
    "LRU",
    "LRUDirection",
    "gamma_log_of",
    "lru_readout",
    "lru_scan",
    "lru_terms",
    "ring_init",
]

LABEL = "lru"


def ring_init(
    key: jax.Array, n: int, r_min: float, r_max: float, max_phase: float
) -> tuple[jax.Array, jax.Array]:
    """(nu_log, theta_log) float32[n]: |lambda| uniform on the ring [r_min, r_max] (uniform in
    area: |lambda|^2 ~ U[r_min^2, r_max^2]) and arg(lambda) ~ U[0, max_phase]."""
    k1, k2 = jax.random.split(key)
    tiny = float(jnp.finfo(jnp.float32).tiny)
    u1 = jax.random.uniform(k1, (n,), jnp.float32, minval=tiny)
    u2 = jax.random.uniform(k2, (n,), jnp.float32, minval=tiny)
    nu_log = jnp.log(-0.5 * jnp.log(u1 * (r_max**2 - r_min**2) + r_min**2))
    theta_log = jnp.log(max_phase * u2)
    return nu_log, theta_log


def gamma_log_of(nu_log: jax.Array) -> jax.Array:
    """log sqrt(1 - |lambda|^2) with |lambda| = exp(-exp(nu_log)), computed stably."""
    return 0.5 * jnp.log(-jnp.expm1(-2.0 * jnp.exp(nu_log)))


def lru_terms(
    x: jax.Array,
    nu_log: jax.Array,
    theta_log: jax.Array,
    gamma_log: jax.Array,
    b_re: jax.Array,
    b_im: jax.Array,
) -> tuple[jax.Array, jax.Array]:
    """The scan's pairs: lambda complex64[1, 1, N] and gamma B x_t complex64[B, L, N]."""
    f32 = jnp.float32
    nu_log, theta_log, gamma_log = (p.astype(f32) for p in (nu_log, theta_log, gamma_log))
    lam = jnp.exp(-jnp.exp(nu_log) + 1j * jnp.exp(theta_log))  # complex64[N]
    b = (b_re.astype(f32) + 1j * b_im.astype(f32)) * jnp.exp(gamma_log)[:, None]  # [N, D]
    bx = jnp.einsum("bld,nd->bln", x.astype(f32).astype(b.dtype), b)
    return lam[None, None, :], bx


def lru_readout(h: jax.Array, c_re: jax.Array, c_im: jax.Array) -> jax.Array:
    """Re(C h) float32[B, L, D] of h complex64[B, L, N]: C_re Re(h) - C_im Im(h), two real
    products and no complex output buffer."""
    f32 = jnp.float32
    return jnp.einsum("bln,dn->bld", jnp.real(h), c_re.astype(f32)) - jnp.einsum(
        "bln,dn->bld", jnp.imag(h), c_im.astype(f32)
    )


def lru_scan(
    x: jax.Array,
    nu_log: jax.Array,
    theta_log: jax.Array,
    gamma_log: jax.Array,
    b_re: jax.Array,
    b_im: jax.Array,
    c_re: jax.Array,
    c_im: jax.Array,
) -> jax.Array:
    """Re(C h_t) float32[B, L, D] for x float[B, L, D], h_t = lambda h_{t-1} + gamma B x_t.

    Parameters as in the module docstring (nu_log, theta_log, gamma_log: [N]; b_*: [N, D];
    c_*: [D, N]); everything is computed in float32 / complex64.
    """
    h = linear_recurrence(*lru_terms(x, nu_log, theta_log, gamma_log, b_re, b_im))
    return lru_readout(h, c_re, c_im)


class LRUDirection(nnx.Module):
    """The recurrent part of one direction: nu_log, theta_log, gamma_log, B and C."""

    def __init__(
        self,
        *,
        dim: int,
        state_size: int,
        r_min: float,
        r_max: float,
        max_phase: float,
        rngs: nnx.Rngs,
    ):
        nu_log, theta_log = ring_init(rngs.params(), state_size, r_min, r_max, max_phase)
        self.nu_log = nnx.Param(nu_log)
        self.theta_log = nnx.Param(theta_log)
        self.gamma_log = nnx.Param(gamma_log_of(nu_log))
        normal = jax.random.normal
        scale_b = 1.0 / math.sqrt(2 * dim)
        scale_c = 1.0 / math.sqrt(state_size)
        self.B_re = nnx.Param(normal(rngs.params(), (state_size, dim)) * scale_b)
        self.B_im = nnx.Param(normal(rngs.params(), (state_size, dim)) * scale_b)
        self.C_re = nnx.Param(normal(rngs.params(), (dim, state_size)) * scale_c)
        self.C_im = nnx.Param(normal(rngs.params(), (dim, state_size)) * scale_c)

    def terms(self, x: jax.Array) -> tuple[jax.Array, jax.Array]:
        """(lambda [1, 1, N], gamma B x [B, L, N]) of x float[B, L, D]."""
        return lru_terms(
            x,
            self.nu_log[...],
            self.theta_log[...],
            self.gamma_log[...],
            self.B_re[...],
            self.B_im[...],
        )

    def readout(self, h: jax.Array) -> jax.Array:
        return lru_readout(h, self.C_re[...], self.C_im[...])

    def __call__(self, x: jax.Array) -> jax.Array:
        """Re(C h) float32[B, L, D] of x float[B, L, D] (padding already handled)."""
        return self.readout(linear_recurrence(*self.terms(x)))


@register("lru")
class LRU(nnx.Module):
    """The Linear Recurrent Unit as a token mixer, optionally bidirectional."""

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
        r_min: float = 0.9,
        r_max: float = 0.999,
        max_phase: float = 2 * math.pi,
        bidirectional: bool = True,
        causal: bool = False,
    ):
        check_int(LABEL, "dim", dim)
        check_int(LABEL, "state_size", state_size)
        check_dropout(LABEL, dropout_rate)
        self.causal = bool(causal)
        if not 0.0 <= r_min < r_max <= 1.0:
            raise ValueError(f"{LABEL}: need 0 <= r_min < r_max <= 1, got {r_min}, {r_max}")
        if not 0.0 < max_phase <= 2 * math.pi + 1e-6:
            raise ValueError(f"{LABEL}: max_phase must be in (0, 2 pi], got {max_phase}")
        if not isinstance(bidirectional, bool):
            raise ValueError(f"{LABEL}: bidirectional must be true or false, got {bidirectional!r}")
        self.dim, self.state_size, self.bidirectional = dim, state_size, bidirectional
        options = dict(dim=dim, state_size=state_size, r_min=r_min, r_max=r_max)
        self.forward = LRUDirection(**options, max_phase=max_phase, rngs=rngs)
        self.backward = (
            LRUDirection(**options, max_phase=max_phase, rngs=rngs) if bidirectional else None
        )
        self.D = nnx.Param(jax.random.normal(rngs.params(), (dim,)))
        self.dropout = nnx.Dropout(dropout_rate)

    def __call__(
        self,
        x: jax.Array,
        *,
        mask: jax.Array,
        deterministic: bool = True,
        rngs: nnx.Rngs | None = None,
    ) -> jax.Array:
        check_call(LABEL, x, mask, deterministic, rngs, needs="dropout")
        x0 = zero_padded(x, mask)
        y = self.forward(x0)
        if self.backward is not None and not self.causal:
            y = y + reverse_real(self.backward(reverse_real(x0, mask)), mask)
        y = self.dropout(y, deterministic=deterministic, rngs=rngs)
        y = y + self.D[...].astype(jnp.float32) * x0.astype(jnp.float32)
        return y.astype(x.dtype)
