"""Shared fixtures: composed configs and a small prepared ListOps data folder."""

import os
import signal

# A suite started in the background by a shell without job control (`(pytest ... &)`) inherits
# SIGINT ignored, as POSIX shells ignore it for asynchronous commands, and so would every
# subprocess the tests start: the Ctrl-C tests need Python's own handler (seen 2026-12-05).
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

os.environ.setdefault("JAX_PLATFORMS", "cpu")
# On a GPU (JAX_PLATFORMS=cuda, as scripts/gpu_check.sh runs the tests) float32 matmuls default
# to TF32, whose rounding differs in the 4th-5th digit between two orders of the same sums
# (seen on an H200): the tests compare formulas and equal runs, so they run full float32.
if os.environ["JAX_PLATFORMS"] != "cpu":
    os.environ.setdefault("JAX_DEFAULT_MATMUL_PRECISION", "highest")
# On a CPU, XLA's backend without LLVM optimisation: it changes how fast a compiled program
# runs, not what it computes or how much memory XLA's analysis gives it, and it cuts the
# suite's compile time 2-4x (tests/test_ssm_lru_mamba.py: 142 -> 75 s; seen 2026-12-05).
# Subprocesses inherit it; lra.measure.conformance compiles its checks the same way.
elif "xla_backend_optimization_level" not in os.environ.get("XLA_FLAGS", ""):
    flags = os.environ.get("XLA_FLAGS", "")
    os.environ["XLA_FLAGS"] = f"{flags} --xla_backend_optimization_level=0".strip()
# Many tests compile the same small programs: let them share XLA's persistent cache
# (subprocesses inherit it through the environment). A fresh folder per test session.
if "JAX_COMPILATION_CACHE_DIR" not in os.environ:
    import atexit
    import shutil
    import tempfile

    os.environ["JAX_COMPILATION_CACHE_DIR"] = tempfile.mkdtemp(prefix="lra-test-jax-cache-")
    atexit.register(shutil.rmtree, os.environ["JAX_COMPILATION_CACHE_DIR"], True)
    os.environ["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] = "0"
    os.environ["JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES"] = "0"

from lra.device import measure  # noqa: E402

measure.configure_cpu_memory_analysis()

import shutil  # noqa: E402
import subprocess  # noqa: E402
from pathlib import Path  # noqa: E402

import pytest  # noqa: E402
from hydra import compose, initialize_config_dir  # noqa: E402

from lra.cli import CONFIG_DIR  # noqa: E402
from lra.data.tasks import prepare_task  # noqa: E402

# The Figure-1 model shrunk for the PyTorch-twin scripts' tests (compare_pytorch, dense_floor):
# 2 layers (TransNormer's split then has one Diag and one Norm layer).
TWIN_TINY = [
    "task.arch.num_layers=2",
    "task.arch.dim=32",
    "task.arch.qkv_dim=32",
    "task.arch.num_heads=2",
    "task.arch.mlp_dim=64",
]
# A ListOps-tiny data set small enough to generate in a second.
SMALL_DATA = [
    "task.generator.num_train=256",
    "task.generator.num_val=64",
    "task.generator.num_test=64",
]
# A model and loop small enough to train a few steps in seconds.
SMALL_RUN = [
    "trainer.num_steps=4",
    "trainer.batch_size=16",
    "trainer.eval_every=2",
    "trainer.log_every=1",
    "trainer.warmup_steps=2",
    "trainer.progress=false",
    "task.arch.num_layers=1",
    "task.arch.dim=16",
    "task.arch.qkv_dim=16",
    "task.arch.mlp_dim=32",
    "task.arch.num_heads=2",
]


def make_config(*overrides: str):
    """The composed lra-train config with ``overrides``, as Hydra would build it."""
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3"):
        return compose(config_name="config", overrides=list(overrides))


def train_small(data_dir, results_dir, *overrides: str) -> dict:
    """``train_and_evaluate`` of the small listops_tiny run, with ``overrides`` last."""
    from lra.train.loop import train_and_evaluate

    cfg = make_config(
        "task=listops_tiny",
        f"data_dir={data_dir}",
        f"results_dir={results_dir}",
        *SMALL_DATA,
        *SMALL_RUN,
        *overrides,
    )
    return train_and_evaluate(cfg)


@pytest.fixture(scope="session")
def listops_tiny_dir(tmp_path_factory):
    """A data_dir holding a small listops_tiny data set."""
    data_dir = tmp_path_factory.mktemp("data")
    cfg = make_config("task=listops_tiny", *SMALL_DATA)
    prepare_task(cfg.task, data_dir, num_workers=1)
    return data_dir


def live_processes_in_group(pgid: int) -> list[int]:
    """Pids of the live (not zombie) processes in process group ``pgid`` (Linux /proc)."""
    alive = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":  # fields[0]: state, [2]: pgrp
            alive.append(int(stat.parent.name))
    return alive


# ---------------------------------------------------------------- the local SLURM cluster

# lra-train -m / lra-tune -m through submitit onto the one node of scripts/slurm_local.sh.
SLURM = [
    "hydra/launcher=slurm",
    "hydra.launcher.gpus_per_node=0",
    "hydra.launcher.cpus_per_task=1",
    "hydra.launcher.mem_gb=2",
    "hydra.launcher.partition=null",
]


def _no_slurm(reason: str) -> None:
    reason += "; start one with `sudo bash scripts/slurm_local.sh`"
    if os.environ.get("CI") == "true":
        pytest.fail(f"CI runs the SLURM tests, but {reason}")
    pytest.skip(reason)


@pytest.fixture(scope="module")
def slurm_node():
    """The name of a SLURM node that takes jobs; skips (fails in CI) without one."""
    if shutil.which("sinfo") is None:
        _no_slurm("no SLURM here (sinfo is not on PATH)")
    out = subprocess.run(
        ["sinfo", "--noheader", "--format=%n %T"], capture_output=True, text=True, timeout=30
    )
    nodes = [line.split() for line in out.stdout.splitlines() if line.strip()]
    ready = [name for name, state in nodes if state.rstrip("*~#") in ("idle", "mixed", "allocated")]
    if out.returncode != 0 or not ready:
        _no_slurm(f"SLURM has no node that takes jobs (sinfo: {out.stdout or out.stderr!r})")
    return ready[0]
