"""What every scan-based token mixer of this package shares (S4D, S5, LRU, Mamba).

Shapes: B batch, L length, ``...`` any trailing dims (channels, states).

- :func:`zero_padded`: float[B, L, ...] with padded positions set to 0. A scan or a causal
  convolution over zeroed padding cannot carry padded content into real tokens, and since
  padding always FOLLOWS the real tokens (the harness's masks come from lengths: row b's
  real tokens are positions 0..n_b-1), a forward scan's outputs at real tokens never see
  what follows them.
- :func:`reverse_real`: each row's real tokens reversed in place (token i < n_b goes to
  n_b-1-i), padding left at the end and zeroed. A bidirectional mixer runs its backward
  direction as ``reverse_real(forward_mixer(reverse_real(x, mask)), mask)``, so the backward
  scan starts at each row's LAST REAL token rather than at the padded end (DESIGN.md:
  "bidirectional scans start at each row's last real token"). It is its own inverse on
  rows whose padding is zero.
- :func:`linear_recurrence`: h_t = a_t * h_{t-1} + b_t along axis 1, h_{-1} = 0, by
  ``jax.lax.associative_scan`` (O(log L) depth), real or complex.
- :func:`hippo_legs_normal`: the diagonalised normal part of the HiPPO-LegS matrix (the
  S4D-LegS and S5 initialisations), in float64 numpy at construction time.

The masks these helpers take are prefix masks (True for the first n_b positions of row b,
False after), which is what the harness builds; :func:`reverse_real` relies on it.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

__all__ = ["hippo_legs", "hippo_legs_normal", "linear_recurrence", "reverse_real", "zero_padded"]


def _expand(mask: jax.Array, ndim: int) -> jax.Array:
    """mask bool[B, L] reshaped to [B, L, 1, ..., 1] with ``ndim`` dims in all."""
    return mask.reshape(*mask.shape, *([1] * (ndim - 2)))


def zero_padded(x: jax.Array, mask: jax.Array) -> jax.Array:
    """x float[B, L, ...] with the positions where mask bool[B, L] is False set to 0.

    Uses ``where`` rather than a product, so a NaN or inf in padding cannot leak as NaN.
    """
    return jnp.where(_expand(mask, x.ndim), x, jnp.zeros((), x.dtype))


def reverse_real(x: jax.Array, mask: jax.Array) -> jax.Array:
    """x float[B, L, ...] with each row's real tokens reversed in place.

    With n_b = number of real tokens of row b (mask bool[B, L], a prefix mask), position
    i < n_b of the result holds x[b, n_b - 1 - i]; positions i >= n_b hold 0. Applying it
    twice gives ``zero_padded(x, mask)``.
    """
    b, n = mask.shape
    lengths = jnp.sum(mask, axis=1, dtype=jnp.int32)[:, None]  # [B, 1]
    i = jnp.arange(n, dtype=jnp.int32)[None, :]  # [1, L]
    source = jnp.where(i < lengths, lengths - 1 - i, i)  # [B, L]
    gathered = jnp.take_along_axis(x, _expand(source, x.ndim), axis=1)
    return zero_padded(gathered, mask)


def _combine(left: tuple[jax.Array, jax.Array], right: tuple[jax.Array, jax.Array]):
    """Compose two affine maps h -> a h + b: first ``left``, then ``right``."""
    a_l, b_l = left
    a_r, b_r = right
    return a_r * a_l, a_r * b_l + b_r


def linear_recurrence(a: jax.Array, b: jax.Array) -> jax.Array:
    """h float[B, L, ...] with h_t = a_t * h_{t-1} + b_t along axis 1 and h_{-1} = 0.

    ``b``: float or complex [B, L, ...]; ``a``: same dtype kind, broadcastable to ``b``
    (e.g. a time-invariant [1, 1, P] diagonal). Computed by ``jax.lax.associative_scan``
    over the affine maps h -> a_t h + b_t (Blelloch 1990; S5, Smith et al. ICLR 2023).
    """
    a = jnp.broadcast_to(a, b.shape).astype(jnp.result_type(a, b))
    _, h = jax.lax.associative_scan(_combine, (a, b.astype(a.dtype)), axis=1)
    return h


def hippo_legs(n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(A float64[n, n], B float64[n], P float64[n]) of HiPPO-LegS (Gu et al. 2020; S4).

    A_nk = -sqrt(2n+1) sqrt(2k+1) for n > k, -(n+1) for n = k, 0 above the diagonal;
    B_n = sqrt(2n+1); P_n = sqrt(n + 1/2) is the rank-1 term making A + P P^T normal
    (= -1/2 I + a skew-symmetric matrix).
    """
    q = np.arange(n, dtype=np.float64)
    r = np.sqrt(2.0 * q + 1.0)
    a = -(np.tril(np.outer(r, r)) - np.diag(q))
    return a, r.copy(), np.sqrt(q + 0.5)


def hippo_legs_normal(n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Half the eigen-decomposition of the normal part S = A + P P^T of HiPPO-LegS(n).

    S = -1/2 I + W with W skew-symmetric, so its eigenvalues are -1/2 + i w with w the
    (real) eigenvalues of the Hermitian matrix -i W. They come in conjugate pairs; the n/2
    with w < 0 are kept, sorted by w ascending (as state-spaces/s4 ``hippo.nplr`` and
    lindermanlab/S5 ``make_DPLR_HiPPO`` do). Returns (Lambda complex128[n/2],
    V complex128[n, n/2] the matching orthonormal eigenvectors, B float64[n] = HiPPO B).
    ``n`` must be even.
    """
    if n < 2 or n % 2:
        raise ValueError(f"hippo_legs_normal: n must be an even integer >= 2, got {n}")
    a, b, p = hippo_legs(n)
    skew = a + np.outer(p, p) + 0.5 * np.eye(n)
    w, v = np.linalg.eigh(-1j * skew)  # ascending
    keep = n // 2
    return -0.5 + 1j * w[:keep], v[:, :keep], b
