"""The state-space mixers LRU and Mamba (models/ssm/lru.py, models/ssm/mamba.py).

Each mixer's output is checked against a sequential Python loop over each row's real tokens in
float64 numpy, with the module's own parameters (both directions); then the initialisations
against their formulas, padding invariance, the contract (dtype, dropout, options, schedules).
"""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import lra.models.ssm.lru as lru
import lra.models.ssm.mamba as mamba
from lra.models import build_classifier, registry

B, L, D = 3, 12, 8
LENGTHS = np.array([L, 5, 1])


def _inputs(lengths=LENGTHS, length=L, seed=0):
    x = np.random.default_rng(seed).normal(size=(len(lengths), length, D)).astype(np.float32)
    mask = np.arange(length)[None, :] < np.asarray(lengths)[:, None]
    return jnp.asarray(x), jnp.asarray(mask)


def _p(param) -> np.ndarray:
    return np.asarray(param[...], np.float64)


# --- float64 references --------------------------------------------------------------------


def _lru_direction_ref(u: np.ndarray, d: lru.LRUDirection) -> np.ndarray:
    """Re(C h_t) for u float64[n, D], h_t = lambda h_{t-1} + gamma B u_t, by a loop."""
    lam = np.exp(-np.exp(_p(d.nu_log)) + 1j * np.exp(_p(d.theta_log)))
    b = (_p(d.B_re) + 1j * _p(d.B_im)) * np.exp(_p(d.gamma_log))[:, None]
    c = _p(d.C_re) + 1j * _p(d.C_im)
    h = np.zeros(lam.shape, np.complex128)
    out = []
    for t in range(u.shape[0]):
        h = lam * h + b @ u[t]
        out.append((c @ h).real)
    return np.array(out).reshape(u.shape[0], -1)


def lru_ref(module: lru.LRU, x: np.ndarray, lengths) -> list[np.ndarray]:
    """Per row, the outputs at its real tokens (float64[n_b, D])."""
    rows = []
    for row, n in zip(np.asarray(x, np.float64), lengths, strict=True):
        u = row[:n]
        y = _lru_direction_ref(u, module.forward) + _p(module.D) * u
        if module.backward is not None:
            y = y + _lru_direction_ref(u[::-1], module.backward)[::-1]
        rows.append(y)
    return rows


def _silu(v):
    return v / (1.0 + np.exp(-v))


def _softplus(v):
    return np.log1p(np.exp(v))


def _mamba_direction_ref(x: np.ndarray, d: mamba.SelectiveDirection) -> np.ndarray:
    """y float64[n, E] of the inner x float64[n, E] by explicit loops (conv, then scan)."""
    n, e = x.shape
    kernel, bias = _p(d.conv_kernel), _p(d.conv_bias)
    k = kernel.shape[0]
    conv = np.zeros_like(x)
    for t in range(n):
        conv[t] = bias
        for i in range(k):
            src = t - (k - 1) + i
            if src >= 0:
                conv[t] += kernel[i] * x[src]
    u = _silu(conv)
    proj = u @ _p(d.x_proj.kernel)
    r, s = d.dt_rank, d.state_size
    dt, bm, cm = proj[:, :r], proj[:, r : r + s], proj[:, r + s :]
    delta = _softplus(dt @ _p(d.dt_proj.kernel) + _p(d.dt_proj.bias))
    a = -np.exp(_p(d.A_log))  # [E, N]
    h = np.zeros((e, s))
    out = np.zeros((n, e))
    for t in range(n):
        for ch in range(e):
            for st in range(s):
                h[ch, st] = (
                    math.exp(delta[t, ch] * a[ch, st]) * h[ch, st]
                    + delta[t, ch] * bm[t, st] * u[t, ch]
                )
        out[t] = h @ cm[t] + _p(d.D) * u[t]
    return out


def mamba_ref(module: mamba.Mamba, x: np.ndarray, lengths) -> list[np.ndarray]:
    rows = []
    w_in, w_out = _p(module.in_proj.kernel), _p(module.out_proj.kernel)
    for row, n in zip(np.asarray(x, np.float64), lengths, strict=True):
        xz = row[:n] @ w_in
        inner, z = xz[:, : module.channels], xz[:, module.channels :]
        y = _mamba_direction_ref(inner, module.forward)
        if module.backward is not None:
            y_b = _mamba_direction_ref(inner[::-1], module.backward)[::-1]
            y = 0.5 * (y + y_b)
        rows.append((y * _silu(z)) @ w_out)
    return rows


# --- the scans against the loops ------------------------------------------------------------


def _perturbed(module, seed=3, scale=0.1):
    """The module with every parameter moved off its init (so D = 1, A_log etc. are generic)."""
    graphdef, state = nnx.split(module)
    leaves, tree = jax.tree.flatten(state)
    keys = jax.random.split(jax.random.key(seed), len(leaves))
    leaves = [v + scale * jax.random.normal(k, v.shape) for v, k in zip(leaves, keys, strict=True)]
    return nnx.merge(graphdef, jax.tree.unflatten(tree, leaves))


def _assert_rows(out, ref, lengths, tol):
    out = np.asarray(out, np.float64)
    for b, n in enumerate(lengths):
        np.testing.assert_allclose(out[b, :n], ref[b], rtol=tol, atol=tol)


@pytest.mark.parametrize("bidirectional", [False, True])
def test_lru_scan_equals_sequential_loop(bidirectional):
    module = lru.LRU(
        dim=D,
        num_heads=2,
        max_len=L,
        rngs=nnx.Rngs(0),
        state_size=6,
        r_min=0.5,
        r_max=0.99,
        max_phase=math.pi,
        bidirectional=bidirectional,
    )
    module = _perturbed(module)
    x, mask = _inputs()
    out = module(x, mask=mask)
    _assert_rows(out, lru_ref(module, x, LENGTHS), LENGTHS, 1e-4)


@pytest.mark.parametrize("bidirectional", [False, True])
def test_mamba_scan_equals_sequential_loop(bidirectional):
    module = mamba.Mamba(
        dim=D, num_heads=2, max_len=L, rngs=nnx.Rngs(0), state_size=4, bidirectional=bidirectional
    )
    module = _perturbed(module)
    x, mask = _inputs()
    out = module(x, mask=mask)
    _assert_rows(out, mamba_ref(module, x, LENGTHS), LENGTHS, 1e-4)


def test_selective_scan_function_matches_loop():
    rng = np.random.default_rng(5)
    b, n, e, s = 2, 9, 3, 4
    u, delta = rng.normal(size=(b, n, e)), np.abs(rng.normal(size=(b, n, e)))
    a = -np.abs(rng.normal(size=(e, s)))
    bm, cm, d = rng.normal(size=(b, n, s)), rng.normal(size=(b, n, s)), rng.normal(size=(e,))
    out = mamba.selective_scan(*(jnp.asarray(t, jnp.float32) for t in (u, delta, a, bm, cm, d)))
    ref = np.zeros((b, n, e))
    for i in range(b):
        h = np.zeros((e, s))
        for t in range(n):
            h = np.exp(delta[i, t][:, None] * a) * h + (delta[i, t] * u[i, t])[:, None] * bm[i, t]
            ref[i, t] = h @ cm[i, t] + d * u[i, t]
    np.testing.assert_allclose(np.asarray(out), ref, rtol=1e-4, atol=1e-4)


def test_causal_depthwise_conv_matches_numpy_convolve():
    rng = np.random.default_rng(6)
    x, kernel, bias = rng.normal(size=(2, 10, 3)), rng.normal(size=(4, 3)), rng.normal(size=3)
    out = mamba.causal_depthwise_conv(*(jnp.asarray(t, jnp.float32) for t in (x, kernel, bias)))
    for b in range(2):
        for c in range(3):
            # PyTorch's Conv1d is a cross-correlation: y_t = sum_k w_k x_{t-3+k}
            ref = np.convolve(x[b, :, c], kernel[::-1, c])[:10] + bias[c]
            np.testing.assert_allclose(np.asarray(out[b, :, c]), ref, rtol=1e-5, atol=1e-5)


# --- initialisations ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("r_min", "r_max", "max_phase"), [(0.0, 1.0, 2 * math.pi), (0.9, 0.999, math.pi / 10)]
)
def test_lru_ring_init_and_gamma(r_min, r_max, max_phase):
    module = lru.LRU(
        dim=16,
        num_heads=1,
        max_len=4,
        rngs=nnx.Rngs(1),
        state_size=4096,
        r_min=r_min,
        r_max=r_max,
        max_phase=max_phase,
    )
    for direction in (module.forward, module.backward):
        nu, theta = _p(direction.nu_log), _p(direction.theta_log)
        lam = np.exp(-np.exp(nu) + 1j * np.exp(theta))
        radius, phase = np.abs(lam), np.exp(theta)
        tol = 1e-6
        assert radius.min() >= r_min - tol and radius.max() <= r_max + tol
        assert phase.min() >= 0 and phase.max() <= max_phase + tol
        # uniform on the ring: |lambda|^2 ~ U[r_min^2, r_max^2], phase ~ U[0, max_phase]
        mean_sq = (r_min**2 + r_max**2) / 2
        assert abs(np.mean(radius**2) - mean_sq) < 0.03 * (r_max**2 - r_min**2) + 1e-6
        assert abs(np.mean(phase) - max_phase / 2) < 0.03 * max_phase
        gamma_formula = np.log(np.sqrt(1 - np.abs(lam) ** 2))
        np.testing.assert_allclose(_p(direction.gamma_log), gamma_formula, rtol=1e-4, atol=1e-5)
        # Glorot-style B, C (Appendix A): std 1/sqrt(2D) and 1/sqrt(N)
        assert abs(_p(direction.B_re).std() * math.sqrt(2 * 16) - 1) < 0.05
        assert abs(_p(direction.C_im).std() * math.sqrt(4096) - 1) < 0.05
    assert module.forward.nu_log[...].shape == (4096,)
    assert not np.allclose(_p(module.forward.nu_log), _p(module.backward.nu_log))


def test_mamba_init_is_s4d_real_and_reference_dt():
    module = mamba.Mamba(dim=32, num_heads=1, max_len=4, rngs=nnx.Rngs(2), state_size=16)
    for direction in (module.forward, module.backward):
        a = -np.exp(_p(direction.A_log))
        np.testing.assert_allclose(a, -np.tile(np.arange(1, 17), (64, 1)), rtol=1e-6)
        np.testing.assert_array_equal(_p(direction.D), np.ones(64))
        dt0 = _softplus(_p(direction.dt_proj.bias))
        assert dt0.min() >= 0.001 - 1e-6 and dt0.max() <= 0.1 + 1e-6
        assert direction.dt_rank == 2  # ceil(32 / 16)
        std = direction.dt_rank**-0.5
        assert np.abs(_p(direction.dt_proj.kernel)).max() <= std
        assert direction.conv_kernel[...].shape == (4, 64)
    assert module.in_proj.kernel[...].shape == (32, 128)
    assert module.in_proj.bias is None and module.out_proj.bias is None


def test_dt_bias_init_inverts_softplus():
    bias = mamba.dt_bias_init(jax.random.key(0), 1000, 0.001, 0.1, 1e-4)
    dt = _softplus(np.asarray(bias, np.float64))
    assert dt.min() >= 0.001 * (1 - 1e-4) and dt.max() <= 0.1 * (1 + 1e-4)
    # log-uniform: the mean of log dt is the midpoint of [log 0.001, log 0.1]
    assert abs(np.mean(np.log(dt)) - math.log(0.01)) < 0.15


# --- padding --------------------------------------------------------------------------------

MIXERS = [
    ("lru", {"state_size": 8}),
    ("lru", {"state_size": 8, "bidirectional": False}),
    ("mamba", {"state_size": 4}),
    ("mamba", {"state_size": 4, "bidirectional": False}),
]
MIXER_IDS = [n + ("-uni" if o.get("bidirectional") is False else "-bi") for n, o in MIXERS]


def _build(name, options, max_len=32):
    return registry.make_attention(
        name, dim=D, num_heads=2, max_len=max_len, rngs=nnx.Rngs(0), **options
    )


@pytest.mark.parametrize(("name", "options"), MIXERS, ids=MIXER_IDS)
def test_padding_invariance(name, options):
    module = _build(name, options)
    x, mask = _inputs()
    out = np.asarray(module(x, mask=mask))
    # each row alone, unpadded
    for b, n in enumerate(LENGTHS):
        alone = module(x[b : b + 1, :n], mask=jnp.ones((1, n), bool))
        np.testing.assert_allclose(out[b, :n], np.asarray(alone)[0], rtol=1e-5, atol=1e-5)
    # more padding, with garbage (large values, inf and NaN) in every padded position
    extra = 9
    garbage = np.random.default_rng(1).normal(size=(B, L + extra, D)).astype(np.float32) * 1e3
    garbage[:, -1] = np.inf
    garbage[:, -2] = np.nan
    longer = np.where(np.arange(L + extra)[None, :, None] < LENGTHS[:, None, None], 0, garbage)
    longer[:, :L] += np.where(np.asarray(mask)[..., None], np.asarray(x), 0)
    mask_long = np.arange(L + extra)[None, :] < LENGTHS[:, None]
    out_long = np.asarray(module(jnp.asarray(longer), mask=jnp.asarray(mask_long)))
    real = np.asarray(mask)
    np.testing.assert_allclose(out_long[:, :L][real], out[real], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(("name", "options"), MIXERS, ids=MIXER_IDS)
def test_backward_direction_sees_later_tokens(name, options):
    """Bidirectional: token 0's output depends on the last real token; causal: it does not."""
    module = _build(name, options)
    x, mask = _inputs()
    changed = x.at[0, L - 1].add(1.0)
    delta = np.abs(np.asarray(module(changed, mask=mask) - module(x, mask=mask)))[0, 0].max()
    if options.get("bidirectional", True):
        assert delta > 1e-6
    else:
        assert delta == 0.0


# --- the contract ---------------------------------------------------------------------------


def test_registered_with_declarations():
    for name, cls in (("lru", lru.LRU), ("mamba", mamba.Mamba)):
        assert registry.get(name) is cls
        assert cls.memory_class == "linear"
        assert cls.same_without_padding is True


@pytest.mark.parametrize(("name", "options"), MIXERS[::2], ids=MIXER_IDS[::2])
def test_bfloat16_dropout_and_jit(name, options):
    module = _build(name, {**options, "dropout_rate": 0.2})
    x, mask = _inputs()
    graphdef, state = nnx.split(module)
    bf16 = jax.tree.map(lambda v: v.astype(jnp.bfloat16), state)
    out = nnx.merge(graphdef, bf16)(x.astype(jnp.bfloat16), mask=mask)
    assert out.dtype == jnp.bfloat16 and bool(jnp.all(jnp.isfinite(out)))

    @jax.jit
    def train_call(state, x, key):
        return nnx.merge(graphdef, state)(
            x, mask=mask, deterministic=False, rngs=nnx.Rngs(dropout=key)
        )

    a, b = train_call(state, x, jax.random.key(0)), train_call(state, x, jax.random.key(0))
    c = train_call(state, x, jax.random.key(1))
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    assert not np.allclose(np.asarray(a), np.asarray(c))
    with pytest.raises(ValueError, match="rngs"):
        module(x, mask=mask, deterministic=False)


@pytest.mark.parametrize(
    ("name", "options", "message"),
    [
        ("lru", {"r_min": 0.9, "r_max": 0.5}, "r_min < r_max"),
        ("lru", {"state_size": 0}, "state_size"),
        ("lru", {"max_phase": 7.0}, "max_phase"),
        ("mamba", {"expand": 0}, "expand"),
        ("mamba", {"dt_min": 0.2, "dt_max": 0.1}, "dt_min"),
        ("mamba", {"dt_rank": "big"}, "dt_rank"),
        ("mamba", {"bidirectional": "yes"}, "bidirectional"),
    ],
)
def test_bad_options_raise(name, options, message):
    with pytest.raises(ValueError, match=message):
        _build(name, options)


def test_lower_upper_schedule_builds_and_runs():
    model = build_classifier(
        dual=False,
        num_classes=3,
        pooling="cls",
        rngs=nnx.Rngs(0),
        vocab_size=10,
        max_len=L,
        num_layers=2,
        dim=D,
        qkv_dim=D,
        num_heads=2,
        mlp_dim=16,
        dropout=0.0,
        attention_dropout=0.0,
        positions="sinusoidal",
        attention={"lower": "mamba", "upper": "lru", "lower_fraction": 0.5},
        attention_options={"lru": {"state_size": 4}, "mamba": {"state_size": 4}},
        remat=False,
    )
    kinds = [type(block.attention).__name__ for block in model.encoder.blocks]
    assert kinds == ["Mamba", "LRU"]
    tokens = jnp.asarray(np.random.default_rng(0).integers(1, 10, size=(B, L)), jnp.int32)
    logits = model(tokens, jnp.asarray(LENGTHS))
    assert logits.shape == (B, 3) and bool(jnp.all(jnp.isfinite(logits)))
