"""The frame shared by the attention mechanisms of this package.

Every multi-head mechanism here wraps its own core in the same frame (B batch, L length,
D model dim, E = qkv_dim, H heads, d_h = E / H):

    x:        float[B, L, D]
    mask:     bool[B, L]             True = real token
    Q, K, V:  float[B, L, H, d_h]    Dense D -> E each (``query``, ``key``, ``value``), then
                                     split into heads ([B, L, E] -> [B, L, H, d_h])
    core:     float[B, L, H, d_h]    the mechanism's own computation
    out:      float[B, L, D]         heads merged ([B, L, H, d_h] -> [B, L, E]), Dense E -> D
                                     (``out``)

``MultiHeadAttention`` is that frame as a base class: it checks the common constructor
arguments (``qkv_dim`` divisible by ``num_heads``, ``dropout_rate`` in [0, 1)), builds the
projections under their usual attribute names (so parameter paths are ``query/kernel``,
``out/bias``, ...), splits and merges heads, checks the call (mask shape, ``rngs`` when not
deterministic) and holds the attention-dropout layer. The functions below are the pieces the
mechanisms share besides: key masking with a finite "minus infinity", zeroing padded
positions, the two products of kernelised linear attention (and their causal prefix-sum
form), and the blocking helpers of the block- and window-local mechanisms.

Causal mode (a mechanism's constructor keyword ``causal``, issue 28): the output at position
i depends only on inputs at positions j <= i. Padding follows the real tokens, so a causal
layer's outputs at real tokens are those without padding.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

__all__ = [
    "MultiHeadAttention",
    "band",
    "causal_keep",
    "causal_linear_context",
    "check_call",
    "check_dropout",
    "check_int",
    "from_blocks",
    "linear_context",
    "linear_normaliser",
    "lowest",
    "mask_logits",
    "to_blocks",
    "with_neighbours",
    "zero_padded",
]


def check_dropout(label: str, dropout_rate: float) -> None:
    """Raise ValueError unless 0 <= dropout_rate < 1; ``label`` starts the message."""
    if not 0.0 <= dropout_rate < 1.0:
        raise ValueError(f"{label}: dropout_rate must be in [0, 1), got {dropout_rate}")


def check_int(label: str, name: str, value, minimum: int = 1) -> None:
    """Raise ValueError unless ``value`` is an int (not a bool) >= ``minimum``."""
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{label}: {name} must be an integer >= {minimum}, got {value!r}")


def check_call(
    label: str,
    x: jax.Array,
    mask: jax.Array,
    deterministic: bool,
    rngs: nnx.Rngs | None,
    needs: str = "attention dropout",
) -> tuple[int, int]:
    """(B, L) of x float[B, L, ...]; raise ValueError for a mask that is not bool[B, L]-shaped
    or for deterministic=False without ``rngs`` (``needs``: what the 'dropout' stream is for)."""
    if not deterministic and rngs is None:
        raise ValueError(
            f"{label}: deterministic=False needs rngs (an nnx.Rngs with a 'dropout' stream) "
            f"for {needs}"
        )
    b, n = x.shape[:2]
    if mask.shape != (b, n):
        raise ValueError(f"{label}: mask shape {mask.shape} != (B, L) = {(b, n)}")
    return b, n


def lowest(dtype) -> jax.Array:
    """The most negative finite value of ``dtype``: the logit of an excluded key."""
    return jnp.asarray(jnp.finfo(dtype).min, dtype)


def mask_logits(logits: jax.Array, keep: jax.Array) -> jax.Array:
    """``logits`` where ``keep`` (broadcast), else the most negative finite value.

    Finite rather than -inf, so a softmax row whose keys are all excluded gives uniform
    weights, not NaN.
    """
    return jnp.where(keep, logits, lowest(logits.dtype))


def zero_padded(y: jax.Array, mask: jax.Array) -> jax.Array:
    """y float[B, L, ...] with the positions where mask bool[B, L] is False set to 0."""
    return y * mask.astype(y.dtype).reshape(*mask.shape, *([1] * (y.ndim - 2)))


def linear_context(q: jax.Array, k: jax.Array, v: jax.Array) -> jax.Array:
    """phi(Q) (phi(K)^T V) per head, in O(L f e): float[B, L, H, e].

    q float[B, Lq, H, f], k float[B, Lk, H, f] (feature maps already applied, padded keys
    zeroed), v float[B, Lk, H, e].
    """
    kv = jnp.einsum("bkhf,bkhe->bhfe", k, v)
    return jnp.einsum("bqhf,bhfe->bqhe", q, kv)


def linear_normaliser(q: jax.Array, k: jax.Array) -> jax.Array:
    """phi(Q) sum_j phi(K_j) per head, the row sums of the implied weights: float[B, Lq, H]."""
    return jnp.einsum("bqhf,bhf->bqh", q, jnp.sum(k, axis=1))


def causal_keep(n: int) -> np.ndarray:
    """bool[n, n]: key j may be seen by query i iff j <= i (lower triangle)."""
    return np.tril(np.ones((n, n), bool))


def causal_linear_context(
    q: jax.Array, k: jax.Array, v: jax.Array, chunk: int = 64
) -> tuple[jax.Array, jax.Array]:
    """The causal (prefix-sum) form of :func:`linear_context` and :func:`linear_normaliser`.

    Katharopoulos et al. 2020, "Transformers are RNNs", eq. 8-9 (S_i = sum_{j<=i} phi(k_j)
    v_j^T, z_i = sum_{j<=i} phi(k_j)): returns (num float[B, L, H, e] with num_i =
    phi(q_i)^T S_i, den float[B, L, H] with den_i = phi(q_i)^T z_i). q float[B, L, H, f],
    k float[B, L, H, f] (feature maps applied, padded keys zeroed), v float[B, L, H, e].

    Computed a chunk of ``chunk`` positions at a time, so no [B, L, H, f, e] tensor of every
    prefix state exists: inside a chunk the weights q_i^T k_j are formed and masked to j <= i
    ([B, G, H, c, c]); the state of all earlier chunks is an exclusive prefix sum over the G
    chunks of their k^T v ([B, G, H, f, e]). Memory O(B H L (c + f e / c)).
    """
    b, n, h, f = q.shape
    c = max(1, min(chunk, n))
    pad = -n % c
    if pad:
        q, k, v = (jnp.pad(t, [(0, 0), (0, pad), (0, 0), (0, 0)]) for t in (q, k, v))
    g = (n + pad) // c
    q, k, v = (t.reshape(b, g, c, h, t.shape[-1]) for t in (q, k, v))
    weights = jnp.einsum("bgqhf,bgkhf->bghqk", q, k)
    weights = jnp.where(jnp.asarray(causal_keep(c)), weights, jnp.zeros((), weights.dtype))
    num = jnp.einsum("bghqk,bgkhe->bgqhe", weights, v)
    den = jnp.einsum("bghqk->bgqh", weights)

    def exclusive(t: jax.Array) -> jax.Array:  # sum over the chunks before each chunk
        t = jnp.cumsum(t, axis=1)
        return jnp.concatenate([jnp.zeros_like(t[:, :1]), t[:, :-1]], axis=1)

    state = exclusive(jnp.einsum("bgkhf,bgkhe->bghfe", k, v))
    total = exclusive(jnp.sum(k, axis=2))  # [B, G, H, f]
    num = num + jnp.einsum("bgqhf,bghfe->bgqhe", q, state)
    den = den + jnp.einsum("bgqhf,bghf->bgqh", q, total)
    num = num.reshape(b, g * c, h, -1)[:, :n]
    return num, den.reshape(b, g * c, h)[:, :n]


def to_blocks(y: jax.Array, size: int) -> jax.Array:
    """[B, L, ...] -> [B, ceil(L / size), size, ...], padded at the end with zeros (False)."""
    pad = -y.shape[1] % size
    y = jnp.pad(y, [(0, 0), (0, pad)] + [(0, 0)] * (y.ndim - 2))
    return y.reshape(y.shape[0], -1, size, *y.shape[2:])


def from_blocks(y: jax.Array, length: int) -> jax.Array:
    """[B, G, c, ...] -> [B, length, ...]: the inverse of ``to_blocks``."""
    return y.reshape(y.shape[0], -1, *y.shape[3:])[:, :length]


def blockwise(fn, arrays: tuple[jax.Array, ...], size: int) -> jax.Array:
    """``fn`` applied block by block, without padding to a whole number of blocks.

    ``arrays`` are [B, L, ...] (the same L); ``fn`` takes their blocks [B, G, c, ...] and
    returns [B, G, c, ...] for any block length c. The first L - L % size positions run as
    blocks of ``size``; the ragged tail (L % size positions) runs as one block of its own
    length instead of being padded to ``size``: the same result when ``fn`` masks padded
    keys (they contribute nothing), for less work (at L = 1025 and size 256, 1025 rather
    than 1280 positions). Returns [B, L, ...].
    """
    n = arrays[0].shape[1]
    full = n - n % size
    parts = []
    if full:
        parts.append(from_blocks(fn(*(to_blocks(a[:, :full], size) for a in arrays)), full))
    if full < n:
        parts.append(from_blocks(fn(*(a[:, None, full:] for a in arrays)), n - full))
    return parts[0] if len(parts) == 1 else jnp.concatenate(parts, axis=1)


def with_neighbours(y: jax.Array) -> jax.Array:
    """[B, G, c, ...] -> [B, G, 3c, ...]: each block preceded by the block before it and
    followed by the block after it (zeros / False beyond the ends)."""
    padded = jnp.pad(y, [(0, 0), (1, 1)] + [(0, 0)] * (y.ndim - 2))
    return jnp.concatenate([padded[:, :-2], padded[:, 1:-1], padded[:, 2:]], axis=2)


def band(c: int, radius: int) -> np.ndarray:
    """bool[c, 3c]: which keys of ``with_neighbours`` lie within ``radius`` of each query.

    Query p of block t sits at t*c + p; gathered key s at (t-1)*c + s.
    """
    offset = np.arange(3 * c)[None, :] - c - np.arange(c)[:, None]
    return np.abs(offset) <= radius


class MultiHeadAttention(nnx.Module):
    """Base of the multi-head mechanisms: checks, Q/K/V/out projections, heads, dropout.

    A subclass sets ``kind`` (its registered name, which starts its error messages) and
    starts ``__call__`` with ``self._check_call(...)``. A mechanism without options of its own
    keeps the ``__init__`` below; one with options calls ``self._init_heads(...)`` first in its
    own ``__init__`` (then checks its options) and builds its projections with
    ``_init_projections`` (or by hand, in its own order).
    """

    replaces_mlp = False
    kind = "multi-head"

    def __init__(
        self,
        *,
        dim: int,
        num_heads: int,
        max_len: int,
        rngs: nnx.Rngs,
        qkv_dim: int | None = None,
        dropout_rate: float = 0.0,
    ):
        self._init_heads(dim, num_heads, max_len, qkv_dim, dropout_rate)
        self._init_projections(rngs)

    @property
    def label(self) -> str:
        return f"{self.kind} attention"

    def _init_heads(
        self,
        dim: int,
        num_heads: int,
        max_len: int,
        qkv_dim: int | None,
        dropout_rate: float,
    ) -> int:
        """Check the common arguments, set dim, num_heads, head_dim, max_len and the dropout
        layer; return qkv_dim (E, ``dim`` when None). Draws no random numbers."""
        qkv_dim = dim if qkv_dim is None else qkv_dim
        if num_heads < 1 or qkv_dim % num_heads:
            raise ValueError(
                f"{self.label}: qkv_dim={qkv_dim} must be divisible by "
                f"num_heads={num_heads}; change one of them"
            )
        check_dropout(self.label, dropout_rate)
        self.dim = dim
        self.num_heads = num_heads
        self.head_dim = qkv_dim // num_heads
        self.max_len = max_len
        self.dropout = nnx.Dropout(dropout_rate)
        return qkv_dim

    def _dense_in(self, rngs: nnx.Rngs) -> nnx.Linear:
        """A Dense D -> E."""
        return nnx.Linear(self.dim, self.num_heads * self.head_dim, rngs=rngs)

    def _dense_out(self, rngs: nnx.Rngs) -> nnx.Linear:
        """A Dense E -> D."""
        return nnx.Linear(self.num_heads * self.head_dim, self.dim, rngs=rngs)

    def _init_projections(self, rngs: nnx.Rngs) -> None:
        """``query``, ``key``, ``value`` (D -> E) and ``out`` (E -> D), drawn in that order."""
        self.query = self._dense_in(rngs)
        self.key = self._dense_in(rngs)
        self.value = self._dense_in(rngs)
        self.out = self._dense_out(rngs)

    def _check_call(
        self, x, mask, deterministic, rngs, needs: str = "attention dropout"
    ) -> tuple[int, int]:
        """(B, L); see ``check_call``."""
        return check_call(self.label, x, mask, deterministic, rngs, needs)

    def _check_length(self, n: int, why: str) -> None:
        """Raise ValueError if the sequence is longer than max_len (``why``: the reason)."""
        if n > self.max_len:
            raise ValueError(
                f"{self.label}: sequence length {n} exceeds max_len={self.max_len}; {why}"
            )

    def _heads(self, y: jax.Array) -> jax.Array:
        """[..., E] -> [..., H, d_h]."""
        return y.reshape(*y.shape[:-1], self.num_heads, self.head_dim)

    def _merge(self, y: jax.Array) -> jax.Array:
        """[..., H, d_h] -> [..., E]."""
        return y.reshape(*y.shape[:-2], self.num_heads * self.head_dim)

    def _qkv(self, x: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
        """Q, K, V float[B, L, H, d_h] from x float[B, L, D]."""
        return self._heads(self.query(x)), self._heads(self.key(x)), self._heads(self.value(x))

    def _attend(self, logits, v, key_mask, deterministic, rngs) -> jax.Array:
        """Softmax over the keys, dropout, weighted sum of the values.

        logits float[B, H, Lq, Lk], v float[B, Lk, H, d_h], key_mask bool[B, Lk] (False keys
        excluded) or None -> float[B, Lq, H, d_h].
        """
        if key_mask is not None:
            logits = mask_logits(logits, key_mask.astype(bool)[:, None, None, :])
        weights = jax.nn.softmax(logits, axis=-1)
        weights = self.dropout(weights, deterministic=deterministic, rngs=rngs)
        return jnp.einsum("bhqk,bkhd->bqhd", weights, v)
