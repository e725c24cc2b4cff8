"""lra.train.dropout_rng: the counter-based hash generator of dropout masks.

Its statistics are checked against what a uniform generator gives (bit frequencies,
a byte chi-square, Bernoulli rates, correlation between neighbours and between child
keys), with bounds of about five standard deviations, so a failure is a defect and
not bad luck; its plumbing through ``jax.random`` and ``nnx.Dropout``; and the
``trainer.dropout_rng`` choice in a run.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import train_small
from flax import nnx

from lra.errors import ConfigError
from lra.train import dropout_rng

N = 1 << 20


def _key(seed=0):
    return dropout_rng.dropout_key(seed, "hash")


def _uniform(key, n=N) -> np.ndarray:
    return np.asarray(jax.random.uniform(key, (n,)), np.float64)


def test_hash32_is_a_bijection_on_a_block_of_integers():
    x = jnp.arange(1 << 16, dtype=jnp.uint32) * jnp.uint32(65537)
    assert len(np.unique(np.asarray(dropout_rng.hash32(x)))) == 1 << 16


def test_a_key_is_a_function_of_its_seed():
    a = jax.random.bits(_key(7), (1000,))
    assert np.array_equal(a, jax.random.bits(_key(7), (1000,)))
    assert not np.array_equal(a, jax.random.bits(_key(8), (1000,)))
    seeds = [0, 1, 2, -1, -2, 2**31 - 1, 2**31]  # distinct in 32 bits, as JAX sees them
    keys = {tuple(np.asarray(jax.random.key_data(_key(s)))) for s in seeds}
    assert len(keys) == len(seeds)


def test_every_bit_is_set_half_the_time():
    bits = np.asarray(jax.random.bits(_key(1), (N,), jnp.uint32))
    rates = ((bits[:, None] >> np.arange(32, dtype=np.uint32)) & 1).mean(axis=0)
    assert np.all(np.abs(rates - 0.5) < 5 * 0.5 / np.sqrt(N)), rates


def test_bytes_are_uniform_by_chi_square():
    bits = np.asarray(jax.random.bits(_key(2), (N,), jnp.uint32))
    for shift in (0, 8, 16, 24):
        counts = np.bincount((bits >> shift) & 0xFF, minlength=256)
        expected = N / 256
        chi2 = ((counts - expected) ** 2 / expected).sum()
        # 255 degrees of freedom: mean 255, standard deviation sqrt(510) ~ 22.6.
        assert chi2 < 255 + 5 * 22.6, (shift, chi2)


@pytest.mark.parametrize("bit_width", [8, 16])
def test_narrow_draws_are_uniform(bit_width):
    bits = np.asarray(jax.random.bits(_key(3), (N,), jnp.dtype(f"uint{bit_width}")))
    assert bits.dtype == np.dtype(f"uint{bit_width}")
    top = bits >> (bit_width - 4)  # 16 bins of the high bits
    counts = np.bincount(top.astype(np.int64), minlength=16)
    chi2 = ((counts - N / 16) ** 2 / (N / 16)).sum()
    assert chi2 < 15 + 5 * np.sqrt(30), chi2


@pytest.mark.parametrize("p", [0.1, 0.5, 0.9])
def test_bernoulli_rate(p):
    draws = np.asarray(jax.random.bernoulli(_key(4), p, (N,)))
    assert abs(draws.mean() - p) < 5 * np.sqrt(p * (1 - p) / N)


def test_neighbouring_elements_are_uncorrelated():
    u = _uniform(_key(5)).reshape(1024, 1024)
    bound = 5 / np.sqrt(N)
    assert abs(np.corrcoef(u[:, :-1].ravel(), u[:, 1:].ravel())[0, 1]) < bound
    assert abs(np.corrcoef(u[:-1].ravel(), u[1:].ravel())[0, 1]) < bound


def test_child_keys_are_distinct_and_uncorrelated():
    key = _key(6)
    children = jax.random.split(key, 1000)
    data = np.asarray(jax.random.key_data(children))
    assert len({tuple(row) for row in data}) == 1000
    assert tuple(np.asarray(jax.random.key_data(key))) not in {tuple(row) for row in data}
    folded = [jax.random.fold_in(key, i) for i in range(200)]
    assert len({tuple(np.asarray(jax.random.key_data(k))) for k in folded}) == 200
    bound = 5 / np.sqrt(N)
    pairs = [(key, children[0]), (children[0], children[1]), (folded[0], folded[1])]
    pairs += [(folded[1], children[1])]
    for a, b in pairs:
        assert abs(np.corrcoef(_uniform(a), _uniform(b))[0, 1]) < bound


def test_dropout_under_jit_drops_the_rate_and_rescales():
    layer = nnx.Dropout(0.25)

    @jax.jit
    def apply(key, x):
        return layer(x, deterministic=False, rngs=nnx.Rngs(dropout=key))

    x = jnp.ones((512, 512))
    y = np.asarray(apply(_key(8), x))
    kept = y != 0
    assert abs(kept.mean() - 0.75) < 5 * np.sqrt(0.75 * 0.25 / x.size)
    assert np.allclose(y[kept], 1 / 0.75)
    assert np.array_equal(y, np.asarray(apply(_key(8), x)))
    assert not np.array_equal(y, np.asarray(apply(jax.random.fold_in(_key(8), 1), x)))


def test_a_draw_beyond_the_counters_is_refused_before_it_is_made():
    with pytest.raises(ValueError, match="2\\^32 counters.*dropout_rng=threefry"):
        jax.jit(lambda k: jax.random.bits(k, (1 << 16, 1 << 16))).lower(_key())


def test_jax_generators_are_still_available():
    for name, impl in (("rbg", "rbg"), ("threefry", "threefry2x32")):
        key, theirs = dropout_rng.dropout_key(3, name), jax.random.key(3, impl=impl)
        assert str(jax.random.key_impl(key)) == str(jax.random.key_impl(theirs))
        assert np.array_equal(jax.random.key_data(key), jax.random.key_data(theirs))


def test_an_unknown_generator_names_the_choices():
    choices = r"^trainer\.dropout_rng: expected one of hash, rbg, threefry; got 'philox'$"
    with pytest.raises(ConfigError, match=choices):
        dropout_rng.dropout_key(0, "philox")


def test_the_generator_is_a_setting_of_the_run(listops_tiny_dir, tmp_path):
    hashed = train_small(listops_tiny_dir, tmp_path / "hash")
    assert hashed["config"]["trainer"]["dropout_rng"] == "hash"
    other = train_small(listops_tiny_dir, tmp_path / "threefry", "trainer.dropout_rng=threefry")
    assert other["overrides"] == {**hashed["overrides"], "trainer.dropout_rng": "threefry"}
    assert other["setting"] != hashed["setting"]
    losses = [[h["train_loss"] for h in r["history"]] for r in (hashed, other)]
    assert losses[0][0] == pytest.approx(losses[1][0], rel=0.2)  # same model, other masks
    assert losses[0] != losses[1]
    with pytest.raises(ConfigError, match="trainer.dropout_rng"):
        train_small(listops_tiny_dir, tmp_path / "bad", "trainer.dropout_rng=philox")


def _lowbias32(x: np.ndarray) -> np.ndarray:
    """Plain numpy lowbias32 (uint32 arithmetic wraps), the reference of hash32."""
    x = x.astype(np.uint32)
    x ^= x >> np.uint32(16)
    x *= np.uint32(0x7FEB352D)
    x ^= x >> np.uint32(15)
    x *= np.uint32(0x846CA68B)
    return x ^ (x >> np.uint32(16))


def test_a_whole_batch_draw_hashes_the_row_major_index():
    # bits(i) = h(h(i + k0) ^ k1) for i the row-major index: the masks of every run before
    # keys carried their rows (issue 29) are unchanged.
    key = jax.random.fold_in(_key(4), 7)
    k0, k1, offset, stride = (np.uint32(w) for w in np.asarray(jax.random.key_data(key)))
    assert (offset, stride) == (0, 1)
    shape = (6, 5, 3)
    index = np.arange(np.prod(shape), dtype=np.uint32).reshape(shape)
    with np.errstate(over="ignore"):
        expected = _lowbias32(_lowbias32(index + k0) ^ k1)
    assert np.array_equal(np.asarray(jax.random.bits(key, shape, jnp.uint32)), expected)


@pytest.mark.parametrize("stride", [1, 2, 4])
def test_micro_batch_keys_draw_their_rows_of_the_whole_batch(stride):
    key = _key(9)
    shape = (8, 3, 5)
    whole = np.asarray(jax.random.bernoulli(key, 0.9, shape))

    @jax.jit
    def micro(offset):  # traced offset, as in the train step's lax.scan
        child = nnx.Rngs(dropout=dropout_rng.batch_rows(key, offset, stride)).dropout()
        parent = nnx.Rngs(dropout=key).dropout()
        rows = (8 // stride, *shape[1:])
        return jax.random.bernoulli(child, 0.9, rows), jax.random.bernoulli(parent, 0.9, shape)

    for offset in range(stride):
        rows, full = micro(offset)
        assert np.array_equal(np.asarray(rows), np.asarray(full)[offset::stride])
    assert np.array_equal(
        np.asarray(jax.random.bernoulli(dropout_rng.batch_rows(key, 1, 2), 0.9, (4, 3, 5))),
        whole[1::2],
    )
    # Rows of rows: micro-batch 1 of 2 of micro-batch 1 of 2 is rows 3, 7 of the whole.
    nested = dropout_rng.batch_rows(dropout_rng.batch_rows(key, 1, 2), 1, 2)
    assert np.array_equal(np.asarray(jax.random.bernoulli(nested, 0.9, (2, 3, 5))), whole[3::4])


def test_only_the_hash_generator_cuts_batches_exactly():
    assert dropout_rng.cuts_batches_exactly(_key())
    for name in ("rbg", "threefry"):
        key = dropout_rng.dropout_key(1, name)
        assert not dropout_rng.cuts_batches_exactly(key)
        child = dropout_rng.batch_rows(key, 1, 2)
        assert np.array_equal(
            jax.random.key_data(child), jax.random.key_data(jax.random.fold_in(key, 1))
        )
