"""The random generator of dropout masks: a counter-based hash, cheap on every backend.

Why: dropout draws one random number per activation, several times per layer and step.
On CPU, JAX's built-in generators cost more than the model they serve: in the Figure-1
TransNormer T2 train step (Text setting, 6 layers, d_model 128, L = 1024, batch 2) XLA's
``rng_bit_generator`` ("rbg") took about 255 of 450 ms (its profile, ``jax.profiler``), and
threefry was no faster. A keyed integer hash of the element's index costs a handful of
vectorised integer operations per element instead (measured: 0.19 ms against 5.7 ms for
threefry and 12.9 ms for rbg for one float32[2, 1025, 512] Bernoulli draw on this 2-core CPU).

``trainer.dropout_rng`` chooses the generator of the dropout keys:

    hash      (default) this module's generator, registered with JAX through
              ``jax.extend.random.define_prng_impl``: every ``jax.random`` function
              (``bernoulli``, ``split``, ``fold_in``; nnx.Dropout) works with its keys
    rbg       JAX's "rbg" (XLA's RngBitGenerator)
    threefry  JAX's default threefry2x32

Parameter initialisation always uses JAX's default generator. The generator changes the
masks, so it is part of a run's identity: a checkpoint never resumes under another one.

The generator. A key is four 32-bit words (k0, k1, offset, stride): two random words and the
place of the draw's rows in the global batch. Element (b, j) of a draw of shape [B, ...]
(b its index on the leading axis, j its row-major index in the rest, R elements per row) has
the counter

    i = (offset + stride * b) * R + j

and the bits

    bits(i) = h(h(i + k0) XOR k1),    h = "lowbias32", an invertible 32-bit integer hash
                                       (Wellons, "Prospecting for hash functions", 2018:
                                       x ^= x >> 16; x *= 0x7feb352d; x ^= x >> 15;
                                       x *= 0x846ca68b; x ^= x >> 16)

so for a fixed key the 2^32 counters map to 2^32 distinct values. A seed's key has offset 0
and stride 1, where i is the element's row-major index: the masks of a whole batch. Split and
fold_in draw the child keys' random words the same way from a key whose first word is XOR-ed
with a tag (one per operation), so a child key is never the parent's own random bits, and
pass the offset and stride on unchanged; the seed's key is the hash
of the seed's two 32-bit halves (without x64, JAX passes only the low 32 bits, as for its
own generators). Draws of 8 and 16 bits take the top bits of the 32-bit
value, 64-bit draws hash the counter with a tagged key for the high word. A draw needs fewer
than 2^32 elements (an error otherwise). This is a generator for dropout masks, not for
cryptography or for statistics that need more than 32 bits per draw.

Masks that do not depend on how a batch is cut. Every dropout draw of the models has the
batch on its leading axis (``float[B, L, D]`` activations, ``float[B, H, L, L]`` attention
weights, their blocks ``float[B, ...]``). :func:`batch_rows` gives a key whose draws are the
rows ``offset, offset + stride, ...`` of the whole batch's draw: the train step gives
micro-batch k of K (rows k, k + K, ... of the batch, :func:`lra.train.steps._micro_batches`)
``batch_rows(key, k, K)``, so ``trainer.grad_accum=K`` draws exactly the masks of the full
batch and trains to its losses (float rounding aside). A mesh needs nothing: the step draws
the global array's masks and XLA partitions the counters. The global counter must stay below
2^32 (checked for the local draw only). ``rbg`` and ``threefry`` keep JAX's own layout:
:func:`batch_rows` folds the micro-batch index into their key, so with them and dropout on,
``grad_accum`` > 1 draws other masks than the full batch (as another seed would).
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
from jax.extend.random import define_prng_impl

from lra.config.schema import check_value
from lra.config.types import DropoutGenerator, allowed

__all__ = ["GENERATORS", "HASH_PRNG", "batch_rows", "cuts_batches_exactly", "dropout_key", "hash32"]

# Tags that separate the uses of one key (arbitrary odd constants: digits of pi).
_SPLIT_TAG = np.uint32(0x243F6A88)
_FOLD_TAG = np.uint32(0x85A308D3)
_HIGH_TAG = np.uint32(0x13198A2E)
_SEED_TAG = np.uint32(0x03707344)


def hash32(x: jax.Array) -> jax.Array:
    """lowbias32 of uint32 ``x`` (elementwise; a bijection of the 32-bit integers)."""
    x = x ^ (x >> 16)
    x = x * jnp.uint32(0x7FEB352D)
    x = x ^ (x >> 15)
    x = x * jnp.uint32(0x846CA68B)
    return x ^ (x >> 16)


def _bits(k0: jax.Array, k1: jax.Array, counter: jax.Array) -> jax.Array:
    return hash32(hash32(counter + k0) ^ k1)


def _counter(shape: tuple[int, ...]) -> jax.Array:
    size = math.prod(shape)
    if size >= 2**32:
        raise ValueError(
            f"dropout_rng 'hash': a draw of shape {shape} has {size} elements, more than the "
            "generator's 2^32 counters; use trainer.dropout_rng=threefry for this model"
        )
    return jax.lax.iota(jnp.uint32, size).reshape(shape)


def _row_counter(key: jax.Array, shape: tuple[int, ...]) -> jax.Array:
    """uint32[shape]: ``(offset + stride * b) * R + j`` (module docstring) of ``key``'s rows.

    With offset 0 and stride 1 this is the row-major index, bit for bit (uint32 wraps alike).
    """
    counter = _counter(shape)
    if len(shape) == 0:
        return counter + key[2]
    rest = jnp.uint32(math.prod(shape[1:]))
    rows = jax.lax.broadcasted_iota(jnp.uint32, shape, 0)
    return counter + (key[2] + (key[3] - jnp.uint32(1)) * rows) * rest


def _words(key: jax.Array, tag, count: int) -> jax.Array:
    """uint32[count]: ``count`` words of ``key`` with its first word tagged."""
    return _bits(key[0] ^ jnp.uint32(tag), key[1], _counter((count,)))


# The (offset, stride) words of a key whose draws are a whole batch's.
_WHOLE_BATCH = np.array([0, 1], np.uint32)


def _seed(seed: jax.Array) -> jax.Array:
    low = seed.astype(jnp.uint32)
    # As JAX's generators do: a seed's high word only when it arrives as 64 bits (x64 on).
    wide = jnp.iinfo(seed.dtype).bits > 32
    high = (seed >> 32).astype(jnp.uint32) if wide else jnp.uint32(0)
    words = _words(jnp.stack([low, high]), _SEED_TAG, 2)
    return jnp.concatenate([words, jnp.asarray(_WHOLE_BATCH)])


def _split(key: jax.Array, shape: tuple[int, ...]) -> jax.Array:
    words = _words(key, _SPLIT_TAG, 2 * math.prod(shape)).reshape(*shape, 2)
    layout = jnp.broadcast_to(key[2:], (*shape, 2))
    return jnp.concatenate([words, layout], axis=-1)


def _fold_in(key: jax.Array, data: jax.Array) -> jax.Array:
    counter = jnp.asarray(data, jnp.uint32) * jnp.uint32(2) + jnp.arange(2, dtype=jnp.uint32)
    return jnp.concatenate([_bits(key[0] ^ jnp.uint32(_FOLD_TAG), key[1], counter), key[2:]])


def _random_bits(key: jax.Array, bit_width: int, shape: tuple[int, ...]) -> jax.Array:
    counter = _row_counter(key, tuple(shape))
    low = _bits(key[0], key[1], counter)
    if bit_width == 32:
        return low
    if bit_width in (8, 16):
        return (low >> (32 - bit_width)).astype(jnp.dtype(f"uint{bit_width}"))
    if bit_width == 64:
        high = _bits(key[0] ^ jnp.uint32(_HIGH_TAG), key[1], counter)
        return (high.astype(jnp.uint64) << 32) | low.astype(jnp.uint64)
    raise ValueError(f"dropout_rng 'hash': bit_width must be 8, 16, 32 or 64, got {bit_width}")


HASH_PRNG = define_prng_impl(
    key_shape=(4,),
    seed=_seed,
    split=_split,
    random_bits=_random_bits,
    fold_in=_fold_in,
    name="lra_hash32",
    tag="lh",
)
# trainer.dropout_rng -> the JAX PRNG implementation of its keys.
_IMPLS = {"hash": HASH_PRNG, "rbg": "rbg", "threefry": "threefry2x32"}
GENERATORS = allowed(DropoutGenerator)  # hash: the fast default; rbg, threefry: JAX's own
assert set(GENERATORS) == set(_IMPLS)


def cuts_batches_exactly(key: jax.Array) -> bool:
    """True if ``key``'s generator draws the same masks however a batch is cut (``hash``)."""
    return jax.random.key_impl(key) == jax.random.key_impl(jax.random.key(0, impl=HASH_PRNG))


def batch_rows(key: jax.Array, offset, stride: int) -> jax.Array:
    """A key whose draws are rows ``offset, offset + stride, ...`` of ``key``'s draws.

    ``key`` draws a whole batch's masks (offset 0, stride 1, as every key from
    :func:`dropout_key` and its splits and folds); ``offset`` may be traced (the index of a
    micro-batch in a ``lax.scan``). For ``rbg`` and ``threefry`` keys, which cannot address
    rows, ``fold_in(key, offset)``: other masks than the whole batch's.
    """
    if not cuts_batches_exactly(key):
        return jax.random.fold_in(key, offset)
    data = jax.random.key_data(key)
    layout = jnp.stack([jnp.asarray(offset, jnp.uint32), jnp.asarray(stride, jnp.uint32)])
    # rows offset + stride * b of a key that already addresses rows o + s * b'
    layout = jnp.stack([data[2] + data[3] * layout[0], data[3] * layout[1]])
    return jax.random.wrap_key_data(jnp.concatenate([data[:2], layout]), impl=HASH_PRNG)


def dropout_key(seed: int, generator: str = "hash") -> jax.Array:
    """The root dropout key of a run: ``jax.random.key(seed)`` with ``generator``'s impl."""
    check_value("trainer.dropout_rng", generator)
    return jax.random.key(int(seed), impl=_IMPLS[generator])
