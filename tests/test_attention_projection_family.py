"""Local, Linformer, Nystromformer and Synthesizer attention against plain quadratic formulas.

Every reference below is written from the paper's formula in float64 numpy with the module's
own weights; the modules compute the efficient (chunked, projected, landmark) forms.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import lra.models.attention.linformer  # noqa: F401  (registers "linformer")
import lra.models.attention.local  # noqa: F401  (registers "local")
import lra.models.attention.nystromformer  # noqa: F401  (registers "nystromformer")
import lra.models.attention.synthesizer  # noqa: F401  (registers the synthesizers)
from lra.models.attention.softmax import SoftmaxAttention
from lra.models.attention.synthesizer import FixedRandom
from lra.models.registry import RegistryError, make_attention

D, H = 32, 2
B, L, MAX_LEN = 4, 24, 32
LENGTHS = np.array([L, 10, 1, 0])  # full, partial, a single token, all padding

# (name, options) for the shared property checks; every mechanism and mode appears. The
# formula tests reuse these configurations where they can (and so their compiled programs).
DENSE = ("synthesizer_dense", {"mix_dot_product": True})
RANDOM = ("synthesizer_random", {"trainable_random": False})
FACTORIZED = ("synthesizer_factorized", {"rank": 4, "mix_dot_product": True})
CASES = [
    ("local", {"window": 5}),
    ("local", {"window": 7, "mode": "sliding"}),
    ("linformer", {"k": 8}),
    ("nystromformer", {"num_landmarks": 5, "conv_kernel": 5}),
    DENSE,
    RANDOM,
    FACTORIZED,
]
CASE_IDS = [f"{name}-{'-'.join(f'{k}={v}' for k, v in opts.items())}" for name, opts in CASES]
# Mechanisms whose outputs must not change when padding is appended.
LENGTH_FREE = {
    "local",
    "linformer",
    "synthesizer_dense",
    "synthesizer_random",
    "synthesizer_factorized",
}


def _key(seed):
    """An "rbg" key: same semantics as threefry, much faster to compile on CPU."""
    return jax.random.key(seed, impl="rbg")


def _attn(name, options, *, max_len=MAX_LEN, dropout_rate=0.5, seed=0, qkv_dim=None):
    return make_attention(
        name,
        dim=D,
        num_heads=H,
        max_len=max_len,
        rngs=nnx.Rngs(_key(seed)),
        qkv_dim=qkv_dim,
        dropout_rate=dropout_rate,
        **options,
    )


def _inputs(n=L, lengths=LENGTHS, seed=0):
    x = np.random.default_rng(seed).normal(size=(len(lengths), n, D)).astype(np.float32)
    mask = np.arange(n)[None, :] < np.asarray(lengths)[:, None]
    return x, mask


# Jitted calls: modules of the same configuration share one compiled program across tests,
# and the tiny programs here compile about twice as fast without XLA's backend optimisations.
_QUICK_COMPILE = {"xla_backend_optimization_level": 0, "xla_llvm_disable_expensive_passes": True}


@functools.partial(jax.jit, static_argnums=(0, 4), compiler_options=_QUICK_COMPILE)
def _apply(graphdef, state, x, mask, deterministic, key):
    rngs = nnx.Rngs(dropout=key)
    return nnx.merge(graphdef, state)(x, mask=mask, deterministic=deterministic, rngs=rngs)


@functools.partial(jax.jit, static_argnums=0, compiler_options=_QUICK_COMPILE)
def _grad_x(graphdef, state, x, mask):
    """d(sum of the outputs at real positions) / dx."""

    def loss(x):
        return jnp.sum(nnx.merge(graphdef, state)(x, mask=mask) * mask[..., None])

    return jax.grad(loss)(x)


def _run(attn, x, mask, *, deterministic=True, key=None):
    """attn(x) as numpy float32; a dropout key is always passed (deterministic runs ignore it),
    so every call of one configuration and shape shares a compiled program."""
    key = _key(0) if key is None else key
    graphdef, state = nnx.split(attn)
    out = _apply(graphdef, state, jnp.asarray(x), jnp.asarray(mask), deterministic, key)
    return np.asarray(out.astype(jnp.float32))


def _softmax_twin(attn):
    """A SoftmaxAttention sharing attn's query/key/value/out layers."""
    twin = SoftmaxAttention(dim=D, num_heads=H, max_len=MAX_LEN, rngs=nnx.Rngs(_key(99)))
    twin.query, twin.key, twin.value, twin.out = attn.query, attn.key, attn.value, attn.out
    return twin


# ---------------------------------------------------------------- numpy building blocks


def _np(a):
    return np.asarray(a, np.float64)


def _dense(layer, y):
    return y @ _np(layer.kernel[...]) + _np(layer.bias[...])


def _heads(y):
    b, n, e = y.shape
    return y.reshape(b, n, H, e // H).transpose(0, 2, 1, 3)  # [B, H, L, d]


def _merge(y):
    b, h, n, d = y.shape
    return y.transpose(0, 2, 1, 3).reshape(b, n, h * d)


def _softmax(logits, allowed):
    logits = np.where(allowed, logits, -1e300)
    w = np.exp(logits - logits.max(-1, keepdims=True))
    return w / w.sum(-1, keepdims=True)


def _qkv(attn, x):
    x = x.astype(np.float64)
    return tuple(_heads(_dense(layer, x)) for layer in (attn.query, attn.key, attn.value))


def _masked_softmax_attention(attn, x, allowed):
    """out = softmax(QK^T / sqrt(d) restricted to allowed[B or 1, L, L]) V, then W_o."""
    q, k, v = _qkv(attn, x)
    logits = q @ k.transpose(0, 1, 3, 2) / np.sqrt(q.shape[-1])
    return _dense(attn.out, _merge(_softmax(logits, allowed[:, None]) @ v))


def _assert_real_close(out, ref, mask, tol):
    np.testing.assert_allclose(np.asarray(out)[mask], np.asarray(ref)[mask], rtol=tol, atol=tol)


# ---------------------------------------------------------------- common properties


@pytest.mark.parametrize(
    "name",
    [
        "local",
        "linformer",
        "nystromformer",
        "synthesizer_dense",
        "synthesizer_random",
        "synthesizer_factorized",
    ],
)
def test_length_4096_shapes_finite_values_and_gradients(name):
    n = 4096
    attn = _attn(name, {}, max_len=n)
    x, mask = _inputs(n=n, lengths=[3000])
    shape = jax.eval_shape(
        lambda x, m: attn(x, mask=m),
        jax.ShapeDtypeStruct((1, n, D), jnp.float32),
        jax.ShapeDtypeStruct((1, n), jnp.bool_),
    )
    assert shape.shape == (1, n, D) and shape.dtype == jnp.float32
    graphdef, params, rest = nnx.split(attn, nnx.Param, ...)

    def loss(params, x):
        return nnx.merge(graphdef, params, rest)(x, mask=jnp.asarray(mask)).sum()

    value, (grad_params, grad_x) = jax.jit(jax.value_and_grad(loss, argnums=(0, 1)))(
        params, jnp.asarray(x)
    )
    assert np.isfinite(float(value))
    leaves = jax.tree.leaves(grad_params)
    assert leaves and all(np.all(np.isfinite(np.asarray(g))) for g in leaves)
    assert np.all(np.isfinite(np.asarray(grad_x)))
    assert np.any(np.asarray(grad_x) != 0)


@pytest.mark.parametrize(("name", "options"), CASES, ids=CASE_IDS)
def test_padding_is_invisible_to_real_positions(name, options):
    attn = _attn(name, options)
    x, mask = _inputs()
    noise = 100.0 * np.random.default_rng(1).normal(size=x.shape).astype(np.float32)
    out = _run(attn, x, mask)
    assert np.all(np.isfinite(out))  # row 3 is all padding
    _assert_real_close(_run(attn, np.where(mask[..., None], x, noise), mask), out, mask, 1e-5)
    if name in LENGTH_FREE:
        extra = MAX_LEN - L
        longer = np.concatenate([x, noise[:, :extra]], axis=1)
        longer_mask = np.concatenate([mask, np.zeros((B, extra), bool)], axis=1)
        _assert_real_close(_run(attn, longer, longer_mask)[:, :L], out, mask, 1e-5)
    grad = _grad_x(*nnx.split(attn), jnp.asarray(x), jnp.asarray(mask))
    assert np.all(np.isfinite(np.asarray(grad)))
    assert np.all(np.asarray(grad)[~mask] == 0)  # padded inputs reach no real output...
    assert np.any(np.asarray(grad)[mask] != 0)  # ...real ones do


@pytest.mark.parametrize(("name", "options"), CASES, ids=CASE_IDS)
def test_deterministic_is_pure_and_dropout_reproducible(name, options):
    attn = _attn(name, options)
    x, mask = _inputs()
    base = _run(attn, x, mask, key=_key(3))
    np.testing.assert_array_equal(base, _run(attn, x, mask, key=_key(4)))  # key ignored
    a = _run(attn, x, mask, deterministic=False, key=_key(1))
    b = _run(attn, x, mask, deterministic=False, key=_key(1))
    c = _run(attn, x, mask, deterministic=False, key=_key(2))
    assert np.all(np.isfinite(a))
    np.testing.assert_array_equal(a, b)
    assert not np.allclose(a, c)
    assert not np.allclose(a, base)
    with pytest.raises(ValueError, match="rngs"):
        attn(jnp.asarray(x), mask=jnp.asarray(mask), deterministic=False)


@pytest.mark.parametrize(("name", "options"), CASES, ids=CASE_IDS)
def test_bfloat16(name, options):
    attn = _attn(name, options)
    x, mask = _inputs()
    x = np.asarray(jnp.asarray(x, jnp.bfloat16), np.float32)  # the same inputs in both runs
    reference = _run(attn, x, mask)
    params = nnx.state(attn, nnx.Param)
    nnx.update(attn, jax.tree.map(lambda p: p.astype(jnp.bfloat16), params))
    graphdef, state = nnx.split(attn)
    out = _apply(graphdef, state, jnp.asarray(x, jnp.bfloat16), jnp.asarray(mask), True, _key(0))
    assert out.dtype == jnp.bfloat16
    out = np.asarray(out, np.float32)
    assert np.all(np.isfinite(out))
    _assert_real_close(out, reference, mask, 0.1)


# ---------------------------------------------------------------- local


@pytest.mark.parametrize("options", [{"window": L}, {"window": 2 * L, "mode": "sliding"}])
def test_local_with_a_window_over_everything_is_softmax_attention(options):
    attn = _attn("local", options)
    x, mask = _inputs()
    expected = _run(_softmax_twin(attn), x, mask)
    _assert_real_close(_run(attn, x, mask), expected, mask, 1e-5)


@pytest.mark.parametrize(
    "options",
    [
        {"window": 5},
        {"window": 7, "mode": "sliding"},
        {"window": 6, "mode": "sliding"},
        {"window": 1, "mode": "sliding"},
    ],
)
def test_local_matches_a_masked_quadratic_softmax(options):
    attn = _attn("local", options)
    x, mask = _inputs()
    i, j = np.arange(L)[:, None], np.arange(L)[None, :]
    w = options["window"]
    band = np.abs(i - j) <= w // 2 if options.get("mode") == "sliding" else i // w == j // w
    expected = _masked_softmax_attention(attn, x, band[None] & mask[:, None, :])
    _assert_real_close(_run(attn, x, mask), expected, mask, 1e-5)


# ---------------------------------------------------------------- linformer


def test_linformer_with_identity_projections_is_softmax_attention():
    attn = _attn("linformer", {"k": L}, max_len=L)
    attn.key_projection[...] = jnp.eye(L)
    attn.value_projection[...] = jnp.eye(L)
    x, _ = _inputs()
    mask = np.ones((B, L), bool)
    expected = _run(_softmax_twin(attn), x, mask)
    np.testing.assert_allclose(_run(attn, x, mask), expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("share_kv", [False, True])
def test_linformer_matches_its_formula(share_kv):
    attn = _attn("linformer", {"k": 8, "share_kv": share_kv})
    x, mask = _inputs()
    q, k, v = _qkv(attn, x)
    real = mask[:, None, :, None]
    e = _np(attn.key_projection[...])[:, :L]
    f = e if share_kv else _np(attn.value_projection[...])[:, :L]
    k, v = e @ (k * real), f @ (v * real)  # [B, H, k, d]
    logits = q @ k.transpose(0, 1, 3, 2) / np.sqrt(q.shape[-1])
    expected = _dense(attn.out, _merge(_softmax(logits, True) @ v))
    _assert_real_close(_run(attn, x, mask), expected, mask, 1e-5)


# ---------------------------------------------------------------- nystromformer


def _nystrom_reference(attn, x, mask, iterations):
    q, k, v = _qkv(attn, x)
    d = q.shape[-1]
    q, k, v = q * d**-0.25, k * d**-0.25, v * mask[:, None, :, None]
    n, m = x.shape[1], attn.num_landmarks
    members = (np.arange(n)[:, None] * m // n == np.arange(m)[None, :])[None] & mask[:, :, None]
    count = members.sum(1)  # [B, m]
    real = count > 0
    average = members / np.maximum(count, 1)[:, None, :]
    q_lm = np.einsum("blm,bhld->bhmd", average, q)
    k_lm = np.einsum("blm,bhld->bhmd", average, k)
    k1 = _softmax(q @ k_lm.transpose(0, 1, 3, 2), real[:, None, None, :])
    k2 = _softmax(q_lm @ k_lm.transpose(0, 1, 3, 2), real[:, None, None, :])
    k2 = k2 * real[:, None, :, None]
    k3 = _softmax(q_lm @ k.transpose(0, 1, 3, 2), mask[:, None, None, :])
    eye = np.eye(m)
    norms = np.maximum(np.abs(k2).sum(-2).max(-1) * np.abs(k2).sum(-1).max(-1), 1e-300)
    z = k2.transpose(0, 1, 3, 2) / norms[..., None, None]
    for _ in range(iterations):
        az = k2 @ z
        z = 0.25 * z @ (13 * eye - az @ (15 * eye - az @ (7 * eye - az)))
    y = k1 @ z @ k3 @ v
    if attn.conv is not None:
        taps = _np(attn.conv[...])  # [H, width]
        half = taps.shape[1] // 2
        padded = np.pad(v, [(0, 0), (0, 0), (half, half), (0, 0)])
        for s in range(taps.shape[1]):
            y = y + taps[None, :, s, None, None] * padded[:, :, s : s + n]
    return _dense(attn.out, _merge(y))


@pytest.mark.parametrize(
    ("num_landmarks", "conv_kernel", "lengths"),
    [(5, 5, LENGTHS), (4, 35, [L, 17, 3, 2]), (30, None, [L, 13, 2, 1])],
)
def test_nystromformer_matches_its_formula(num_landmarks, conv_kernel, lengths):
    options = {"num_landmarks": num_landmarks, "conv_kernel": conv_kernel}
    attn = _attn("nystromformer", options)
    x, mask = _inputs(lengths=lengths)
    expected = _nystrom_reference(attn, x, mask, 6)
    _assert_real_close(_run(attn, x, mask), expected, mask, 2e-4)


def test_nystromformer_with_a_landmark_per_token_approaches_softmax():
    x, _ = _inputs()
    mask = np.ones((B, L), bool)
    errors = {}
    for iterations in (6, 20):
        options = {"num_landmarks": L, "conv_kernel": 0, "pinv_iterations": iterations}
        attn = _attn("nystromformer", options)
        expected = _run(_softmax_twin(attn), x, mask)
        errors[iterations] = np.abs(_run(attn, x, mask) - expected).max() / np.abs(expected).mean()
    assert errors[6] < 0.2  # six Newton steps: close, the paper's setting
    assert errors[20] < 3e-3  # converged pseudo-inverse: K1 pinv(K2) K3 = softmax
    assert errors[20] < errors[6] / 10


# ---------------------------------------------------------------- synthesizers


def _synthesizer_reference(attn, x, mask, synthetic):
    """softmax(synthetic [+ QK^T / sqrt(d)] over real keys) V, then W_o."""
    x = x.astype(np.float64)
    logits = np.broadcast_to(synthetic, (x.shape[0], H, L, L))
    if attn.query is not None:
        q, k = _heads(_dense(attn.query, x)), _heads(_dense(attn.key, x))
        logits = logits + q @ k.transpose(0, 1, 3, 2) / np.sqrt(q.shape[-1])
    v = _heads(_dense(attn.value, x))
    return _dense(attn.out, _merge(_softmax(logits, mask[:, None, None, :]) @ v))


def test_random_synthesizer_with_a_known_matrix():
    attn = _attn(*RANDOM)
    assert isinstance(attn.random_logits, FixedRandom)  # the fixed table is used as well
    table = np.random.default_rng(5).normal(size=(H, MAX_LEN, MAX_LEN)).astype(np.float32)
    attn.random_logits[...] = jnp.asarray(table)
    x, mask = _inputs()
    expected = _synthesizer_reference(attn, x, mask, _np(table)[None, :, :L, :L])
    _assert_real_close(_run(attn, x, mask), expected, mask, 1e-5)


def test_dense_synthesizer_matches_its_formula():
    attn = _attn(*DENSE)
    x, mask = _inputs()
    hidden = _heads(np.maximum(_dense(attn.hidden, x.astype(np.float64)), 0.0))  # [B, H, L, d]
    logits = hidden @ _np(attn.to_logits.kernel[...])[:, :L] + _np(attn.to_logits.bias[...])[:L]
    expected = _synthesizer_reference(attn, x, mask, logits)
    _assert_real_close(_run(attn, x, mask), expected, mask, 1e-5)


def test_factorized_synthesizer_matches_its_formula():
    attn = _attn(*FACTORIZED)
    rank = attn.random_left.shape[-1]
    scale = 5.0  # spread the logits so that a wrong product would show
    attn.random_left[...] = attn.random_left[...] * scale
    attn.random_right[...] = attn.random_right[...] * scale
    x, mask = _inputs()
    left, right = _np(attn.random_left[...])[:, :L], _np(attn.random_right[...])[:, :L]
    logits = (left @ right.transpose(0, 2, 1))[None]
    assert np.linalg.matrix_rank(logits[0, 0]) == rank < L
    expected = _synthesizer_reference(attn, x, mask, logits)
    _assert_real_close(_run(attn, x, mask), expected, mask, 1e-5)


@pytest.mark.parametrize(
    "name", ["synthesizer_dense", "synthesizer_random", "synthesizer_factorized"]
)
def test_synthesizer_mixed_with_zero_synthetic_logits_is_softmax_attention(name):
    options = {"synthesizer_factorized": {"rank": 4}}.get(name, {})
    attn = _attn(name, {**options, "mix_dot_product": True})
    if name == "synthesizer_dense":
        attn.to_logits.kernel[...] = jnp.zeros_like(attn.to_logits.kernel[...])
        attn.to_logits.bias[...] = jnp.zeros_like(attn.to_logits.bias[...])
    elif name == "synthesizer_random":
        attn.random_logits[...] = jnp.zeros_like(attn.random_logits[...])
    else:
        attn.random_left[...] = jnp.zeros_like(attn.random_left[...])
    x, mask = _inputs()
    expected = _run(_softmax_twin(attn), x, mask)
    out = _run(attn, x, mask)
    _assert_real_close(out, expected, mask, 1e-5)


def test_fixed_random_tables_are_not_params():
    fixed = _attn("synthesizer_factorized", {"trainable_random": False})
    learned = _attn("synthesizer_factorized", {})
    assert isinstance(fixed.random_left, FixedRandom)
    assert isinstance(learned.random_left, nnx.Param)
    assert "random_left" not in nnx.state(fixed, nnx.Param)
    assert "random_left" in nnx.state(fixed, FixedRandom)
    assert "random_left" in nnx.state(learned, nnx.Param)
    assert fixed.query is None and fixed.key is None


# ---------------------------------------------------------------- options and errors


@pytest.mark.parametrize(
    ("name", "options", "match"),
    [
        ("local", {"mode": "dilated"}, "mode"),
        ("local", {"window": 0}, "window"),
        ("linformer", {"k": 0}, "k must"),
        ("nystromformer", {"num_landmarks": 0}, "num_landmarks"),
        ("nystromformer", {"conv_kernel": 4}, "odd"),
        ("nystromformer", {"pinv_iterations": 0}, "pinv_iterations"),
        ("synthesizer_factorized", {"rank": 0}, "rank"),
        ("synthesizer_random", {"trainable_random": "yes"}, "trainable_random"),
    ],
)
def test_bad_options_raise(name, options, match):
    with pytest.raises(ValueError, match=match):
        _attn(name, options)


@pytest.mark.parametrize("name", ["linformer", "synthesizer_dense", "synthesizer_random"])
def test_longer_than_max_len_raises(name):
    attn = _attn(name, {}, max_len=8)
    x, mask = _inputs(n=9, lengths=[9])
    with pytest.raises(ValueError, match="max_len"):
        _run(attn, x, mask)


def test_options_belong_to_their_mechanism():
    with pytest.raises(RegistryError, match="trainable_random"):
        _attn("synthesizer_dense", {"trainable_random": False})
    with pytest.raises(RegistryError, match="rank"):
        _attn("synthesizer_random", {"rank": 4})


def test_qkv_dim_is_respected():
    for name in ("local", "linformer", "nystromformer", "synthesizer_dense"):
        attn = _attn(name, {}, qkv_dim=16)
        assert attn.value.kernel.shape == (D, 16) and attn.out.kernel.shape == (16, D)
        out = jax.eval_shape(
            lambda x, m, attn=attn: attn(x, mask=m),
            jax.ShapeDtypeStruct((B, L, D), jnp.float32),
            jax.ShapeDtypeStruct((B, L), jnp.bool_),
        )
        assert out.shape == (B, L, D)
