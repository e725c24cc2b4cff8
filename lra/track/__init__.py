"""Watching runs: one small interface, a JSON-lines file always, wandb and TensorBoard on request.

The training loop talks to one :class:`Trackers` object: ``log(step, metrics)`` at
every log line and evaluation, ``summary(values)`` once at the end, ``close()``.
``metrics.jsonl`` in the run folder is always written (:mod:`lra.track.jsonl`);
``logger=wandb``, ``logger=tensorboard`` or ``logger=[wandb,tensorboard]`` add the
backends configured in ``configs/logger/`` (each its own module, imported only when
chosen; a missing package names the extra to install). Only process 0 of a
multi-process run logs.

Scalar names, the same in every backend: ``train/loss``, ``train/accuracy``,
``train/learning_rate`` (the rate the step used), ``train/steps_per_sec`` (the timed window
ending at that step), ``val/accuracy``, ``val/loss``. Test metrics and the record's other
final figures go into the summary (:data:`SUMMARY_KEYS`).

Resuming: a backend is opened with :attr:`RunInfo.resumed_step` ``S``; everything up to
step ``S`` was logged by an earlier session and steps after ``S`` are logged again
(with the same values, since a resumed run repeats itself exactly), so each backend
drops what it holds past ``S`` or skips what it already has: no step appears twice.
"""

import importlib
import importlib.util
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Protocol

from lra.config.schema import SchemaError, key_problem
from lra.config.types import LoggerConfig, TrainConfig
from lra.errors import ConfigError

SUMMARY_KEYS = (
    "test_accuracy",
    "test_loss",
    "val_accuracy",
    "selected_step",
    "train_steps_per_sec",
    "eval_steps_per_sec",
    "peak_memory_bytes",
    "flops_per_step",
    "num_params",
    "wall_seconds",
)
# logger name -> (module, its opening function, the package it imports, the pip extra)
BACKENDS = {
    "wandb": ("lra.track.wandb_backend", "open_wandb", "wandb", "wandb"),
    "tensorboard": (
        "lra.track.tensorboard_backend",
        "open_tensorboard",
        "tensorboardX",
        "tensorboard",
    ),
}

assert set(BACKENDS) == {f.name for f in fields(LoggerConfig)}  # the schema's logger names


@dataclass
class RunInfo:
    """What a backend needs to know of the run it logs."""

    run_dir: Path
    run_key: str
    model: str
    task: str
    seed: int
    config: dict  # the resolved config
    resumed_step: int = 0  # 0 for a fresh run
    group: str | None = None  # the sweep a job belongs to (Hydra's sweep folder), if any
    tags: list = field(default_factory=list)


class Backend(Protocol):
    def log(self, step: int, metrics: dict[str, float]) -> None: ...

    def summary(self, values: dict) -> None: ...

    def close(self) -> None: ...


class MissingExtra(ConfigError):
    """A chosen logger's package is not installed."""


def _backend(name: str) -> tuple[str, str, str, str]:
    """``(module, opener, package, extra)`` of a logger name (a key of ``logger``), or the
    schema's unknown-key error."""
    problem = key_problem(f"logger.{name}", TrainConfig)
    if problem:
        raise SchemaError(problem)
    return BACKENDS[name]


def _missing(name: str) -> MissingExtra:
    _, _, package, extra = BACKENDS[name]
    return MissingExtra(
        f"logger={name} needs the {package} package; install it with: pip install -e '.[{extra}]'"
    )


def check_loggers(logger_cfg: dict | None) -> None:
    """Fail fast (before data and compilation) on an unknown logger or a missing package."""
    for name in logger_cfg or {}:
        if importlib.util.find_spec(_backend(name)[2]) is None:
            raise _missing(name)


def open_backend(name: str, options: dict, info: RunInfo) -> Backend:
    """Open the backend ``name`` (a key of :data:`BACKENDS`) with its ``options``."""
    module, opener, package, _ = _backend(name)
    try:
        return getattr(importlib.import_module(module), opener)(options, info)
    except ModuleNotFoundError as err:
        if err.name and err.name.split(".")[0] == package:
            raise _missing(name) from None
        raise


class Trackers:
    """``metrics.jsonl`` plus the chosen backends, fanned out; silent off process 0."""

    def __init__(self, backends: list[Backend]):
        self.backends = backends

    def log(self, step: int, metrics: dict[str, float]) -> None:
        for backend in self.backends:
            backend.log(step, metrics)

    def summary(self, record: dict) -> None:
        values = {k: record[k] for k in SUMMARY_KEYS if record.get(k) is not None}
        for backend in self.backends:
            backend.summary(values)

    def close(self) -> None:
        for backend in self.backends:
            backend.close()


def sweep_group() -> str | None:
    """The sweep folder of the Hydra multirun this job belongs to, else None."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    if not HydraConfig.initialized() or HydraConfig.get().mode != RunMode.MULTIRUN:
        return None
    return str(HydraConfig.get().sweep.dir)


def open_trackers(logger_cfg: dict | None, info: RunInfo) -> Trackers:
    """The trackers of a run: the JSON-lines file and every backend in ``logger_cfg``."""
    import jax  # here, not at the top: lra-report reads lra.track.jsonl and never imports JAX

    from lra.track.jsonl import JsonLines

    if jax.process_index() != 0:
        return Trackers([])
    backends: list[Backend] = [JsonLines(info)]
    try:
        for name, options in (logger_cfg or {}).items():
            backends.append(open_backend(name, dict(options or {}), info))
    except BaseException:
        Trackers(backends).close()
        raise
    return Trackers(backends)
