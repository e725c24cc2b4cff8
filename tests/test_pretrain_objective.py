"""Self-pretraining's objectives and hand-off, against plain float64 NumPy (no training run)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import SMALL_RUN, make_config
from flax import nnx

from lra.config.identity import run_key
from lra.errors import ConfigError
from lra.train import pretrain
from lra.train.model import build_model
from lra.train.objective import MASK_RATIOS, Pretraining, mask_ratio_for

V, B, L = 16, 4, 12


def batch(dual=False, seed=0):
    rng = np.random.default_rng(seed)
    lengths = np.array([12, 7, 3, 0], np.int32)
    tokens = rng.integers(0, V, (B, L)).astype(np.int32)
    tokens[np.arange(L)[None] >= lengths[:, None]] = 0  # padding id 0, a real id too
    n = 2 if dual else 1
    return {
        "tokens": tuple(jnp.asarray(np.roll(tokens, i, 0)) for i in range(n)),
        "lengths": tuple(jnp.asarray(np.roll(lengths, i)) for i in range(n)),
        "labels": jnp.zeros(B, jnp.int32),
        "weights": jnp.array([1, 1, 1, 0], jnp.float32),  # the last row is filler
    }


def masked(ratio=0.5, **kw):
    return Pretraining("masked", V, ratio, kw.get("pixel_target", "classify"), 0)


def test_mask_token_is_a_new_id_and_only_real_tokens_are_masked():
    obj = masked(0.5)
    assert obj.mask_id == V and obj.input_vocab == V + 1 and obj.outputs == V
    b = batch()
    out = obj.prepare(b, obj.key(3))
    tokens, inputs = np.asarray(b["tokens"][0]), np.asarray(out["tokens"][0])
    real = np.arange(L)[None] < np.asarray(b["lengths"][0])[:, None]
    changed = inputs != tokens
    assert changed.any()
    assert np.all(inputs[changed] == V)  # never padding's 0 nor a real id in [0, V)
    assert not changed[~real].any()  # padding is never masked
    w = np.asarray(out["target_weights"])
    np.testing.assert_array_equal(w[:3] > 0, changed[:3])  # the loss counts masked only
    assert not w[3].any()  # filler row
    # the masks are a function of (seed, step)
    again = obj.prepare(b, obj.key(3))
    np.testing.assert_array_equal(np.asarray(again["tokens"][0]), inputs)
    other = obj.prepare(b, obj.key(4))
    assert not np.array_equal(np.asarray(other["tokens"][0]), inputs)


def test_loss_matches_float64_and_has_zero_gradient_on_unmasked_positions():
    obj = masked(0.5)
    out = obj.prepare(batch(), obj.key(1))
    logits = jax.random.normal(jax.random.key(0), (B, L, V))

    def loss(lg):
        s, _, n = obj.metrics(lg, out)
        return s / n

    grad = np.asarray(jax.grad(loss)(logits))
    w = np.asarray(out["target_weights"])
    assert np.all(grad[w == 0] == 0.0)  # exactly zero, not small
    assert np.abs(grad[w > 0]).sum() > 0
    lg = np.asarray(logits, np.float64)
    logp = lg - np.log(np.exp(lg).sum(-1, keepdims=True))
    t = np.asarray(out["targets"])
    nll = -np.take_along_axis(logp, t[..., None], -1)[..., 0]
    np.testing.assert_allclose(float(loss(logits)), (nll * w).sum() / w.sum(), rtol=1e-5)


def test_causal_targets_are_the_next_real_token():
    obj = Pretraining("causal", V, 0.0, "classify", 0)
    b = batch()
    out = obj.prepare(b, obj.key(0))
    tokens, lengths = np.asarray(b["tokens"][0]), np.asarray(b["lengths"][0])
    np.testing.assert_array_equal(np.asarray(out["tokens"][0]), tokens)  # nothing masked
    w, t = np.asarray(out["target_weights"]), np.asarray(out["targets"])
    for row in range(3):
        n = lengths[row]
        assert w[row].sum() == max(n - 1, 0)
        np.testing.assert_array_equal(t[row, : n - 1], tokens[row, 1:n])


def test_dual_inputs_stack_both_documents():
    obj = masked(0.3)
    b = batch(dual=True)
    out = obj.prepare(b, obj.key(0))
    assert out["tokens"][0].shape == (2 * B, L)
    np.testing.assert_array_equal(
        np.asarray(out["lengths"][0]), np.concatenate([np.asarray(x) for x in b["lengths"]])
    )
    assert not np.asarray(out["target_weights"])[[3, 7]].any()  # both filler rows


def test_l1_pixel_target():
    obj = Pretraining("masked", 256, 0.5, "l1", 0)
    assert obj.outputs == 1
    out = {
        "targets": jnp.array([[0, 255]]),
        "target_weights": jnp.array([[1.0, 1.0]], jnp.float32),
    }
    s, correct, n = obj.metrics(jnp.array([[[0.5], [1.0]]]), out)
    assert float(s) == pytest.approx(0.5) and float(correct) == 1 and float(n) == 2


def test_default_mask_ratios_follow_the_task_family():
    for task, ratio in [
        ("listops", 0.10),
        ("listops_tiny", 0.10),
        ("text_tiny", 0.15),
        ("retrieval", 0.15),
        ("image_tiny", 0.50),
        ("pathfinder", 0.50),
        ("pathx_tiny", 0.50),
    ]:
        cfg = make_config(f"task={task}", "pretrain=masked")
        assert mask_ratio_for(cfg.pretrain, cfg.task) == ratio
        assert pretrain.pretrain_config(cfg).pretrain.mask_ratio == ratio
    assert set(MASK_RATIOS) == {"listops", "text", "retrieval", "image", "pathfinder"}
    cfg = make_config("pretrain=masked", "pretrain.mask_ratio=0.3")
    assert pretrain.pretrain_config(cfg).pretrain.mask_ratio == 0.3


def test_identity_chain():
    base = ("task=listops_tiny", "pretrain=masked")
    cfg = make_config(*base)
    first = run_key(_plain(pretrain.pretrain_config(cfg)))
    fine = run_key(_plain(pretrain.finetune_config(cfg, first)))
    # a fine-tuning setting does not move the pretraining run
    other = make_config(*base, "trainer.learning_rate=0.01", "trainer.num_steps=77")
    assert run_key(_plain(pretrain.pretrain_config(other))) == first
    assert run_key(_plain(pretrain.finetune_config(other, first))) != fine
    # a pretraining setting moves both
    more = make_config(*base, "pretrain.num_steps=50")
    first_more = run_key(_plain(pretrain.pretrain_config(more)))
    assert first_more != first
    assert run_key(_plain(pretrain.finetune_config(more, first_more))) != fine
    # the trainer keys that shape pretraining move it; the seed is in the key
    assert (
        run_key(_plain(pretrain.pretrain_config(make_config(*base, "trainer.batch_size=8"))))
        != first
    )
    assert run_key(_plain(pretrain.pretrain_config(make_config(*base, "seed=1")))) != first
    # pretrain=none leaves the identity of every run as it was (tests/test_identity_stable.py)
    assert run_key(_plain(make_config("task=listops_tiny"))) == run_key(
        _plain(make_config("task=listops_tiny", "pretrain.num_steps=5"))
    )
    assert first != fine and not fine.startswith(first)


def _plain(cfg):
    from omegaconf import OmegaConf

    return OmegaConf.to_container(cfg, resolve=True)


def _params(cfg, seed):
    model = build_model(cfg, nnx.Rngs(params=jax.random.key(seed)))
    return nnx.split(model, nnx.Param, ...)[1]


def test_encoder_hand_off_loads_every_encoder_parameter_and_drops_the_head():
    cfg = make_config(*SMALL_RUN, "pretrain=masked", "task.arch.positions=learned")
    stage1 = pretrain.pretrain_config(cfg)
    pre, fresh = pretrain._flat(_params(stage1, 0)), _params(cfg, 1)
    loaded = pretrain._flat(pretrain.load_encoder(fresh, pre, "test"))
    before = pretrain._flat(fresh)
    for path, value in loaded.items():
        if path[0] != "encoder":
            np.testing.assert_array_equal(value, before[path])  # the head stays fresh
        elif path[1:] == ("embedder", "embedding"):
            np.testing.assert_array_equal(value, np.asarray(pre[path])[:V])  # mask row dropped
        elif path[1:] == ("embedder", "pos"):  # CLS position fresh, the rest shifted
            np.testing.assert_array_equal(value[1:], pre[path])
            np.testing.assert_array_equal(value[0], before[path][0])
        elif path[1:] == ("embedder", "cls"):
            np.testing.assert_array_equal(value, before[path])
        else:
            np.testing.assert_array_equal(value, pre[path])
    assert ("head", "kernel") in pre and ("head", "kernel") not in loaded


def test_encoder_hand_off_refuses_a_mismatched_or_missing_parameter_by_name():
    cfg = make_config(*SMALL_RUN, "pretrain=masked")
    pre = pretrain._flat(_params(pretrain.pretrain_config(cfg), 0))
    fresh = _params(cfg, 1)
    path = ("encoder", "blocks", "0", "mlp", "fc1", "kernel")
    wrong = {**pre, path: np.zeros((3, 5), np.float32)}
    with pytest.raises(ConfigError, match="encoder/blocks/0/mlp/fc1/kernel has shape"):
        pretrain.load_encoder(fresh, wrong, "run x")
    missing = {k: v for k, v in pre.items() if k != path}
    with pytest.raises(ConfigError, match="encoder/blocks/0/mlp/fc1/kernel is missing"):
        pretrain.load_encoder(fresh, missing, "run x")
    wider = make_config(*SMALL_RUN, "task.arch.mlp_dim=64")
    with pytest.raises(ConfigError, match="cannot load the pretrained encoder of run x: encoder/"):
        pretrain.load_encoder(_params(wider, 1), pre, "run x")


def test_causal_is_refused_in_one_line_before_compiling():
    from lra.train.loop import train_and_evaluate

    cfg = make_config(*SMALL_RUN, "model=flash", "pretrain=causal", "results_dir=/nonexistent/x")
    with pytest.raises(ConfigError) as err:
        train_and_evaluate(cfg)
    assert "flash" in str(err.value) and "\n" not in str(err.value)
    pretrain.check_pretraining(make_config("model=transformer", "pretrain=causal"))
    with pytest.raises(ConfigError, match="pixel_target=l1"):
        pretrain.check_pretraining(make_config("pretrain=masked", "pretrain.pixel_target=l1"))


def test_a_pretraining_run_held_by_another_sweep_job_is_waited_for():
    from lra.run.lock import RunLocked

    calls = []

    def run_stage(cfg):
        calls.append(cfg)
        if len(calls) == 1:
            raise RunLocked("held by pid 1")
        return {"skipped": True}

    assert pretrain._shared_stage(run_stage, "cfg", poll_seconds=0) == {"skipped": True}
    assert calls == ["cfg", "cfg"]
