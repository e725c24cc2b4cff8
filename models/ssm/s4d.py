"""S4D: Gu, Gupta, Goel and Re, 2022, "On the Parameterization and Initialization of Diagonal
State Space Models" (NeurIPS 2022). Reference code: state-spaces/s4 ``models/s4/s4d.py`` (the
standalone S4D layer) and ``src/models/sequence/kernels/ssm.py`` (``SSMKernelDiag``, with
the initialisations of ``kernels/dplr.py`` and ``hippo/hippo.py``).

One single-input single-output diagonal SSM per channel (H = ``dim`` channels, N =
``state_size``, kept as N/2 complex states with their conjugates implied):

    x'(t) = A x(t) + B u(t),  y(t) = 2 Re C x(t),     A, B, C complex[H, N/2] (A diagonal)

discretised with a step Delta_h per channel (log-uniform in [dt_min, dt_max] at init):

    zoh:       Abar = exp(Delta A),                 Bbar = (exp(Delta A) - 1) / A * B
    bilinear:  Abar = (1 + Delta A/2)/(1 - Delta A/2), Bbar = Delta / (1 - Delta A/2) * B

and applied as a causal convolution with the kernel

    K_l = 2 Re sum_n C_n Bbar_n Abar_n^l,   l = 0..L-1           float[H, L]

built by a Vandermonde product (exp(l log Abar), as the reference's naive backend), and
computed with FFTs of length 2L (u and K zero-padded to 2L, so there is no circular
wrap-around). Initialisations of A (``init``; the reference's ``diag-*`` options):

    lin:   A_n = -1/2 - i pi n                                    B_n = 1
    inv:   A_n = -1/2 - i (N/pi) (N/(2n+1) - 1)                   B_n = 1
    legs:  A_n = the eigenvalues of the normal part of HiPPO-LegS(N) with negative imaginary
           part; B = V^* B_HiPPO with its imaginary part clipped to [-2, 2] (as ``hippo.nplr``)

for n = 0..N/2-1. These are the conjugates of the issue's formulas (-1/2 + i pi n, ...): the
reference keeps the states with negative imaginary part, and 2 Re(...) of a conjugate-pair
system is unchanged by conjugating A, B and C together. C ~ complex normal (variance 1/2 per
part, torch's ``randn(cfloat)``), D ~ N(0, 1). Parameters: ``log_dt`` [H] (dt = exp(log_dt),
the standalone ``s4d.py`` parameterisation; the full kernel's default is softplus),
``log_a_real`` [H, N/2] (Re A = -exp), ``a_imag`` [H, N/2] (Im A = -a_imag), ``b``
[H, N/2, 2], ``c`` [2 or 1, H, N/2, 2] (real and imaginary parts), ``d`` [H].

Bidirectional (``bidirectional``, default True as in every S4 LRA config): a second kernel
K' with its own C (same A, B, Delta, as the reference's ``channels * 2``) is applied
anti-causally, y_t += sum_{s > t} K'_{s-t-1} u_s: the reference's layout, one kernel of
length 2L (K then K' reversed) and one FFT. This equals running K' over each row's real
tokens reversed (:func:`lra.models.ssm.common.reverse_real`) and shifted by one, i.e. a
backward recurrence started at the row's LAST REAL token: padded inputs are zeroed first, a
time-invariant system fed zeros stays at zero state, so the backward pass over the padding
contributes nothing and the result at real tokens does not depend on how much padding
follows.

Causal mode (``causal=True``, for next-token pretraining, issue 28): only the forward (causal)
direction runs; the anti-causal kernel K' is not added. The parameters are those of
``bidirectional`` (the backward direction's stay, unused and untrained, so a causal-pretrained
encoder loads into a bidirectional classifier with the same parameter tree). With
``bidirectional=False`` the layer is causal already and ``causal`` changes nothing.

Layer (the reference's ``S4D`` / ``FFTConv`` with ``activation=gelu``,
``final_act=glu``):

    y = K * u + D u;  y = dropout(GELU(y));  out = GLU(Linear(H -> 2H)(y))    float[B, L, H]

with GLU(a, b) = a * sigmoid(b). The encoder block around the mixer adds the norm, the
residual and the MLP. ``num_heads`` and ``qkv_dim`` are accepted (the contract) and unused.

Departures: A, B and Delta are per channel (the standalone ``s4d.py``; the LRA configs tie
A and B across channels with ``n_ssm: 1``). The reference's separate learning rate and
weight decay for A, B and Delta are ``trainer.param_groups`` (lra.train.optim.param_kind),
which ``protocol=authors`` sets.

Shapes: x float[B, L, D] (D = H = dim), mask bool[B, L] (a prefix mask), out float[B, L, D].
The SSM itself runs in float32 / complex64 whatever the input dtype; the output has x's
dtype.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from lra.models.attention.common import check_call, check_dropout, check_int
from lra.models.registry import register
from lra.models.ssm.common import hippo_legs_normal, zero_padded

__all__ = ["S4D", "s4d_init", "s4d_kernel", "discretize"]

INITS = ("lin", "inv", "legs")
DISCRETISATIONS = ("zoh", "bilinear")


def s4d_init(init: str, n: int) -> tuple[np.ndarray, np.ndarray]:
    """(A complex128[n/2], B complex128[n/2]) of the S4D initialisation ``init`` for state
    size n (n/2 complex states)."""
    half = np.arange(n // 2, dtype=np.float64)
    if init == "lin":
        return -0.5 - 1j * np.pi * half, np.ones(n // 2, np.complex128)
    if init == "inv":
        return -0.5 - 1j * (n / np.pi) * (n / (2 * half + 1) - 1), np.ones(n // 2, np.complex128)
    if init == "legs":
        lam, v, b = hippo_legs_normal(n)
        b_tilde = v.conj().T @ b
        b_tilde = b_tilde.real + 1j * np.clip(b_tilde.imag, -2.0, 2.0)
        return lam, b_tilde
    raise ValueError(f"s4d: init must be one of {INITS}, got {init!r}")


def discretize(a: jax.Array, b: jax.Array, dt: jax.Array, method: str):
    """(log Abar, Bbar) for diagonal a, b complex[..., N] and steps dt float[..., 1 or N]."""
    dta = dt * a
    if method == "zoh":
        return dta, (jnp.exp(dta) - 1.0) / a * b
    if method == "bilinear":
        abar = (1.0 + dta / 2) / (1.0 - dta / 2)
        return jnp.log(abar), dt / (1.0 - dta / 2) * b
    raise ValueError(f"s4d: discretization must be one of {DISCRETISATIONS}, got {method!r}")


def s4d_kernel(log_abar: jax.Array, bbar: jax.Array, c: jax.Array, length: int) -> jax.Array:
    """K float32[C, H, L]: K_l = 2 Re sum_n c_n bbar_n exp(l log_abar_n), by a Vandermonde
    product. log_abar, bbar complex[H, N/2]; c complex[C, H, N/2]."""
    vandermonde = jnp.exp(log_abar[..., None] * jnp.arange(length, dtype=jnp.float32))
    return 2.0 * jnp.einsum("chn,hnl->chl", c * bbar, vandermonde).real


def _complex(pair: jax.Array) -> jax.Array:
    pair = pair.astype(jnp.float32)
    return jax.lax.complex(pair[..., 0], pair[..., 1])


@register("s4d")
class S4D(nnx.Module):
    """S4D mixer (see the module docstring). x float[B, L, D], mask bool[B, L] -> [B, L, D]."""

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
        state_size: int = 64,
        init: str = "inv",
        discretization: str = "zoh",
        dt_min: float = 0.001,
        dt_max: float = 0.1,
        bidirectional: bool = True,
        causal: bool = False,
    ):
        label = "s4d"
        self.causal = bool(causal)
        check_int(label, "dim", dim)
        check_int(label, "state_size", state_size, minimum=2)
        if state_size % 2:
            raise ValueError(f"{label}: state_size must be even (N/2 conjugate pairs)")
        check_dropout(label, dropout_rate)
        if init not in INITS:
            raise ValueError(f"{label}: init must be one of {INITS}, got {init!r}")
        if discretization not in DISCRETISATIONS:
            raise ValueError(
                f"{label}: discretization must be one of {DISCRETISATIONS}, got {discretization!r}"
            )
        if not 0.0 < dt_min <= dt_max:
            raise ValueError(f"{label}: need 0 < dt_min <= dt_max, got {dt_min}, {dt_max}")
        self.dim, self.state_size = dim, state_size
        self.discretization, self.bidirectional = discretization, bool(bidirectional)
        h, half = dim, state_size // 2
        channels = 2 if self.bidirectional else 1

        key = rngs.params()
        k_dt, k_c, k_d = jax.random.split(key, 3)
        log_dt = jax.random.uniform(k_dt, (h,), jnp.float32, math.log(dt_min), math.log(dt_max))
        a, b = s4d_init(init, state_size)
        self.log_dt = nnx.Param(log_dt)
        self.log_a_real = nnx.Param(
            jnp.broadcast_to(jnp.asarray(np.log(-a.real), jnp.float32), (h, half))
        )
        self.a_imag = nnx.Param(jnp.broadcast_to(jnp.asarray(-a.imag, jnp.float32), (h, half)))
        b_pair = np.stack([b.real, b.imag], axis=-1)
        self.b = nnx.Param(jnp.broadcast_to(jnp.asarray(b_pair, jnp.float32), (h, half, 2)))
        self.c = nnx.Param(
            jax.random.normal(k_c, (channels, h, half, 2), jnp.float32) * math.sqrt(0.5)
        )
        self.d = nnx.Param(jax.random.normal(k_d, (h,), jnp.float32))
        self.dropout = nnx.Dropout(dropout_rate)
        self.output_linear = nnx.Linear(h, 2 * h, rngs=rngs)

    def ssm(self):
        """(log Abar, Bbar complex64[H, N/2], C complex64[channels, H, N/2])."""
        a = jax.lax.complex(
            -jnp.exp(self.log_a_real[...].astype(jnp.float32)),
            -self.a_imag[...].astype(jnp.float32),
        )
        dt = jnp.exp(self.log_dt[...].astype(jnp.float32))[:, None]
        log_abar, bbar = discretize(a, _complex(self.b[...]), dt, self.discretization)
        return log_abar, bbar, _complex(self.c[...])

    def kernel(self, length: int) -> jax.Array:
        """float32[channels, H, L]: the forward kernel, and the backward one if bidirectional."""
        return s4d_kernel(*self.ssm(), length)

    def convolve(self, u: jax.Array) -> jax.Array:
        """K * u (+ the anti-causal K' * u): u float32[B, L, H] with padding zeroed."""
        n = u.shape[1]
        k = self.kernel(n)
        full = jnp.pad(k[0], ((0, 0), (0, n)))  # [H, 2L]
        if self.bidirectional and not self.causal:
            full = full + jnp.pad(k[1][:, ::-1], ((0, 0), (n, 0)))
        u_f = jnp.fft.rfft(u, n=2 * n, axis=1)  # [B, L+1, H]
        k_f = jnp.fft.rfft(full, n=2 * n, axis=-1).T  # [L+1, H]
        return jnp.fft.irfft(u_f * k_f[None], n=2 * n, axis=1)[:, :n]

    def __call__(
        self,
        x: jax.Array,
        *,
        mask: jax.Array,
        deterministic: bool = True,
        rngs: nnx.Rngs | None = None,
    ) -> jax.Array:
        check_call("s4d", x, mask, deterministic, rngs, needs="dropout")
        u = zero_padded(x.astype(jnp.float32), mask)
        y = self.convolve(u) + u * self.d[...].astype(jnp.float32)
        y = jax.nn.gelu(y, approximate=False).astype(x.dtype)
        y = self.dropout(y, deterministic=deterministic, rngs=rngs)
        gated = self.output_linear(y)
        out = gated[..., : self.dim] * jax.nn.sigmoid(gated[..., self.dim :])
        return zero_padded(out, mask)
