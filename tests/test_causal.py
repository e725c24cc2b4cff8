"""Causal mode of the token mixers (issue 28): no look-ahead, float64 references, parameters
unchanged, the encoder's one-line refusal, supports_causal by signature."""

import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from lra.models import registry
from lra.models.attention.common import causal_linear_context
from lra.models.encoder import Encoder

B, L, D, H = 2, 12, 8, 2
LENGTHS = np.array([12, 9], np.int32)

# Small options per mechanism (defaults elsewhere); extra cases cover other paths.
SMALL = {
    "local": {"window": 4},
    "transnormer_diag": {"block_size": 4},
    "s4d": {"state_size": 4},
    "s5": {"state_size": 4, "blocks": 1},
    "lru": {"state_size": 4},
    "mamba": {"state_size": 4},
    "softmax": {"implementation": "plain"},
}
EXTRA = [
    ("softmax", {"implementation": "chunked", "block_size": 5}),
    ("softmax", {"implementation": "fused"}),
    ("local", {"window": 4, "mode": "sliding"}),
    ("transnormer_diag", {"block_size": 5, "score": "relu", "lrpe": True}),
    ("transnormer_norm", {"kernel": "elu", "lrpe": True, "norm_type": "rmsnorm"}),
    ("s4d", {"state_size": 4, "bidirectional": False}),
]
CASES = [(name, SMALL.get(name, {})) for name in registry.causal_mechanisms()] + EXTRA
IDS = [f"{n}-{'-'.join(f'{k}={v}' for k, v in o.items())}" for n, o in CASES]


def build(name, options, causal, seed=0):
    return registry.make_attention(
        name, dim=D, num_heads=H, max_len=16, rngs=nnx.Rngs(seed), causal=causal, **options
    )


def mask_of(lengths=LENGTHS, n=L):
    return jnp.arange(n)[None, :] < jnp.asarray(lengths)[:, None]


def inputs(seed=0):
    return jnp.asarray(np.random.default_rng(seed).normal(size=(B, L, D)), jnp.float32)


def test_causal_mechanisms_are_the_expected_builtins():
    expected = {"softmax", "linear", "transnormer_norm", "transnormer_diag", "cosformer", "local"}
    expected |= {"s4d", "s5", "lru", "mamba"}
    assert set(registry.causal_mechanisms()) == expected
    for name in ("flash", "linformer", "nystromformer", "reformer", "long_short"):
        assert not registry.supports_causal(name)


@pytest.mark.parametrize(("name", "options"), CASES, ids=IDS)
def test_no_look_ahead_and_not_vacuous(name, options):
    layer = build(name, options, causal=True)
    x, mask = inputs(), mask_of()
    run = jax.jit(lambda x: layer(x, mask=mask))
    out = np.asarray(run(x))
    noise = jnp.asarray(np.random.default_rng(1).normal(size=x.shape), jnp.float32)
    for i in (0, 4, 7, 10):
        later = np.asarray(run(x.at[:, i + 1 :].add(noise[:, i + 1 :])))
        np.testing.assert_allclose(later[:, : i + 1], out[:, : i + 1], atol=1e-5, rtol=1e-5)
        if i == 0:
            continue  # relu scores: one key may give a zero output whatever it is
        earlier = np.asarray(run(x.at[:, : i + 1].add(noise[:, : i + 1])))
        assert np.abs(earlier[0, : i + 1] - out[0, : i + 1]).max() > 1e-4  # row 0: all real
    # Without causal the same layer looks ahead (so the check above has teeth).
    plain = build(name, options, causal=False)
    if name == "s4d" and not options.get("bidirectional", True):
        return  # a one-directional S4D is causal either way
    i = 5
    run_plain = jax.jit(lambda x: plain(x, mask=mask))
    changed = np.asarray(run_plain(x.at[:, i + 1 :].add(noise[:, i + 1 :])))
    assert np.abs(changed[0, : i + 1] - np.asarray(run_plain(x))[0, : i + 1]).max() > 1e-4


@pytest.mark.parametrize(("name", "options"), CASES, ids=IDS)
def test_parameters_do_not_depend_on_causal(name, options):
    a, b = nnx.state(build(name, options, True)), nnx.state(build(name, options, False))
    flat_a = jax.tree_util.tree_flatten_with_path(a)[0]
    flat_b = jax.tree_util.tree_flatten_with_path(b)[0]
    assert [p for p, _ in flat_a] == [p for p, _ in flat_b]
    for (path, u), (_, v) in zip(flat_a, flat_b, strict=True):
        np.testing.assert_array_equal(np.asarray(u), np.asarray(v), err_msg=str(path))


def test_causal_padding_leaves_real_tokens_unchanged():
    """Padding follows the real tokens: a causal layer's real outputs do not see it."""
    for name, options in CASES:
        layer = build(name, options, causal=True)
        x = inputs(3)
        full = layer(x, mask=mask_of(np.array([L, L])))
        padded = layer(x.at[1, 9:].set(7.0), mask=mask_of())
        np.testing.assert_allclose(padded[1, :9], full[1, :9], atol=1e-5, rtol=1e-5)


# ---------------------------------------------------------------- float64 references


def _np(v):
    return np.asarray(v[...], np.float64)


def _proj(x, dense):
    return x @ _np(dense.kernel) + _np(dense.bias)


def _qkv(layer, x):
    q, k, v = (_proj(x, getattr(layer, n)) for n in ("query", "key", "value"))
    return (t.reshape(B, L, H, D // H) for t in (q, k, v))


def _reference(layer, x, mask, weights_of, finish):
    """out[b, i] of weights w_ij (j <= i, j real) per head, finished per row."""
    q, k, v = _qkv(layer, x)
    y = np.zeros((B, L, H, D // H))
    for b in range(B):
        for h in range(H):
            w = weights_of(q[b, :, h], k[b, :, h])  # [L, L]
            w = w * np.tril(np.ones((L, L))) * mask[b][None, :]
            y[b, :, h] = finish(w, v[b, :, h])
    return y.reshape(B, L, D)


def test_causal_softmax_matches_float64_reference():
    layer = build("softmax", {"implementation": "plain"}, True)
    x, mask = inputs(5), np.asarray(mask_of())

    def weights(q, k):
        logits = q @ k.T / np.sqrt(D // H)
        keep = np.tril(np.ones((L, L), bool))
        logits = np.where(keep, logits, -np.inf)
        return np.exp(logits - logits.max(-1, keepdims=True))

    def finish(w, v):  # w already masked; renormalise over the kept keys
        return (w / w.sum(-1, keepdims=True)) @ v

    y = _reference(layer, np.asarray(x, np.float64), mask, weights, finish)
    expected = _proj(y, layer.out)
    got = np.asarray(layer(x, mask=mask_of()))
    np.testing.assert_allclose(got[0], expected[0], atol=1e-5)
    np.testing.assert_allclose(got[1, :9], expected[1, :9], atol=1e-5)
    chunked = build("softmax", {"implementation": "chunked", "block_size": 5}, True)
    np.testing.assert_allclose(np.asarray(chunked(x, mask=mask_of())), got, atol=1e-5)


def _elu1(t):
    return np.where(t > 0, t + 1.0, np.exp(t))


def test_causal_linear_matches_float64_reference():
    layer = build("linear", {}, True)
    x, mask = inputs(6), np.asarray(mask_of())

    def finish(w, v):
        return (w @ v) / (w.sum(-1, keepdims=True) + 1e-6)

    y = _reference(
        layer, np.asarray(x, np.float64), mask, lambda q, k: _elu1(q) @ _elu1(k).T, finish
    )
    got = np.asarray(layer(x, mask=mask_of()))
    np.testing.assert_allclose(got[0], _proj(y, layer.out)[0], atol=1e-5)
    np.testing.assert_allclose(got[1, :9], _proj(y, layer.out)[1, :9], atol=1e-5)


def test_causal_norm_attention_matches_float64_reference():
    layer = build("transnormer_norm", {}, True)
    x, mask = inputs(7), np.asarray(mask_of())
    y = _reference(
        layer, np.asarray(x, np.float64), mask, lambda q, k: _elu1(q) @ _elu1(k).T, np.matmul
    )
    mean, var = y.mean(-1, keepdims=True), y.var(-1, keepdims=True)
    normed = (y - mean) / np.sqrt(var + 1e-6) * _np(layer.norm.scale) + _np(layer.norm.bias)
    expected = _proj(normed, layer.out)
    got = np.asarray(layer(x, mask=mask_of()))
    np.testing.assert_allclose(got[0], expected[0], atol=1e-4)
    np.testing.assert_allclose(got[1, :9], expected[1, :9], atol=1e-4)


@pytest.mark.parametrize("chunk", [1, 3, 4, 64])
def test_causal_linear_context_chunks_match_prefix_sums(chunk):
    rng = np.random.default_rng(8)
    n, f, e = 10, 3, 2
    q, k, v = (rng.uniform(size=(B, n, H, s)) for s in (f, f, e))
    num, den = causal_linear_context(*(jnp.asarray(t, jnp.float32) for t in (q, k, v)), chunk)
    state = np.cumsum(np.einsum("blhf,blhe->blhfe", k, v), axis=1)
    expected_num = np.einsum("blhf,blhfe->blhe", q, state)
    expected_den = np.einsum("blhf,blhf->blh", q, np.cumsum(k, axis=1))
    np.testing.assert_allclose(np.asarray(num), expected_num, rtol=1e-5)
    np.testing.assert_allclose(np.asarray(den), expected_den, rtol=1e-5)


# ---------------------------------------------------------------- encoder and registry


def _encoder(attention, num_layers=2, causal=True, **options):
    return Encoder(
        vocab_size=11,
        max_len=16,
        num_layers=num_layers,
        dim=D,
        qkv_dim=D,
        num_heads=H,
        mlp_dim=16,
        dropout=0.0,
        attention_dropout=0.0,
        positions="sinusoidal",
        cls_token=False,
        attention=attention,
        attention_options=options or None,
        causal=causal,
        rngs=nnx.Rngs(0),
    )


def test_encoder_refuses_a_mechanism_without_causal_mode_in_one_line():
    with pytest.raises(ValueError, match=r"attention 'flash' has no causal mode") as err:
        _encoder("flash")
    message = str(err.value)
    assert "\n" not in message
    assert "transnormer_norm" in message and "pretrain=masked" in message


def test_encoder_checks_every_layer_of_a_schedule():
    with pytest.raises(ValueError, match=r"'linformer' \(layer 2 of 2\) has no causal mode"):
        _encoder(["transnormer_diag", "linformer"])
    _encoder(["transnormer_diag", "transnormer_norm"])  # both causal: fine
    _encoder(["transnormer_diag", "linformer"], causal=False)  # not asked: fine


def test_causal_encoder_does_not_look_ahead():
    encoder = _encoder(["transnormer_diag", "softmax"], transnormer_diag={"block_size": 4})
    tokens = np.random.default_rng(9).integers(0, 11, size=(B, L)).astype(np.int32)
    out, _ = encoder(tokens, LENGTHS)
    changed = tokens.copy()
    changed[:, 6:] = (changed[:, 6:] + 1) % 11
    later, _ = encoder(changed, LENGTHS)
    np.testing.assert_allclose(np.asarray(later)[:, :6], np.asarray(out)[:, :6], atol=1e-5)
    assert np.abs(np.asarray(later)[0, 6:] - np.asarray(out)[0, 6:]).max() > 1e-4


def test_supports_causal_on_an_import_path(tmp_path, monkeypatch):
    monkeypatch.setattr(registry, "_LOADED", {})
    (tmp_path / "causal_outside.py").write_text(
        textwrap.dedent(
            """
            from flax import nnx

            class WithCausal(nnx.Module):
                def __init__(self, *, dim, num_heads, max_len, rngs, qkv_dim=None,
                             dropout_rate=0.0, causal: bool = False):
                    self.causal = causal
                def __call__(self, x, *, mask, deterministic=True, rngs=None):
                    return x

            class AnyKeywords(nnx.Module):
                def __init__(self, *, dim, num_heads, max_len, rngs, **options):
                    pass
                def __call__(self, x, *, mask, deterministic=True, rngs=None):
                    return x
            """
        )
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    assert registry.supports_causal("causal_outside:WithCausal")
    assert not registry.supports_causal("causal_outside:AnyKeywords")  # **options: not declared
    with pytest.raises(registry.RegistryError):
        registry.supports_causal("no_such_mechanism")
    assert _encoder("causal_outside:WithCausal").blocks[0].attention.causal is True
