"""Softmax attention against a numpy reference, its dropout, and the mechanism registry."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import lra.models
from lra.models import registry
from lra.models.attention.softmax import SoftmaxAttention

B, L, D, H = 3, 12, 32, 4


def _attn(qkv_dim=None, dropout_rate=0.0, seed=0):
    return lra.models.make_attention(
        "softmax",
        dim=D,
        num_heads=H,
        max_len=L,
        rngs=nnx.Rngs(seed),
        qkv_dim=qkv_dim,
        dropout_rate=dropout_rate,
    )


def drop_rngs(seed):
    """Dropout Rngs on an "rbg" key: same semantics as threefry, much faster to compile on CPU."""
    return nnx.Rngs(dropout=jax.random.key(seed, impl="rbg"))


def _inputs(seed=0):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(B, L, D)).astype(np.float32)
    lengths = np.array([L, 5, 1])
    mask = np.arange(L)[None, :] < lengths[:, None]
    return x, mask


def _reference(attn, x, mask):
    """The formula in float64 numpy with the module's own weights."""

    def dense(layer, y):
        return y @ np.asarray(layer.kernel[...], np.float64) + np.asarray(
            layer.bias[...], np.float64
        )

    x = x.astype(np.float64)
    b, n, _ = x.shape
    e = attn.query.kernel.shape[1]
    dh = e // attn.num_heads

    def heads(y):
        return y.reshape(b, n, attn.num_heads, dh).transpose(0, 2, 1, 3)  # [B, H, L, dh]

    q, k, v = heads(dense(attn.query, x)), heads(dense(attn.key, x)), heads(dense(attn.value, x))
    logits = q @ k.transpose(0, 1, 3, 2) / np.sqrt(dh)
    logits = np.where(mask[:, None, None, :], logits, -1e300)
    logits = logits - logits.max(-1, keepdims=True)
    w = np.exp(logits)
    w = w / w.sum(-1, keepdims=True)
    y = (w @ v).transpose(0, 2, 1, 3).reshape(b, n, e)
    return dense(attn.out, y)


@pytest.mark.parametrize("qkv_dim", [None, 16])
@pytest.mark.parametrize("masked", [False, True])
def test_matches_numpy_reference(qkv_dim, masked):
    attn = _attn(qkv_dim=qkv_dim)
    x, mask = _inputs()
    if not masked:
        mask = np.ones_like(mask)
    out = attn(jnp.asarray(x), mask=jnp.asarray(mask))
    np.testing.assert_allclose(np.asarray(out), _reference(attn, x, mask), rtol=1e-5, atol=1e-5)


def test_padded_keys_do_not_affect_real_queries():
    attn = _attn()
    x, mask = _inputs()
    x2 = np.where(mask[..., None], x, 100.0 * np.random.default_rng(1).normal(size=x.shape))
    out1 = attn(jnp.asarray(x), mask=jnp.asarray(mask))
    out2 = attn(jnp.asarray(x2, jnp.float32), mask=jnp.asarray(mask))
    np.testing.assert_allclose(np.asarray(out1)[mask], np.asarray(out2)[mask], rtol=1e-5, atol=1e-5)


def test_fully_masked_rows_are_finite():
    attn = _attn()
    x, _ = _inputs()
    mask = np.zeros((B, L), bool)
    out = attn(jnp.asarray(x), mask=jnp.asarray(mask))
    assert np.all(np.isfinite(np.asarray(out)))
    grad = jax.grad(lambda x: attn(x, mask=jnp.asarray(mask)).sum())(jnp.asarray(x))
    assert np.all(np.isfinite(np.asarray(grad)))


def test_shapes_through_eval_shape():
    attn = _attn(qkv_dim=16)
    out = jax.eval_shape(
        lambda x, m: attn(x, mask=m),
        jax.ShapeDtypeStruct((2, 7, D), jnp.float32),
        jax.ShapeDtypeStruct((2, 7), jnp.bool_),
    )
    assert out.shape == (2, 7, D) and out.dtype == jnp.float32


def test_bfloat16():
    attn = _attn(dropout_rate=0.1)
    params = nnx.state(attn, nnx.Param)
    nnx.update(attn, jax.tree.map(lambda p: p.astype(jnp.bfloat16), params))
    x, mask = _inputs()
    xb = jnp.asarray(x, jnp.bfloat16)
    out = attn(xb, mask=jnp.asarray(mask))
    assert out.dtype == jnp.bfloat16
    assert np.all(np.isfinite(np.asarray(out, np.float32)))
    ref = _reference(attn, np.asarray(xb, np.float32), mask)
    np.testing.assert_allclose(np.asarray(out, np.float32), ref, atol=0.1, rtol=0.1)
    out = attn(xb, mask=jnp.zeros((B, L), bool), deterministic=False, rngs=drop_rngs(0))
    assert out.dtype == jnp.bfloat16 and np.all(np.isfinite(np.asarray(out, np.float32)))


def test_attention_dropout():
    attn = _attn(dropout_rate=0.5)
    x, mask = jnp.asarray(_inputs()[0]), jnp.asarray(_inputs()[1])
    base = attn(x, mask=mask)
    # deterministic=True ignores rngs
    np.testing.assert_array_equal(base, attn(x, mask=mask, rngs=nnx.Rngs(dropout=3)))
    a = attn(x, mask=mask, deterministic=False, rngs=drop_rngs(1))
    b = attn(x, mask=mask, deterministic=False, rngs=drop_rngs(1))
    c = attn(x, mask=mask, deterministic=False, rngs=drop_rngs(2))
    np.testing.assert_array_equal(a, b)
    assert not np.allclose(a, c)
    assert not np.allclose(a, base)
    with pytest.raises(ValueError, match="rngs"):
        attn(x, mask=mask, deterministic=False)


def test_qkv_dim_must_divide_by_heads():
    with pytest.raises(ValueError, match="divisible"):
        _attn(qkv_dim=30)


def test_registry_lists_softmax():
    assert "softmax" in lra.models.ATTENTION_NAMES
    assert registry.names() == tuple(sorted(registry.names()))
    assert registry.get("softmax") is SoftmaxAttention


def test_unknown_name_lists_registered_names():
    with pytest.raises(lra.models.RegistryError, match="no_such_attention") as info:
        lra.models.make_attention(
            "no_such_attention", dim=D, num_heads=H, max_len=L, rngs=nnx.Rngs(0)
        )
    assert "softmax" in str(info.value)


def test_duplicate_registration_raises():
    class Other(nnx.Module):
        pass

    with pytest.raises(lra.models.RegistryError, match="softmax"):
        lra.models.register("softmax")(Other)
    assert registry.get("softmax") is SoftmaxAttention


def test_register_new_name(monkeypatch):
    monkeypatch.setattr(registry, "_REGISTRY", dict(registry._REGISTRY))

    @lra.models.register("aaa_test")
    class Tiny(nnx.Module):
        def __init__(
            self, *, dim, num_heads, max_len, rngs, qkv_dim=None, dropout_rate=0.0, width=1
        ):
            self.width = width

        def __call__(self, x, *, mask, deterministic=True, rngs=None):
            return x

    assert registry.names()[0] == "aaa_test"
    made = lra.models.make_attention(
        "aaa_test", dim=D, num_heads=H, max_len=L, rngs=nnx.Rngs(0), width=3
    )
    assert isinstance(made, Tiny) and made.width == 3


def test_bad_option_is_named():
    with pytest.raises(lra.models.RegistryError, match="softmax") as info:
        lra.models.make_attention(
            "softmax", dim=D, num_heads=H, max_len=L, rngs=nnx.Rngs(0), window_size=8
        )
    assert "window_size" in str(info.value)
    assert isinstance(info.value, ValueError)


def test_fused_implementation_matches_the_plain_reference():
    plain = _attn()
    fused = lra.models.make_attention(
        "softmax", dim=D, num_heads=H, max_len=L, rngs=nnx.Rngs(0), implementation="fused"
    )
    x, mask = _inputs()
    real = np.asarray(mask)
    np.testing.assert_allclose(
        np.asarray(fused(x, mask=mask))[real], np.asarray(plain(x, mask=mask))[real], atol=1e-5
    )


def test_fused_implementation_refuses_attention_dropout():
    with pytest.raises(ValueError, match="attention_dropout=0"):
        lra.models.make_attention(
            "softmax",
            dim=D,
            num_heads=H,
            max_len=L,
            rngs=nnx.Rngs(0),
            dropout_rate=0.1,
            implementation="fused",
        )


def test_auto_implementation_picks_cudnn_only_where_it_applies():
    from lra.models.attention.softmax import choose_implementation

    def pick(**over):
        kw = dict(platform="gpu", dtype=jnp.bfloat16, head_dim=64, dropout_active=False)
        kw.update(over)
        return choose_implementation("auto", **kw)

    assert pick() == "cudnn" and pick(dtype=jnp.float16, head_dim=128) == "cudnn"
    assert pick(platform="cpu") == "plain" and pick(platform="tpu") == "plain"
    assert pick(platform="cpu", max_len=1023) == "plain"
    assert pick(platform="cpu", max_len=1024) == "chunked"  # long sequences on a CPU
    assert pick(platform="cpu", max_len=4097, dropout_active=True) == "chunked"
    assert pick(platform="tpu", max_len=4097) == "plain" and pick(max_len=4097) == "cudnn"
    assert pick(dropout_active=True) == "plain"  # training with attention dropout
    assert pick(dtype=jnp.float32) == "plain" and pick(head_dim=60) == "plain"
    assert pick(head_dim=256) == "plain"
    assert (
        choose_implementation(
            "plain", platform="gpu", dtype=jnp.bfloat16, head_dim=64, dropout_active=False
        )
        == "plain"
    )


def test_auto_is_the_plain_reference_on_this_backend():
    x, mask = _inputs()
    auto = _attn()
    plain = lra.models.make_attention(
        "softmax", dim=D, num_heads=H, max_len=L, rngs=nnx.Rngs(0), implementation="plain"
    )
    assert auto.implementation == "auto"
    np.testing.assert_array_equal(np.asarray(auto(x, mask=mask)), np.asarray(plain(x, mask=mask)))
    with pytest.raises(ValueError, match="must be one of auto, plain, chunked, fused"):
        lra.models.make_attention(
            "softmax", dim=D, num_heads=H, max_len=L, rngs=nnx.Rngs(0), implementation="x"
        )
