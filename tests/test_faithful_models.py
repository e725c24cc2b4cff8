"""Settings that make the Figure 1 models follow their authors' code.

- long_short: the authors' segment-wise window (each query's local key set) and DualLN eps;
- transnormer_norm / transnormer_diag ``lrpe``: LRPE as the TransNormer authors' LRA code uses
  it, against the relative form q_i^T R(j - i) k_j written out with rotation matrices;
- flash / flash_quad ``rope``: RoPE on the shared Q/K, against the same relative form;
- ``describe_layers`` and the Encoder's warning for a lower/upper split that loses a part.

The references are float64 numpy with the module's own weights; modules run jitted with
LLVM's optimisations off (fast compiles on two CPU cores).
"""

import functools
import warnings
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from omegaconf import OmegaConf

import lra.models.attention.flash  # noqa: F401  (registers flash_quad, flash)
import lra.models.attention.long_short  # noqa: F401  (registers long_short)
import lra.models.attention.transnormer  # noqa: F401  (registers transnormer_norm, _diag)
from lra.models import registry
from lra.models.encoder import Encoder
from lra.models.schedule import describe_layers, resolve_schedule

D, H = 16, 2
FAST_COMPILE = {"xla_backend_optimization_level": 0}
CONFIG_DIR = Path(__file__).resolve().parents[1] / "configs"


def make(name, *, seed=0, max_len=64, dim=D, heads=H, **options):
    rngs = nnx.Rngs(params=jax.random.key(seed, impl="rbg"))
    return registry.make_attention(
        name, dim=dim, num_heads=heads, max_len=max_len, rngs=rngs, **options
    )


@functools.partial(jax.jit, static_argnums=0, compiler_options=FAST_COMPILE)
def _apply(graphdef, state, x, mask):
    return nnx.merge(graphdef, state)(x, mask=mask)


def run(module, x, mask):
    graphdef, state = nnx.split(module)
    return np.asarray(_apply(graphdef, state, jnp.asarray(x), jnp.asarray(mask)))


def inputs(lengths, n, seed=0, dim=D):
    x = np.random.default_rng(seed).normal(size=(len(lengths), n, dim)).astype(np.float32)
    mask = np.arange(n)[None, :] < np.asarray(lengths)[:, None]
    return x, mask


def assert_padding_inert(module, lengths, n, extra=11):
    """Padded content and appended padding leave every real output unchanged."""
    x, mask = inputs(lengths, n)
    base = run(module, x, mask)
    assert np.all(np.isfinite(base))
    noise = 100.0 * np.random.default_rng(1).normal(size=x.shape).astype(np.float32)
    changed = run(module, np.where(mask[..., None], x, noise), mask)
    np.testing.assert_allclose(changed[mask], base[mask], rtol=1e-5, atol=1e-5)
    tail = np.random.default_rng(2).normal(size=(len(lengths), extra, x.shape[-1]))
    longer = run(
        module,
        np.concatenate([x, tail.astype(np.float32)], 1),
        np.concatenate([mask, np.zeros((len(lengths), extra), bool)], 1),
    )
    np.testing.assert_allclose(longer[:, :n][mask], base[mask], rtol=1e-5, atol=1e-5)


def f64(a):
    return np.asarray(a, np.float64)


def dense(layer, y):
    return y @ f64(layer.kernel[...]) + f64(layer.bias[...])


def rotation(angles, pairs, d):
    """float64[d, d] acting on column vectors: channel pair (a, b) turned by its angle (from
    a towards b) for each (a, b) in ``pairs``; other channels unchanged."""
    r = np.eye(d)
    for angle, (a, b) in zip(angles, pairs, strict=True):
        r[a, a] = r[b, b] = np.cos(angle)
        r[b, a], r[a, b] = np.sin(angle), -np.sin(angle)
    return r


def relative_scores(q, k, theta, pairs):
    """scores[..., i, j] = q_i^T R((j - i) theta) k_j for q, k float64[..., L, d]: the
    relative form that rotating q_i by i theta and k_j by j theta must give."""
    n, d = q.shape[-2], q.shape[-1]
    out = np.zeros(q.shape[:-1] + (n,))
    for offset in range(-(n - 1), n):
        r = rotation(offset * theta, pairs, d)
        rk = k @ r.T  # R k_j for every j
        for i in range(max(0, -offset), min(n, n - offset)):
            out[..., i, i + offset] = np.sum(q[..., i, :] * rk[..., i + offset, :], -1)
    return out


# ---------------------------------------------------------------------------------------------
# Long-Short: the authors' local key set.


def authors_local_keys(n, window, mask_row):
    """bool[L, L] from the authors' tiling (NVIDIA/transformer-ls lra/attention_transformer_ls.py,
    get_tiles_v2 / get_tiled_mask_v2): the key indices padded by ext = max(w // 2, 1) on each
    side with "no key", tile t = padded[t w : t w + w + 2 ext] for the queries of segment t;
    padded and outside keys masked. w <= 0: each query scores only its own key."""
    allowed = np.zeros((n, n), bool)
    if window <= 0:
        allowed[np.arange(n), np.arange(n)] = True
        return allowed & mask_row[None, :]
    ext = max(window // 2, 1)
    segments = -(-n // window)
    padded = np.concatenate([-np.ones(ext, int), np.arange(n), -np.ones(ext + window, int)])
    for t in range(segments):
        tile = padded[t * window : t * window + window + 2 * ext]
        keys = tile[tile >= 0]
        for i in range(t * window, min((t + 1) * window, n)):
            allowed[i, keys] = True
    return allowed & mask_row[None, :]


@functools.cache
def _jacobian_fn(graphdef):
    def out(state, x, mask):
        return nnx.merge(graphdef, state)(x, mask=mask)

    return jax.jit(jax.jacfwd(out, argnums=1), compiler_options=FAST_COMPILE)


def attended_keys(module, x, mask):
    """bool[B, L, L]: [b, i, j] when output i of row b depends on input j (landmarks off, so
    only the query itself and its local keys can matter)."""
    graphdef, state = nnx.split(module)
    jac = np.asarray(_jacobian_fn(graphdef)(state, jnp.asarray(x), jnp.asarray(mask)))
    b = np.arange(x.shape[0])
    jac = jac[b, :, :, b]  # [B, L, D, L, D]: each row against its own inputs
    return np.abs(jac).max(axis=(2, 4)) > 0


@pytest.mark.parametrize("window", [8, 5, 1, 0])
def test_long_short_local_keys_are_the_authors_tiles(window):
    n = 21  # ends in a partial segment for every window here
    lengths = [n, 13]  # unpadded and padded
    attn = make("long_short", window=window, num_landmarks=0)
    x, mask = inputs(lengths, n)
    got = attended_keys(attn, x, mask)
    for row, length in enumerate(lengths):
        expected = authors_local_keys(n, window, mask[row])
        real = slice(0, length)
        np.testing.assert_array_equal(got[row, real], expected[real])


def test_long_short_default_window_is_the_authors_16_keys():
    attn = make("long_short", num_landmarks=0)  # default window: the authors' win_size 8
    assert attn.window == 8
    n = 40
    x, mask = inputs([n], n)
    counts = attended_keys(attn, x, mask)[0].sum(-1)
    # Segments of 8 plus 4 keys on each side: 16 keys away from the ends of the sequence.
    assert np.all(counts[8:32] == 16)
    assert np.all(counts[:8] == 12) and np.all(counts[32:] == 12)


@pytest.mark.parametrize("options", [{}, {"window": 5, "num_landmarks": 3}, {"num_landmarks": 0}])
def test_long_short_padding_inert(options):
    assert_padding_inert(make("long_short", **options), [21, 13, 0], 21)


def test_long_short_dual_ln_uses_pytorch_epsilon():
    attn = make("long_short")
    assert attn.local_norm.epsilon == 1e-5 and attn.global_norm.epsilon == 1e-5


# ---------------------------------------------------------------------------------------------
# TransNormer LRPE.


def lrpe_pairs(d):
    """The authors' LRPE: interleaved pairs (2p, 2p + 1) of the even part of d, theta_p =
    10000^(-2p / e)."""
    e = d - d % 2
    return np.array([10000.0 ** (-2 * p / e) for p in range(e // 2)]), [
        (2 * p, 2 * p + 1) for p in range(e // 2)
    ]


def heads(y, h):
    b, n, _ = y.shape
    return y.reshape(b, n, h, -1).transpose(0, 2, 1, 3)  # [B, H, L, d]


def merge(y):
    b, h, n, d = y.shape
    return y.transpose(0, 2, 1, 3).reshape(b, n, h * d)


def elu(a):
    return np.where(a > 0, a, np.expm1(np.minimum(a, 0)))


KERNELS = {"1+elu": lambda a: elu(a) + 1, "elu": elu, "relu": lambda a: np.maximum(a, 0)}


def output_norm(norm, y):
    eps, scale = norm.epsilon, f64(norm.scale[...])
    if isinstance(norm, nnx.LayerNorm):
        c = y - y.mean(-1, keepdims=True)
        return c / np.sqrt(c.var(-1, keepdims=True) + eps) * scale + f64(norm.bias[...])
    return y / np.sqrt(np.mean(y**2, -1, keepdims=True) + eps) * scale


def qkv(attn, x):
    x = f64(x)
    h = attn.num_heads
    return tuple(heads(dense(layer, x), h) for layer in (attn.query, attn.key, attn.value))


def reference_norm_lrpe(attn, x, mask):
    """Norm(S V) with S_ij = phi(q_i)^T R(j - i) phi(k_j) over real keys j, no denominator."""
    q, k, v = qkv(attn, x)
    phi = KERNELS[attn.kernel]
    theta, pairs = lrpe_pairs(q.shape[-1])
    scores = relative_scores(phi(q), phi(k), theta, pairs) * mask[:, None, None, :]
    return dense(attn.out, output_norm(attn.norm, merge(scores @ v)))


def reference_diag_lrpe(attn, x, mask):
    """Block attention with logits q_i^T R(j - i) k_j / sqrt(d) inside each block."""
    q, k, v = qkv(attn, x)
    theta, pairs = lrpe_pairs(q.shape[-1])
    i = np.arange(x.shape[1])
    same_block = (i[:, None] // attn.block_size) == (i[None, :] // attn.block_size)
    allowed = same_block[None, None] & mask[:, None, None, :]
    logits = relative_scores(q, k, theta, pairs) / np.sqrt(q.shape[-1])
    if attn.score == "softmax":
        logits = np.where(allowed, logits, -1e300)
        w = np.exp(logits - logits.max(-1, keepdims=True))
        y = merge((w / w.sum(-1, keepdims=True)) @ v)
    else:
        y = output_norm(attn.norm, merge((np.maximum(logits, 0) * allowed) @ v))
    return dense(attn.out, y)


LRPE_CASES = [
    ("transnormer_norm", {"kernel": "1+elu"}),
    ("transnormer_norm", {"kernel": "elu"}),
    ("transnormer_norm", {"kernel": "elu", "qkv_dim": 10}),  # head dim 5: odd channel kept
    ("transnormer_diag", {"block_size": 8, "score": "softmax"}),
    ("transnormer_diag", {"block_size": 8, "score": "relu"}),
    ("transnormer_diag", {"block_size": 8, "score": "relu", "qkv_dim": 10}),
]
LRPE_IDS = [name + "".join(f"-{v}" for v in opts.values()) for name, opts in LRPE_CASES]
LRPE_REFERENCES = {"transnormer_norm": reference_norm_lrpe, "transnormer_diag": reference_diag_lrpe}


@pytest.mark.parametrize(("name", "options"), LRPE_CASES, ids=LRPE_IDS)
def test_lrpe_matches_relative_rotation_formula(name, options):
    attn = make(name, lrpe=True, **options)
    n = 19
    x, mask = inputs([n, 7, 1], n)
    out = run(attn, x, mask)
    np.testing.assert_allclose(
        out[mask], LRPE_REFERENCES[name](attn, x, mask)[mask], rtol=2e-4, atol=2e-5
    )
    # LRPE really changes the output, and adds no parameters (theta is fixed).
    plain = make(name, lrpe=False, **options)
    assert not np.allclose(run(plain, x, mask)[mask], out[mask], atol=1e-4)
    assert jax.tree.structure(nnx.state(attn, nnx.Param)) == jax.tree.structure(
        nnx.state(plain, nnx.Param)
    )


@pytest.mark.parametrize(("name", "options"), LRPE_CASES, ids=LRPE_IDS)
def test_lrpe_padding_inert(name, options):
    assert_padding_inert(make(name, lrpe=True, **options), [19, 7, 0], 19)


def test_lrpe_is_off_by_default_and_checked():
    assert not make("transnormer_norm").lrpe and not make("transnormer_diag").lrpe
    with pytest.raises(ValueError, match="lrpe"):
        make("transnormer_norm", lrpe="yes")


# ---------------------------------------------------------------------------------------------
# FLASH RoPE.


def rope_pairs(s):
    """The FLASH ports' RoPE: channel p paired with p + s/2, theta_p = 10000^(-p / (s/2))."""
    half = s // 2
    return np.array([10000.0 ** (-p / half) for p in range(half)]), [
        (p, p + half) for p in range(half)
    ]


def silu(y):
    return y / (1.0 + np.exp(-y))


def gau_parts(attn, x):
    u, v = np.split(silu(dense(attn.hidden, x)), 2, axis=-1)
    z = silu(dense(attn.shared, x))
    gamma, beta = f64(attn.gamma[...]), f64(attn.beta[...])
    return u, v, [z * gamma[i] + beta[i] for i in range(gamma.shape[0])]


def toeplitz_bias(rel_bias, n):
    span = rel_bias.span
    offset = np.clip(np.arange(n)[None, :] - np.arange(n)[:, None], 1 - span, span - 1)
    return f64(rel_bias.table[...])[offset + span - 1]


def reference_flash_quad_rope(attn, x, mask):
    x = f64(x)
    n = x.shape[1]
    u, v, (q, k) = gau_parts(attn, x)
    theta, pairs = rope_pairs(q.shape[-1])
    count = np.maximum(mask.sum(-1), 1)[:, None, None]
    qk = relative_scores(q, k, theta, pairs)
    a = np.maximum(qk / count + toeplitz_bias(attn.rel_bias, n), 0) ** 2 * mask[:, None, :]
    return dense(attn.out, u * (a @ v))


def reference_flash_rope(attn, x, mask):
    x = f64(x)
    n = x.shape[1]
    g = attn.chunk_size
    u, v, (qq, qk, lq, lk) = gau_parts(attn, x)
    theta, pairs = rope_pairs(qq.shape[-1])
    chunk = np.arange(n) // g
    same_chunk = chunk[:, None] == chunk[None, :]
    quad = relative_scores(qq, qk, theta, pairs) / g + toeplitz_bias(attn.rel_bias, n)
    quad = np.maximum(quad, 0) ** 2 * same_chunk * mask[:, None, :]
    count = np.maximum(mask.sum(-1), 1)[:, None, None]
    linear = relative_scores(lq, lk, theta, pairs) * mask[:, None, :] / count
    return dense(attn.out, u * ((quad + linear) @ v))


ROPE_CASES = {
    "flash_quad": (dict(shared_dim=8), reference_flash_quad_rope),
    "flash": (dict(shared_dim=8, chunk_size=8), reference_flash_rope),
}


def rope_module(name):
    attn = make(name, rope=True, **ROPE_CASES[name][0])
    rng = np.random.default_rng(3)  # visible offsets and scales, so rotations matter
    attn.beta[...] = jnp.asarray(rng.normal(size=attn.beta.shape), jnp.float32)
    attn.gamma[...] = jnp.asarray(rng.normal(size=attn.gamma.shape), jnp.float32)
    return attn


@pytest.mark.parametrize("name", list(ROPE_CASES))
def test_rope_matches_relative_rotation_formula(name):
    attn = rope_module(name)
    n = 19
    x, mask = inputs([n, 7, 1], n)
    out = run(attn, x, mask)
    expected = ROPE_CASES[name][1](attn, x, mask)
    np.testing.assert_allclose(out[mask], expected[mask], rtol=2e-4, atol=1e-6)
    plain = make(name, rope=False, **ROPE_CASES[name][0])
    nnx.update(plain, nnx.state(attn, nnx.Param))
    assert not np.allclose(run(plain, x, mask)[mask], out[mask], atol=1e-5)


@pytest.mark.parametrize("name", list(ROPE_CASES))
def test_rope_padding_inert(name):
    assert_padding_inert(rope_module(name), [19, 7, 0], 19)


def test_rope_is_off_by_default_and_needs_even_shared_dim():
    assert not make("flash").rope and not make("flash_quad").rope
    for name in ROPE_CASES:
        with pytest.raises(ValueError, match="even shared_dim"):
            make(name, rope=True, shared_dim=7)


# ---------------------------------------------------------------------------------------------
# Model configs: the options exist under the mechanism names, off under the official protocol.


def test_model_configs_name_the_options_and_keep_them_off():
    def options(model):
        return OmegaConf.to_container(
            OmegaConf.load(CONFIG_DIR / "model" / f"{model}.yaml").attention_options
        )

    for model in ("transnormer_t1", "transnormer_t2"):
        opts = options(model)
        assert opts["transnormer_norm"]["lrpe"] is False
        assert opts["transnormer_diag"]["lrpe"] is False
    assert options("flash")["flash"]["rope"] is False
    assert options("flash_quad")["flash_quad"]["rope"] is False
    assert options("ls")["long_short"] == {"window": 8, "num_landmarks": 32}


# ---------------------------------------------------------------------------------------------
# Per-layer schedules.

T2 = {"lower": "transnormer_diag", "upper": "transnormer_norm", "lower_fraction": 0.5}


def test_describe_layers_one_layer_split_warns():
    info = describe_layers(T2, 1)
    assert info["layer_mechanisms"] == ["transnormer_norm"]
    warning = info["schedule_warning"]
    for part in ("transnormer_diag", "transnormer_norm", "num_layers=1", "no lower layer"):
        assert part in warning
    assert "task.arch.num_layers=2" in warning
    assert resolve_schedule(T2, 1) == ("transnormer_norm",)  # behaviour unchanged


@pytest.mark.parametrize(("num_layers", "num_lower"), [(2, 1), (6, 3)])
def test_describe_layers_deeper_splits_are_silent(num_layers, num_lower):
    info = describe_layers(T2, num_layers)
    expected = ["transnormer_diag"] * num_lower + ["transnormer_norm"] * (num_layers - num_lower)
    assert info == {"layer_mechanisms": expected, "schedule_warning": None}


def test_describe_layers_other_schedules():
    local_then_global = OmegaConf.create({"lower": "local", "upper": "softmax"})  # as Hydra
    info = describe_layers(local_then_global, 1)
    assert info["layer_mechanisms"] == ["softmax"] and "local" in info["schedule_warning"]
    all_lower = describe_layers({**T2, "lower_fraction": 1.0}, 2)
    assert all_lower["layer_mechanisms"] == ["transnormer_diag"] * 2
    assert "no upper layer" in all_lower["schedule_warning"]
    assert "lower_fraction strictly between 0 and 1" in all_lower["schedule_warning"]
    assert "num_layers=4" in describe_layers({**T2, "lower_fraction": 0.25}, 3)["schedule_warning"]
    same = describe_layers({"lower": "softmax", "upper": "softmax"}, 1)
    assert same == {"layer_mechanisms": ["softmax"], "schedule_warning": None}
    assert describe_layers("softmax", 1)["schedule_warning"] is None
    assert describe_layers(["local", "softmax"], 2) == {
        "layer_mechanisms": ["local", "softmax"],
        "schedule_warning": None,
    }


def _encoder(num_layers):
    return Encoder(
        vocab_size=5,
        max_len=8,
        num_layers=num_layers,
        dim=8,
        qkv_dim=8,
        num_heads=2,
        mlp_dim=8,
        dropout=0.0,
        attention_dropout=0.0,
        positions="learned",
        cls_token=False,
        attention=T2,
        attention_options={"transnormer_diag": {"block_size": 4}},
        rngs=nnx.Rngs(0),
    )


def test_encoder_warns_once_for_a_degenerate_split():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        encoder = _encoder(1)
    schedule_warnings = [w for w in caught if "attention schedule" in str(w.message)]
    assert len(schedule_warnings) == 1 and schedule_warnings[0].category is UserWarning
    assert str(schedule_warnings[0].message) == describe_layers(T2, 1)["schedule_warning"]
    assert encoder.schedule == ("transnormer_norm",)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _encoder(2)
    assert not [w for w in caught if "attention schedule" in str(w.message)]
