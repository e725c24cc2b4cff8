"""LSH attention (Reformer): Kitaev, Kaiser, Levskaya, "Reformer: The Efficient Transformer",
ICLR 2020.

Shared-QK attention restricted, by locality-sensitive hashing, to keys likely to be close.
Shapes (B batch, L length, D model dim, H heads, E = qkv_dim, d = E / H, R = n_hashes,
nb = n_buckets, c = chunk_length):

    Q = x W_qk                      float[B, L, H, d]   queries; also the keys, normalised:
    K_j = Q_j / sqrt(mean(Q_j^2) + 1e-6) / sqrt(d)      (= Q_j / |Q_j|, as in Trax and HF)
    V = x W_v                       float[B, L, H, d]
    hash_r(i) = argmax([Q_i M_r ; -Q_i M_r])   M_r float[d, nb / 2] random, per head and round
    for each round r: sort positions by (hash_r, position), cut the sorted order into chunks
    of c; a query attends the keys of its own chunk and of the previous chunk:
        o_r(i) = sum_j softmax_j(Q_i . K_j) V_j,  lse_r(i) = logsumexp_j(Q_i . K_j)
    out_i = sum_r softmax_r(lse_r(i)) o_r(i),  then W_o

Self is excluded: a query's own key gets a large negative but finite logit, so it is used
only when no other real key is in reach (the paper's rule). Keys of another bucket that fall
in the same or previous chunk are attended too (Trax's and HF's default). Rounds are not
de-duplicated (Trax and HF do not either).

Rotations M: with deterministic=True, fixed ones drawn once at init from the init rngs and
stored as a non-trained variable (so evaluation is a pure function of the parameters and
inputs); with deterministic=False, fresh ones from the call-time ``rngs`` ('dropout' stream,
the stream the encoder threads), shared by the batch, different per head and round. HF
redraws at every call, train or eval, and the LRA JAX code always used one fixed key.

Options and defaults: n_hashes = 2 (the Nystromformer / Transformer-LS LRA scripts, which run
HF's LSHSelfAttention with num_hash = 2), chunk_length = 64 (HF's default
lsh_attn_chunk_length), n_buckets = None: chosen from max_len as HF does from the sequence
length, the largest power of two <= 2 * max_len / chunk_length (at least 2; HF factorises
counts above 128 with chunk 64, which LRA lengths up to 4K + CLS do not reach). n_buckets
must be even, or 1 (everything in one bucket, no hashing). With nb ~ 2 L / c the hashing
costs O(R L nb) = O(R L^2 / c), comparable to the O(R L c) attention at LRA lengths (as in
HF). ``dropout_rate`` drops entries of the attention weights of each round.

Padding: padded keys get the most negative finite logit (below the self logit). Padded
positions are given an extra bucket past the last one, so they sort after every real token:
they never displace real tokens from chunks, and changing their values changes nothing at
real positions. Unlike Trax/HF/LRA, the first chunk does not wrap around to look at the
last one. Together with n_buckets fixed by max_len, this makes appending padding leave the
outputs at real positions unchanged too (the real tokens fill the same leading chunks);
with wrap-around (theirs) the first chunk would see the last chunk, which padding changes.
The sequence is padded internally to a multiple of chunk_length the same way.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from lra.models.attention.common import MultiHeadAttention
from lra.models.registry import register

__all__ = ["LSHRotations", "ReformerAttention"]


class LSHRotations(nnx.Variable):
    """Fixed random rotations float[H, d, R, nb / 2] used when deterministic (not trained)."""


def default_n_buckets(max_len: int, chunk_length: int) -> int:
    """HF's rule: the largest power of two <= 2 * max_len // chunk_length, at least 2."""
    return 2 ** max((2 * (max_len // chunk_length)).bit_length() - 1, 1)


@register("reformer")
class ReformerAttention(MultiHeadAttention):
    """Multi-round LSH attention with shared QK."""

    kind = "reformer"
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
        n_hashes: int = 2,
        n_buckets: int | None = None,
        chunk_length: int = 64,
    ):
        self._init_heads(dim, num_heads, max_len, qkv_dim, dropout_rate)
        if n_hashes < 1:
            raise ValueError(f"reformer attention: n_hashes must be >= 1, got {n_hashes}")
        if chunk_length < 1:
            raise ValueError(f"reformer attention: chunk_length must be >= 1, got {chunk_length}")
        if n_buckets is None:
            n_buckets = default_n_buckets(max_len, chunk_length)
        if n_buckets < 1 or (n_buckets > 1 and n_buckets % 2):
            raise ValueError(
                f"reformer attention: n_buckets must be 1 or a positive even number, got "
                f"{n_buckets}"
            )
        self.n_hashes = n_hashes
        self.n_buckets = n_buckets
        self.chunk_length = chunk_length
        self.query_key = self._dense_in(rngs)
        self.value = self._dense_in(rngs)
        self.out = self._dense_out(rngs)
        self.rotations = LSHRotations(jax.random.normal(rngs.params(), self._rotation_shape()))

    def _rotation_shape(self) -> tuple[int, ...]:
        return (self.num_heads, self.head_dim, self.n_hashes, self.n_buckets // 2)

    def _buckets(self, qk: jax.Array, mask: jax.Array, rotations: jax.Array) -> jax.Array:
        """int[B, H, R, L]: the bucket of each position per round; padding -> n_buckets."""
        b, h, n, _ = qk.shape
        if self.n_buckets == 1:
            buckets = jnp.zeros((b, h, self.n_hashes, n), jnp.int32)
        else:
            rotated = jnp.einsum("bhld,hdrk->bhrlk", qk, rotations.astype(qk.dtype))
            rotated = jnp.concatenate([rotated, -rotated], axis=-1)
            buckets = jnp.argmax(rotated, axis=-1).astype(jnp.int32)
        return jnp.where(mask[:, None, None, :], buckets, self.n_buckets)

    def __call__(
        self,
        x: jax.Array,
        *,
        mask: jax.Array,
        deterministic: bool = True,
        rngs: nnx.Rngs | None = None,
    ) -> jax.Array:
        b, n = self._check_call(
            x, mask, deterministic, rngs, needs="the random rotations and attention dropout"
        )
        c = self.chunk_length
        pad = -n % c
        length = n + pad
        chunks = length // c
        mask = jnp.pad(mask.astype(bool), [(0, 0), (0, pad)])
        x = jnp.pad(x, [(0, 0), (0, pad), (0, 0)])

        qk = self._heads(self.query_key(x)).transpose(0, 2, 1, 3)  # [B, H, L, d]
        v = self._heads(self.value(x)).transpose(0, 2, 1, 3)
        dtype = qk.dtype
        if deterministic:
            rotations = self.rotations[...]
        else:
            rotations = jax.random.normal(rngs.dropout(), self._rotation_shape())
        buckets = jax.lax.stop_gradient(self._buckets(qk, mask, rotations))

        # Sort each round by (bucket, position); padding sorts last.
        positions = jnp.arange(length, dtype=jnp.int32)
        order = jnp.argsort(buckets * length + positions, axis=-1)  # [B, H, R, L]
        undo = jnp.argsort(order, axis=-1)

        def gather(y: jax.Array) -> jax.Array:  # [B, H, L, ...] -> sorted [B, H, R, L, ...]
            idx = order.reshape(*order.shape, *([1] * (y.ndim - 3)))
            return jnp.take_along_axis(y[:, :, None], idx, axis=3)

        def chunked(y: jax.Array) -> jax.Array:
            return y.reshape(b, self.num_heads, self.n_hashes, chunks, c, *y.shape[4:])

        def look_back(y: jax.Array, fill) -> jax.Array:  # previous chunk, then own chunk
            edge = jnp.full_like(y[:, :, :, :1], fill)
            return jnp.concatenate([jnp.concatenate([edge, y[:, :, :, :-1]], 3), y], axis=4)

        variance = jnp.mean(jnp.square(qk), axis=-1, keepdims=True)
        keys = qk * jax.lax.rsqrt(variance + jnp.asarray(1e-6, dtype))
        keys = keys * jnp.asarray(self.head_dim**-0.5, dtype)
        s_q = chunked(gather(qk))  # [B, H, R, C, c, d]
        s_k = look_back(chunked(gather(keys)), 0)  # [B, H, R, C, 2c, d]
        s_v = look_back(chunked(gather(v)), 0)
        q_pos = chunked(order)  # [B, H, R, C, c]
        k_pos = look_back(q_pos, -1)  # [B, H, R, C, 2c]
        k_real = look_back(chunked(jnp.take_along_axis(mask[:, None, None], order, axis=3)), False)

        finfo = jnp.finfo(dtype)
        logits = jnp.einsum("bhrcid,bhrcjd->bhrcij", s_q, s_k)
        logits = jnp.where(k_real[..., None, :], logits, jnp.asarray(finfo.min, dtype))
        is_self = q_pos[..., :, None] == k_pos[..., None, :]
        logits = jnp.where(is_self, jnp.asarray(finfo.min / 2, dtype), logits)
        lse = jax.nn.logsumexp(logits, axis=-1, keepdims=True)
        weights = jnp.exp(logits - lse)
        weights = self.dropout(weights, deterministic=deterministic, rngs=rngs)
        o = jnp.einsum("bhrcij,bhrcjd->bhrcid", weights, s_v)

        # Unsort and combine the rounds, weighted by their softmax normalisers.
        o = o.reshape(b, self.num_heads, self.n_hashes, length, self.head_dim)
        o = jnp.take_along_axis(o, undo[..., None], axis=3)
        lse = jnp.take_along_axis(lse.reshape(undo.shape), undo, axis=3)
        round_weights = jax.nn.softmax(lse, axis=2)[..., None]
        y = jnp.sum(o * round_weights, axis=2)  # [B, H, L, d]
        return self.out(self._merge(y.transpose(0, 2, 1, 3))[:, :n])
