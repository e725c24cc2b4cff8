"""Linear-family attentions (linear, cosformer, performer, transnormer_norm, transnormer_diag).

Each efficient form is checked against its formula computed the plain quadratic way in numpy
(float64, with the module's own weights); then padding, long sequences, dropout and bf16.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import lra.models.attention.cosformer as cosformer
import lra.models.attention.linear  # noqa: F401  (registers "linear")
import lra.models.attention.performer as performer
import lra.models.attention.transnormer  # noqa: F401  (registers "transnormer_norm", "_diag")
from lra.models import registry

B, L, D, H = 3, 20, 32, 4
LENGTHS = np.array([L, 7, 0])  # the last row has no real token

# (name, options): every mechanism, and the option values that change the computation.
CASES = [
    ("linear", {}),
    ("cosformer", {}),
    ("performer", {"num_features": 20}),  # blocks of 8, 8 and 4 rows (d = 8)
    ("transnormer_norm", {}),
    ("transnormer_norm", {"kernel": "elu", "norm_type": "rmsnorm"}),
    ("transnormer_norm", {"kernel": "relu"}),
    ("transnormer_diag", {"block_size": 8}),
    ("transnormer_diag", {"block_size": 8, "score": "relu"}),
    ("transnormer_diag", {"block_size": 8, "score": "relu", "norm_type": "rmsnorm"}),
]
IDS = [name + "".join(f"-{v}" for v in opts.values()) for name, opts in CASES]


def rbg(seed):
    """An "rbg" key: same semantics as threefry, much faster to compile on CPU."""
    return jax.random.key(seed, impl="rbg")


def build(name, options, *, seed=0, num_heads=H, dropout_rate=0.0):
    """The mechanism as the encoder builds it (it always passes qkv_dim and dropout_rate)."""
    options = {"qkv_dim": None, "dropout_rate": dropout_rate, **options}
    return registry.make_attention(
        name, dim=D, num_heads=num_heads, max_len=64, rngs=nnx.Rngs(params=rbg(seed)), **options
    )


def inputs(seed=0, length=L, lengths=LENGTHS):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(len(lengths), length, D)).astype(np.float32)
    mask = np.arange(length)[None, :] < np.asarray(lengths)[:, None]
    return x, mask


def run(attn, x, mask, **kw):
    return np.asarray(attn(jnp.asarray(x), mask=jnp.asarray(mask), **kw), np.float32)


# ---------------------------------------------------------------------------------------------
# Plain quadratic references, float64 numpy, written from each paper's formula.


def f64(a):
    return np.asarray(a, np.float64)


def dense(layer, y):
    return y @ f64(layer.kernel[...]) + f64(layer.bias[...])


def projections(attn, x):
    """Q, K, V as float64[B, H, L, d]."""
    x = f64(x)
    b, n, _ = x.shape

    def heads(y):
        return y.reshape(b, n, attn.num_heads, -1).transpose(0, 2, 1, 3)

    return heads(dense(attn.query, x)), heads(dense(attn.key, x)), heads(dense(attn.value, x))


def merge_heads(y):
    b, h, n, d = y.shape
    return y.transpose(0, 2, 1, 3).reshape(b, n, h * d)


def elu(a):
    return np.where(a > 0, a, np.expm1(np.minimum(a, 0)))


def relu(a):
    return np.maximum(a, 0)


def output_norm(norm, y):
    """nnx.LayerNorm / nnx.RMSNorm over the last axis, from their definitions."""
    eps = norm.epsilon
    scale = f64(norm.scale[...])
    if isinstance(norm, nnx.LayerNorm):
        centred = y - y.mean(-1, keepdims=True)
        return centred / np.sqrt(centred.var(-1, keepdims=True) + eps) * scale + f64(norm.bias[...])
    return y / np.sqrt(np.mean(y**2, -1, keepdims=True) + eps) * scale


def normalised_kernel_attention(w, v, mask, floor=None, add=None):
    """sum_j w_ij v_j / (sum_j w_ij), over real keys j: w float64[B, H, L, L]."""
    w = w * mask[:, None, None, :]
    den = w.sum(-1, keepdims=True)
    den = den + add if add is not None else np.maximum(den, floor)
    return (w @ v) / den


def reference_linear(attn, x, mask):
    q, k, v = projections(attn, x)
    phi_q, phi_k = elu(q) + 1, elu(k) + 1
    w = phi_q @ phi_k.transpose(0, 1, 3, 2)  # w_ij = phi(q_i)^T phi(k_j)
    y = normalised_kernel_attention(w, v, mask, add=1e-6)
    return dense(attn.out, merge_heads(y))


def reference_cosformer(attn, x, mask):
    q, k, v = projections(attn, x)
    n = x.shape[1]
    horizon = np.array([np.flatnonzero(row).max() + 1 if row.any() else 1 for row in mask])
    i = np.arange(n)
    cos = np.cos(np.pi / 2 * (i[:, None] - i[None, :]) / horizon[:, None, None])  # [B, L, L]
    w = relu(q) @ relu(k).transpose(0, 1, 3, 2) * cos[:, None]
    y = normalised_kernel_attention(w, v, mask, floor=1e-6)
    return dense(attn.out, merge_heads(y))


def favor_features(x, w):
    """The paper's phi(x) = exp(w.x' - |x'|^2 / 2) / sqrt(m), x' = x d^-1/4, no stabiliser."""
    xs = x * x.shape[-1] ** -0.25
    return np.exp(xs @ w.T - 0.5 * np.sum(xs**2, -1, keepdims=True)) / np.sqrt(w.shape[0])


def reference_performer(attn, x, mask, features=None):
    q, k, v = projections(attn, x)
    w_feat = f64(attn.features[...] if features is None else features)
    w = favor_features(q, w_feat) @ favor_features(k, w_feat).transpose(0, 1, 3, 2)
    y = normalised_kernel_attention(w, v, mask, floor=1e-300)
    return dense(attn.out, merge_heads(y))


def exact_softmax(attn, x, mask):
    q, k, v = projections(attn, x)
    logits = q @ k.transpose(0, 1, 3, 2) / np.sqrt(q.shape[-1])
    logits = np.where(mask[:, None, None, :], logits, -1e300)
    w = np.exp(logits - logits.max(-1, keepdims=True))
    y = (w / w.sum(-1, keepdims=True)) @ v
    return dense(attn.out, merge_heads(y))


TRANSNORMER_KERNELS = {"1+elu": lambda a: elu(a) + 1, "elu": elu, "relu": relu}


def reference_transnormer_norm(attn, x, mask):
    q, k, v = projections(attn, x)
    phi = TRANSNORMER_KERNELS[attn.kernel]
    scores = phi(q) @ phi(k).transpose(0, 1, 3, 2) * mask[:, None, None, :]  # no denominator
    return dense(attn.out, output_norm(attn.norm, merge_heads(scores @ v)))


def reference_transnormer_diag(attn, x, mask):
    q, k, v = projections(attn, x)
    i = np.arange(x.shape[1])
    same_block = (i[:, None] // attn.block_size) == (i[None, :] // attn.block_size)
    allowed = same_block[None, None] & mask[:, None, None, :]  # [B, 1, L, L]
    logits = q @ k.transpose(0, 1, 3, 2) / np.sqrt(q.shape[-1])
    if attn.score == "softmax":
        logits = np.where(allowed, logits, -1e300)
        w = np.exp(logits - logits.max(-1, keepdims=True))
        y = merge_heads((w / w.sum(-1, keepdims=True)) @ v)
    else:
        y = output_norm(attn.norm, merge_heads((relu(logits) * allowed) @ v))
    return dense(attn.out, y)


REFERENCES = {
    "linear": reference_linear,
    "cosformer": reference_cosformer,
    "performer": reference_performer,
    "transnormer_norm": reference_transnormer_norm,
    "transnormer_diag": reference_transnormer_diag,
}


@pytest.mark.parametrize(("name", "options"), CASES, ids=IDS)
def test_efficient_form_matches_quadratic_formula(name, options):
    attn = build(name, options)
    x, mask = inputs()
    out = run(attn, x, mask)
    assert np.all(np.isfinite(out))  # padded positions too, and the row with no real token
    ref = REFERENCES[name](attn, x, mask)
    # Outputs at padded positions are not specified by the formulas: compare real ones.
    np.testing.assert_allclose(out[mask], ref[mask], rtol=2e-4, atol=2e-5)


# ---------------------------------------------------------------------------------------------
# Padding.


@pytest.mark.parametrize(("name", "options"), CASES, ids=IDS)
def test_padded_values_and_appended_padding_leave_real_outputs(name, options):
    attn = build(name, options)
    x, mask = inputs()
    base = run(attn, x, mask)
    noise = 100.0 * np.random.default_rng(1).normal(size=x.shape).astype(np.float32)
    changed = run(attn, np.where(mask[..., None], x, noise), mask)
    np.testing.assert_allclose(changed[mask], base[mask], rtol=1e-5, atol=1e-5)

    extra = np.random.default_rng(2).normal(size=(B, 13, D)).astype(np.float32)
    longer = run(
        attn, np.concatenate([x, extra], 1), np.concatenate([mask, np.zeros((B, 13), bool)], 1)
    )
    np.testing.assert_allclose(longer[:, :L][mask], base[mask], rtol=1e-5, atol=1e-5)


def test_cosformer_horizon_is_the_real_extent_of_each_row():
    _, mask = inputs()
    horizon = cosformer.reweighting_horizon(jnp.asarray(mask))
    np.testing.assert_array_equal(horizon, np.maximum(LENGTHS, 1))  # at least 1: no 0 / 0
    holes = np.array([[True, False, True, False, False], [False] * 5])
    np.testing.assert_array_equal(cosformer.reweighting_horizon(jnp.asarray(holes)), [3, 1])


# ---------------------------------------------------------------------------------------------
# Length 4096: shapes, finite values and gradients (also for a row with no real token), and no
# gradient into padded inputs.

LONG_CASES = [
    ("linear", {}),
    ("cosformer", {}),
    ("performer", {}),
    ("transnormer_norm", {}),
    ("transnormer_diag", {}),
    ("transnormer_diag", {"score": "relu"}),
]
LONG_IDS = [name + "".join(f"-{v}" for v in opts.values()) for name, opts in LONG_CASES]
BF16_CASES = [CASES[i] for i in (0, 1, 2, 3, 7)]  # every mechanism; diag with its output norm
BF16_IDS = [IDS[i] for i in (0, 1, 2, 3, 7)]


@pytest.mark.parametrize(("name", "options"), LONG_CASES, ids=LONG_IDS)
def test_length_4096_finite_outputs_and_gradients(name, options):
    n, real = 4096, 4000
    attn = build(name, options, num_heads=2)
    x = jnp.asarray(np.random.default_rng(0).normal(size=(2, n, D)), jnp.float32)
    mask = jnp.stack([jnp.arange(n) < real, jnp.zeros(n, bool)])  # row 1: all padding
    shape = jax.eval_shape(lambda x, m: attn(x, mask=m), x, mask)
    assert shape.shape == (2, n, D) and shape.dtype == jnp.float32

    graphdef, params, rest = nnx.split(attn, nnx.Param, ...)

    def loss(params, x):
        out = nnx.merge(graphdef, params, rest)(x, mask=mask)
        return jnp.sum(out[0] * mask[0, :, None]) + jnp.sum(out[1]), out

    # The check is of values, not speed: skipping LLVM optimisation halves the CPU compile time.
    step = jax.jit(
        jax.value_and_grad(loss, (0, 1), has_aux=True),
        compiler_options={"xla_backend_optimization_level": 0},
    )
    (_, out), (grad_params, grad_x) = step(params, x)
    assert np.all(np.isfinite(np.asarray(out)))
    leaves = jax.tree.leaves(grad_params)
    assert leaves and all(np.all(np.isfinite(np.asarray(g))) for g in leaves)
    grad_x = np.asarray(grad_x)
    assert np.all(np.isfinite(grad_x))
    assert np.abs(grad_x[0, :real]).max() > 0
    np.testing.assert_array_equal(grad_x[0, real:], 0.0)  # padded inputs reach nothing real


# ---------------------------------------------------------------------------------------------
# Shapes, determinism, dropout, bf16, options.


@pytest.mark.parametrize(("name", "options"), CASES, ids=IDS)
def test_shapes_through_eval_shape(name, options):
    attn = registry.make_attention(
        name, dim=D, num_heads=2, max_len=9, rngs=nnx.Rngs(params=rbg(0)), qkv_dim=16, **options
    )
    out = jax.eval_shape(
        lambda x, m: attn(x, mask=m),
        jax.ShapeDtypeStruct((2, 7, D), jnp.float32),
        jax.ShapeDtypeStruct((2, 7), jnp.bool_),
    )
    assert out.shape == (2, 7, D) and out.dtype == jnp.float32


@pytest.mark.parametrize(("name", "options"), CASES, ids=IDS)
def test_deterministic_is_pure_and_dropout_reproducible(name, options):
    attn = build(name, options, dropout_rate=0.5)
    x, mask = inputs()
    base = run(attn, x, mask)
    np.testing.assert_array_equal(base, run(attn, x, mask, rngs=nnx.Rngs(dropout=rbg(3))))
    a = run(attn, x, mask, deterministic=False, rngs=nnx.Rngs(dropout=rbg(1)))
    b = run(attn, x, mask, deterministic=False, rngs=nnx.Rngs(dropout=rbg(1)))
    c = run(attn, x, mask, deterministic=False, rngs=nnx.Rngs(dropout=rbg(2)))
    np.testing.assert_array_equal(a, b)
    assert not np.allclose(a[mask], c[mask])
    assert not np.allclose(a[mask], base[mask])
    with pytest.raises(ValueError, match="rngs"):
        attn(jnp.asarray(x), mask=jnp.asarray(mask), deterministic=False)


@pytest.mark.parametrize(("name", "options"), BF16_CASES, ids=BF16_IDS)
def test_bfloat16(name, options):
    attn = build(name, options, dropout_rate=0.1)
    x, mask = inputs()
    ref = run(attn, x, mask)
    params = nnx.state(attn, nnx.Param)
    nnx.update(attn, jax.tree.map(lambda p: p.astype(jnp.bfloat16), params))
    xb = jnp.asarray(x, jnp.bfloat16)
    out = attn(xb, mask=jnp.asarray(mask))
    assert out.dtype == jnp.bfloat16
    out = np.asarray(out, np.float32)
    assert np.all(np.isfinite(out))
    assert np.abs(out - ref)[mask].mean() < 0.05 * np.abs(ref[mask]).mean() + 0.01


@pytest.mark.parametrize(
    ("name", "options", "message"),
    [
        ("linear", {"qkv_dim": 30}, "divisible"),
        ("cosformer", {"dropout_rate": 1.0}, "dropout_rate"),
        ("performer", {"num_features": 0}, "num_features"),
        ("performer", {"redraw": "sometimes"}, "redraw"),
        ("transnormer_norm", {"kernel": "gelu"}, "kernel"),
        ("transnormer_norm", {"norm_type": "batchnorm"}, "norm_type"),
        ("transnormer_diag", {"score": "sigmoid"}, "score"),
        ("transnormer_diag", {"block_size": 0}, "block_size"),
        ("transnormer_diag", {"score": "relu", "norm_type": "srms"}, "norm_type"),
    ],
)
def test_bad_options_raise(name, options, message):
    with pytest.raises(ValueError, match=message):
        build(name, options)


def test_names_are_registered():
    for name in REFERENCES:
        assert name in registry.names()
        assert registry.get(name).replaces_mlp is False


# ---------------------------------------------------------------------------------------------
# Performer specifics: the random features and the softmax estimate.


def test_orthogonal_random_features():
    d = D // H  # 8, the head dim used throughout, so draws of 64 rows share one compiled shape
    partial = np.asarray(performer.orthogonal_random_features(rbg(0), 20, d), np.float64)
    assert partial.shape == (20, d)  # blocks of 8, 8 and 4 rows
    draws = [np.asarray(performer.orthogonal_random_features(rbg(s), 64, d)) for s in range(1, 51)]
    for w in (partial, draws[0]):
        unit = w / np.linalg.norm(w, axis=1, keepdims=True)
        for start in range(0, len(w), d):  # rows orthogonal inside each block of d
            block = unit[start : start + d]
            np.testing.assert_allclose(block @ block.T, np.eye(len(block)), atol=1e-5)
        assert np.abs(unit[:d] @ unit[d : 2 * d].T).max() > 1e-3  # blocks are independent
    many = np.concatenate(draws).astype(np.float64)
    # Directions are uniform (QR sign correction): a block's first row has no preferred sign.
    assert 0.4 < np.mean(many[::d, 0] > 0) < 0.6
    norms = np.linalg.norm(many, axis=1)
    assert abs(norms.mean() - np.sqrt(d - 0.5)) < 0.1  # chi(d) mean ~ sqrt(d - 1/2)
    assert 0.5 < norms.std() < 0.9  # chi(d) std ~ 1/sqrt(2): not a fixed length


def test_performer_features_are_fixed_state_not_params():
    attn = build("performer", {"num_features": 64})
    assert isinstance(attn.features, performer.RandomFeatures)
    assert attn.features[...].shape == (64, D // H)
    params = jax.tree.leaves(nnx.state(attn, nnx.Param))
    assert all(p.shape != (64, D // H) for p in params)
    again = build("performer", {"num_features": 64})
    np.testing.assert_array_equal(attn.features[...], again.features[...])  # from the init rngs


def test_performer_every_call_redraws_only_when_not_deterministic():
    fixed = build("performer", {"num_features": 64})
    redraw = build("performer", {"num_features": 64, "redraw": "every_call"})
    x, mask = inputs()
    np.testing.assert_array_equal(run(fixed, x, mask), run(redraw, x, mask))
    np.testing.assert_array_equal(
        run(fixed, x, mask), run(fixed, x, mask, deterministic=False, rngs=nnx.Rngs(dropout=rbg(1)))
    )
    a = run(redraw, x, mask, deterministic=False, rngs=nnx.Rngs(dropout=rbg(1)))
    b = run(redraw, x, mask, deterministic=False, rngs=nnx.Rngs(dropout=rbg(1)))
    c = run(redraw, x, mask, deterministic=False, rngs=nnx.Rngs(dropout=rbg(2)))
    np.testing.assert_array_equal(a, b)
    assert not np.allclose(a[mask], c[mask])


def test_performer_error_against_softmax_shrinks_with_more_features():
    x, mask = inputs()
    x = 0.5 * x  # logits of std ~0.5, past the heavy-tailed regime of very few features
    errors = {}
    for m in (64, 1024):
        attn = build("performer", {"num_features": m})  # same Q/K/V/out weights for both m
        exact = exact_softmax(attn, x, mask)
        runs = []
        for seed in range(4):
            # m // 64 independent draws of 64 rows (whole blocks of d = 8): the same law as one
            # draw of m rows, with a single compiled shape.
            draws = [
                performer.orthogonal_random_features(rbg(1000 * seed + j), 64, D // H)
                for j in range(m // 64)
            ]
            attn.features[...] = jnp.concatenate(draws)
            runs.append(np.abs(run(attn, x, mask) - exact)[mask].mean())
        errors[m] = np.mean(runs)
    assert errors[1024] < 0.5 * errors[64], errors  # ~1/sqrt(m) predicts a factor 4
    assert errors[1024] < 0.02, errors
