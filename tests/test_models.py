"""The LRA classifier: shapes, padding invariance, pooling, schedules, gradients, bfloat16."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import lra.models
from lra.models import registry
from lra.models.attention.softmax import SoftmaxAttention
from lra.models.encoder import Encoder
from lra.models.heads import pool

VOCAB, CLASSES = 20, 3


def _kwargs(**over):
    kw = dict(
        vocab_size=VOCAB,
        num_classes=CLASSES,
        max_len=24,
        num_layers=2,
        dim=32,
        qkv_dim=32,
        num_heads=4,
        mlp_dim=64,
        dropout=0.1,
        attention_dropout=0.1,
        pooling="cls",
        positions="sinusoidal",
        attention="softmax",
    )
    kw.update(over)
    return kw


@functools.partial(nnx.jit, static_argnames="deterministic")
def fwd(model, *args, deterministic=True, rngs=None):
    """``model(*args, ...)``, compiled: one compile is faster than eager op-by-op on CPU."""
    return model(*args, deterministic=deterministic, rngs=rngs)


def drop_rngs(seed):
    """Dropout Rngs on an "rbg" key: same semantics as threefry, much faster to compile on CPU."""
    return nnx.Rngs(dropout=jax.random.key(seed, impl="rbg"))


def _model(dual=False, seed=0, **over):
    return lra.models.build_classifier(dual=dual, rngs=nnx.Rngs(seed), **_kwargs(**over))


def _batch(seed, b=4, n=16, lengths=(16, 9, 1, 0)):
    rng = np.random.default_rng(seed)
    tokens = rng.integers(0, VOCAB, size=(b, n)).astype(np.int32)
    return tokens, np.asarray(lengths, np.int32)


def _repad(tokens, lengths, extra, seed):
    """Random tokens at every padded position, plus ``extra`` padding columns."""
    rng = np.random.default_rng(seed)
    b, n = tokens.shape
    noise = rng.integers(0, VOCAB, size=(b, n + extra)).astype(np.int32)
    real = np.arange(n + extra)[None, :] < lengths[:, None]
    wide = np.concatenate([tokens, noise[:, n:]], axis=1)
    return np.where(real, wide, noise)


@pytest.mark.parametrize("pooling", ["cls", "mean"])
@pytest.mark.parametrize("positions", ["sinusoidal", "learned"])
def test_classifier_shapes(pooling, positions):
    model = _model(pooling=pooling, positions=positions)
    out = jax.eval_shape(
        lambda t, n: model(t, n),
        jax.ShapeDtypeStruct((5, 24), jnp.int32),
        jax.ShapeDtypeStruct((5,), jnp.int32),
    )
    assert out.shape == (5, CLASSES) and out.dtype == jnp.float32
    if positions == "learned":
        assert model.encoder.embedder.pos.shape == (24 + (pooling == "cls"), 32)


def test_last_pooling_takes_the_last_real_position():
    h = jnp.arange(2 * 5 * 3, dtype=jnp.float32).reshape(2, 5, 3)
    mask = jnp.asarray([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]], bool)
    np.testing.assert_array_equal(pool(h, mask, "last"), jnp.stack([h[0, 2], h[1, 4]]))
    empty = jnp.zeros((1, 5), bool)
    np.testing.assert_array_equal(pool(h[:1], empty, "last"), jnp.zeros((1, 3)))


def test_dual_classifier_shape():
    model = _model(dual=True, qkv_dim=16, num_classes=2)
    t = jax.ShapeDtypeStruct((3, 20), jnp.int32)
    n = jax.ShapeDtypeStruct((3,), jnp.int32)
    out = jax.eval_shape(lambda a, b, c, d: model(a, b, c, d), t, n, t, n)
    assert out.shape == (3, 2)


def test_dual_classifier_is_its_head_on_each_document_encoded_alone():
    """One encoder pass over both documents (2B rows) gives each document's own encoding."""
    model = _model(dual=True, pooling="mean", dropout=0.0, attention_dropout=0.0)
    t1, n1 = _batch(0)
    t2, n2 = _batch(1, lengths=(3, 16, 0, 12))
    logits = {}
    for deterministic in (True, False):
        logits[deterministic] = np.asarray(
            fwd(model, t1, n1, t2, n2, deterministic=deterministic, rngs=drop_rngs(0))
        )
    u = pool(*model.encoder(jnp.asarray(t1), jnp.asarray(n1)), "mean")
    v = pool(*model.encoder(jnp.asarray(t2), jnp.asarray(n2)), "mean")
    z = jnp.concatenate([u, v, u * v, u - v], axis=-1)
    expected = model.logits(nnx.relu(model.hidden2(nnx.relu(model.hidden1(z)))))
    for out in logits.values():  # no dropout: training mode computes the same
        np.testing.assert_allclose(out, np.asarray(expected), rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="two documents of one shape"):
        model(t1, n1, t2[:, :8], n2)


@pytest.mark.parametrize(
    "pooling, positions", [("cls", "sinusoidal"), ("mean", "learned"), ("last", "sinusoidal")]
)
def test_padding_invariance(pooling, positions):
    extra = 8  # 16 + 8 = max_len: eager-mode shapes shared across tests keep the file fast
    model = _model(pooling=pooling, positions=positions)
    tokens, lengths = _batch(0)
    base = fwd(model, jnp.asarray(tokens), jnp.asarray(lengths))
    moved = fwd(model, jnp.asarray(_repad(tokens, lengths, extra, seed=1)), jnp.asarray(lengths))
    assert np.all(np.isfinite(np.asarray(base)))
    np.testing.assert_allclose(np.asarray(base), np.asarray(moved), atol=1e-5, rtol=1e-5)


def test_dual_padding_invariance():
    model = _model(dual=True, pooling="cls", num_layers=1)
    t1, n1 = _batch(0)
    t2, n2 = _batch(1, lengths=(3, 16, 0, 12))
    base = fwd(model, *map(jnp.asarray, (t1, n1, t2, n2)))
    moved = fwd(
        model,
        jnp.asarray(_repad(t1, n1, 8, seed=2)),
        jnp.asarray(n1),
        jnp.asarray(_repad(t2, n2, 8, seed=3)),
        jnp.asarray(n2),
    )
    np.testing.assert_allclose(np.asarray(base), np.asarray(moved), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("pooling", ["cls", "mean"])
def test_token_zero_is_a_real_token(pooling):
    model = _model(pooling=pooling)
    tokens = np.zeros((4, 16), np.int32)
    tokens[:, 0] = 7
    # Only the length differs: if zeros were taken for padding the logits would agree.
    a = fwd(model, jnp.asarray(tokens), jnp.asarray([1] * 4))
    b = fwd(model, jnp.asarray(tokens), jnp.asarray([4] * 4))
    assert not np.allclose(a, b, atol=1e-4)
    # Changing a 0 inside the length changes the logits.
    tokens2 = tokens.copy()
    tokens2[:, 2] = 5
    c = fwd(model, jnp.asarray(tokens2), jnp.asarray([4] * 4))
    assert not np.allclose(b, c, atol=1e-4)


def test_masked_mean_pooling_matches_numpy():
    rng = np.random.default_rng(0)
    h = rng.normal(size=(3, 10, 8)).astype(np.float32)
    lengths = np.array([10, 4, 0])
    mask = np.arange(10)[None, :] < lengths[:, None]
    expected = np.stack(
        [h[i, : lengths[i]].mean(0) if lengths[i] else np.zeros(8) for i in range(3)]
    )
    got = pool(jnp.asarray(h), jnp.asarray(mask), "mean")
    np.testing.assert_allclose(np.asarray(got), expected, rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(
        np.asarray(pool(jnp.asarray(h), jnp.asarray(mask), "cls")), h[:, 0]
    )
    with pytest.raises(ValueError, match="pooling"):
        pool(jnp.asarray(h), jnp.asarray(mask), "max")


def test_sinusoidal_positions():
    table = np.asarray(lra.models.sinusoidal_positions(50, 16))
    assert table.shape == (50, 16) and table.dtype == np.float32
    np.testing.assert_allclose(table[0], np.tile([0.0, 1.0], 8))
    p, i = 7, 3
    angle = p / 10000 ** (2 * i / 16)
    np.testing.assert_allclose(
        table[p, 2 * i : 2 * i + 2], [np.sin(angle), np.cos(angle)], rtol=1e-6
    )


def test_gradients_finite_with_dropout():
    model = _model(pooling="mean", positions="learned")
    tokens, lengths = _batch(0)
    labels = jnp.asarray([0, 1, 2, 0])

    def loss_fn(m):
        logits = m(
            jnp.asarray(tokens), jnp.asarray(lengths), deterministic=False, rngs=drop_rngs(3)
        )
        return -jnp.mean(jnp.take_along_axis(jax.nn.log_softmax(logits), labels[:, None], 1))

    grads = nnx.jit(nnx.grad(loss_fn))(model)
    leaves = jax.tree.leaves(grads)
    assert leaves and all(np.all(np.isfinite(np.asarray(g))) for g in leaves)
    assert np.abs(np.asarray(grads.encoder.embedder.pos[...])).sum() > 0


def test_dropout_rngs():
    model = _model(num_layers=1)
    tokens, lengths = map(jnp.asarray, _batch(0))
    base = fwd(model, tokens, lengths)
    np.testing.assert_array_equal(base, fwd(model, tokens, lengths, rngs=nnx.Rngs(5)))
    a = fwd(model, tokens, lengths, deterministic=False, rngs=drop_rngs(1))
    b = fwd(model, tokens, lengths, deterministic=False, rngs=jax.random.key(1, impl="rbg"))
    c = fwd(model, tokens, lengths, deterministic=False, rngs=drop_rngs(2))
    np.testing.assert_array_equal(a, b)
    assert not np.allclose(a, c)
    with pytest.raises(ValueError, match="rngs"):
        model(tokens, lengths, deterministic=False)


def test_too_long_input_raises():
    model = _model(max_len=16)
    with pytest.raises(ValueError, match="max_len"):
        model(jnp.zeros((1, 17), jnp.int32), jnp.asarray([3]))


class _MeanMix(nnx.Module):
    """A toy whole-layer mechanism: every real position gets the masked mean, times a scale."""

    replaces_mlp = True

    def __init__(self, *, dim, num_heads, max_len, rngs, qkv_dim=None, dropout_rate=0.0, scale=1.0):
        self.scale = scale
        self.proj = nnx.Linear(dim, dim, rngs=rngs)

    def __call__(self, x, *, mask, deterministic=True, rngs=None):
        return self.proj(pool(x, mask, "mean"))[:, None, :] * self.scale * mask[..., None]


@pytest.fixture
def mean_mix(monkeypatch):
    monkeypatch.setattr(registry, "_REGISTRY", dict(registry._REGISTRY))
    lra.models.register("test_mean_mix")(_MeanMix)
    return "test_mean_mix"


def _encoder(attention, attention_options=None, num_layers=2):
    kw = _kwargs(num_layers=num_layers, attention=attention, attention_options=attention_options)
    del kw["num_classes"], kw["pooling"]
    return Encoder(cls_token=False, rngs=nnx.Rngs(0), **kw)


def test_per_layer_schedule(mean_mix):
    enc = _encoder(["softmax", mean_mix], attention_options={mean_mix: {"scale": 2.5}})
    assert enc.schedule == ("softmax", mean_mix)
    assert isinstance(enc.blocks[0].attention, SoftmaxAttention)
    assert isinstance(enc.blocks[1].attention, _MeanMix)
    assert enc.blocks[1].attention.scale == 2.5
    assert enc.blocks[0].has_mlp and enc.blocks[0].mlp is not None
    assert not enc.blocks[1].has_mlp and enc.blocks[1].mlp is None
    h, mask = fwd(enc, *map(jnp.asarray, _batch(0)))
    assert h.shape == (4, 16, 32) and np.all(np.isfinite(np.asarray(h)))
    # A schedule of one mechanism for every layer.
    same = _encoder(["softmax", "softmax"])
    assert all(isinstance(b.attention, SoftmaxAttention) for b in same.blocks)


def test_schedule_errors(mean_mix):
    with pytest.raises(ValueError, match="num_layers=2"):
        _encoder(["softmax", "softmax", "softmax"])
    with pytest.raises(ValueError, match="num_features"):
        _encoder("softmax", attention_options={"num_features": 256})
    with pytest.raises(lra.models.RegistryError, match="nope"):
        _encoder(["softmax", "nope"])
    with pytest.raises(lra.models.RegistryError, match="scale"):
        _encoder("softmax", attention_options={"softmax": {"scale": 2.0}})


@pytest.mark.parametrize("pooling", ["cls", "mean"])
def test_bfloat16_forward(pooling):
    model = _model(pooling=pooling, positions="learned" if pooling == "mean" else "sinusoidal")
    params = nnx.state(model, nnx.Param)
    nnx.update(model, jax.tree.map(lambda p: p.astype(jnp.bfloat16), params))
    tokens, lengths = map(jnp.asarray, _batch(0))
    logits = fwd(model, tokens, lengths)
    assert logits.dtype == jnp.bfloat16
    assert np.all(np.isfinite(np.asarray(logits, np.float32)))
    if pooling == "cls":  # one dropout compile is enough
        logits = fwd(model, tokens, lengths, deterministic=False, rngs=drop_rngs(0))
        assert logits.dtype == jnp.bfloat16


@pytest.mark.parametrize(
    "num_layers, expected_lower",
    [(1, 0), (2, 1), (4, 2), (6, 3)],
)
def test_lower_upper_split_schedule_fits_any_depth(num_layers, expected_lower):
    from lra.models.schedule import resolve_schedule

    split = {"lower": "local", "upper": "softmax", "lower_fraction": 0.5}
    schedule = resolve_schedule(split, num_layers)
    assert schedule == ("local",) * expected_lower + ("softmax",) * (num_layers - expected_lower)
    with pytest.raises(ValueError, match="lower, upper"):
        resolve_schedule({"lower": "local"}, num_layers)
