import math

import numpy as np
import pytest

from lra.config.schema import command_line_problem
from lra.errors import ConfigError
from lra.train.optim import make_schedule


def test_rsqrt_schedule_matches_the_lra_formula():
    lr, warmup = 0.05, 1000
    schedule = make_schedule("rsqrt", lr, warmup, 5000)
    for step in [0, 1, 500, 999, 1000, 1001, 4000, 5000]:
        expected = lr * min(1.0, step / warmup) / math.sqrt(max(step, warmup))
        assert float(schedule(step)) == pytest.approx(expected, rel=1e-6)
    assert float(schedule(warmup)) == pytest.approx(0.05 / math.sqrt(1000), rel=1e-6)


def test_cosine_schedule_warms_up_then_decays_to_zero():
    schedule = make_schedule("cosine", 1e-3, 100, 1100)
    assert float(schedule(50)) == pytest.approx(5e-4, rel=1e-6)
    assert float(schedule(100)) == pytest.approx(1e-3, rel=1e-6)
    assert float(schedule(600)) == pytest.approx(5e-4, rel=1e-5)
    assert float(schedule(1100)) == pytest.approx(0.0, abs=1e-12)
    values = np.array([float(schedule(s)) for s in range(100, 1101, 50)])
    assert np.all(np.diff(values) <= 0)


def test_constant_schedule_and_no_warmup():
    schedule = make_schedule("constant", 0.1, 0, 10)
    assert float(schedule(0)) == pytest.approx(0.1)
    assert float(schedule(7)) == pytest.approx(0.1)


def test_unknown_schedule_names_the_choices():
    with pytest.raises(ConfigError, match="rsqrt, cosine, constant"):
        make_schedule("linear", 0.1, 10, 100)


def trainer_cfg(**overrides):
    from omegaconf import OmegaConf

    base = dict(
        schedule="constant",
        learning_rate=0.1,
        warmup_steps=0,
        num_steps=10,
        grad_clip=0.0,
        b1=0.9,
        b2=0.98,
        eps=1e-9,
        weight_decay=0.0,
    )
    base.update(overrides)
    return OmegaConf.create(base)


def two_updates(tx, grads):
    import jax.numpy as jnp

    params = jnp.zeros(3)
    state = tx.init(params)
    _, state = tx.update(grads[0], state, params)
    update, _ = tx.update(grads[1], state, params)
    return np.asarray(update)


def test_grad_clip_clips_the_global_norm_before_adam():
    import jax.numpy as jnp

    from lra.train.optim import make_optimizer

    big, small = jnp.array([60.0, 80.0, 0.0]), jnp.array([0.6, 0.8, 0.0])  # norms 100 and 1
    clipped = two_updates(make_optimizer(trainer_cfg(grad_clip=1.0)), [big, small])
    as_if_small = two_updates(make_optimizer(trainer_cfg()), [small, small])
    unclipped = two_updates(make_optimizer(trainer_cfg()), [big, small])
    np.testing.assert_allclose(clipped, as_if_small, rtol=1e-5)
    assert not np.allclose(clipped, unclipped, rtol=1e-3)


def test_weight_decay_is_decoupled_and_scaled_by_the_learning_rate():
    import jax.numpy as jnp

    from lra.train.optim import make_optimizer

    tx = make_optimizer(trainer_cfg(weight_decay=0.5))
    params = jnp.array([2.0, -4.0])
    update, _ = tx.update(jnp.zeros(2), tx.init(params), params)
    np.testing.assert_allclose(np.asarray(update), -0.1 * 0.5 * np.asarray(params), rtol=1e-6)


def test_cosine_with_a_horizon_follows_the_transformers_formula_past_it():
    """decay_steps: get_cosine_schedule_with_warmup's horizon, unclipped (TransNormer LRA)."""
    lr, warmup, horizon = 5e-4, 312, 50000
    schedule = make_schedule("cosine", lr, warmup, 62400, decay_steps=horizon)
    for step in (0, 100, 312, 20000, 50000, 55000, 62400):
        progress = max(0.0, (step - warmup) / (horizon - warmup))
        expected = lr * min(1.0, step / warmup) * 0.5 * (1 + math.cos(math.pi * progress))
        assert float(schedule(step)) == pytest.approx(expected, rel=1e-5, abs=1e-12)
    assert float(schedule(62400)) > float(schedule(50000))  # rises again past the horizon
    # decay_steps <= warmup_steps is refused by the schema, before any work (lra.config.types)
    bad = ["trainer.schedule=cosine", "trainer.warmup_steps=1000", "trainer.decay_steps=500"]
    assert command_line_problem("config", bad).startswith(
        "trainer.decay_steps (500) must exceed trainer.warmup_steps (1000)"
    )
