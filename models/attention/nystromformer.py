"""Nystromformer attention: Xiong, Zeng, Chakraborty, Tan, Fung, Li and Singh, AAAI 2021,
"Nystromformer: A Nystrom-Based Algorithm for Approximating Self-Attention".

Softmax attention approximated through m landmarks (segment means of the queries and keys):

    Q~, K~ = segment means of Q, K                                      float[B, H, m, d_h]
    K1 = softmax(Q K~^T / sqrt(d_h))      over landmarks                float[B, H, L, m]
    K2 = softmax(Q~ K~^T / sqrt(d_h))     over landmarks                float[B, H, m, m]
    K3 = softmax(Q~ K^T / sqrt(d_h))      over the (real) keys          float[B, H, m, L]
    out = concat_h( K1 (pinv(K2) (K3 V)) + conv(V) ) W_o

pinv is the iterative Moore-Penrose inverse of the paper (Razavi et al., 2014):

    Z0 = K2^T / (||K2||_1 ||K2||_inf)        (max column sum times max row sum)
    Z <- Z (13 I - K2 Z (15 I - K2 Z (7 I - K2 Z))) / 4          ``pinv_iterations`` times

and conv is a depthwise convolution along the sequence of the (masked) values: one kernel of
``conv_kernel`` taps per head, shared by the d_h channels of that head, zero "same" padding,
no bias (the authors' Conv2d(H, H, (k, 1), groups=H)). Products are taken right to left, so
memory is O(L * m).

Shapes: x float[B, L, D]; mask bool[B, L] (True = real token); Q, K, V float[B, L, H, d_h]
from Dense D -> E (E = qkv_dim, d_h = E / H); out float[B, L, D].

Segments: position t (0-based) belongs to segment floor(t * m / L), for the padded length L
of the batch. When m divides L these are the authors' equal contiguous segments of L / m
tokens; otherwise their sizes differ by at most one; when m > L some segments are empty.

Options and their sources (the authors' LRA code, mlpen/Nystromformer LRA/code, whose
"nystrom-64" entry is the usual LRA Nystromformer): ``num_landmarks=64``, ``conv_kernel=35``
(0 or None disables the convolution; must be odd), ``pinv_iterations=6`` (the paper).

Padding: each landmark is the mean over the REAL tokens of its segment (padded Q, K rows
never enter); a segment with no real token gives an empty landmark, which is excluded from
the softmaxes over landmarks (K1, K2's columns) and whose K2 row is zeroed, so pinv acts on the
real-landmark block only (the Newton iteration preserves that zero pattern). K3 excludes
padded keys; V is zeroed at padded positions before K3 V and before the convolution. So
changing values at padded positions leaves real outputs unchanged. Appending padding does
change them: the segments are computed over the padded length, so landmarks regroup.

Attention dropout (``dropout_rate``) is applied to K3, the weights over the keys: with m = L
landmarks K1 pinv(K2) = I and this is exactly softmax attention's dropout. (The authors'
Nystromformer has no attention dropout.)

Deviations from the authors' code, on purpose: landmark means over real tokens only (theirs
average zeroed padded rows in), empty landmarks masked, lengths not divisible by m allowed,
and Z0 scaled per (batch, head) matrix as the paper writes it (their default takes one max
over the whole batch, coupling examples). The m x m pseudo-inverse is computed in float32
whatever the compute dtype: the Newton iteration amplifies bfloat16 rounding, and m x m is
small.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from lra.models.attention.common import MultiHeadAttention, check_int, mask_logits, zero_padded
from lra.models.registry import register

__all__ = ["NystromAttention", "iterative_pinv"]


def iterative_pinv(a: jax.Array, iterations: int) -> jax.Array:
    """Approximate Moore-Penrose inverse of float[..., m, m] by the paper's iteration."""
    eye = jnp.eye(a.shape[-1], dtype=a.dtype)
    max_col_sum = jnp.max(jnp.sum(jnp.abs(a), axis=-2), axis=-1)
    max_row_sum = jnp.max(jnp.sum(jnp.abs(a), axis=-1), axis=-1)
    scale = 1.0 / jnp.maximum(max_col_sum * max_row_sum, jnp.finfo(a.dtype).tiny)
    z = jnp.swapaxes(a, -1, -2) * scale[..., None, None]
    for _ in range(iterations):
        az = a @ z
        z = 0.25 * z @ (13 * eye - az @ (15 * eye - az @ (7 * eye - az)))
    return z


@register("nystromformer")
class NystromAttention(MultiHeadAttention):
    """Multi-head Nystrom-approximated softmax attention with a depthwise conv skip on V."""

    kind = "nystromformer"
    memory_class = "linear"
    same_without_padding = False  # landmarks are means of segments of the padded length

    def __init__(
        self,
        *,
        dim: int,
        num_heads: int,
        max_len: int,
        rngs: nnx.Rngs,
        qkv_dim: int | None = None,
        dropout_rate: float = 0.0,
        num_landmarks: int = 64,
        conv_kernel: int | None = 35,
        pinv_iterations: int = 6,
    ):
        self._init_heads(dim, num_heads, max_len, qkv_dim, dropout_rate)
        conv_kernel = 0 if conv_kernel is None else conv_kernel
        check_int(self.label, "num_landmarks", num_landmarks)
        check_int(self.label, "conv_kernel", conv_kernel, minimum=0)
        check_int(self.label, "pinv_iterations", pinv_iterations)
        if conv_kernel and conv_kernel % 2 == 0:
            raise ValueError(
                "nystromformer attention: conv_kernel must be odd (a same-length output) or "
                f"0/None to disable the convolution, got {conv_kernel}"
            )
        self.num_landmarks = num_landmarks
        self.pinv_iterations = pinv_iterations
        self._init_projections(rngs)
        if conv_kernel:
            # PyTorch's Conv2d default init, as in the authors' code: U(+-1/sqrt(fan_in)).
            bound = conv_kernel**-0.5
            self.conv = nnx.Param(
                jax.random.uniform(
                    rngs.params(), (num_heads, conv_kernel), jnp.float32, -bound, bound
                )
            )
        else:
            self.conv = None

    def _conv_skip(self, v: jax.Array) -> jax.Array:
        """Depthwise conv along the sequence, one kernel per head: [B, L, H, d] -> same."""
        taps = self.conv[...].astype(v.dtype)  # [H, width]
        width, n = taps.shape[-1], v.shape[1]
        # A sum of shifted copies: XLA fuses it into one loop, where its CPU convolution
        # with one group per head was about a fifth of the train step.
        padded = jnp.pad(v, [(0, 0), (width // 2, width // 2), (0, 0), (0, 0)])
        return sum(padded[:, t : t + n] * taps[:, t, None] for t in range(width))

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
        q, k, v = self._qkv(x)
        dtype = q.dtype
        # d_h^-1/4 on each side gives the 1/sqrt(d_h) of every logit, landmarks included.
        q = q * jnp.asarray(self.head_dim**-0.25, dtype)
        k = k * jnp.asarray(self.head_dim**-0.25, dtype)
        v = zero_padded(v, mask)

        m = self.num_landmarks
        segment = np.arange(n) * m // n
        members = jnp.asarray(segment[:, None] == np.arange(m)[None, :]) & mask[:, :, None]
        count = jnp.sum(members, axis=1)  # [B, m] real tokens per segment
        average = members.astype(dtype) / jnp.maximum(count, 1).astype(dtype)[:, None, :]
        q_landmarks = jnp.einsum("blm,blhd->bhmd", average, q)
        k_landmarks = jnp.einsum("blm,blhd->bhmd", average, k)
        landmark_real = (count > 0)[:, None, None, :]  # [B, 1, 1, m]

        kernel_1 = jnp.einsum("blhd,bhmd->bhlm", q, k_landmarks)
        kernel_1 = jax.nn.softmax(mask_logits(kernel_1, landmark_real), axis=-1)
        kernel_2 = jnp.einsum("bhmd,bhpd->bhmp", q_landmarks, k_landmarks)
        kernel_2 = jax.nn.softmax(mask_logits(kernel_2, landmark_real), axis=-1)
        kernel_2 = kernel_2 * jnp.swapaxes(landmark_real, -1, -2).astype(dtype)
        kernel_3 = jnp.einsum("bhmd,blhd->bhml", q_landmarks, k)
        kernel_3 = jax.nn.softmax(mask_logits(kernel_3, mask[:, None, None, :]), axis=-1)
        kernel_3 = self.dropout(kernel_3, deterministic=deterministic, rngs=rngs)

        inverse = iterative_pinv(kernel_2.astype(jnp.float32), self.pinv_iterations)
        summary = jnp.einsum("bhml,blhd->bhmd", kernel_3, v)  # [B, H, m, d]
        summary = (inverse @ summary.astype(jnp.float32)).astype(dtype)
        y = jnp.einsum("bhlm,bhmd->blhd", kernel_1, summary)
        if self.conv is not None:
            y = y + self._conv_skip(v)
        return self.out(self._merge(y))
