"""Masked BatchNorm and the norm's position (lra.models.masked_batch_norm, lra.models.norms;
issue 27): statistics over real tokens only against a float64 reference, padding never
reaching a real token, running statistics used in evaluation, carried by the train step with
no optimizer update, kept by a checkpoint (exact resume), and post-norm blocks as their
formula. Synchronisation over a data-parallel mesh: tests/test_parallel.py."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import make_config, train_small
from flax import nnx
from omegaconf import OmegaConf

from lra.config.identity import result_hash
from lra.errors import ConfigError
from lra.models import build_classifier
from lra.models.encoder import Block, Encoder
from lra.models.masked_batch_norm import MaskedBatchNorm
from lra.models.norms import normalize
from lra.train.compile import abstract_batch, compile_steps
from lra.train.model import count_params, weights_only

B, L, D = 3, 10, 4
LENGTHS = np.array([10, 6, 2])


def _inputs(seed=0):
    x = np.random.default_rng(seed).normal(size=(B, L, D)) * 3.0 + 1.5
    mask = np.arange(L)[None, :] < LENGTHS[:, None]
    return x, mask


def test_masked_batch_norm_equals_batch_norm_over_the_real_tokens_alone():
    x, mask = _inputs()
    norm = MaskedBatchNorm(D, momentum=0.9)
    norm.scale[...] = jnp.array([1.0, 2.0, 0.5, -1.0])
    norm.bias[...] = jnp.array([0.0, 1.0, -1.0, 0.25])
    y = np.asarray(norm(jnp.asarray(x, jnp.float32), jnp.asarray(mask), use_running_average=False))
    real = x[mask]  # float64[tokens, D]: the real tokens alone
    mean, var = real.mean(0), real.var(0)
    expected = (real - mean) / np.sqrt(var + 1e-5) * np.asarray(norm.scale[...]) + np.asarray(
        norm.bias[...]
    )
    np.testing.assert_allclose(y[mask], expected, rtol=1e-5, atol=1e-5)
    # The running statistics moved 10 % of the way from (0, 1) to the batch's.
    np.testing.assert_allclose(np.asarray(norm.mean[...]), 0.1 * mean, rtol=1e-5)
    np.testing.assert_allclose(np.asarray(norm.var[...]), 0.9 + 0.1 * var, rtol=1e-5)
    # Evaluation uses them, not the batch's.
    z = np.asarray(norm(jnp.asarray(x, jnp.float32), jnp.asarray(mask), use_running_average=True))
    stats = (x - 0.1 * mean) / np.sqrt(0.9 + 0.1 * var + 1e-5)
    np.testing.assert_allclose(
        z, stats * np.asarray(norm.scale[...]) + np.asarray(norm.bias[...]), rtol=1e-4, atol=1e-5
    )


def test_padding_never_reaches_a_real_token():
    x, mask = _inputs()
    other = np.where(mask[..., None], x, 1e3)  # other padded inputs
    longer = np.concatenate([other, np.full((B, 5, D), -7.0)], axis=1)  # more padding
    longer_mask = np.concatenate([mask, np.zeros((B, 5), bool)], axis=1)
    outs = []
    for inputs, m in ((x, mask), (other, mask), (longer, longer_mask)):
        norm = MaskedBatchNorm(D)
        y = norm(jnp.asarray(inputs, jnp.float32), jnp.asarray(m), use_running_average=False)
        outs.append((np.asarray(y)[:, :L][mask], np.asarray(norm.mean[...])))
    for y, mean in outs[1:]:
        np.testing.assert_allclose(y, outs[0][0], rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(mean, outs[0][1], rtol=1e-5, atol=1e-6)


def _classifier(norm="batch", position="pre", remat="none", momentum=0.9, dual=False):
    return build_classifier(
        vocab_size=11,
        max_len=16,
        num_layers=2,
        dim=8,
        qkv_dim=8,
        num_heads=2,
        mlp_dim=16,
        dropout=0.0,
        attention_dropout=0.0,
        positions="sinusoidal",
        attention="softmax",
        attention_options={},
        num_classes=3,
        pooling="mean",
        dual=dual,
        remat=remat,
        norm=norm,
        norm_position=position,
        norm_momentum=momentum,
        rngs=nnx.Rngs(0),
    )


def test_the_momentum_reaches_every_batch_norm():
    tokens, lengths = np.ones((2, 16), np.int32), np.array([16, 3])
    moved = []
    for momentum in (0.9, 0.5):
        model = _classifier(momentum=momentum)
        model(tokens, lengths, deterministic=False, rngs=jax.random.key(0))
        norms = [m for _, m in nnx.iter_graph(model) if isinstance(m, MaskedBatchNorm)]
        assert len(norms) == 5 and {n.momentum for n in norms} == {momentum}  # 2 x 2 + final
        moved.append(np.asarray(norms[0].var[...]) - 1.0)  # (1 - m) * (var - 1)
    np.testing.assert_allclose(moved[1], 5 * moved[0], rtol=1e-4)


def test_retrievals_two_documents_share_one_statistics_update():
    """Both documents' real tokens form the batch statistics, and they move once a step."""
    from lra.models.encoder import padding_mask
    from lra.models.masked_batch_norm import masked_moments

    model = _classifier(dual=True)
    rng = np.random.default_rng(2)
    tokens = [rng.integers(1, 11, size=(2, 16)) for _ in range(2)]
    lengths = [np.array([16, 5]), np.array([9, 2])]
    model(tokens[0], lengths[0], tokens[1], lengths[1], deterministic=False, rngs=jax.random.key(0))
    embedded = [
        model.encoder.embedder(jnp.asarray(t), padding_mask(jnp.asarray(n), 16))
        for t, n in zip(tokens, lengths, strict=True)
    ]
    x = jnp.concatenate([e[0] for e in embedded])
    mask = jnp.concatenate([e[1] for e in embedded])
    mean, var = masked_moments(x, mask)
    first = model.encoder.blocks[0].attention_norm
    np.testing.assert_allclose(np.asarray(first.mean[...]), 0.1 * mean, rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(np.asarray(first.var[...]), 0.9 + 0.1 * var, rtol=1e-4)


@pytest.mark.parametrize("position", ["pre", "post"])
def test_a_classifier_with_batch_norm_ignores_padding_in_training_and_evaluation(position):
    tokens = np.random.default_rng(1).integers(1, 11, size=(3, 16))
    lengths = np.array([16, 9, 4])
    padded = np.where(np.arange(16)[None] < lengths[:, None], tokens, 5)
    logits = {}
    for name, toks in (("tokens", tokens), ("padded", padded)):
        model = _classifier(position=position)
        train = model(toks, lengths, deterministic=False, rngs=jax.random.key(0))
        logits[name] = (np.asarray(train), np.asarray(model(toks, lengths, deterministic=True)))
    for a, b in zip(logits["tokens"], logits["padded"], strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)


def test_a_post_norm_block_is_its_formula_and_a_post_norm_encoder_has_no_final_norm():
    block = Block(
        attention="softmax",
        attention_options={},
        dim=D,
        qkv_dim=D,
        num_heads=2,
        mlp_dim=8,
        max_len=L,
        dropout=0.0,
        attention_dropout=0.0,
        rngs=nnx.Rngs(0),
        norm="batch",
        norm_position="post",
    )
    x, mask = (jnp.asarray(a) for a in _inputs())
    x = x.astype(jnp.float32)
    reference = nnx.clone(block)
    out = block(x, mask=mask, deterministic=True)
    h = normalize(
        reference.attention_norm, x + reference.attention(x, mask=mask), mask, deterministic=True
    )
    h = normalize(reference.mlp_norm, h + reference.mlp(h), mask, deterministic=True)
    np.testing.assert_allclose(np.asarray(out), np.asarray(h), rtol=1e-5, atol=1e-6)
    assert _classifier(position="post").encoder.final_norm is None
    assert isinstance(_classifier(position="pre").encoder.final_norm, MaskedBatchNorm)


def test_remat_scan_gives_the_loops_statistics_and_gradients():
    tokens = jax.random.randint(jax.random.key(1), (3, 16), 1, 11)
    lengths = jnp.array([16, 9, 4])
    results = []
    for remat in ("none", "block"):
        graphdef, params, stats, rest = nnx.split(
            _classifier(remat=remat), nnx.Param, nnx.BatchStat, ...
        )

        def loss(params, stats, graphdef=graphdef, rest=rest):
            model = nnx.merge(graphdef, params, stats, rest, copy=True)
            out = model(tokens, lengths, deterministic=False, rngs=jax.random.key(2))
            return jnp.sum(out**2), nnx.state(model, nnx.BatchStat)

        (value, new), grads = jax.jit(jax.value_and_grad(loss, has_aux=True))(params, stats)
        results.append((float(value), jax.tree.leaves(new), jax.tree.leaves(grads)))
    (v0, s0, g0), (v1, s1, g1) = results
    assert v1 == pytest.approx(v0, rel=1e-6)
    assert any(np.abs(np.asarray(s)).sum() > 0 for s in s0[::2])  # the means moved
    for a, b in zip(s0 + g0, s1 + g1, strict=True):
        np.testing.assert_allclose(np.asarray(b), np.asarray(a), rtol=1e-4, atol=1e-6)


def test_causal_batch_norm_and_unknown_norms_are_one_line_errors():
    with pytest.raises(ValueError, match="use norm=layer with pretrain=causal"):
        Encoder(
            vocab_size=5, max_len=8, num_layers=1, dim=4, qkv_dim=4, num_heads=1, mlp_dim=4,
            dropout=0.0, attention_dropout=0.0, positions="sinusoidal", cls_token=False,
            attention="softmax", causal=True, norm="batch", rngs=nnx.Rngs(0),
        )  # fmt: skip
    with pytest.raises(ValueError, match="norm must be one of layer, batch; got 'group'"):
        _classifier(norm="group")
    with pytest.raises(ValueError, match="norm_position must be one of pre, post"):
        _classifier(position="middle")


def test_the_default_norm_keeps_every_earlier_run_identity():
    config = OmegaConf.to_container(make_config("task=listops_tiny"), resolve=True)
    assert config["task"]["arch"]["norm"] == "layer"
    older = {**config, "task": {**config["task"], "arch": dict(config["task"]["arch"])}}
    for key in ("norm", "norm_position", "norm_momentum"):
        del older["task"]["arch"][key]
    assert result_hash(older) == result_hash(config)
    for override in ("norm=batch", "norm_position=post", "norm_momentum=0.95"):
        other = make_config("task=listops_tiny", f"task.arch.{override}")
        assert result_hash(OmegaConf.to_container(other, resolve=True)) != result_hash(config)


LAYER_NORM_RUN = (
    "task.arch.num_layers=2",
    "task.arch.dim=16",
    "task.arch.qkv_dim=16",
    "task.arch.mlp_dim=32",
    "task.arch.num_heads=2",
    "task.arch.dropout=0",
    "task.arch.attention_dropout=0",
)
BATCH_NORM_RUN = (*LAYER_NORM_RUN, "task.arch.norm=batch")


def test_the_train_step_sets_the_statistics_the_forward_pass_computed():
    from lra.models.encoder import padding_mask
    from lra.models.masked_batch_norm import masked_moments
    from lra.train.model import build_model

    # AdamW with weight decay would move the statistics too, were it applied to them.
    cfg = make_config(
        "task=listops_tiny",
        *BATCH_NORM_RUN,
        "trainer.weight_decay=0.5",
        "trainer.batch_size=8",
        "trainer.warmup_steps=0",
        "trainer.schedule=constant",
    )
    compiled = compile_steps(cfg, abstract_batch(cfg.task, 8), count_flops=False)
    state = compiled.state
    assert count_params(state.params) == count_params(weights_only(state.params))
    assert count_params(state.params) < sum(x.size for x in jax.tree.leaves(state.params))
    rng = np.random.default_rng(0)
    length = int(cfg.task.max_length)
    tokens = jnp.asarray(rng.integers(1, 10, size=(8, length)), jnp.int32)
    lengths = jnp.asarray(rng.integers(3, length, size=8), jnp.int32)
    batch = {
        "tokens": (tokens,),
        "lengths": (lengths,),
        "labels": jnp.zeros((8,), jnp.int32),
        "weights": jnp.ones((8,), jnp.float32),
    }
    old_scale = np.asarray(state.params["encoder"]["blocks"][0]["attention_norm"]["scale"][...])
    new_state, _ = compiled.train_step(state, batch, compiled.dropout_key)  # donates state
    # The first norm sees the embedded tokens: its statistics are the momentum rule's.
    model = build_model(cfg, nnx.Rngs(params=jax.random.key(int(cfg.seed))))
    embedded, mask = model.encoder.embedder(tokens, padding_mask(lengths, length))
    mean, var = masked_moments(embedded, mask)
    first = new_state.params["encoder"]["blocks"][0]["attention_norm"]
    np.testing.assert_allclose(np.asarray(first["mean"][...]), 0.1 * mean, rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(np.asarray(first["var"][...]), 0.9 + 0.1 * var, rtol=1e-4)
    # The weights did move (the optimizer ran).
    assert not np.allclose(np.asarray(first["scale"][...]), old_scale)


def test_a_batch_norm_run_resumes_exactly(listops_tiny_dir, tmp_path, monkeypatch):
    from test_resume import Crash, assert_same_result, crash_after_saving

    steps = ("trainer.num_steps=6", "trainer.eval_every=3", "trainer.checkpoint_every=3")
    full = train_small(listops_tiny_dir, tmp_path / "full", *BATCH_NORM_RUN, *steps)
    crash_after_saving(monkeypatch, 3)
    with pytest.raises(Crash):
        train_small(listops_tiny_dir, tmp_path / "resumed", *BATCH_NORM_RUN, *steps)
    monkeypatch.undo()
    resumed = train_small(listops_tiny_dir, tmp_path / "resumed", *BATCH_NORM_RUN, *steps)
    assert [r["step"] for r in resumed["resumed_from"]] == [3]
    assert_same_result(resumed, full)
    assert full["config"]["task"]["arch"]["norm"] == "batch"
    layer = train_small(listops_tiny_dir, tmp_path / "layer", *LAYER_NORM_RUN, *steps)
    assert layer["config"]["task"]["arch"]["norm"] == "layer"
    assert layer["history"] != full["history"]


def test_causal_pretraining_with_batch_norm_is_a_config_error():
    from lra.train.model import build_model

    cfg = make_config("task=listops_tiny", *BATCH_NORM_RUN, "pretrain=causal", "+stage=pretrain")
    with pytest.raises(ConfigError, match="use norm=layer with pretrain=causal"):
        build_model(cfg, nnx.Rngs(0))
