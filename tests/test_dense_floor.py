"""lra.measure.dense_floor (scripts/dense_floor.py): the Figure-1 step without attention, in
the harness and the twin.

The floor is only evidence if it is what it says: every layer's Q/K/V/output projections
still run forward and backward (so the step keeps all of the dense layers' FLOPs) while no
position mixes with another; and, with PyTorch, its twin gives the harness's logits.
"""

import json
import sys

import jax
import numpy as np
import pytest
from conftest import TWIN_TINY
from flax import nnx

from lra.measure import compare_cli
from lra.measure import dense_floor as floor
from lra.measure.bench_config import compose_bench_config
from lra.models import registry

TINY = TWIN_TINY  # length 64, batch 2
LENGTH, BATCH = 64, 2


@pytest.fixture(scope="module", autouse=True)
def registered():
    floor.register_floor()
    floor.register_floor()  # a second call does nothing
    assert {floor.FLOOR, floor.GAU_FLOOR} <= set(registry.names())


def test_value_only_is_the_output_projection_of_the_values():
    layer = floor.ValueOnly(dim=32, num_heads=2, max_len=LENGTH, rngs=nnx.Rngs(0))
    x = jax.random.normal(jax.random.key(1), (BATCH, LENGTH, 32))
    mask = np.ones((BATCH, LENGTH), bool)
    expected = layer.out(layer.value(x))
    np.testing.assert_allclose(layer(x, mask=mask), expected, rtol=1e-6, atol=1e-6)
    # position i depends on x[i] only: changing the last token changes only the last output
    changed = layer(x.at[:, -1].add(1.0), mask=mask)
    np.testing.assert_array_equal(changed[:, :-1], layer(x, mask=mask)[:, :-1])
    assert not np.allclose(changed[:, -1], expected[:, -1])


def test_floor_step_keeps_every_dense_layer_and_drops_attention():
    from lra.train.compile import abstract_batch, compile_steps

    def flops(overrides):
        cfg = compose_bench_config("transnormer_t2", LENGTH, BATCH, [*TINY, *overrides])
        compiled = compile_steps(cfg, abstract_batch(cfg.task, BATCH), evaluate=False)
        return compiled.flops_per_step

    floor_flops = flops(floor.FLOOR_OVERRIDES)
    tokens, dim, mlp, layers = BATCH * (LENGTH + 1), 32, 64, 2  # + 1: the CLS token
    # forward matmuls of Q, K, V, out and the MLP, then two of the same size backward
    dense = 3 * layers * tokens * (4 * 2 * dim * dim + 2 * 2 * dim * mlp)
    assert floor_flops >= dense
    assert floor_flops < flops([])  # the attention's own work is gone


def test_gau_floor_keeps_the_unit_projections_and_drops_attention():
    from lra.train.compile import abstract_batch, compile_steps

    assert floor.floor_overrides("flash") == floor.GAU_FLOOR_OVERRIDES
    assert floor.floor_overrides("transnormer_t2") == floor.FLOOR_OVERRIDES

    def flops(overrides):
        cfg = compose_bench_config("flash", LENGTH, BATCH, [*TINY, *overrides])
        compiled = compile_steps(cfg, abstract_batch(cfg.task, BATCH), evaluate=False)
        return compiled.flops_per_step

    floor_flops = flops(floor.GAU_FLOOR_OVERRIDES)
    tokens, dim, layers, e, s = BATCH * (LENGTH + 1), 32, 2, 64, 128  # expansion 2, shared 128
    # forward matmuls of U and V (dim -> 2e), Z (dim -> s) and out (e -> dim), then backward
    dense = 3 * layers * tokens * 2 * dim * (2 * e + s + e)
    assert floor_flops >= dense
    assert floor_flops < flops([])


def test_floor_twin_gives_the_harness_logits():
    pytest.importorskip("torch")
    import torch

    from lra.measure.compare.floor import register_floor_twins
    from lra.measure.compare.weights import check_model

    register_floor_twins()
    for model in ("transnormer_t2", "flash"):
        overrides = [*TINY, *floor.floor_overrides(model)]
        result = check_model(model, LENGTH, BATCH, overrides, 1e-4, torch.device("cpu"))
        assert result["ok"], result
        assert result["max_abs_logit"] > 0.01


def test_without_torch_the_program_names_the_extra(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "torch", None)  # import torch -> ImportError
    for name in [m for m in sys.modules if m.startswith("lra.measure.compare.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.delitem(sys.modules, "lra.measure.compare", raising=False)
    assert compare_cli.floor_main(["--lengths", "64"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "[compare]" in err[0], err


def test_smoke_times_full_and_floor_side_by_side(tmp_path, capsys):
    pytest.importorskip("torch")
    out = tmp_path / "floor.json"
    argv = ["--lengths", "32", "--rounds", "2", "--steps", "1", "--warmup", "0"]
    assert compare_cli.floor_main([*argv, "--out", str(out), *TINY]) == 0
    printed = capsys.readouterr().out
    saved = json.loads(out.read_text())
    assert saved["table"] in printed and "| 32 |" in saved["table"]
    assert sorted(r["variant"] for r in saved["rows"]) == ["floor", "full"]
    for row in saved["rows"]:
        assert len(row["harness"]) == len(row["torch"]) == 2
        assert all(rate > 0 for rate in row["harness"] + row["torch"])
