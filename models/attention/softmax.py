"""Multi-head softmax (dot-product) attention: Vaswani et al., "Attention Is All You Need", 2017.

    out = concat_h( softmax(Q_h K_h^T / sqrt(d_h) + mask bias) V_h ) W_o

Shapes (B batch, L length, D model dim, H heads, E = qkv_dim, d_h = E / H):

    x:        float[B, L, D]
    mask:     bool[B, L]            True = real token; padded KEYS are excluded
    Q, K, V:  float[B, L, H, d_h]   from Dense D -> E
    weights:  float[B, H, L, L]     softmax over the key axis, then dropout
    out:      float[B, L, D]        from Dense E -> D

``implementation`` picks how it is computed (:func:`choose_implementation`):

* ``"auto"`` (default): cuDNN's fused flash attention (``jax.nn.dot_product_attention``
  with ``implementation="cudnn"`` and the key lengths) on a GPU when the call has no active
  attention dropout, the dtype is bfloat16 or float16 and the head size is a multiple of 8
  up to 128; on a CPU the chunked path when ``max_len`` >= 1024 (``CHUNKED_MIN_LENGTH``,
  where it was measured faster, with and without dropout); the plain path everywhere else
  (shorter CPU settings, TPU, a GPU in float32 or training with attention dropout). If
  cuDNN refuses the shapes when the step is traced, the plain path is used.
* ``"plain"``: the formula above written out; the reference.
* ``"chunked"``: the same formula ``block_size`` queries at a time, each block
  rematerialised in the backward pass (:mod:`lra.models.attention.chunked_softmax`): attention
  memory O(B H block L) instead of O(B H L^2). Attention dropout draws its masks per block
  (same distribution, other random numbers than the plain path).
* ``"fused"``: ``jax.nn.dot_product_attention`` with JAX's own choice (cuDNN or XLA); it
  has no attention-weight dropout, so it requires ``dropout_rate=0``.

Causal mode (``causal=True``, for next-token pretraining, issue 28): query i sees only keys
j <= i, on every path: a lower-triangular mask on the plain and chunked paths,
``is_causal=True`` on the fused and cuDNN ones. The parameters do not depend on it.

Masked keys get the most negative finite value of the activation dtype instead of
``-inf``, so a row whose keys are all padding gives uniform weights, not NaN. Everything is
computed in the dtype of ``x`` and the parameters (bfloat16 works when both are bfloat16).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from lra.models.attention.chunked_softmax import DEFAULT_BLOCK, query_chunked_attention
from lra.models.attention.common import MultiHeadAttention, causal_keep, check_int, mask_logits
from lra.models.platform import target_platform
from lra.models.registry import register

__all__ = ["CHUNKED_MIN_LENGTH", "IMPLEMENTATIONS", "SoftmaxAttention", "choose_implementation"]

IMPLEMENTATIONS = ("auto", "plain", "chunked", "fused")
_CUDNN_DTYPES = (jnp.bfloat16, jnp.float16)
# From this max_len on, "auto" runs the chunked path on a CPU. Measured (2-core CPU, B=2,
# H=4, d_h=32, train step of the attention alone, hash dropout): L=512 plain 12 ms vs
# chunked 16-18 ms; L=1024 100 vs 64 ms; L=2048 304 vs 268 ms; L=4096 1150 vs 1072 ms.
CHUNKED_MIN_LENGTH = 1024


def choose_implementation(
    requested: str,
    *,
    platform: str,
    dtype,
    head_dim: int,
    dropout_active: bool,
    max_len: int = 0,
) -> str:
    """What ``implementation=requested`` runs as: ``"cudnn"``, ``"fused"``, ``"chunked"`` or
    ``"plain"`` (``max_len``: the longest sequence the layer is built for)."""
    if requested != "auto":
        return requested
    if platform == "cpu" and max_len >= CHUNKED_MIN_LENGTH:
        return "chunked"
    if (
        platform == "gpu"
        and not dropout_active
        and jnp.dtype(dtype) in [jnp.dtype(d) for d in _CUDNN_DTYPES]
        and head_dim % 8 == 0
        and head_dim <= 128
    ):
        return "cudnn"
    return "plain"


@register("softmax")
class SoftmaxAttention(MultiHeadAttention):
    """Full quadratic multi-head attention with a key padding mask."""

    kind = "softmax"
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
        implementation: str = "auto",
        block_size: int = DEFAULT_BLOCK,
        causal: bool = False,
    ):
        self._init_heads(dim, num_heads, max_len, qkv_dim, dropout_rate)
        self.causal = bool(causal)
        check_int(self.label, "block_size", block_size)
        self.block_size = block_size
        if implementation not in IMPLEMENTATIONS:
            raise ValueError(
                f"softmax attention: implementation must be one of {', '.join(IMPLEMENTATIONS)}, "
                f"got {implementation!r}"
            )
        if implementation == "fused" and dropout_rate:
            raise ValueError(
                "softmax attention: implementation='fused' has no attention dropout; "
                "set task.arch.attention_dropout=0 or use implementation='plain'"
            )
        self.implementation = implementation
        self._init_projections(rngs)

    def _chosen(self, dtype, dropout_active: bool) -> str:
        """The path a call in ``dtype`` takes on this backend (:func:`choose_implementation`)."""
        return choose_implementation(
            self.implementation,
            platform=target_platform(),
            dtype=dtype,
            head_dim=self.head_dim,
            dropout_active=dropout_active,
            max_len=self.max_len,
        )

    @property
    def memory_class(self) -> str:
        """How a training call's memory grows with the length on this backend: "linear" on
        the chunked path, "quadratic" on the plain one (and on cuDNN's, which training with
        attention dropout does not take)."""
        chunked = self._chosen(jnp.float32, bool(self.dropout.rate)) == "chunked"
        return "linear" if chunked else "quadratic"

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
        dropping = bool(self.dropout.rate) and not deterministic
        chosen = self._chosen(q.dtype, dropping)
        if chosen == "cudnn":
            # Masks are length prefixes; an all-padding row keeps one key (its output is
            # never used) so cuDNN never normalises over nothing.
            lengths = jnp.maximum(jnp.sum(mask.astype(jnp.int32), axis=-1), 1)
            try:
                y = jax.nn.dot_product_attention(
                    q,
                    k,
                    v,
                    key_value_seq_lengths=lengths,
                    implementation="cudnn",
                    is_causal=self.causal,
                )
                return self.out(self._merge(y))
            except (NotImplementedError, ValueError, RuntimeError, TypeError):
                pass  # shapes or GPU cuDNN cannot take: the plain path below
        if chosen == "fused":
            y = jax.nn.dot_product_attention(
                q, k, v, mask=mask.astype(bool)[:, None, None, :], is_causal=self.causal
            )
            return self.out(self._merge(y))
        q = q * jnp.asarray(self.head_dim**-0.5, q.dtype)
        if chosen == "chunked":
            y = query_chunked_attention(
                q,
                k,
                v,
                mask,
                block=self.block_size,
                dropout_rate=self.dropout.rate if dropping else 0.0,
                dropout_key=rngs.dropout() if dropping else None,
                causal=self.causal,
            )
            return self.out(self._merge(y))
        logits = jnp.einsum("bqhd,bkhd->bhqk", q, k)
        if not self.causal:
            return self.out(self._merge(self._attend(logits, v, mask, deterministic, rngs)))
        keep = mask.astype(bool)[:, None, None, :] & jnp.asarray(causal_keep(q.shape[1]))
        logits = mask_logits(logits, keep)
        return self.out(self._merge(self._attend(logits, v, None, deterministic, rngs)))
