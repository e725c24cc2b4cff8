"""lra.measure.compare (scripts/compare_pytorch.py): the PyTorch twin of the harness's classifier.

The default CI has no PyTorch: there the package must fail to import with one line naming the
``compare`` extra, and the program must stop with a one-line error. With PyTorch importable
(``pip install -e '.[compare]'``), the twin's logits must equal the harness's for every model it
mirrors, and a perturbed twin weight must fail the check (exit 1) before anything is timed.
"""

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import TWIN_TINY

from lra.measure import compare_cli
from lra.measure.bench_config import SetupError, compose_bench_config

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "compare_pytorch.py"
TINY = TWIN_TINY  # length 64, batch 2
LENGTH, BATCH = 64, 2
HINT = "pip install 'lra-harness[compare]'"


def block_torch(monkeypatch):
    """Make ``import torch`` fail and forget any imported lra.measure.compare module."""
    monkeypatch.setitem(sys.modules, "torch", None)
    for name in [m for m in sys.modules if m.startswith("lra.measure.compare.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.delitem(sys.modules, "lra.measure.compare", raising=False)


def test_without_torch_the_package_names_the_extra_in_one_line(monkeypatch):
    block_torch(monkeypatch)
    with pytest.raises(ImportError) as raised:
        import lra.measure.compare  # noqa: F401
    assert raised.value.name == "torch"
    message = str(raised.value)
    assert "\n" not in message and HINT in message and "PyTorch" in message


def test_without_torch_the_program_exits_with_one_line(monkeypatch, capsys):
    block_torch(monkeypatch)
    assert compare_cli.compare_main(["--check-only", "--models", "transformer"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: compare_pytorch.py: "), err
    assert HINT in err[0]


def test_without_torch_the_command_exits_with_one_line_and_help_works():
    blocked = (
        "import runpy, sys; sys.modules['torch'] = None; "
        f"sys.argv = [{str(SCRIPT)!r}, '--check-only']; "
        f"runpy.run_path({str(SCRIPT)!r}, run_name='__main__')"
    )
    proc = subprocess.run(
        [sys.executable, "-c", blocked], capture_output=True, text=True, timeout=120, cwd=ROOT
    )
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "[compare]" in lines[0], lines
    assert proc.stdout == ""
    shown = subprocess.run(
        [sys.executable, str(SCRIPT), "--help"], capture_output=True, text=True, timeout=120
    )
    assert shown.returncode == 0 and "--check-only" in shown.stdout and HINT in shown.stdout


def test_an_override_of_an_option_is_refused():
    with pytest.raises(SetupError, match="--lengths"):
        compose_bench_config("transformer", 64, 2, ["task.max_length=32"])


# --- with PyTorch ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def twinlib():
    """lra.measure.compare.weights (skips without PyTorch)."""
    pytest.importorskip("torch")
    from lra.measure.compare import weights

    return weights


@pytest.mark.parametrize(
    "model",
    [
        "transformer",
        "transnormer_t1",
        "transnormer_t2",
        "performer",
        "cosformer",
        "flash",
        "flash_quad",
    ],
)
def test_twin_logits_equal_the_harness(twinlib, model):
    import torch

    from lra.measure.bench import synthetic_batch

    cpu = torch.device("cpu")
    result = twinlib.check_model(model, LENGTH, BATCH, TINY, 1e-4, cpu)
    assert result["ok"], result
    assert result["max_abs_logit"] > 0.01  # not a trivially zero output

    # Padded rows too (synthetic batches are full length); flash with chunks shorter than L.
    extra = ["model.attention_options.flash.chunk_size=16"] if model == "flash" else []
    cfg = compose_bench_config(model, LENGTH, 3, [*TINY, *extra])
    harness = twinlib.build_harness(cfg)
    twin = twinlib.build_twin(cfg, harness)
    batch = synthetic_batch(cfg.task, 3, LENGTH, seed=1)
    batch["lengths"] = (np.array([LENGTH, 23, 1], np.int32),)
    expected = twinlib.harness_logits(harness, batch)
    np.testing.assert_allclose(twinlib.twin_logits(twin, batch, cpu), expected, rtol=0, atol=1e-4)


def test_dual_twin_logits_equal_the_harness(twinlib):
    """Retrieval: both documents in one encoder batch, in the twin as in the harness."""
    import torch

    from lra.measure.bench import synthetic_batch

    cfg = compose_bench_config("transformer", LENGTH, 3, [*TINY, "task=retrieval"])
    assert cfg.task.dual
    harness = twinlib.build_harness(cfg)
    twin = twinlib.build_twin(cfg, harness)
    batch = synthetic_batch(cfg.task, 3, LENGTH, seed=2)
    batch["lengths"] = (np.array([LENGTH, 23, 1], np.int32), np.array([5, LENGTH, 40], np.int32))
    expected = twinlib.harness_logits(harness, batch)
    twin_out = twinlib.twin_logits(twin, batch, torch.device("cpu"))
    np.testing.assert_allclose(twin_out, expected, rtol=0, atol=1e-4)


def test_a_norm_the_twin_lacks_is_refused(twinlib):
    cfg = compose_bench_config("transformer", LENGTH, BATCH, [*TINY, "task.arch.norm=batch"])
    with pytest.raises(SetupError, match="pre-norm LayerNorm only; got task.arch.norm=batch"):
        twinlib.twin_kwargs(cfg)


def test_weight_without_a_place_is_an_error(twinlib):
    cfg = compose_bench_config("transformer", LENGTH, BATCH, TINY)
    harness = twinlib.build_harness(cfg)
    weights = twinlib.harness_weights(harness)
    twin = twinlib.build_twin(cfg, harness)
    with pytest.raises(SetupError, match="no weight"):
        twinlib.load_harness_weights(
            twin, {**weights, ("encoder", "final_norm", "gain"): np.ones(32)}
        )
    with pytest.raises(SetupError, match="no harness value"):
        twinlib.load_harness_weights(twin, {k: v for k, v in weights.items() if k[0] != "logits"})
    kernel = ("hidden", "kernel")
    with pytest.raises(SetupError, match="does not fit"):
        twinlib.load_harness_weights(twin, {**weights, kernel: weights[kernel][:-1]})


def test_perturbed_twin_weight_fails_the_check_and_times_nothing(twinlib, monkeypatch, capsys):
    import torch

    built = twinlib.build_twin

    def perturbed(cfg, harness):
        twin = built(cfg, harness)
        with torch.no_grad():
            twin.encoder.blocks[0].mlp.fc1.weight[0, 0] += 0.5
        return twin

    def no_timing(*args, **kwargs):
        raise AssertionError("timed after a failed check")

    from lra.measure.compare import run

    monkeypatch.setattr(twinlib, "build_twin", perturbed)
    monkeypatch.setattr(run, "time_cells", no_timing)
    argv = ["--models", "transformer", "--lengths", str(LENGTH), "--rounds", "1", *TINY]
    assert compare_cli.compare_main(argv) == 1
    out, err = capsys.readouterr()
    assert "DIFFERS" in out and "| model |" not in out and "round" not in out  # nothing timed
    assert "transformer" in err and "nothing timed" in err


def test_smoke_timing_writes_table_and_json(twinlib, tmp_path, capsys):
    out_path = tmp_path / "compare.json"
    argv = [
        "--models", "cosformer", "--lengths", "32", "--batch-size", "2", "--rounds", "2",
        "--steps", "1", "--warmup", "1", "--attention-dropout", "0.1",
        "--out", str(out_path), *TINY,
    ]  # fmt: skip
    assert compare_cli.compare_main(argv) == 0
    out = capsys.readouterr().out
    assert "| model | length | attention dropout | harness steps/s | PyTorch steps/s" in out
    saved = json.loads(out_path.read_text())
    assert [c["ok"] for c in saved["check"]] == [True]
    cells = saved["cells"]
    assert [(c["model"], c["length"], c["attention_dropout"]) for c in cells] == [
        ("cosformer", 32, 0.1)
    ]
    for cell in cells:
        assert len(cell["harness_steps_per_sec"]) == len(cell["torch_steps_per_sec"]) == 2
        assert all(r > 0 for r in cell["harness_steps_per_sec"] + cell["torch_steps_per_sec"])
        assert cell["flops_per_step"] > 0
    assert saved["table"] in out


def test_unsupported_model_is_refused_in_one_line(twinlib, capsys):
    argv = ["--check-only", "--models", "linformer", "--lengths", "64", *TINY]
    assert compare_cli.compare_main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "linformer" in err[0] and "does not implement" in err[0], err
