"""trainer.param_groups (issue 27 part 4): the SSM parameters' own learning rate and weight
decay through optax.multi_transform (lra.train.optim), checked against a float64 numpy AdamW."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from conftest import make_config
from flax import nnx
from omegaconf import OmegaConf

from lra.config.identity import result_config, result_hash
from lra.config.schema import command_line_problem
from lra.errors import ConfigError
from lra.train import optim

TINY = ("task=listops_tiny", "task.arch.num_layers=1", "task.arch.dim=8", "task.arch.mlp_dim=8")
TINY += ("task.arch.qkv_dim=8", "task.arch.num_heads=2")
SSM = {"ssm": {"learning_rate": 0.001, "weight_decay": 0.0}}

# The parameters each mixer's reference trains specially (lra/train/optim.py SSM_PARAMETERS),
# by their name in the mixer module (the path below ``attention``).
EXPECTED = {
    "s4d": {"log_a_real": "ssm_a", "a_imag": "ssm_a", "b": "ssm_b", "log_dt": "ssm_dt"},
    "s5": {"lambda_re": "ssm_a", "lambda_im": "ssm_a", "b": "ssm_b", "log_step": "ssm_dt"},
    "lru": {
        f"{side}.{name}": kind
        for side in ("forward", "backward")
        for name, kind in [
            ("nu_log", "ssm_a"),
            ("theta_log", "ssm_a"),
            ("gamma_log", "ssm_b"),
            ("B_re", "ssm_b"),
            ("B_im", "ssm_b"),
        ]
    },
    "mamba": {
        f"{side}.{name}": kind
        for side in ("forward", "backward")
        for name, kind in [("A_log", "ssm_a"), ("D", "ssm_d")]
    },
}


def tiny_params(model: str, *overrides: str):
    from lra.train.model import build_model

    cfg = make_config(f"model={model}", *TINY, *overrides)
    _, params, _ = nnx.split(build_model(cfg, nnx.Rngs(params=0)), nnx.Param, ...)
    return cfg, params


def trainer(**overrides):
    base = dict(
        schedule="constant",
        learning_rate=0.1,
        warmup_steps=0,
        num_steps=10,
        decay_steps=None,
        grad_clip=0.0,
        b1=0.9,
        b2=0.98,
        eps=1e-9,
        weight_decay=0.3,
        param_groups=None,
    )
    base.update(overrides)
    return OmegaConf.create(base)


@pytest.mark.parametrize("model", sorted(EXPECTED))
def test_each_ssm_mixer_labels_exactly_its_references_ssm_parameters(model):
    _, params = tiny_params(model)
    kinds = optim.param_kinds(params)
    special = {
        ".".join(path[path.index("attention") + 1 :]): kind
        for path, kind in kinds.items()
        if kind != optim.DEFAULT_GROUP
    }
    assert special == EXPECTED[model]
    assert all(
        path[:3] == ("encoder", "blocks", "0") for path, kind in kinds.items() if kind != "default"
    )


def test_attention_models_have_no_ssm_parameters_and_generic_names_need_the_mixer():
    _, params = tiny_params("transformer")
    assert set(optim.param_kinds(params).values()) == {"default"}
    # ``b`` and ``D`` are SSM parameters only inside a module with the mixer's signature.
    assert optim.param_kind(("x", "b"), {"b", "kernel"}) == "default"
    assert optim.param_kind(("x", "D"), {"D", "A_log"}) == "default"
    assert optim.param_kind(("x", "b"), {"b", "lambda_re", "lambda_im", "log_step"}) == "ssm_b"


def np_adamw(params, grads_seq, lr, wd, b1, b2, eps):
    """Float64 AdamW (decoupled decay scaled by lr, optax's eps outside the sqrt) -> updates
    of the last step."""
    m = np.zeros_like(params)
    v = np.zeros_like(params)
    p = params.astype(np.float64)
    update = None
    for t, g in enumerate(grads_seq, start=1):
        g = g.astype(np.float64)
        m = b1 * m + (1 - b1) * g
        v = b2 * v + (1 - b2) * g * g
        mhat, vhat = m / (1 - b1**t), v / (1 - b2**t)
        update = -lr * (mhat / (np.sqrt(vhat) + eps) + wd * p)
        p = p + update
    return update


def hand_tree(seed=0):
    """An S5-like module (its signature names) next to an ordinary dense layer."""
    rng = np.random.default_rng(seed)
    shapes = {
        "mixer": {
            "lambda_re": (4,),
            "lambda_im": (4,),
            "log_step": (4,),
            "b": (4, 3),
            "c1": (3, 4),
        },
        "dense": {"kernel": (3, 3), "bias": (3,)},
    }
    return jax.tree.map(
        lambda s: jnp.asarray(rng.normal(size=s), jnp.float32),
        shapes,
        is_leaf=lambda s: isinstance(s, tuple),
    )


def run_steps(tx, params, grads_seq):
    state = tx.init(params)
    update = None
    for g in grads_seq:
        update, state = tx.update(g, state, params)
        params = optax.apply_updates(params, update)
    return update


def test_a_group_gets_its_own_learning_rate_and_no_decay():
    cfg = trainer(param_groups=SSM)
    params = hand_tree(0)
    grads_seq = [hand_tree(1), hand_tree(2)]
    got = run_steps(optim.make_optimizer(cfg), params, grads_seq)
    ssm_names = {"lambda_re", "lambda_im", "log_step", "b"}
    for module in params:
        for name in params[module]:
            ssm = module == "mixer" and name in ssm_names
            lr, wd = (0.001, 0.0) if ssm else (0.1, 0.3)
            p = np.asarray(params[module][name])
            gs = [np.asarray(g[module][name]) for g in grads_seq]
            expected = np_adamw(p, gs, lr, wd, 0.9, 0.98, 1e-9)
            np.testing.assert_allclose(got[module][name], expected, rtol=2e-5, atol=1e-6 * lr)
            # The same as optax.adamw applied by hand to that leaf alone.
            by_hand = run_steps(optax.adamw(lr, b1=0.9, b2=0.98, eps=1e-9, weight_decay=wd), p, gs)
            np.testing.assert_allclose(got[module][name], by_hand, rtol=1e-6, atol=1e-7 * lr)


def test_a_group_keeps_the_schedule_shape_scaled_to_its_peak():
    cfg = trainer(schedule="cosine", warmup_steps=2, num_steps=6, param_groups=SSM)
    params = hand_tree(0)
    grads_seq = [hand_tree(k) for k in range(1, 5)]
    got = run_steps(optim.make_optimizer(cfg), params, grads_seq)
    lr = optim.make_schedule("cosine", 0.001, 2, 6)
    p, gs = np.asarray(params["mixer"]["b"]), [np.asarray(g["mixer"]["b"]) for g in grads_seq]
    by_hand = run_steps(optax.adamw(lr, b1=0.9, b2=0.98, eps=1e-9, weight_decay=0.0), p, gs)
    np.testing.assert_allclose(got["mixer"]["b"], by_hand, rtol=1e-6, atol=1e-10)


def test_a_kind_of_its_own_overrides_the_ssm_group():
    groups = {"ssm": {"learning_rate": 0.001, "weight_decay": 0.0}}
    groups["ssm_b"] = {"learning_rate": 0.002, "weight_decay": 0.5}
    params = hand_tree(0)
    labels = optim.param_labels(params, optim._groups(trainer(param_groups=groups)))
    assert labels["mixer"] == {
        "lambda_re": "ssm",
        "lambda_im": "ssm",
        "log_step": "ssm",
        "b": "ssm_b",
        "c1": "default",
    }
    assert labels["dense"] == {"kernel": "default", "bias": "default"}


def test_null_param_groups_is_bit_identical_to_the_single_adamw():
    """Today's optimizer (before the key existed): clip, then one AdamW on the schedule."""
    cfg, params = tiny_params("s5", "trainer.grad_clip=1.0")
    t = cfg.trainer
    schedule = optim.make_schedule(t.schedule, t.learning_rate, t.warmup_steps, t.num_steps)
    single = optax.chain(
        optax.clip_by_global_norm(1.0),
        optax.adamw(schedule, b1=t.b1, b2=t.b2, eps=t.eps, weight_decay=t.weight_decay),
    )
    assert cfg.trainer.param_groups is None
    grads = [jax.tree.map(lambda p, k=k: jnp.sin(p * (k + 1)), params) for k in range(3)]
    ours = run_steps(optim.make_optimizer(cfg.trainer), params, grads)
    theirs = run_steps(single, params, grads)
    for a, b in zip(jax.tree.leaves(ours), jax.tree.leaves(theirs), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    old = OmegaConf.create({k: v for k, v in cfg.trainer.items() if k != "param_groups"})
    again = run_steps(optim.make_optimizer(old), params, grads)  # a run older than the key
    for a, b in zip(jax.tree.leaves(again), jax.tree.leaves(theirs), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_groups_on_a_real_ssm_model_initialise_and_update():
    cfg, params = tiny_params("lru")
    t = OmegaConf.merge(cfg.trainer, {"param_groups": SSM})
    tx = optim.make_optimizer(t)
    update, _ = jax.jit(tx.update)(jax.tree.map(jnp.ones_like, params), tx.init(params), params)
    assert jax.tree.structure(update) == jax.tree.structure(params)


def test_a_group_matching_no_parameter_is_an_error_naming_it():
    _, params = tiny_params("transformer")
    tx = optim.make_optimizer(trainer(param_groups=SSM))
    with pytest.raises(ConfigError, match=r"trainer\.param_groups\.ssm: no parameter"):
        tx.init(params)
    _, params = tiny_params("s4d")
    only_d = {"ssm_d": {"learning_rate": 0.001, "weight_decay": 0.0}}  # Mamba's D; S4D has none
    with pytest.raises(ConfigError, match=r"trainer\.param_groups\.ssm_d: no parameter"):
        optim.make_optimizer(trainer(param_groups=only_d)).init(params)
    with pytest.raises(ConfigError, match=r"trainer\.param_groups\.lambda: unknown group"):
        optim.make_optimizer(trainer(param_groups={"lambda": SSM["ssm"]}))


def test_the_record_describes_each_group():
    cfg, params = tiny_params("s5")
    described = optim.describe_param_groups(cfg.trainer, params)
    assert list(described) == ["default"]
    assert described["default"]["learning_rate"] == cfg.trainer.learning_rate
    total = sum(int(np.prod(x.shape)) for x in jax.tree.leaves(params))
    assert described["default"]["num_params"] == total
    t = OmegaConf.merge(cfg.trainer, {"param_groups": SSM})
    described = optim.describe_param_groups(t, params)
    assert described["ssm"]["learning_rate"] == 0.001 and described["ssm"]["weight_decay"] == 0
    assert described["ssm"]["num_tensors"] == 4
    assert "encoder.blocks.0.attention.lambda_re" in described["ssm"]["examples"]
    assert described["ssm"]["num_params"] + described["default"]["num_params"] == total


def test_the_schema_checks_groups_and_null_keeps_every_identity():
    ok = ["model=s5", "trainer.param_groups={ssm:{learning_rate:0.001,weight_decay:0.0}}"]
    assert command_line_problem("config", ok) is None
    bad = ["trainer.param_groups={ssm:{learning_rate:-1,weight_decay:0.0}}"]
    assert command_line_problem("config", bad).startswith(
        "trainer.param_groups.ssm.learning_rate: expected a float > 0"
    )
    typo = ["trainer.param_groups={ssm:{lr:0.1,weight_decay:0.0}}"]
    assert command_line_problem("config", typo).startswith(
        "trainer.param_groups.ssm.lr: unknown key"
    )
    config = OmegaConf.to_container(make_config("model=s5"), resolve=True)
    assert config["trainer"]["param_groups"] is None
    assert "param_groups" not in result_config(config)["trainer"]
    grouped = OmegaConf.to_container(make_config("model=s5", ok[1]), resolve=True)
    assert result_hash(grouped) != result_hash(config)


def test_a_training_record_lists_its_parameter_groups(listops_tiny_dir, tmp_path):
    from conftest import train_small

    record = train_small(
        listops_tiny_dir,
        tmp_path,
        "model=s5",
        "model.attention_options.s5.state_size=8",
        "model.attention_options.s5.blocks=2",
        "trainer.param_groups={ssm:{learning_rate:0.001,weight_decay:0.0}}",
    )
    groups = record["param_groups"]
    assert set(groups) == {"default", "ssm"}
    assert groups["ssm"]["learning_rate"] == 0.001 and groups["ssm"]["weight_decay"] == 0.0
    assert groups["ssm"]["num_tensors"] == 4 * record["config"]["task"]["arch"]["num_layers"]
    assert groups["default"]["num_params"] + groups["ssm"]["num_params"] == record["num_params"]


def test_lr_factor_is_a_share_of_the_base_rate_and_one_rate_is_required():
    groups = {"ssm": {"lr_factor": 0.25, "weight_decay": 0.0}}
    assert optim._groups(trainer(param_groups=groups))["ssm"]["learning_rate"] == 0.025
    both = "trainer.param_groups={ssm:{learning_rate:0.1,lr_factor:0.5,weight_decay:0.0}}"
    neither = "trainer.param_groups={ssm:{weight_decay:0.0}}"
    for override in (both, neither):
        assert command_line_problem("config", ["model=lru", override]) == (
            "trainer.param_groups: each group gives learning_rate or lr_factor (one of the two)"
        )
