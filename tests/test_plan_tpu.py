"""lra-plan device=tpu:<topology> (issue 40, part 6): a cell compiled for a TPU slice from this
CPU host with libtpu (the ``tpu-aot`` extra), and libtpu leaving CPU runs alone.

These need libtpu, which the development install leaves out (212 MB, and it must never change a
CPU run): ``.ci/run`` runs this file in a virtualenv of its own with ``.[test,tpu-aot]`` and
``LRA_REQUIRE_TPU_AOT=1``, which turns the skip below into a failure.
"""

import importlib.util
import json
import os
import subprocess
import sys

import pytest
from conftest import SMALL_RUN

HAVE_LIBTPU = importlib.util.find_spec("libtpu") is not None
if not HAVE_LIBTPU and os.environ.get("LRA_REQUIRE_TPU_AOT") == "1":
    raise RuntimeError("LRA_REQUIRE_TPU_AOT=1 but libtpu is missing: pip install '.[tpu-aot]'")
pytestmark = pytest.mark.skipif(
    not HAVE_LIBTPU, reason="needs libtpu (.[tpu-aot]); .ci/run runs it in a venv of its own"
)


def _tpu_plan(tmp_path, name, *overrides):
    from lra.plan.main import make_plan

    out = tmp_path / name
    argv = ["task=listops_tiny", *SMALL_RUN, *overrides, "device=tpu:v5e:2x2"]
    return make_plan([*argv, f"out_dir={out}", f"results_dir={tmp_path / 'runs'}"]), out


def test_a_tiny_cell_compiles_for_v5e_2x2_below_the_single_device_memory(tmp_path):
    plan, out = _tpu_plan(tmp_path, "four", "seed=0,1")
    (cell,) = plan["cells"]
    (stage,) = cell["stages"]
    assert stage["platform"] == "tpu" and stage["device"] == "TPU v5 lite"
    assert stage["num_devices"] == 4 and stage["per_device_batch_size"] == 4  # batch 16 / 4
    assert cell["fits"] is True and cell["device_memory_bytes"] == 16_000_000_000
    assert cell["devices_per_run"] == 4 and cell["seeds"] == [0, 1]
    # A roofline from the cost analysis, labelled as an estimate everywhere.
    assert stage["estimate"] == "roofline" and plan["device"]["estimate"] == "roofline"
    chip_flops = 197e12
    assert stage["train_roofline_seconds"] >= stage["train_flops_per_device"] / chip_flops
    assert cell["steps_per_sec"] == pytest.approx(1 / stage["train_roofline_seconds"])
    assert cell["device_hours"] == pytest.approx(cell["projected_seconds"] * 4 * 2 / 3600)
    md = (out / "plan.md").read_text()
    assert "ESTIMATES, not measurements" in md and "no TPU ran" in md
    assert "Train steps/s (estimate)" in md
    # The same cell on one chip of the slice: the whole batch on one device needs more.
    single, _ = _tpu_plan(tmp_path, "one", "trainer.mesh.data=1")
    one = single["cells"][0]
    assert one["stages"][0]["num_devices"] == 1
    assert cell["compiled_memory_bytes"] < one["compiled_memory_bytes"]
    assert stage["train_flops_per_device"] < one["stages"][0]["train_flops_per_device"]


def test_libtpu_installed_leaves_the_cpu_the_default_backend(tmp_path):
    code = (
        "import jax, json; from lra.plan.measure import measure_stage; "
        "print(json.dumps([jax.default_backend(), [d.platform for d in jax.devices()]]))"
    )
    env = {k: v for k, v in os.environ.items() if k != "JAX_PLATFORMS"}
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True
    )
    assert json.loads(done.stdout.strip().splitlines()[-1]) == ["cpu", ["cpu"]]
    # libtpu's probe for a TPU prints its warnings then (docs/plan.md); JAX_PLATFORMS=cpu skips
    # the probe and with it every line of libtpu's.
    quiet = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env={**env, "JAX_PLATFORMS": "cpu"},
        check=True,
    )
    assert json.loads(quiet.stdout.strip().splitlines()[-1]) == ["cpu", ["cpu"]]
    assert "TPU" not in quiet.stderr


def test_a_cpu_training_step_is_the_same_with_libtpu_installed(tmp_path):
    # The plan's CPU measurement in this venv: compiled for and run on the CPU, as without libtpu.
    from lra.plan.main import make_plan

    out = tmp_path / "cpu"
    plan = make_plan(
        ["task=listops_tiny", *SMALL_RUN, f"out_dir={out}", f"results_dir={tmp_path / 'runs'}"]
        + ["plan.windows=1", "plan.steps_per_window=1", "plan.isolate=false"]
    )
    (stage,) = plan["cells"][0]["stages"]
    assert stage["platform"] == "cpu" and stage["train_steps_per_sec"] > 0
    assert stage.get("estimate") is None
