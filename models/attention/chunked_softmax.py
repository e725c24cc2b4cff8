"""Exact softmax attention computed a block of queries at a time (the memory-efficient path).

The formula is that of :mod:`lra.models.attention.softmax` (Vaswani et al., 2017), unchanged:

    out_h = dropout( softmax(Q_h K_h^T / sqrt(d_h) + mask bias) ) V_h

but the queries are taken ``block`` at a time (``lax.map``, one block after the other), so
the logits and weights that exist at once are float[B, H, block, L] instead of
float[B, H, L, L], and each block's function is rematerialised in the backward pass
(``jax.checkpoint``): the gradient recomputes a block's logits instead of keeping all
L x L of them (Rabe & Staats, "Self-attention Does Not Need O(n^2) Memory", 2021, query
chunking; every row's softmax sees all of its keys at once, so no online rescaling is
needed). Training memory of the attention falls from O(B H L^2) to O(B H block L); on a CPU
the blocks also stay in cache, which is faster from L = 1024 on (see ``choose_implementation``
in softmax.py and the README's performance section).

Shapes (B batch, L length, H heads, d_h head size):

    q, k, v:   float[B, L, H, d_h]   (q already scaled by 1/sqrt(d_h))
    key_mask:  bool[B, L]            True = real key; False keys get the most negative
                                     finite logit (an all-padding row: uniform weights)
    returns:   float[B, L, H, d_h]

Attention dropout draws each block's keep-mask from ``fold_in(dropout_key, block index)``:
the same distribution as the plain path (keep with probability 1 - rate, kept weights
scaled by 1 / (1 - rate)), other random numbers. The ragged tail (L % block queries) runs
as one block of its own length, not padded.

Causal mode (``causal=True``): query i of block t (position t * block + i) also excludes the
keys after it, so row i's softmax runs over keys 0..i; the rows still see all of K at once
(keys beyond the query get the excluded-key logit), so the memory is unchanged.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from lra.models.attention.common import mask_logits

__all__ = ["DEFAULT_BLOCK", "block_dropout_keep", "query_chunked_attention"]

DEFAULT_BLOCK = 128


def block_dropout_keep(dropout_key: jax.Array, index, rate: float, shape) -> jax.Array:
    """bool[shape]: the keep-mask of query block ``index`` (True = kept, probability 1 - rate)."""
    return jax.random.bernoulli(jax.random.fold_in(dropout_key, index), 1.0 - rate, shape)


def query_chunked_attention(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    key_mask: jax.Array,
    *,
    block: int = DEFAULT_BLOCK,
    dropout_rate: float = 0.0,
    dropout_key: jax.Array | None = None,
    causal: bool = False,
) -> jax.Array:
    """Softmax attention of q over (k, v), ``block`` queries at a time; see the module doc.

    Dropout applies when ``dropout_rate > 0`` and ``dropout_key`` is given. ``causal``: query
    i sees only keys j <= i (and the key mask), as in softmax.py's causal mode.
    """
    if block < 1:
        raise ValueError(f"chunked softmax attention: block must be >= 1, got {block}")
    drop = dropout_rate > 0 and dropout_key is not None
    keep_bias = key_mask.astype(bool)[:, None, None, :]  # [B, 1, 1, L]
    key_position = jnp.arange(k.shape[1])

    @jax.checkpoint
    def attend(q_block: jax.Array, index) -> jax.Array:
        """q_block float[B, c, H, d_h] -> float[B, c, H, d_h]."""
        keep = keep_bias
        if causal:  # the block's queries sit at index * block + 0 .. c-1
            query_position = index * block + jnp.arange(q_block.shape[1])
            keep = keep & (key_position[None, :] <= query_position[:, None])
        logits = mask_logits(jnp.einsum("bqhd,bkhd->bhqk", q_block, k), keep)
        weights = jax.nn.softmax(logits, axis=-1)  # [B, H, c, L]
        if drop:
            kept = block_dropout_keep(dropout_key, index, dropout_rate, weights.shape)
            scale = jnp.asarray(1.0 / (1.0 - dropout_rate), weights.dtype)
            weights = jnp.where(kept, weights * scale, jnp.zeros((), weights.dtype))
        return jnp.einsum("bhqk,bkhd->bqhd", weights, v)

    b, n = q.shape[:2]
    full = n - n % block
    parts = []
    if full:
        blocks = q[:, :full].reshape(b, full // block, block, *q.shape[2:]).swapaxes(0, 1)
        out = jax.lax.map(lambda args: attend(*args), (blocks, jnp.arange(full // block)))
        parts.append(out.swapaxes(0, 1).reshape(b, full, *q.shape[2:]))
    if full < n:
        parts.append(attend(q[:, full:], full // block))
    return parts[0] if len(parts) == 1 else jnp.concatenate(parts, axis=1)
