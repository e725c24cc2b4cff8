"""Task dispatch: from a task config to prepared data on disk and loaded splits.

Each dataset kind (``task.dataset`` in the config) has a ``prepare`` function
that writes its data under ``data_dir`` and a ``load`` function that reads it
back as ``{"train", "val", "test"} -> Split``. Nothing here knows a model.
"""

import os
from pathlib import Path

from lra.data import listops
from lra.data.split import Split
from lra.errors import ConfigError


def default_data_dir() -> Path:
    """``$LRA_DATA_DIR``, else ``$XDG_CACHE_HOME/lra``, else ``~/.cache/lra``."""
    if os.environ.get("LRA_DATA_DIR"):
        return Path(os.environ["LRA_DATA_DIR"]).expanduser()
    cache = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(cache).expanduser() / "lra"


def resolve_data_dir(data_dir: str | Path | None) -> Path:
    """The data folder a run uses: the given one, or :func:`default_data_dir`."""
    if data_dir in (None, ""):
        return default_data_dir().resolve()
    return Path(data_dir).expanduser().resolve()


def prepare_command(task_name: str, data_dir: Path) -> str:
    """The exact command that prepares ``task_name`` into ``data_dir``."""
    return f"lra-data task={task_name} data_dir={data_dir}"


def _dataset(task_cfg) -> str:
    kind = task_cfg.get("dataset")
    if kind not in DATASETS:
        raise ConfigError(
            f"task {task_cfg.get('name')!r} has dataset {kind!r}, which the harness does not "
            f"know; known datasets: {', '.join(sorted(DATASETS))}"
        )
    return kind


def prepare_task(task_cfg, data_dir: Path, *, num_workers: int | None = None) -> Path:
    """Prepare the data of a task into ``data_dir``; returns the folder it lives in."""
    return DATASETS[_dataset(task_cfg)]["prepare"](task_cfg, data_dir, num_workers)


def load_task(task_cfg, data_dir: Path) -> dict[str, Split]:
    """Load the train/val/test splits of a prepared task."""
    kind = _dataset(task_cfg)
    return DATASETS[kind]["load"](task_cfg, data_dir, prepare_command(task_cfg.name, data_dir))


def _prepare_listops(task_cfg, data_dir: Path, num_workers: int | None) -> Path:
    found = listops.find_listops_dir(data_dir, task_cfg.data_subdir)
    if found is not None:
        return found
    gen = task_cfg.generator
    return listops.write_listops(
        data_dir / task_cfg.data_subdir,
        num_train=gen.num_train,
        num_val=gen.num_val,
        num_test=gen.num_test,
        min_length=gen.min_length,
        max_length=gen.max_length,
        max_depth=gen.max_depth,
        max_args=gen.max_args,
        seed=gen.seed,
        num_workers=num_workers,
    )


def _load_listops(task_cfg, data_dir: Path, command: str) -> dict[str, Split]:
    return listops.load_listops(data_dir, task_cfg.data_subdir, task_cfg.max_length, command)


DATASETS = {
    "listops": {"prepare": _prepare_listops, "load": _load_listops},
}
