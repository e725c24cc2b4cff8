"""The contract every registered mechanism keeps, parametrized over models.ATTENTION_NAMES.

1. Shapes through jax.eval_shape; finite outputs and gradients at length 4096.
2. Padded positions have no influence: changing the inputs at masked positions leaves the
   outputs at real positions unchanged, and (for mechanisms whose definition does not depend
   on the padded length) so does appending more padding.
3. Memory class: compiled memory of forward + backward at length 4096 versus 1024 grows
   about 4x for linear-class mechanisms and about 16x for quadratic ones.

Each mechanism's agreement with the formula it implements is tested in its own test file.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import models
from lra import measure

D, H = 32, 2

# Mechanisms whose output depends on the padded length by definition, and why. They must
# still ignore the VALUES at padded positions. (Linformer, the Synthesizers and Reformer
# slice fixed max_len tables or fix their bucket count by max_len, so appending padding
# leaves them unchanged too.)
PADDED_LENGTH_DEPENDENT = {
    "nystromformer": "landmarks are means of equal segments of the padded sequence",
}

# Quick-compile settings for checks of values (not of memory): LLVM optimisation does not
# change what is computed, only how fast, and it dominates compile time on 2 CPU cores.
FAST_COMPILE = {"xla_backend_optimization_level": 0}

QUADRATIC = {
    "softmax",
    "flash_quad",
    "synthesizer_dense",
    "synthesizer_random",
    "synthesizer_factorized",
}


def make(name, max_len, seed=0):
    return models.make_attention(name, dim=D, num_heads=H, max_len=max_len, rngs=nnx.Rngs(seed))


def inputs(batch, length, lengths, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(batch, length, D)).astype(np.float32)
    mask = np.arange(length)[None, :] < np.asarray(lengths)[:, None]
    return jnp.asarray(x), jnp.asarray(mask)


def apply_fn(attn):
    """``attn(x, mask=mask)`` jitted with quick-compile settings."""
    graphdef, state = nnx.split(attn)

    def apply(x, mask):
        return nnx.merge(graphdef, state)(x, mask=mask)

    return jax.jit(apply, compiler_options=FAST_COMPILE)


def test_every_figure1_mechanism_is_registered():
    expected = {
        "softmax", "flash_quad", "flash", "long_short", "performer", "cosformer", "linformer",
        "nystromformer", "reformer", "transnormer_diag", "transnormer_norm",
        "synthesizer_dense", "synthesizer_random", "synthesizer_factorized", "local", "linear",
    }  # fmt: skip
    assert expected <= set(models.ATTENTION_NAMES)


@pytest.mark.parametrize("name", models.ATTENTION_NAMES)
def test_shapes_and_finite_values_and_gradients_at_4096(name):
    length = 4096
    attn = make(name, length)
    x, mask = inputs(1, length, [length - 100])
    shape = jax.eval_shape(lambda x, m: attn(x, mask=m), x, mask)
    assert shape.shape == (1, length, D) and shape.dtype == jnp.float32

    graphdef, params = nnx.split(attn)

    def loss(params, x):
        out = nnx.merge(graphdef, params)(x, mask=mask)
        return jnp.sum(jnp.where(mask[..., None], out, 0.0) ** 2), out

    (value, out), grads = jax.jit(jax.value_and_grad(loss, argnums=(0, 1), has_aux=True))(params, x)
    assert np.isfinite(float(value))
    assert np.all(np.isfinite(np.asarray(out)))
    for leaf in jax.tree.leaves(grads):
        assert np.all(np.isfinite(np.asarray(leaf))), name


@pytest.mark.parametrize("name", models.ATTENTION_NAMES)
def test_values_at_padded_positions_do_not_matter(name):
    length = 96
    attn = make(name, length + 32)
    lengths = [length, 61, 7]
    x, mask = inputs(3, length, lengths)
    noise = jnp.asarray(np.random.default_rng(1).normal(size=x.shape).astype(np.float32)) * 5
    x_changed = jnp.where(mask[..., None], x, noise)
    apply = apply_fn(attn)
    out = np.asarray(apply(x, mask))
    out_changed = np.asarray(apply(x_changed, mask))
    real = np.asarray(mask)
    np.testing.assert_allclose(out_changed[real], out[real], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize(
    "name", [n for n in models.ATTENTION_NAMES if n not in PADDED_LENGTH_DEPENDENT]
)
def test_appending_padding_changes_nothing(name):
    length, extra = 96, 32
    attn = make(name, length + extra)
    lengths = [length, 61, 7]
    x, mask = inputs(3, length, lengths)
    x_long, mask_long = inputs(3, length + extra, lengths, seed=2)
    x_long = x_long.at[:, :length].set(x)
    apply = apply_fn(attn)
    out = np.asarray(apply(x, mask))
    out_long = np.asarray(apply(x_long, mask_long))[:, :length]
    real = np.asarray(mask)
    np.testing.assert_allclose(out_long[real], out[real], atol=1e-5, rtol=1e-5)


def compiled_train_memory(name, length):
    attn = make(name, length)
    graphdef, params = nnx.split(attn)
    x, mask = inputs(1, length, [length])

    def loss(params, x):
        return jnp.sum(nnx.merge(graphdef, params)(x, mask=mask) ** 2)

    compiled = jax.jit(jax.grad(loss, argnums=(0, 1))).lower(params, x).compile()
    return measure.compiled_memory_bytes(compiled)


@pytest.mark.parametrize("name", models.ATTENTION_NAMES)
def test_memory_class_from_compiled_analysis(name):
    ratio = compiled_train_memory(name, 4096) / compiled_train_memory(name, 1024)
    if name in QUADRATIC:
        assert 10 < ratio < 20, f"{name}: memory grew {ratio:.1f}x for 4x the length"
    else:
        assert 2.5 < ratio < 6, f"{name}: memory grew {ratio:.1f}x for 4x the length"
