"""Task dispatch: from a task config to prepared data on disk and loaded splits.

Each dataset kind (``task.dataset`` in the config) has a ``prepare`` function
that writes its data into the prepared-data store (:mod:`lra.data.store`,
``data_dir/prepared/<task.data_subdir>``) and a ``load`` function that reads it
back as ``{"train", "val", "test"} -> Split``. Preparing twice does no work the
second time beyond checking the stored files against the manifest in their
``meta.json`` (sizes and SHA-256, :func:`lra.data.store.verify_prepared`); a
damaged folder raises DataError naming :func:`rebuild_command`, and
``prepare_task(..., rebuild=True)`` prepares the folder again from its sources
(the old one is kept aside until the new one is complete, and restored if
preparing fails). Loading verifies the folder too. Nothing here knows a model.
"""

import importlib
import os
import shutil
import time
from pathlib import Path

from lra.data import listops, store
from lra.data.split import Split
from lra.errors import ConfigError, DataError


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


def rebuild_command(task_name: str, data_dir: Path) -> str:
    """The exact command that prepares ``task_name`` into ``data_dir`` again from its sources."""
    return f"lra-data task={task_name} data_dir={data_dir} rebuild=true"


def _dataset(task_cfg) -> str:
    kind = task_cfg.get("dataset")
    if kind not in DATASETS:
        raise ConfigError(
            f"task {task_cfg.get('name')!r} has dataset {kind!r}, which the harness does not "
            f"know; known datasets: {', '.join(sorted(DATASETS))}"
        )
    return kind


def prepare_task(
    task_cfg, data_dir: Path, *, num_workers: int | None = None, rebuild: bool = False
) -> Path:
    """Prepare the data of a task into ``data_dir``; returns the folder it lives in.

    An already prepared folder is verified (:func:`lra.data.store.verify_prepared`)
    and returned; when it is damaged, DataError names :func:`rebuild_command`.
    With ``rebuild=True`` the folder (damaged or not) is prepared again from its
    sources: the existing one is moved to a sibling ``<name>.aside-<pid>``,
    deleted once the new one is complete, and moved back if preparing raises.
    """
    prepare = DATASETS[_dataset(task_cfg)]["prepare"]
    data_dir = Path(data_dir)
    target = store.prepared_dir(task_cfg, data_dir)
    if not rebuild:
        if store.is_prepared(target):
            store.verify_prepared(target, rebuild_command(task_cfg.name, data_dir))
            return target
        return prepare(task_cfg, data_dir, num_workers)
    if not target.exists():
        return prepare(task_cfg, data_dir, num_workers)
    aside = target.with_name(f"{target.name}.aside-{os.getpid()}")
    if aside.exists():
        shutil.rmtree(aside)
    try:
        os.replace(target, aside)
    except OSError as err:
        raise DataError(
            f"cannot move {target} aside to rebuild it ({err}); delete it and prepare again "
            f"with: {prepare_command(task_cfg.name, data_dir)}"
        ) from None
    try:
        folder = prepare(task_cfg, data_dir, num_workers)
    except BaseException:
        if target.exists():
            shutil.rmtree(target, ignore_errors=True)
        os.replace(aside, target)
        raise
    shutil.rmtree(aside, ignore_errors=True)
    return folder


def load_task(task_cfg, data_dir: Path) -> dict[str, Split]:
    """Load the train/val/test splits of a prepared task (verified against its manifest)."""
    kind = _dataset(task_cfg)
    return DATASETS[kind]["load"](
        task_cfg,
        data_dir,
        prepare_command(task_cfg.name, data_dir),
        rebuild_command(task_cfg.name, data_dir),
    )


def _prepare_listops(task_cfg, data_dir: Path, num_workers: int | None) -> Path:
    """ListOps: find the TSVs (official or generated), else generate them; then store them."""
    target = store.prepared_dir(task_cfg, data_dir)
    if store.is_prepared(target):
        return target
    start = time.perf_counter()
    found = listops.find_listops_dir(data_dir, task_cfg.data_subdir)
    if found is None:
        gen = task_cfg.generator
        found = listops.write_listops(
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
    splits = {
        split: listops.read_tsv(found / name, task_cfg.max_length)
        for split, name in listops.SPLIT_FILES.items()
    }
    meta = {"source": str(found), "seconds": round(time.perf_counter() - start, 3)}
    return store.write_prepared(target, splits, meta)


def _load_listops(
    task_cfg, data_dir: Path, command: str, rebuild_cmd: str | None = None
) -> dict[str, Split]:
    """The stored form when prepared (verified; a damaged one names ``rebuild_cmd``), else
    the TSVs as they are (an official archive)."""
    if store.is_prepared(store.prepared_dir(task_cfg, data_dir)):
        return store.load_prepared(task_cfg, data_dir, command, rebuild_cmd)
    return listops.load_listops(data_dir, task_cfg.data_subdir, task_cfg.max_length, command)


def _lazy_prepare(module: str):
    """The ``prepare`` of ``lra.data.<module>``, imported on first use."""

    def prepare(task_cfg, data_dir: Path, num_workers: int | None) -> Path:
        prepare_module = importlib.import_module(f"lra.data.{module}")
        return prepare_module.prepare(task_cfg, data_dir, num_workers)

    return prepare


DATASETS = {
    "listops": {"prepare": _prepare_listops, "load": _load_listops},
    "text": {"prepare": _lazy_prepare("text"), "load": store.load_prepared},
    "image": {"prepare": _lazy_prepare("image"), "load": store.load_prepared},
    "retrieval": {"prepare": _lazy_prepare("retrieval"), "load": store.load_prepared},
    "pathfinder": {"prepare": _lazy_prepare("pathfinder"), "load": store.load_prepared},
}
