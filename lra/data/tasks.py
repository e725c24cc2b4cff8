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

Validation split (``task.val_source``, applied by :func:`load_task` at load
time to the stored splits, so prepared folders never change):

* ``official``: the task's own validation split, disjoint from test: ListOps
  ``basic_val``, Retrieval ``new_aan_pairs.eval``, Image ``train[90%:]`` (a
  seeded 10% of CIFAR-10 train, made at preparation), Pathfinder / Path-X the
  seeded 10% of the 80/10/10 split. The only value such tasks allow: holding
  out more of train would shrink the training set below the benchmark's, and
  validating on test would select on test where the official code did not.
* ``train``: for data without a validation split (Text / IMDB): a fixed,
  seeded ``task.val_fraction`` of the training split
  (:func:`lra.data.split.hold_out`, seed :data:`lra.data.split.VAL_SPLIT_SEED`,
  independent of the run seed) becomes val, and train is the rest.
* ``test``: val is the test split, as the official LRA code does for Text
  (``trainer.selection=best_val`` then selects on test: reproduction only).

:func:`effective_val_source` is the value a loaded task used.
"""

import importlib
import logging
import os
import shutil
import time
from pathlib import Path

from lra.config.types import ValSource, allowed
from lra.data import listops, store
from lra.data.split import VAL_SPLIT_SEED, Split, hold_out
from lra.errors import ConfigError, DataError

logger = logging.getLogger(__name__)

#: Every ``task.val_source`` value; :func:`allowed_val_sources` says which a task accepts.
VAL_SOURCES = allowed(ValSource)


def default_data_dir() -> Path:
    """``$LRA_DATA_DIR``, else ``$XDG_CACHE_HOME/lra``, else ``~/.cache/lra``."""
    if os.environ.get("LRA_DATA_DIR"):
        return Path(os.environ["LRA_DATA_DIR"]).expanduser()
    cache = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(cache).expanduser() / "lra"


def resolve_data_dir(data_dir: str | Path | None) -> Path:
    """The data folder a run uses: the given one, or :func:`default_data_dir`.

    Raises DataError when the path, or a folder above it, is an existing file:
    data lives in a folder (prepared/, downloads/, fixtures/ inside it).
    """
    if data_dir in (None, ""):
        path, named = default_data_dir().resolve(), "the default data_dir"
        if os.environ.get("LRA_DATA_DIR"):
            named = "data_dir (from $LRA_DATA_DIR)"
    else:
        path, named = Path(data_dir).expanduser().resolve(), "data_dir"
    for folder in (path, *path.parents):
        if folder.exists():
            if not folder.is_dir():
                where = "is a file" if folder == path else f"is inside {folder}, which is a file"
                raise DataError(
                    f"{named} {path} {where}, not a folder; point data_dir at a folder "
                    f"(data_dir=/path/to/folder, created if missing)"
                )
            break
    return path


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
    effective_val_source(task_cfg)  # a bad task.val_source fails here too, not at training
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


def load_task(task_cfg, data_dir: Path, splits=("train", "val", "test")) -> dict[str, Split]:
    """Load the train/val/test splits of a prepared task (verified against its manifest).

    The validation split follows ``task.val_source`` (checked first, before any
    data is read; see the module docstring). Every returned split names the
    stored split and rows it comes from (``Split.origin``, ``Split.rows``). With ``splits``
    ``("train", "val")`` (self-pretraining) no test split is returned and the test split's
    files are never opened.
    """
    source = effective_val_source(task_cfg)
    kind = _dataset(task_cfg)
    wanted = tuple(splits)
    if "test" not in wanted and source == "test":
        raise ConfigError(
            f"task.val_source=test validates on the test split of {task_cfg.name}, which this "
            "stage must not read; use task.val_source=train"
        )
    stored_splits = wanted if source == "official" else ("train", "test")[: 1 + ("test" in wanted)]
    stored = DATASETS[kind]["load"](
        task_cfg,
        data_dir,
        prepare_command(task_cfg.name, data_dir),
        rebuild_command(task_cfg.name, data_dir),
        splits=stored_splits,
    )
    stored = {name: split.with_origin(name) for name, split in stored.items()}
    if source == "official":
        return stored
    if source == "test":
        logger.warning(
            "task %s: validation split = test split (task.val_source=test, the official LRA "
            "code's practice); trainer.selection=best_val then selects on test",
            task_cfg.name,
        )
        return {"train": stored["train"], "val": stored["test"], "test": stored["test"]}
    fraction = float(task_cfg.val_fraction)
    num = len(stored["train"])
    try:
        train, val = hold_out(stored["train"], fraction)
    except ValueError as err:
        raise ConfigError(
            f"task.val_fraction={fraction} cannot split the training split of task "
            f"{task_cfg.name}: {err}; choose a fraction that leaves examples on both sides"
        ) from None
    logger.info(
        "task %s: validation = %d examples held out of the %d of train (task.val_source=train, "
        "task.val_fraction=%s, split seed %d); training on %d",
        task_cfg.name,
        len(val),
        num,
        fraction,
        VAL_SPLIT_SEED,
        len(train),
    )
    return {"train": train, "val": val, **({"test": stored["test"]} if "test" in wanted else {})}


def allowed_val_sources(task_cfg) -> tuple[str, ...]:
    """The ``task.val_source`` values a task accepts: ``official`` alone when its data has a
    validation split, else ``train`` and ``test``."""
    return ("official",) if DATASETS[_dataset(task_cfg)]["official_val"] else ("train", "test")


def effective_val_source(task_cfg) -> str:
    """The validation source a task loads with: ``task.val_source``, checked.

    Raises ConfigError (one line naming the key, the value and the allowed
    values) for an unknown value, a value the task does not allow, or, with
    ``train``, a ``task.val_fraction`` outside (0, 1); and for a
    ``task.val_fraction`` set on a task whose validation split is official.
    A config without the key (written before it existed, e.g. an old run's)
    gets the behaviour it was run with: ``official``, or ``test`` for data with
    no validation split (with a warning).
    """
    allowed = allowed_val_sources(task_cfg)
    name = task_cfg.get("name")
    if "val_source" not in task_cfg:
        if allowed == ("official",):
            return "official"
        logger.warning(
            "task %s sets no task.val_source (a config from before the key existed): "
            "validating on test as such runs did; set task.val_source=train to hold out "
            "part of train instead",
            name,
        )
        return "test"
    source = task_cfg.get("val_source")
    if source not in allowed:
        if source not in VAL_SOURCES:
            why = "is not a known value"
        elif source == "official":
            why = f"is not allowed for task {name}: its data has no official validation split"
        else:
            why = (
                f"is not allowed for task {name}: it has an official validation split, "
                f"disjoint from test, which the benchmark uses"
            )
        raise ConfigError(f"task.val_source={source!r} {why}; allowed: {', '.join(allowed)}")
    fraction = task_cfg.get("val_fraction")
    if source == "train":
        if isinstance(fraction, bool) or not isinstance(fraction, int | float):
            ok = False
        else:
            ok = 0.0 < float(fraction) < 1.0
        if not ok:
            raise ConfigError(
                f"task.val_fraction={fraction!r} is not allowed with task.val_source=train: "
                f"allowed: a number strictly between 0 and 1 (the share of train held out, "
                f"e.g. 0.1)"
            )
    elif source == "official" and fraction is not None:
        raise ConfigError(
            f"task.val_fraction={fraction!r} is not allowed for task {name}, whose validation "
            f"split is official (task.val_source=official); allowed: null"
        )
    return source


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
    task_cfg, data_dir: Path, command: str, rebuild_cmd: str | None = None, splits=store.SPLITS
) -> dict[str, Split]:
    """The stored form when prepared (verified; a damaged one names ``rebuild_cmd``), else
    the TSVs as they are (an official archive)."""
    if store.is_prepared(store.prepared_dir(task_cfg, data_dir)):
        return store.load_prepared(task_cfg, data_dir, command, rebuild_cmd, splits)
    return listops.load_listops(
        data_dir, task_cfg.data_subdir, task_cfg.max_length, command, splits
    )


def _lazy_prepare(module: str):
    """The ``prepare`` of ``lra.data.<module>``, imported on first use."""

    def prepare(task_cfg, data_dir: Path, num_workers: int | None) -> Path:
        prepare_module = importlib.import_module(f"lra.data.{module}")
        return prepare_module.prepare(task_cfg, data_dir, num_workers)

    return prepare


#: Per dataset kind: ``prepare``, ``load`` and ``official_val`` (whether its data has a
#: validation split of its own, disjoint from test; see the module docstring).
DATASETS = {
    "listops": {"prepare": _prepare_listops, "load": _load_listops, "official_val": True},
    "text": {"prepare": _lazy_prepare("text"), "load": store.load_prepared, "official_val": False},
    "image": {"prepare": _lazy_prepare("image"), "load": store.load_prepared, "official_val": True},
    "retrieval": {
        "prepare": _lazy_prepare("retrieval"),
        "load": store.load_prepared,
        "official_val": True,
    },
    "pathfinder": {
        "prepare": _lazy_prepare("pathfinder"),
        "load": store.load_prepared,
        "official_val": True,
    },
}
