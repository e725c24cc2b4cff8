"""Data parallelism over several devices and processes, grad_accum, remat, pre-flight check.

Multi-device runs need XLA's host-device count set before JAX starts, so they run
in fresh processes (tests/parallel_worker.py); the 2-process run uses
jax.distributed on localhost with gloo collectives.
"""

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import jax
import numpy as np
import pytest
from conftest import SMALL_RUN, make_config, train_small

from lra.config.identity import result_hash
from lra.device import measure
from lra.errors import ConfigError, DataError
from lra.train import parallel
from lra.train.preflight import OutOfMemory, check_fits, fitting_overrides

WORKER = Path(__file__).with_name("parallel_worker.py")
NO_DROPOUT = ("task.arch.dropout=0", "task.arch.attention_dropout=0")


def _losses(record) -> list[float]:
    return [h["train_loss"] for h in record["history"]]


def _start_worker(data_dir, results_dir, num_devices: int, *overrides: str):
    return subprocess.Popen(
        [sys.executable, str(WORKER), str(data_dir), str(results_dir), str(num_devices)]
        + list(overrides),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def _result(proc, timeout=240) -> dict:
    out, _ = proc.communicate(timeout=timeout)
    assert proc.returncode == 0, out[-3000:]
    line = next(line for line in out.splitlines() if line.startswith("RESULT "))
    return json.loads(line[len("RESULT ") :])


@pytest.fixture(scope="module")
def two_device_run(listops_tiny_dir, tmp_path_factory):
    """The small run on one process with 2 CPU devices."""
    results = tmp_path_factory.mktemp("two_devices")
    return _result(_start_worker(listops_tiny_dir, results, 2))


def _one_cpu_device_run(data_dir, results_dir) -> dict:
    """The small run on one CPU device: in this process when JAX runs on the CPU, else (a GPU
    test run, as in scripts/gpu_check.sh) in a CPU worker like the 2-device run, since the
    same steps on a GPU differ from the CPU's in the 5th digit (TF32 matmuls; seen on an H200).
    """
    if jax.default_backend() == "cpu":
        return train_small(data_dir, results_dir)
    return _result(_start_worker(data_dir, results_dir, 1))


def test_two_devices_give_the_losses_of_one(listops_tiny_dir, tmp_path, two_device_run):
    one = _one_cpu_device_run(listops_tiny_dir, tmp_path)
    assert one["num_devices"] == 1 and one["per_device_batch_size"] == 16
    two = two_device_run
    assert two["num_devices"] == 2 and two["mesh_shape"] == {"data": 2}
    assert two["global_batch_size"] == 16 and two["per_device_batch_size"] == 8
    assert _losses(two) == pytest.approx(_losses(one), rel=1e-5)
    assert two["test_accuracy"] == pytest.approx(one["test_accuracy"], abs=1e-6)
    assert "does not split evenly over the 2 devices" in two["indivisible_error"]
    assert "multiple of 2 (e.g. 14 or 16)" in two["indivisible_error"]


def test_two_processes_give_the_record_of_two_devices(listops_tiny_dir, tmp_path, two_device_run):
    with socket.socket() as sock:
        sock.bind(("localhost", 0))
        port = sock.getsockname()[1]
    dist = [
        f"distributed.coordinator_address=localhost:{port}",
        "distributed.num_processes=2",
    ]
    procs = [
        _start_worker(listops_tiny_dir, tmp_path, 1, *dist, f"distributed.process_id={i}")
        for i in range(2)
    ]
    results = [_result(p) for p in procs]
    for out in results:
        assert out["num_processes"] == 2 and out["num_devices"] == 2
        assert _losses(out) == pytest.approx(_losses(two_device_run), rel=1e-5)
        assert out["test_accuracy"] == pytest.approx(two_device_run["test_accuracy"], abs=1e-6)
    # Only process 0 wrote a record; both wrote the checkpoint the orbax multi-process way.
    assert [p.name for p in tmp_path.rglob("record.json")] == ["record.json"]
    assert [p.name for p in tmp_path.glob("*/checkpoints/*")] == ["4"]


def test_mesh_and_batch_errors_name_the_fix():
    with pytest.raises(ConfigError, match="trainer.mesh.data=2, but 1 devices are visible"):
        parallel.make_topology({"data": 2}, 16)
    with pytest.raises(ConfigError, match="unknown axes"):
        parallel.make_topology({"model": 2}, 16)
    with pytest.raises(ConfigError, match="grad_accum=3 micro-batches; use a multiple of 3"):
        parallel.make_topology(None, 16, 3)


def test_grad_accum_matches_the_full_batch_in_less_memory(listops_tiny_dir, tmp_path):
    full = train_small(listops_tiny_dir, tmp_path / "full", *NO_DROPOUT)
    accum = train_small(listops_tiny_dir, tmp_path / "accum", *NO_DROPOUT, "trainer.grad_accum=4")
    assert accum["grad_accum"] == 4 and full["grad_accum"] == 1
    assert _losses(accum) == pytest.approx(_losses(full), rel=1e-5)
    assert accum["test_accuracy"] == pytest.approx(full["test_accuracy"], abs=1e-6)
    assert accum["compiled_memory_bytes"] < 0.7 * full["compiled_memory_bytes"]


# A tiny model trained 30 steps with dropout on (0.1, listops_tiny's default), one loss a step.
DROPOUT_RUN = (
    "trainer.num_steps=30",
    "trainer.eval_every=30",
    "task.arch.num_layers=1",
    "task.arch.dim=16",
    "task.arch.qkv_dim=16",
    "task.arch.mlp_dim=32",
    "task.arch.num_heads=2",
)


def test_grad_accum_and_devices_give_the_full_batch_losses_with_dropout(listops_tiny_dir, tmp_path):
    # Each micro-batch draws its rows of the whole batch's dropout masks (dropout_rng.batch_rows)
    # and a mesh draws the global masks, so neither changes the losses (issue 29).
    assert make_config().task.arch.dropout > 0  # hash generator, dropout on
    accums = (1, 2, 4)
    workers = {
        (2, k): _start_worker(
            listops_tiny_dir, tmp_path / f"d2-k{k}", 2, *DROPOUT_RUN, f"trainer.grad_accum={k}"
        )
        for k in accums
    }
    losses = {
        (1, k): _losses(
            train_small(
                listops_tiny_dir, tmp_path / f"d1-k{k}", *DROPOUT_RUN, f"trainer.grad_accum={k}"
            )
        )
        for k in accums
    }
    losses.update({run: _losses(_result(proc)) for run, proc in workers.items()})
    full = losses[1, 1]
    assert len(full) == 30
    for run, run_losses in losses.items():
        assert run_losses == pytest.approx(full, rel=1e-5), run


def test_batch_norm_statistics_span_the_devices(listops_tiny_dir, tmp_path):
    # One jit over the mesh: a masked BatchNorm's sums run over the global batch (SyncBatchNorm;
    # statistics of each device's 8 rows alone would give other losses), and evaluation uses
    # the same running statistics.
    overrides = (*DROPOUT_RUN, "task.arch.norm=batch")
    two = _start_worker(listops_tiny_dir, tmp_path / "d2", 2, *overrides)
    one = train_small(listops_tiny_dir, tmp_path / "d1", *overrides)
    two = _result(two)
    assert two["num_devices"] == 2 and one["config"]["task"]["arch"]["norm"] == "batch"
    assert _losses(two) == pytest.approx(_losses(one), rel=1e-5)
    assert two["test_accuracy"] == pytest.approx(one["test_accuracy"], abs=1e-6)


def test_grad_accum_with_threefry_draws_other_masks(listops_tiny_dir, tmp_path):
    # threefry cannot address a batch's rows: its micro-batches fold their index into the key.
    short = (*DROPOUT_RUN[2:], "trainer.num_steps=2", "trainer.dropout_rng=threefry")
    full = train_small(listops_tiny_dir, tmp_path / "full", *short)
    accum = train_small(listops_tiny_dir, tmp_path / "accum", *short, "trainer.grad_accum=2")
    assert _losses(accum)[0] != pytest.approx(_losses(full)[0], rel=1e-5)


def test_remat_gives_the_same_losses(listops_tiny_dir, tmp_path):
    plain = train_small(listops_tiny_dir, tmp_path / "plain", *NO_DROPOUT)
    remat = train_small(listops_tiny_dir, tmp_path / "remat", *NO_DROPOUT, "trainer.remat=true")
    assert remat["remat"] == "block" and plain["remat"] == "none"  # true, false: aliases
    assert _losses(remat) == pytest.approx(_losses(plain), rel=1e-5)
    # How a run is spread over devices and memory is not part of its identity.
    assert remat["run_key"] == plain["run_key"]
    moved = {**plain["config"], "trainer": {**plain["config"]["trainer"], "mesh": {"data": 2}}}
    assert result_hash(moved) == result_hash(plain["config"])
    changed = {**plain["config"], "trainer": {**plain["config"]["trainer"], "grad_accum": 2}}
    assert result_hash(changed) != result_hash(plain["config"])


REMAT_MEMORY = """
import json, sys
sys.path.insert(0, {tests!r})
from lra.device import measure
measure.configure_cpu_memory_analysis()
{scheduler}
from conftest import make_config
from lra.train import parallel
from lra.train.compile import abstract_batch, compile_steps
out = {{}}
for remat in ("none", "block", "attention"):
    cfg = make_config(*{overrides!r}, "task.arch.num_layers=3", "task.arch.dim=32",
                      "task.arch.qkv_dim=32", "task.arch.mlp_dim=64", "task.arch.num_heads=2",
                      "trainer.remat=" + remat)
    topo = parallel.make_topology(None, 4)
    c = compile_steps(cfg, abstract_batch(cfg.task, 4, topo.batch_sharding), topology=topo,
                      evaluate=False)
    out[remat] = measure.compiled_memory_bytes(c.train_step)
print("RESULT " + json.dumps(out))
"""


@pytest.mark.parametrize(
    "scheduler, overrides, ratio",
    [
        # The plain softmax path under the memory-aware scheduler.
        ("assert measure.configure_cpu_remat()", ["task.max_length=256"], 0.7),
        # The chunked path under XLA's default scheduler, as lra-train compiles: per-block remat
        # raised this step's memory; remat as a scan over the layers lowers it (issue 29).
        (
            "",
            ["task.max_length=1024", "+model.attention_options.softmax.implementation=chunked"],
            0.8,
        ),
    ],
    ids=["plain-memory-scheduler", "chunked-default-scheduler"],
)
def test_remat_lowers_compiled_memory(scheduler, overrides, ratio):
    code = REMAT_MEMORY.format(
        tests=str(Path(__file__).parent), scheduler=scheduler, overrides=overrides
    )
    env = {**os.environ, "XLA_FLAGS": ""}
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=240
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = next(x for x in proc.stdout.splitlines() if x.startswith("RESULT "))
    memory = json.loads(line[len("RESULT ") :])
    assert memory["block"] < ratio * memory["none"], memory
    assert memory["attention"] < memory["none"], memory  # attention's residuals are not kept


def _train_without_data(tmp_path, *overrides):
    from lra.train.loop import train_and_evaluate

    empty = tmp_path / "no-data"
    empty.mkdir(exist_ok=True)
    cfg = make_config(
        "task=listops_tiny", f"data_dir={empty}", f"results_dir={tmp_path}", *SMALL_RUN, *overrides
    )
    return train_and_evaluate(cfg)


def test_preflight_stops_before_loading_data_and_names_what_fits(tmp_path):
    # The small run's step needs about 3 MB; allow 2. (remat=true: only grad_accum is searched.)
    limit = ("trainer.memory_limit_gb=0.002", "trainer.remat=true")
    with pytest.raises(OutOfMemory) as err:
        _train_without_data(tmp_path, *limit)
    message = str(err.value)
    assert "per device (XLA compiled memory analysis) but trainer.memory_limit_gb is" in message
    assert "these overrides fit (compiled and measured): trainer.grad_accum=" in message
    fitting = message.split("trainer.grad_accum=")[1].split(" ")[0]
    # The suggested setting passes the check (and then finds no data: nothing was loaded before).
    with pytest.raises(DataError):
        _train_without_data(tmp_path, *limit, f"trainer.grad_accum={fitting}")


def test_compile_out_of_memory_is_a_preflight_that_names_what_fits(tmp_path, monkeypatch):
    # On a GPU, compiling a step far too large already fails (the autotuner's trial buffers);
    # seen on an H200: task=listops trainer.batch_size=2048. Here compiling the steps with
    # grad_accum < 4 fails that way, as XLA words it.
    import lra.train.compile
    import lra.train.memory

    compile_steps = lra.train.compile.compile_steps
    tried = []

    def compile_on_a_small_gpu(cfg, *args, **kwargs):
        accum = int(cfg.trainer.grad_accum)
        tried.append(accum)
        if accum < 4:
            raise jax.errors.JaxRuntimeError(
                "RESOURCE_EXHAUSTED: Failed to get configs for: 2 out of 24 instructions. See "
                "logs for all failures. Example failure: \nOut of memory while trying to "
                "allocate 244.40GiB with allocator GPU_0_bfc on device 0."
            )
        return compile_steps(cfg, *args, **kwargs)

    monkeypatch.setattr(lra.train.compile, "compile_steps", compile_on_a_small_gpu)
    monkeypatch.setattr(lra.train.memory, "compile_steps", compile_on_a_small_gpu)
    with pytest.raises(OutOfMemory) as err:
        _train_without_data(tmp_path, "trainer.memory_limit_gb=1", "trainer.remat=true")
    message = str(err.value)
    assert message.startswith(
        "the steps do not compile in the device's memory (XLA: Out of memory while trying to "
        "allocate 244.40GiB; trainer.memory_limit_gb is 1.0 GB); these overrides fit "
        "(compiled and measured): trainer.grad_accum=4 ("
    ), message
    assert tried[0] == 1 and 4 in tried
    # Without the pre-flight, the same failure is one clean error too.
    with pytest.raises(OutOfMemory, match="ran out of memory: Out of memory while trying"):
        _train_without_data(tmp_path, "trainer.preflight=false")


def test_eval_step_in_micro_batches_gives_the_sums_of_the_whole_batch(listops_tiny_dir):
    from lra.data.pipeline import eval_batches
    from lra.data.tasks import load_task
    from lra.train.compile import compile_steps

    cfg = make_config("task=listops_tiny", f"data_dir={listops_tiny_dir}", *SMALL_RUN)
    batch = next(eval_batches(load_task(cfg.task, listops_tiny_dir)["val"], 16))
    sums, rows, memory = {}, {}, {}
    for accum in (1, 4):
        variant = make_config(
            "task=listops_tiny", *SMALL_RUN, "task.arch.dropout=0", f"trainer.grad_accum={accum}"
        )
        compiled = compile_steps(variant, batch, train=False)
        out = compiled.eval_step(compiled.state.params, batch)
        sums[accum] = {k: float(out[k]) for k in ("count", "correct", "loss_sum")}
        rows[accum] = {k: np.asarray(out[k]) for k in ("logits", "pred")}
        memory[accum] = measure.compiled_memory_bytes(compiled.eval_step)
    assert sums[4]["count"] == sums[1]["count"] == 16
    assert sums[4]["correct"] == sums[1]["correct"]
    assert sums[4]["loss_sum"] == pytest.approx(sums[1]["loss_sum"], rel=1e-5)
    # The micro-batches' rows come back in the batch's order (micro-batch k took rows k + 4j).
    assert rows[1]["logits"].shape == rows[4]["logits"].shape == (16, 10)
    np.testing.assert_allclose(rows[4]["logits"], rows[1]["logits"], rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(rows[4]["pred"], np.argmax(rows[1]["logits"], -1))
    assert memory[4] < memory[1]


# Bytes a step would need under each remat policy: 64 MB of activations (split over
# micro-batches) scaled by the policy; "worse" stands for a policy that raises memory, as
# block remat does on XLA's CPU for the official settings (issue 29).
_REMAT_SCALE = {"none": 1.0, "block": 0.5, "attention": 0.75, "dots_no_batch": 0.75, "worse": 1.25}


def _fake_memory(k: int, remat: str) -> int:
    return 8_000_000 + int(64_000_000 * _REMAT_SCALE[remat]) // k


def test_fitting_overrides_are_the_cheapest_that_fit():
    tried = []

    def measured(k, remat):
        tried.append((k, remat))
        return _fake_memory(k, remat)

    found = fitting_overrides(measured, 30_000_000, 32, 1, "none", needed=72_000_000)
    assert found == [
        ("trainer.grad_accum=4", 24_000_000),
        ("trainer.remat=block trainer.grad_accum=2", 24_000_000),
    ]
    assert len(tried) <= 8  # bisection, not every divisor
    policies = ("dots_no_batch", "block")
    assert fitting_overrides(_fake_memory, 57_000_000, 32, 1, False, 72_000_000, policies) == [
        ("trainer.grad_accum=2", 40_000_000),
        ("trainer.remat=dots_no_batch", 56_000_000),
        ("trainer.remat=block", 40_000_000),
    ]
    # true is block: only none and dots_no_batch are other settings.
    assert fitting_overrides(_fake_memory, 41_000_000, 32, 1, True, 40_000_000, policies) == [
        ("trainer.grad_accum=2", 24_000_000)
    ]


def test_preflight_never_offers_a_setting_that_raises_memory():
    policies = ("worse", "block")
    found = fitting_overrides(_fake_memory, 10**9, 32, 1, "none", 72_000_000, policies)
    assert ("trainer.remat=worse", 88_000_000) not in found
    assert ("trainer.remat=block", 40_000_000) in found
    with pytest.raises(OutOfMemory) as err:
        check_fits(72_000_000, 0.05, _fake_memory, 32, 1, "none")
    message = str(err.value)
    assert "these overrides fit (compiled and measured): trainer.grad_accum=2 (72 MB → 40 MB)" in (
        message
    )
    assert "trainer.remat=block (72 MB → 40 MB)" in message
    with pytest.raises(OutOfMemory, match="dropout_rng=threefry micro-batches draw other"):
        check_fits(72_000_000, 0.05, _fake_memory, 32, 1, "none", dropout_rng="threefry")
    with pytest.raises(OutOfMemory, match="norm=batch each micro-batch is normalised by its own"):
        check_fits(72_000_000, 0.05, _fake_memory, 32, 1, "none", batch_norm=True)
    assert "normalised" not in message  # a LayerNorm model: grad_accum changes nothing
    # A run whose policy costs memory is told that none needs less.
    found = fitting_overrides(_fake_memory, 80_000_000, 32, 1, "worse", needed=88_000_000)
    assert ("trainer.remat=none", 72_000_000) in found


def test_preflight_when_nothing_fits():
    with pytest.raises(OutOfMemory, match="no grad_accum/remat setting fits"):
        check_fits(80_000_000, 0.005, _fake_memory, 32, 1, "none")
    check_fits(80_000_000, 0.1, _fake_memory, 32, 1, "none")  # fits: no error


def test_out_of_memory_during_a_run_is_one_clear_error(listops_tiny_dir, tmp_path, monkeypatch):
    import lra.train.loop

    def exhausted(*args, **kwargs):
        raise RuntimeError("RESOURCE_EXHAUSTED: Out of memory while trying to allocate 1.0GiB")

    monkeypatch.setattr(lra.train.loop, "_train", exhausted)
    with pytest.raises(OutOfMemory, match="ran out of memory .* trainer.grad_accum=2"):
        train_small(listops_tiny_dir, tmp_path)


def test_device_memory_reads_the_limit_or_the_ram():
    from lra.train.preflight import device_memory

    assert device_memory(1.5) == (1_500_000_000, "trainer.memory_limit_gb")
    available, source = device_memory(None)
    if jax.default_backend() == "cpu":
        assert source == "available RAM" and available > 0
    else:  # e.g. "NVIDIA H200 bytes_limit" (GPU/TPU memory statistics)
        assert source.endswith(" bytes_limit") and available > 0
    assert measure.is_out_of_memory(RuntimeError("RESOURCE_EXHAUSTED: x"))
