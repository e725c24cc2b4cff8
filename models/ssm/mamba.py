"""Mamba: Gu and Dao, "Mamba: Linear-Time Sequence Modeling with Selective State Spaces" (2023).
Reference code: state-spaces/mamba ``mamba_ssm/modules/mamba_simple.py`` (the block's
projections, convolution and initialisation) and ``selective_scan_ref`` in
``mamba_ssm/ops/selective_scan_interface.py`` (the scan's definition), read, not copied.

With E = ``expand`` * D inner channels, N = ``state_size`` states, R = ``dt_rank``:

    [x, z]   = in_proj(u)                          Dense D -> 2E (no bias)
    x        = SiLU(causal depthwise conv(x))      kernel ``d_conv`` (4), with bias
    [dt, B, C] = x_proj(x)                         Dense E -> R + 2N (no bias)
    Delta    = softplus(dt_proj(dt))               Dense R -> E (bias = softplus^-1(dt_0))
    A        = -exp(A_log)                         float[E, N]
    h_t      = exp(Delta_t A) * h_{t-1} + Delta_t B_t x_t      (per channel e and state n)
    y_t      = <h_t, C_t> + D * x_t
    out      = out_proj(y * SiLU(z))               Dense E -> D (no bias)

Initialisation as in mamba_simple.py: A_log = log(n + 1), n = 0..N-1, for every channel
(S4D-Real); D = 1; dt_proj.kernel ~ U[-R^-1/2 dt_scale, R^-1/2 dt_scale]; dt_proj.bias =
softplus^-1(dt_0) with dt_0 = max(exp(U[log dt_min, log dt_max]), dt_init_floor), so that
softplus(bias) = dt_0 at start; dt_rank "auto" = ceil(D / 16). The dense layers and the
convolution take PyTorch's default init, U[-1/sqrt(fan_in), 1/sqrt(fan_in)], as the
reference's modules do (the reference's model-level out_proj rescaling by depth is not part of
the mixer and is not applied).

The scan runs as ``jax.lax.associative_scan`` over the pairs (exp(Delta A), Delta B x)
(``common.linear_recurrence``), in float32 whatever the parameter dtype (the reference also
upcasts), and the output is cast back to the input dtype.

Bidirectional (``bidirectional=True``, the default): no official LRA setting exists (the
authors never ran LRA; state-spaces/mamba#282 asks for it), so this is the harness's choice,
following Vision Mamba's "bidirectional v2" (Zhu et al. 2024, hustvl/Vim): in_proj, the gate z
and out_proj are shared; the backward direction has its OWN convolution, x_proj, dt_proj, A_log
and D, and runs over each row's real tokens reversed (``common.reverse_real``: it starts at
the row's last real token). The two directions' y are averaged (Vim's divided output) before
the gate: out = out_proj((y_f + y_b) / 2 * SiLU(z)). The two directions are two scans: one
scan over 2E side-by-side channels saved ~15% of the compile time but took ~27% more memory
(measured on CPU), and memory is what the harness reports. ``bidirectional=False`` is the causal
Mamba block of the paper.

Causal mode (``causal=True``, for next-token pretraining, issue 28): only the forward (causal)
direction runs; out = out_proj(y_f * SiLU(z)), the causal Mamba block (y_f not halved). The
parameters are those of ``bidirectional`` (the backward direction's stay, unused and untrained,
so a causal-pretrained encoder loads into a bidirectional classifier with the same parameter
tree). With ``bidirectional=False`` the layer is causal already and ``causal`` changes nothing.

Options (defaults in configs/model/mamba.yaml): ``state_size`` (16), ``expand`` (2),
``d_conv`` (4), ``dt_rank`` ("auto" or an int), ``dt_min`` (0.001), ``dt_max`` (0.1),
``dt_init_floor`` (1e-4), ``dt_scale`` (1.0), ``bidirectional``. ``num_heads`` and ``qkv_dim``
are accepted for the contract and unused. ``dropout_rate`` (the harness's attention dropout)
drops the gated y before out_proj; the reference has no dropout in the mixer.

Shapes (B batch, L length, D = dim, E inner channels, N states):

    x:            float[B, L, D]        mask: bool[B, L], True = real token (a prefix mask)
    x, z:         float[B, L, E]
    Delta:        float32[B, L, E]      B_t, C_t: float32[B, L, N]
    h:            float32[B, L, E, N]   (materialised: memory O(B L E N), linear in L)
    out:          float[B, L, D]

Padding: the inner x is zeroed at padded positions before the convolution and again after
it, so neither the convolution's bias nor padded content can reach a real token; padding
follows the real tokens, so the causal forward direction never sees it, and the backward
direction runs on ``reverse_real`` rows (padding also at the end, reversal within the real
tokens only). Real outputs are independent of padded inputs and of the amount of padding.
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
    "Mamba",
    "SelectiveDirection",
    "causal_depthwise_conv",
    "dt_bias_init",
    "s4d_real_a_log",
    "selective_readout",
    "selective_scan",
    "selective_terms",
]

LABEL = "mamba"


def _torch_default(fan_in: int):
    """PyTorch's default Linear/Conv init: U[-1/sqrt(fan_in), 1/sqrt(fan_in)]."""
    bound = 1.0 / math.sqrt(fan_in)
    return lambda key, shape, dtype=jnp.float32: jax.random.uniform(
        key, shape, dtype, minval=-bound, maxval=bound
    )


def s4d_real_a_log(channels: int, state_size: int) -> jax.Array:
    """float32[channels, state_size] with A_log[e, n] = log(n + 1) (S4D-Real: A_n = -(n+1))."""
    a = jnp.arange(1, state_size + 1, dtype=jnp.float32)
    return jnp.log(jnp.broadcast_to(a, (channels, state_size)))


def dt_bias_init(
    key: jax.Array, channels: int, dt_min: float, dt_max: float, floor: float
) -> jax.Array:
    """softplus^-1(dt_0) float32[channels], dt_0 = max(exp(U[log dt_min, log dt_max]), floor)."""
    u = jax.random.uniform(key, (channels,), jnp.float32)
    dt = jnp.exp(u * (math.log(dt_max) - math.log(dt_min)) + math.log(dt_min))
    dt = jnp.maximum(dt, floor)
    return dt + jnp.log(-jnp.expm1(-dt))  # softplus^-1(dt) = log(exp(dt) - 1)


def causal_depthwise_conv(x: jax.Array, kernel: jax.Array, bias: jax.Array) -> jax.Array:
    """y[b, t, e] = bias[e] + sum_k kernel[k, e] x[b, t - (K - 1) + k, e], zeros before t = 0.

    x: float[B, L, E]; kernel: float[K, E]; bias: float[E] (PyTorch Conv1d(groups=E,
    padding=K-1) truncated to the first L outputs, as in mamba_simple.py).
    """
    k = kernel.shape[0]
    n = x.shape[1]
    padded = jnp.pad(x, ((0, 0), (k - 1, 0), (0, 0)))
    y = sum(padded[:, i : i + n] * kernel[i] for i in range(k))
    return y + bias


def selective_terms(
    u: jax.Array, delta: jax.Array, a: jax.Array, b: jax.Array
) -> tuple[jax.Array, jax.Array]:
    """The scan's pairs (exp(delta A), delta B u), each float32[B, L, E, N].

    u, delta: [B, L, E]; a: [E, N] (negative); b: [B, L, N].
    """
    f32 = jnp.float32
    u, delta, a, b = (t.astype(f32) for t in (u, delta, a, b))
    decay = jnp.exp(delta[..., None] * a)
    drive = (delta * u)[..., None] * b[:, :, None, :]
    return decay, drive


def selective_readout(h: jax.Array, c: jax.Array, u: jax.Array, d: jax.Array) -> jax.Array:
    """y float32[B, L, E] = <h_t, C_t> + D u_t for h float32[B, L, E, N], c [B, L, N]."""
    f32 = jnp.float32
    return jnp.einsum("blen,bln->ble", h, c.astype(f32)) + d.astype(f32) * u.astype(f32)


def selective_scan(
    u: jax.Array, delta: jax.Array, a: jax.Array, b: jax.Array, c: jax.Array, d: jax.Array
) -> jax.Array:
    """y float32[B, L, E] of the selective SSM (``selective_scan_ref`` with the softplus
    already applied to delta and no z):

        h_t = exp(delta_t A) * h_{t-1} + delta_t B_t u_t,   y_t = <h_t, C_t> + D u_t

    u, delta: [B, L, E]; a: [E, N] (negative); b, c: [B, L, N]; d: [E].
    """
    h = linear_recurrence(*selective_terms(u, delta, a, b))
    return selective_readout(h, c, u, d)


class SelectiveDirection(nnx.Module):
    """One direction's convolution and selective SSM: conv, x_proj, dt_proj, A_log, D."""

    def __init__(
        self,
        *,
        channels: int,
        state_size: int,
        d_conv: int,
        dt_rank: int,
        dt_min: float,
        dt_max: float,
        dt_init_floor: float,
        dt_scale: float,
        rngs: nnx.Rngs,
    ):
        self.state_size, self.dt_rank = state_size, dt_rank
        conv_init = _torch_default(d_conv)  # fan_in of a depthwise Conv1d = kernel size
        self.conv_kernel = nnx.Param(conv_init(rngs.params(), (d_conv, channels)))
        self.conv_bias = nnx.Param(conv_init(rngs.params(), (channels,)))
        self.x_proj = nnx.Linear(
            channels,
            dt_rank + 2 * state_size,
            use_bias=False,
            kernel_init=_torch_default(channels),
            rngs=rngs,
        )
        std = dt_rank**-0.5 * dt_scale
        self.dt_proj = nnx.Linear(
            dt_rank,
            channels,
            kernel_init=lambda key, shape, dtype=jnp.float32: jax.random.uniform(
                key, shape, dtype, minval=-std, maxval=std
            ),
            bias_init=lambda key, shape, dtype=jnp.float32: dt_bias_init(
                key, shape[0], dt_min, dt_max, dt_init_floor
            ).astype(dtype),
            rngs=rngs,
        )
        self.A_log = nnx.Param(s4d_real_a_log(channels, state_size))
        self.D = nnx.Param(jnp.ones((channels,), jnp.float32))

    def terms(self, x: jax.Array, mask: jax.Array) -> tuple[jax.Array, ...]:
        """(decay, drive, C, u) of the inner x float[B, L, E] (zeroed at padding): the scan's
        pairs float32[B, L, E, N], C float[B, L, N] and the conv output u float[B, L, E]."""
        x = causal_depthwise_conv(x, self.conv_kernel[...], self.conv_bias[...])
        u = zero_padded(jax.nn.silu(x), mask)
        dt, b, c = jnp.split(
            self.x_proj(u), [self.dt_rank, self.dt_rank + self.state_size], axis=-1
        )
        delta = jax.nn.softplus(self.dt_proj(dt).astype(jnp.float32))
        a = -jnp.exp(self.A_log[...].astype(jnp.float32))
        return (*selective_terms(u, delta, a, b), c, u)

    def __call__(self, x: jax.Array, mask: jax.Array) -> jax.Array:
        """y float32[B, L, E] of the inner x float[B, L, E], zeroed at padding."""
        decay, drive, c, u = self.terms(x, mask)
        return selective_readout(linear_recurrence(decay, drive), c, u, self.D[...])


@register("mamba")
class Mamba(nnx.Module):
    """The Mamba mixer (selective SSM with gate), optionally bidirectional."""

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
        state_size: int = 16,
        expand: int = 2,
        d_conv: int = 4,
        dt_rank: int | str = "auto",
        dt_min: float = 0.001,
        dt_max: float = 0.1,
        dt_init_floor: float = 1e-4,
        dt_scale: float = 1.0,
        bidirectional: bool = True,
        causal: bool = False,
    ):
        check_int(LABEL, "dim", dim)
        self.causal = bool(causal)
        check_int(LABEL, "state_size", state_size)
        check_int(LABEL, "expand", expand)
        check_int(LABEL, "d_conv", d_conv)
        check_dropout(LABEL, dropout_rate)
        if dt_rank == "auto":
            dt_rank = math.ceil(dim / 16)
        check_int(LABEL, "dt_rank", dt_rank)
        if not 0.0 < dt_min <= dt_max:
            raise ValueError(f"{LABEL}: need 0 < dt_min <= dt_max, got {dt_min}, {dt_max}")
        if not isinstance(bidirectional, bool):
            raise ValueError(f"{LABEL}: bidirectional must be true or false, got {bidirectional!r}")
        channels = expand * dim
        self.dim, self.channels, self.bidirectional = dim, channels, bidirectional
        self.in_proj = nnx.Linear(
            dim, 2 * channels, use_bias=False, kernel_init=_torch_default(dim), rngs=rngs
        )
        options = dict(
            channels=channels,
            state_size=state_size,
            d_conv=d_conv,
            dt_rank=dt_rank,
            dt_min=dt_min,
            dt_max=dt_max,
            dt_init_floor=dt_init_floor,
            dt_scale=dt_scale,
        )
        self.forward = SelectiveDirection(**options, rngs=rngs)
        self.backward = SelectiveDirection(**options, rngs=rngs) if bidirectional else None
        self.out_proj = nnx.Linear(
            channels, dim, use_bias=False, kernel_init=_torch_default(channels), rngs=rngs
        )
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
        inner, z = jnp.split(self.in_proj(x), 2, axis=-1)
        inner = zero_padded(inner, mask)
        y = self.forward(inner, mask)
        if self.backward is not None and not self.causal:
            y_b = reverse_real(self.backward(reverse_real(inner, mask), mask), mask)
            y = 0.5 * (y + y_b)
        y = y * jax.nn.silu(z.astype(jnp.float32))
        y = self.dropout(y.astype(x.dtype), deterministic=deterministic, rngs=rngs)
        return self.out_proj(y)
