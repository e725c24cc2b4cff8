"""S4D and S5 (models/ssm/s4d.py, s5.py) and the scan helpers (models/ssm/common.py), each
against an independent float64 numpy reference: explicit recurrences, sequential loops, the
initialisation formulas, numpy's eigenvalues of the HiPPO-LegS matrix and a matrix
exponential."""

from __future__ import annotations

import math
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import yaml
from flax import nnx

from lra.models import make_attention, names
from lra.models.ssm import common
from lra.models.ssm.s4d import discretize, s4d_init
from lra.models.ssm.s5 import s5_init

CONFIGS = Path(__file__).resolve().parents[1] / "configs" / "model"


def _prefix_mask(lengths, n):
    return np.arange(n)[None, :] < np.asarray(lengths)[:, None]


def _gelu(x, approximate):
    return np.asarray(jax.nn.gelu(jnp.asarray(x), approximate=approximate))


# ---------------------------------------------------------------- numpy references


def np_hippo_legs(n):
    """HiPPO-LegS (A, B) and the rank-1 term P, written from the definitions (S4 paper)."""
    a = np.zeros((n, n))
    for i in range(n):
        for k in range(n):
            if i > k:
                a[i, k] = -math.sqrt((2 * i + 1) * (2 * k + 1))
            elif i == k:
                a[i, k] = -(i + 1)
    b = np.sqrt(2 * np.arange(n) + 1.0)
    p = np.sqrt(np.arange(n) + 0.5)
    return a, b, p


def np_expm(m):
    """Matrix exponential by scaling and squaring of a Taylor series (float64 / complex128)."""
    norm = np.abs(m).sum(axis=1).max()
    s = max(0, int(math.ceil(math.log2(norm))) + 1) if norm > 0 else 0
    x = m / 2**s
    out, term = np.eye(len(m), dtype=m.dtype), np.eye(len(m), dtype=m.dtype)
    for k in range(1, 30):
        term = term @ x / k
        out = out + term
    for _ in range(s):
        out = out @ out
    return out


def np_reverse_real(x, mask):
    out = np.zeros_like(x)
    for b in range(x.shape[0]):
        n = int(mask[b].sum())
        out[b, :n] = x[b, :n][::-1]
    return out


def np_s4d_discrete(m):
    """(Abar, Bbar complex128[H, N/2], C complex128[channels, H, N/2]) from S4D's raw params."""
    p = {k: np.asarray(getattr(m, k)[...], np.float64) for k in ("log_dt", "log_a_real", "a_imag")}
    a = -np.exp(p["log_a_real"]) - 1j * p["a_imag"]
    b_raw = np.asarray(m.b[...], np.float64)
    c_raw = np.asarray(m.c[...], np.float64)
    b = b_raw[..., 0] + 1j * b_raw[..., 1]
    c = c_raw[..., 0] + 1j * c_raw[..., 1]
    dt = np.exp(p["log_dt"])[:, None]
    if m.discretization == "zoh":
        abar = np.exp(dt * a)
        bbar = (abar - 1) / a * b
    else:
        abar = (1 + dt * a / 2) / (1 - dt * a / 2)
        bbar = dt / (1 - dt * a / 2) * b
    return abar, bbar, c


def np_s4d_recurrence(m, u, mask):
    """y_t = 2 Re C0 x_t, x_t = Abar x_{t-1} + Bbar u_t (forward), plus, if bidirectional,
    2 Re C1 z_t with z_t = Abar z_{t+1} + Bbar u_{t+1} run backward from each row's last real
    token; plus D u. u float64[B, L, H]; real tokens only (padding left 0)."""
    abar, bbar, c = np_s4d_discrete(m)
    d = np.asarray(m.d[...], np.float64)
    bsz, _, h = u.shape
    y = np.zeros_like(u)
    for b in range(bsz):
        n = int(mask[b].sum())
        x = np.zeros(abar.shape, np.complex128)
        for t in range(n):
            x = abar * x + bbar * u[b, t][:, None]
            y[b, t] = 2 * (c[0] * x).sum(-1).real + d * u[b, t]
        if m.bidirectional:
            z = np.zeros(abar.shape, np.complex128)
            for t in range(n - 1, -1, -1):
                y[b, t] += 2 * (c[1] * z).sum(-1).real
                z = abar * z + bbar * u[b, t][:, None]
    return y


def np_s5_loop(m, u, mask):
    """S5's SSM y = 2 Re (C1 x_t + C2 x'_t) + D u by sequential loops (x' backward from each
    row's last real token, including u_t), from the raw parameters."""
    lam = np.asarray(m.lambda_re[...], np.float64) + 1j * np.asarray(m.lambda_im[...], np.float64)
    step = np.exp(np.asarray(m.log_step[...], np.float64))
    b_raw = np.asarray(m.b[...], np.float64)
    bt = b_raw[..., 0] + 1j * b_raw[..., 1]  # [P/2, H]
    if m.discretization == "zoh":
        lbar = np.exp(lam * step)
        bbar = ((lbar - 1) / lam)[:, None] * bt
    else:
        lbar = (1 + step * lam / 2) / (1 - step * lam / 2)
        bbar = (step / (1 - step * lam / 2))[:, None] * bt

    def cmat(name):
        raw = np.asarray(getattr(m, name)[...], np.float64)
        return raw[..., 0] + 1j * raw[..., 1]  # [H, P/2]

    d = np.asarray(m.d[...], np.float64)
    y = np.zeros_like(u)
    for b in range(u.shape[0]):
        n = int(mask[b].sum())
        x = np.zeros(lam.shape, np.complex128)
        for t in range(n):
            x = lbar * x + bbar @ u[b, t]
            y[b, t] = 2 * (cmat("c1") @ x).real + d * u[b, t]
        if m.bidirectional:
            x = np.zeros(lam.shape, np.complex128)
            for t in range(n - 1, -1, -1):
                x = lbar * x + bbar @ u[b, t]
                y[b, t] += 2 * (cmat("c2") @ x).real
    return y


# ---------------------------------------------------------------- common.py


def test_zero_padded_and_reverse_real_match_numpy():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(3, 7, 2, 3)).astype(np.float32)
    mask = _prefix_mask([7, 4, 1], 7)
    z = np.asarray(common.zero_padded(jnp.asarray(x), jnp.asarray(mask)))
    np.testing.assert_array_equal(z, np.where(mask[..., None, None], x, 0.0))
    r = np.asarray(common.reverse_real(jnp.asarray(x), jnp.asarray(mask)))
    np.testing.assert_array_equal(r, np_reverse_real(x, mask))
    twice = common.reverse_real(jnp.asarray(r), jnp.asarray(mask))
    np.testing.assert_array_equal(np.asarray(twice), z)
    # complex inputs and NaN in padding
    xc = (x + 1j * x).astype(np.complex64)
    xc[1, 5] = np.nan
    rc = np.asarray(common.reverse_real(jnp.asarray(xc), jnp.asarray(mask)))
    assert np.isfinite(rc).all()
    np.testing.assert_array_equal(rc, np_reverse_real(np.where(mask[..., None, None], xc, 0), mask))


@pytest.mark.parametrize("kind", ["real", "complex"])
def test_linear_recurrence_equals_loop(kind):
    rng = np.random.default_rng(1)
    shape = (2, 9, 3)
    a = rng.uniform(-1, 1, size=shape)
    b = rng.normal(size=shape)
    if kind == "complex":
        a = a * np.exp(1j * rng.uniform(0, 6, size=shape))
        b = b + 1j * rng.normal(size=shape)
    h = np.zeros(shape, a.dtype)
    prev = np.zeros((2, 3), a.dtype)
    for t in range(shape[1]):
        prev = a[:, t] * prev + b[:, t]
        h[:, t] = prev
    dtype = jnp.complex64 if kind == "complex" else jnp.float32
    got = common.linear_recurrence(jnp.asarray(a, dtype), jnp.asarray(b, dtype))
    np.testing.assert_allclose(np.asarray(got), h, rtol=1e-5, atol=1e-5)
    # a broadcast along the batch and time axes
    got = common.linear_recurrence(jnp.asarray(a[:1, :1], dtype), jnp.asarray(b, dtype))
    prev, ref = np.zeros((2, 3), a.dtype), np.zeros(shape, a.dtype)
    for t in range(shape[1]):
        prev = a[0, 0] * prev + b[:, t]
        ref[:, t] = prev
    np.testing.assert_allclose(np.asarray(got), ref, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("n", [2, 8, 16])
def test_hippo_legs_normal_against_numpy_eigenvalues(n):
    a, b, p = np_hippo_legs(n)
    ha, hb, hp = common.hippo_legs(n)
    np.testing.assert_allclose(ha, a, atol=1e-12)
    np.testing.assert_allclose(hb, b)
    np.testing.assert_allclose(hp, p)
    normal = a + np.outer(p, p)
    ev = np.linalg.eigvals(normal)
    expect = np.sort(ev[ev.imag < 0].imag)
    lam, v, b_out = common.hippo_legs_normal(n)
    np.testing.assert_allclose(lam.real, -0.5, atol=1e-9)
    np.testing.assert_allclose(ev.real, -0.5, atol=1e-9)  # the normal part is -1/2 I + skew
    np.testing.assert_allclose(lam.imag, expect, atol=1e-9)
    np.testing.assert_allclose(normal @ v, v * lam, atol=1e-9)  # eigenvectors
    np.testing.assert_allclose(v.conj().T @ v, np.eye(n // 2), atol=1e-9)
    np.testing.assert_allclose(b_out, b)


def test_hippo_legs_normal_rejects_odd_sizes():
    with pytest.raises(ValueError, match="even"):
        common.hippo_legs_normal(5)


# ---------------------------------------------------------------- initialisations


def test_s4d_lin_and_inv_inits_equal_their_formulas():
    n = 64
    idx = np.arange(n // 2)
    a, b = s4d_init("lin", n)
    np.testing.assert_array_equal(a, -0.5 - 1j * np.pi * idx)
    np.testing.assert_array_equal(b, np.ones(n // 2))
    a, b = s4d_init("inv", n)
    np.testing.assert_array_equal(a, -0.5 - 1j * (n / np.pi) * (n / (2 * idx + 1) - 1))
    np.testing.assert_array_equal(b, np.ones(n // 2))
    # the module stores exactly these (Re A = -exp(log_a_real), Im A = -a_imag), per channel
    m = make_attention("s4d", dim=3, num_heads=1, max_len=8, rngs=nnx.Rngs(0), init="inv")
    stored = -np.exp(np.asarray(m.log_a_real[...], np.float64)) - 1j * np.asarray(m.a_imag[...])
    np.testing.assert_allclose(stored, np.broadcast_to(a, (3, n // 2)), rtol=1e-6)


def test_s4d_legs_init_against_numpy_eigenvalues():
    n = 16
    a_hippo, b_hippo, p = np_hippo_legs(n)
    ev = np.linalg.eigvals(a_hippo + np.outer(p, p))
    a, b = s4d_init("legs", n)
    np.testing.assert_allclose(np.sort(a.imag), np.sort(ev[ev.imag < 0].imag), atol=1e-9)
    np.testing.assert_allclose(a.real, -0.5, atol=1e-9)
    # B = V^* B_HiPPO (imaginary part clipped to [-2, 2]): check against V from numpy's eig
    lam, v, _ = common.hippo_legs_normal(n)
    bt = v.conj().T @ b_hippo
    np.testing.assert_allclose(b, bt.real + 1j * np.clip(bt.imag, -2, 2), atol=1e-12)


@pytest.mark.parametrize("state_size,blocks", [(16, 1), (16, 2), (24, 3)])
def test_s5_init_hippo_n_blocks_against_numpy_eigenvalues(state_size, blocks):
    size = state_size // blocks
    a_hippo, _, p = np_hippo_legs(size)
    ev = np.linalg.eigvals(a_hippo + np.outer(p, p))
    block = np.sort(ev[ev.imag < 0].imag)
    lam, v = s5_init(state_size, blocks)
    assert lam.shape == (state_size // 2,) and v.shape == (state_size, state_size // 2)
    for j in range(blocks):
        part = lam[j * size // 2 : (j + 1) * size // 2]
        np.testing.assert_allclose(np.sort(part.imag), block, atol=1e-9)
        np.testing.assert_allclose(part.real, -0.5, atol=1e-9)
    # V is block diagonal and diagonalises the block-diagonal normal part
    big = np.kron(np.eye(blocks), a_hippo + np.outer(p, p))
    np.testing.assert_allclose(big @ v, v * lam, atol=1e-9)
    m = make_attention(
        "s5", dim=4, num_heads=1, max_len=8, rngs=nnx.Rngs(0), state_size=state_size, blocks=blocks
    )
    np.testing.assert_allclose(np.asarray(m.lambda_im[...]), lam.imag, rtol=1e-6)
    assert m.log_step[...].shape == (state_size // 2,)  # one Delta per state


def test_s4d_and_s5_draw_delta_log_uniform_in_range():
    m = make_attention("s4d", dim=256, num_heads=1, max_len=8, rngs=nnx.Rngs(3))
    dt = np.exp(np.asarray(m.log_dt[...]))
    assert dt.min() >= 0.001 * (1 - 1e-6) and dt.max() <= 0.1 * (1 + 1e-6)
    assert np.log(dt).std() > 0.5  # spread over the log range, not collapsed
    s = make_attention("s5", dim=8, num_heads=1, max_len=8, rngs=nnx.Rngs(3), dt_min=0.01)
    step = np.exp(np.asarray(s.log_step[...]))
    assert step.min() >= 0.01 * (1 - 1e-6) and step.max() <= 0.1 * (1 + 1e-6)


# ---------------------------------------------------------------- discretisation


@pytest.mark.parametrize("method", ["zoh", "bilinear"])
def test_discretisation_against_matrix_exponential_and_formula(method):
    rng = np.random.default_rng(2)
    n = 5
    a = -rng.uniform(0.1, 2, n) + 1j * rng.normal(0, 5, n)
    b = rng.normal(size=n) + 1j * rng.normal(size=n)
    dt = rng.uniform(0.01, 0.5, n)
    log_abar, bbar = discretize(
        jnp.asarray(a, jnp.complex64),
        jnp.asarray(b, jnp.complex64),
        jnp.asarray(dt, jnp.float32),
        method,
    )
    abar = np.exp(np.asarray(log_abar, np.complex128))
    bbar = np.asarray(bbar, np.complex128)
    for i in range(n):
        if method == "zoh":
            # exp(dt [[a, b], [0, 0]]) = [[Abar, Bbar], [0, 1]]
            e = np_expm(dt[i] * np.array([[a[i], b[i]], [0, 0]], np.complex128))
            want_a, want_b = e[0, 0], e[0, 1]
        else:
            # (I - dt A / 2)^-1 (I + dt A / 2), (I - dt A / 2)^-1 dt B
            left = np.array([[1 - dt[i] * a[i] / 2]])
            want_a = np.linalg.solve(left, np.array([[1 + dt[i] * a[i] / 2]]))[0, 0]
            want_b = np.linalg.solve(left, np.array([[dt[i] * b[i]]]))[0, 0]
        np.testing.assert_allclose(abar[i], want_a, rtol=1e-5)
        np.testing.assert_allclose(bbar[i], want_b, rtol=1e-5, atol=1e-6)
    # bilinear approaches ZOH's matrix exponential for a small step
    if method == "bilinear":
        small = 1e-3
        e = np_expm(small * np.array([[a[0], b[0]], [0, 0]], np.complex128))
        la, bb = discretize(
            jnp.asarray(a[:1], jnp.complex64),
            jnp.asarray(b[:1], jnp.complex64),
            jnp.float32(small),
            method,
        )
        np.testing.assert_allclose(np.exp(np.asarray(la))[0], e[0, 0], rtol=1e-5)
        np.testing.assert_allclose(np.asarray(bb)[0], e[0, 1], rtol=1e-3)


# ---------------------------------------------------------------- S4D convolution


@pytest.mark.parametrize(
    "options",
    [
        {},
        {"bidirectional": False},
        {"init": "lin", "discretization": "bilinear"},
        {"init": "legs", "state_size": 8},
    ],
)
def test_s4d_fft_convolution_equals_explicit_recurrence(options):
    m = make_attention("s4d", dim=4, num_heads=1, max_len=24, rngs=nnx.Rngs(5), **options)
    rng = np.random.default_rng(6)
    lengths = [24, 17, 1]
    mask = _prefix_mask(lengths, 24)
    u = np.where(mask[..., None], rng.normal(size=(3, 24, 4)), 0.0)
    got = np.asarray(m.convolve(jnp.asarray(u, jnp.float32))) + u * np.asarray(m.d[...])
    want = np_s4d_recurrence(m, u, mask)
    np.testing.assert_allclose(got[mask], want[mask], rtol=1e-4, atol=1e-4)


def test_s4d_kernel_has_no_circular_wraparound():
    """An impulse at the last position reaches no earlier position: a circular convolution of
    length L would carry it to position 0 (y_0 = K_1 u_{L-1}); the length-2L FFT does not."""
    m = make_attention("s4d", dim=2, num_heads=1, max_len=16, rngs=nnx.Rngs(0), bidirectional=False)
    u = np.zeros((1, 16, 2), np.float32)
    u[0, -1] = 1.0
    y = np.asarray(m.convolve(jnp.asarray(u)))
    np.testing.assert_allclose(y[0, :-1], 0.0, atol=1e-6)


def test_s4d_layer_output_matches_numpy():
    m = make_attention("s4d", dim=4, num_heads=1, max_len=12, rngs=nnx.Rngs(7))
    rng = np.random.default_rng(8)
    mask = _prefix_mask([12, 5], 12)
    x = rng.normal(size=(2, 12, 4))
    u = np.where(mask[..., None], x, 0.0)
    y = _gelu(np_s4d_recurrence(m, u, mask), approximate=False)
    w = np.asarray(m.output_linear.kernel[...], np.float64)
    bias = np.asarray(m.output_linear.bias[...], np.float64)
    g = y @ w + bias
    want = g[..., :4] / (1 + np.exp(-g[..., 4:])) * mask[..., None]
    got = np.asarray(m(jnp.asarray(x, jnp.float32), mask=jnp.asarray(mask)))
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


# ---------------------------------------------------------------- S5 scan


@pytest.mark.parametrize(
    "options",
    [
        {},
        {"bidirectional": False, "c_init": "complex_normal"},
        {"discretization": "bilinear", "c_init": "trunc_standard_normal", "blocks": 2},
    ],
)
def test_s5_scan_equals_sequential_loop(options):
    m = make_attention(
        "s5",
        dim=4,
        num_heads=1,
        max_len=20,
        rngs=nnx.Rngs(9),
        state_size=8,
        **{"blocks": 1, **options},
    )
    rng = np.random.default_rng(10)
    mask = _prefix_mask([20, 13, 1], 20)
    u = np.where(mask[..., None], rng.normal(size=(3, 20, 4)), 0.0)
    got = np.asarray(m.scan(jnp.asarray(u, jnp.float32), jnp.asarray(mask)))
    want = np_s5_loop(m, u, mask)
    np.testing.assert_allclose(got[mask], want[mask], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("activation", ["gelu", "half_glu1", "half_glu2", "full_glu"])
def test_s5_layer_activations_match_numpy(activation):
    m = make_attention(
        "s5",
        dim=4,
        num_heads=1,
        max_len=10,
        rngs=nnx.Rngs(11),
        state_size=8,
        blocks=2,
        activation=activation,
    )
    rng = np.random.default_rng(12)
    mask = _prefix_mask([10, 6], 10)
    x = rng.normal(size=(2, 10, 4))
    y = np_s5_loop(m, np.where(mask[..., None], x, 0.0), mask)

    def dense(name, z):
        layer = getattr(m, name)
        return z @ np.asarray(layer.kernel[...], np.float64) + np.asarray(layer.bias[...])

    def sig(z):
        return 1 / (1 + np.exp(-z))

    g = _gelu(y, approximate=True)
    want = {
        "gelu": lambda: g,
        "half_glu1": lambda: g * sig(dense("out2", g)),
        "half_glu2": lambda: y * sig(dense("out2", g)),
        "full_glu": lambda: dense("out1", g) * sig(dense("out2", g)),
    }[activation]()
    got = np.asarray(m(jnp.asarray(x, jnp.float32), mask=jnp.asarray(mask)))
    np.testing.assert_allclose(got, want * mask[..., None], rtol=1e-4, atol=1e-4)


# ---------------------------------------------------------------- padding and contract


@pytest.mark.parametrize(
    "name,options",
    [
        ("s4d", {}),
        ("s4d", {"init": "legs", "discretization": "bilinear", "state_size": 8}),
        ("s5", {"state_size": 16, "blocks": 2}),
        ("s5", {"state_size": 8, "blocks": 1, "activation": "full_glu"}),
    ],
)
def test_padding_invariance(name, options):
    """Real-token outputs equal the unpadded shorter input's, whatever the padding holds and
    however much of it follows."""
    m = make_attention(name, dim=6, num_heads=2, max_len=40, rngs=nnx.Rngs(13), **options)
    rng = np.random.default_rng(14)
    n = 11
    x = rng.normal(size=(1, n, 6)).astype(np.float32)
    alone = np.asarray(m(jnp.asarray(x), mask=jnp.ones((1, n), bool)))
    for total in (n + 1, n + 9, 40):
        padded = np.concatenate([x, 1e3 * rng.normal(size=(1, total - n, 6))], axis=1)
        mask = _prefix_mask([n], total)
        out = np.asarray(m(jnp.asarray(padded, jnp.float32), mask=jnp.asarray(mask)))
        np.testing.assert_allclose(out[:, :n], alone, rtol=1e-5, atol=1e-5)
        np.testing.assert_array_equal(out[:, n:], 0.0)


@pytest.mark.parametrize("name", ["s4d", "s5"])
def test_contract_config_and_training_call(name):
    assert name in names()
    config = yaml.safe_load((CONFIGS / f"{name}.yaml").read_text())
    assert config["name"] == name and config["attention"] == name
    options = config["attention_options"][name]
    m = make_attention(
        name,
        dim=32,
        num_heads=4,
        max_len=16,
        rngs=nnx.Rngs(0),
        qkv_dim=32,
        dropout_rate=0.1,
        **options,
    )
    assert type(m).memory_class == "linear" and type(m).same_without_padding is True
    x = jnp.asarray(np.random.default_rng(0).normal(size=(2, 16, 32)), jnp.float32)
    mask = jnp.asarray(_prefix_mask([16, 9], 16))
    train = m(x, mask=mask, deterministic=False, rngs=nnx.Rngs(dropout=1))
    evals = m(x, mask=mask)
    assert train.shape == evals.shape == (2, 16, 32)
    assert np.isfinite(np.asarray(train)).all()
    assert not np.allclose(np.asarray(train), np.asarray(evals))  # dropout acts in training
    with pytest.raises(ValueError, match="rngs"):
        m(x, mask=mask, deterministic=False)


@pytest.mark.parametrize(
    "name,options,match",
    [
        ("s4d", {"state_size": 7}, "even"),
        ("s4d", {"init": "hippo"}, "init"),
        ("s4d", {"discretization": "euler"}, "discretization"),
        ("s4d", {"dt_min": 0.2, "dt_max": 0.1}, "dt_min"),
        ("s5", {"state_size": 12, "blocks": 4}, "even"),
        ("s5", {"activation": "relu"}, "activation"),
        ("s5", {"c_init": "zeros"}, "c_init"),
    ],
)
def test_bad_options_are_refused(name, options, match):
    with pytest.raises(ValueError, match=match):
        make_attention(name, dim=4, num_heads=1, max_len=8, rngs=nnx.Rngs(0), **options)
