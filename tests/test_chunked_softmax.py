"""Query-chunked softmax attention against the plain path: values, gradients, padding,
dropout, the automatic choice, and the memory it saves."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import lra.models
from lra.models.attention.chunked_softmax import block_dropout_keep, query_chunked_attention
from lra.models.attention.common import mask_logits
from lra.train.describe import softmax_implementations

B, H, DH = 2, 2, 8


def qkv_and_mask(n: int, lengths=None, seed=0):
    rng = np.random.default_rng(seed)
    q, k, v = (jnp.asarray(rng.normal(size=(B, n, H, DH)), jnp.float32) for _ in range(3))
    lengths = np.array(lengths if lengths is not None else [n, max(n // 3, 1)])
    return q, k, v, jnp.asarray(np.arange(n)[None, :] < lengths[:, None])


def plain(q, k, v, mask, keep=None, rate=0.0):
    """The formula on the whole [B, H, L, L] at once; ``keep`` bool[B, H, L, L] drops weights."""
    logits = mask_logits(jnp.einsum("bqhd,bkhd->bhqk", q, k), mask[:, None, None, :])
    weights = jax.nn.softmax(logits, axis=-1)
    if keep is not None:
        weights = jnp.where(keep, weights / (1.0 - rate), 0.0)
    return jnp.einsum("bhqk,bkhd->bqhd", weights, v)


@pytest.mark.parametrize(
    ("n", "block"),
    [(32, 8), (37, 8), (5, 8), (16, 16)],  # whole blocks, a ragged tail, L < block, one block
)
def test_values_and_gradients_equal_the_plain_formula(n, block):
    q, k, v, mask = qkv_and_mask(n)

    def loss(fn):
        return lambda q, k, v: jnp.sum(jnp.sin(fn(q, k, v, mask)))

    chunked = lambda q, k, v, m: query_chunked_attention(q, k, v, m, block=block)  # noqa: E731
    np.testing.assert_allclose(chunked(q, k, v, mask), plain(q, k, v, mask), atol=2e-6)
    got = jax.grad(loss(chunked), argnums=(0, 1, 2))(q, k, v)
    want = jax.grad(loss(plain), argnums=(0, 1, 2))(q, k, v)
    for g, w in zip(got, want, strict=True):
        np.testing.assert_allclose(g, w, atol=2e-5)


def test_padding_keys_change_nothing_and_an_all_padding_row_is_uniform():
    n = 20
    q, k, v, mask = qkv_and_mask(n, lengths=[12, 0])
    out = query_chunked_attention(q, k, v, mask, block=8)
    # Real rows: the keys past the length do not matter (masked against unmasked).
    short = query_chunked_attention(q[:, :12], k[:, :12], v[:, :12], mask[:, :12], block=8)
    np.testing.assert_allclose(out[0, :12], short[0], atol=2e-6)
    noisy = k.at[0, 12:].set(100.0), v.at[0, 12:].set(-50.0)
    np.testing.assert_allclose(
        query_chunked_attention(q, *noisy, mask, block=8)[0], out[0], atol=2e-6
    )
    # A row with no real key: uniform weights over all keys, as the plain path (not NaN).
    np.testing.assert_allclose(out[1], np.broadcast_to(v[1].mean(0), out[1].shape), atol=2e-6)


def test_dropout_uses_each_blocks_mask_and_is_off_without_a_key():
    n, block, rate = 21, 8, 0.3
    q, k, v, mask = qkv_and_mask(n)
    key = jax.random.key(3)
    got = query_chunked_attention(q, k, v, mask, block=block, dropout_rate=rate, dropout_key=key)
    starts = range(0, n, block)
    keep = jnp.concatenate(
        [
            block_dropout_keep(key, i, rate, (B, H, min(block, n - s), n))
            for i, s in enumerate(starts)
        ],
        axis=2,
    )
    np.testing.assert_allclose(got, plain(q, k, v, mask, keep, rate), atol=2e-6)
    assert 0.55 < float(keep.mean()) < 0.85  # 1 - rate = 0.7 over 2*2*21*21 draws
    assert not jnp.array_equal(keep[:, :, :8], keep[:, :, 8:16])  # each block its own draw
    without = query_chunked_attention(q, k, v, mask, block=block, dropout_rate=rate)
    np.testing.assert_allclose(without, plain(q, k, v, mask), atol=2e-6)


def test_softmax_module_chunked_equals_plain_and_auto_is_chunked_from_1024_on_cpu():
    def make(**options):  # the same weights every time
        return lra.models.make_attention(
            "softmax", dim=16, num_heads=2, max_len=40, rngs=nnx.Rngs(0), **options
        )

    x = jnp.asarray(np.random.default_rng(1).normal(size=(2, 40, 16)), jnp.float32)
    mask = jnp.arange(40)[None, :] < jnp.array([[40], [9]])
    outs = {
        impl: make(implementation=impl, block_size=16)(x, mask=mask)
        for impl in ("plain", "chunked")
    }
    np.testing.assert_allclose(outs["chunked"], outs["plain"], atol=2e-6)
    with pytest.raises(ValueError, match="block_size must be an integer >= 1"):
        make(block_size=0)
    dropping = make(implementation="chunked", block_size=16, dropout_rate=0.5)
    a = dropping(x, mask=mask, deterministic=False, rngs=nnx.Rngs(dropout=1))
    b = dropping(x, mask=mask, deterministic=False, rngs=nnx.Rngs(dropout=1))
    c = dropping(x, mask=mask, deterministic=False, rngs=nnx.Rngs(dropout=2))
    np.testing.assert_array_equal(a, b)  # the masks come from the dropout stream
    assert not np.allclose(a, c)
    np.testing.assert_allclose(dropping(x, mask=mask), outs["plain"], atol=2e-6)  # eval: none


def test_the_description_names_the_path_each_length_runs(tmp_path):
    from conftest import make_config

    long = make_config("model=transformer", "task=text_tiny", "task.max_length=1023")
    assert softmax_implementations(long) == {"train": "chunked", "eval": "chunked"}  # + CLS
    short = make_config("model=transformer", "task=text_tiny", "task.max_length=1000")
    assert softmax_implementations(short) == {"train": "plain", "eval": "plain"}


def test_chunked_gradient_needs_far_less_compiled_memory():
    n = 1024
    q, k, v, mask = qkv_and_mask(n)

    def temp_bytes(fn) -> int:
        grad = jax.jit(jax.grad(lambda q, k, v: jnp.sum(fn(q, k, v, mask) ** 2), (0, 1, 2)))
        return grad.lower(q, k, v).compile().memory_analysis().temp_size_in_bytes

    whole = temp_bytes(plain)
    chunked = temp_bytes(lambda q, k, v, m: query_chunked_attention(q, k, v, m, block=128))
    assert whole > B * H * n * n * 4  # at least one float32 [B, H, L, L]
    assert chunked < whole / 4


def test_the_flop_count_is_the_formulas_not_the_loops():
    """XLA counts a loop's body once: the chunked step's FLOPs come from the plain path."""
    from conftest import SMALL_RUN, make_config

    from lra.device import measure
    from lra.train.compile import abstract_batch, compile_steps

    def compiled(implementation):
        cfg = make_config(
            "model=transformer",
            "task=listops_tiny",
            *SMALL_RUN,
            f"+model.attention_options.softmax.implementation={implementation}",
            "+model.attention_options.softmax.block_size=8",
            "task.arch.attention_dropout=0",  # the fused path has none
        )
        return compile_steps(cfg, abstract_batch(cfg.task, 4), evaluate=False)

    chunked, plain, fused = compiled("chunked"), compiled("plain"), compiled("fused")
    assert "flops" in chunked.compile_seconds and "flops" not in plain.compile_seconds
    assert chunked.flops_per_step == plain.flops_per_step
    assert measure.compiled_flops(chunked.train_step) < 0.9 * plain.flops_per_step
    # A fused call (cuDNN on a GPU) is counted as the formula too.
    assert "flops" in fused.compile_seconds and fused.flops_per_step == plain.flops_per_step
