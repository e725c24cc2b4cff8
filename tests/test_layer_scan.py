"""Remat as a scan over identical layers (models/layer_scan.py, issue 29): the loss and every
gradient equal those without remat, with dropout on, for every built-in mechanism and for a
layer schedule (that the compiled memory falls, on the chunked softmax path too, is
tests/test_parallel.py::test_remat_lowers_compiled_memory)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from lra.models import build_classifier, registry
from lra.models.layer_scan import runs_of_equal_layers

LENGTH, BATCH = 24, 3


def _classifier(attention, remat):
    return build_classifier(
        vocab_size=11,
        max_len=LENGTH,
        num_layers=3,
        dim=16,
        qkv_dim=16,
        num_heads=2,
        mlp_dim=32,
        dropout=0.1,
        attention_dropout=0.1,
        positions="sinusoidal",
        attention=attention,
        attention_options={},
        num_classes=3,
        pooling="mean",
        dual=False,
        remat=remat,
        rngs=nnx.Rngs(0),
    )


def _loss_and_grads(attention, remat):
    model = _classifier(attention, remat)
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)
    tokens = jax.random.randint(jax.random.key(1), (BATCH, LENGTH), 1, 11)
    lengths = jnp.array([LENGTH, 17, 5])

    def loss(params):
        m = nnx.merge(graphdef, params, rest, copy=True)
        logits = m(tokens, lengths, deterministic=False, rngs=nnx.Rngs(dropout=jax.random.key(2)))
        return jnp.sum(logits**2)

    value, grads = jax.jit(jax.value_and_grad(loss))(params)
    return float(value), jax.tree.leaves(grads)


def _close(expected, actual):
    """Gradients equal up to float rounding (the recomputation may fuse differently), relative
    to the largest gradient (a gradient that is 0 in exact arithmetic is rounding noise on
    both sides); other dropout masks would differ by the size of the gradients themselves."""
    scale = max(float(np.abs(np.asarray(a)).max()) for a in expected)
    for a, b in zip(expected, actual, strict=True):
        np.testing.assert_allclose(np.asarray(b), np.asarray(a), rtol=1e-4, atol=1e-5 * scale)


# The policies that keep some residuals, checked where their choices differ: dots_no_batch
# keeps products, real (softmax) and complex (S5, LRU, whose complex products the policy must
# recompute: REMAT_POLICIES' real_dots_only); attention keeps the named values outside the
# attention sublayer (its output, the MLP's; SAVED_OUTSIDE_ATTENTION).
KEEPING_TOO = ("softmax", "s5", "lru")


@pytest.mark.parametrize("attention", registry.names())
def test_block_remat_gives_the_loss_and_gradients_of_none(attention):
    value, grads = _loss_and_grads(attention, "none")
    keeping = ("block", "attention", "dots_no_batch") if attention in KEEPING_TOO else ("block",)
    for policy in keeping:
        other, other_grads = _loss_and_grads(attention, policy)
        assert other == pytest.approx(value, rel=1e-6), policy
        _close(grads, other_grads)


def test_a_layer_schedule_scans_each_run_of_equal_layers():
    schedule = ["local", "local", "softmax"]
    model = _classifier(schedule, "block")
    runs = runs_of_equal_layers(model.encoder.blocks)
    assert [len(run) for run in runs] == [2, 1]
    value, grads = _loss_and_grads(schedule, "none")
    other, other_grads = _loss_and_grads(schedule, "block")
    assert other == pytest.approx(value, rel=1e-6)
    _close(grads, other_grads)


def test_counting_a_layers_dropout_draws_draws_no_mask():
    # The count is read while tracing; were the probe's masks drawn eagerly, this layer's
    # float[64, 2, 4096, 4096] attention-dropout mask alone would need 8 GB.
    from lra.models.encoder import Block
    from lra.models.layer_scan import dropout_draws

    block = Block(
        attention="softmax",
        attention_options={"implementation": "plain"},
        dim=16,
        qkv_dim=16,
        num_heads=2,
        mlp_dim=32,
        max_len=4096,
        dropout=0.1,
        attention_dropout=0.1,
        rngs=nnx.Rngs(0),
    )
    counted = []

    def traced(x, mask):  # as in the encoder: x and mask are tracers of the train step
        counted.append(dropout_draws(block, x, mask))
        return x

    x = jax.ShapeDtypeStruct((64, 4096, 16), jnp.float32)
    jax.eval_shape(traced, x, jax.ShapeDtypeStruct((64, 4096), jnp.bool_))
    assert counted == [4]  # attention weights, attention output, MLP hidden, MLP output
