"""The mechanism passes the harness's conformance check and matches its formula."""

import jax.numpy as jnp
import numpy as np
from flax import nnx
from my_attention.attention import SquaredReluAttention

from lra.measure.conformance import check_attention


def test_passes_the_conformance_check():
    report = check_attention("my_attention")
    assert report.passed, report.text()
    assert "my_attention.attention:SquaredReluAttention" in report.source


def test_matches_the_formula_on_one_head():
    attn = SquaredReluAttention(dim=4, num_heads=1, max_len=5, rngs=nnx.Rngs(0))
    x = jnp.asarray(np.random.default_rng(0).normal(size=(1, 5, 4)), jnp.float32)
    mask = jnp.asarray([[True, True, True, False, False]])
    q, k, v = attn.query(x)[0], attn.key(x)[0], attn.value(x)[0]
    w = np.maximum(np.asarray(q @ k.T) / 2.0, 0) ** 2 * np.asarray(mask[0], np.float32) / 3
    expected = attn.out(jnp.asarray(w @ np.asarray(v))[None])
    np.testing.assert_allclose(attn(x, mask=mask), expected, rtol=1e-5, atol=1e-5)
