"""The prepared-data store: one compact on-disk format shared by every task.

A prepared task is a folder holding, for each split ``s`` in train/val/test:

* ``s.tokens0.npy`` (and ``s.tokens1.npy`` for two-input tasks): ``uint8[N, L]``
  or ``uint16[N, L]`` token ids, padded with 0 past each row's length,
* ``s.lengths0.npy`` (``s.lengths1.npy``): ``int32[N]`` real lengths,
* ``s.labels.npy``: ``int32[N]`` class ids,

plus ``meta.json``: the format version, the counts per split, the stored length
and whatever the preparer records (source, checksum, split seed, time taken).
Arrays are read memory-mapped, so a multi-gigabyte task costs no RAM until
batches touch it. A stored length longer than the task's ``max_length`` is cut
at load time (Text is stored at 4000 bytes and can be trained at 1000).

Writing is atomic: everything goes to a temporary sibling folder that is renamed
into place only once complete, so an interrupted preparation never leaves a
folder that looks prepared. ``meta.json`` is the completeness marker.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import numpy as np

from lra.data.split import Split
from lra.errors import DataError

FORMAT_VERSION = 1
META_FILE = "meta.json"
SPLITS = ("train", "val", "test")


def token_dtype(max_token: int) -> np.dtype:
    """The smallest unsigned dtype that holds ids up to ``max_token``."""
    return np.dtype(np.uint8) if max_token < 256 else np.dtype(np.uint16)


def read_meta(folder: Path) -> dict | None:
    """The metadata of a prepared folder, or None when it is not (completely) prepared."""
    path = Path(folder) / META_FILE
    if not path.is_file():
        return None
    try:
        meta = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return None
    return meta if meta.get("format_version") == FORMAT_VERSION else None


def is_prepared(folder: Path) -> bool:
    """Whether ``folder`` holds a complete prepared task in the current format."""
    return read_meta(folder) is not None


def write_prepared(folder: Path, splits: dict[str, Split], meta: dict) -> Path:
    """Write ``splits`` (keys train/val/test) and ``meta`` into ``folder``, atomically.

    Returns ``folder``. An existing prepared folder is replaced only after the
    new one is complete.
    """
    folder = Path(folder)
    missing = [s for s in SPLITS if s not in splits]
    if missing:
        raise ValueError(f"write_prepared needs splits {SPLITS}; missing {missing}")
    folder.parent.mkdir(parents=True, exist_ok=True)
    tmp = folder.parent / f"{folder.name}.partial-{os.getpid()}"
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir()
    try:
        for name in SPLITS:
            split = splits[name]
            for i, (tokens, lengths) in enumerate(zip(split.inputs, split.lengths, strict=True)):
                np.save(tmp / f"{name}.tokens{i}.npy", tokens)
                np.save(tmp / f"{name}.lengths{i}.npy", np.asarray(lengths, np.int32))
            np.save(tmp / f"{name}.labels.npy", np.asarray(split.labels, np.int32))
        full_meta = {
            **meta,
            "format_version": FORMAT_VERSION,
            "num_inputs": len(splits["train"].inputs),
            "stored_length": int(splits["train"].max_length),
            "counts": {name: len(splits[name]) for name in SPLITS},
        }
        (tmp / META_FILE).write_text(json.dumps(full_meta, indent=2, sort_keys=True) + "\n")
        if folder.exists():
            old = folder.parent / f"{folder.name}.old-{os.getpid()}"
            os.replace(folder, old)
            os.replace(tmp, folder)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, folder)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return folder


def read_prepared(folder: Path, max_length: int, command: str) -> dict[str, Split]:
    """Load a prepared folder as ``{"train", "val", "test"} -> Split``, memory-mapped.

    Rows are cut to ``max_length`` (lengths clipped to match). ``command`` is
    the exact preparation command, named in the error when the folder is not
    prepared.
    """
    folder = Path(folder)
    meta = read_meta(folder)
    if meta is None:
        raise DataError(f"no prepared data in {folder}; prepare it with: {command}")
    splits = {}
    for name in SPLITS:
        inputs, lengths = [], []
        for i in range(meta["num_inputs"]):
            tokens = np.load(folder / f"{name}.tokens{i}.npy", mmap_mode="r")
            inputs.append(tokens[:, :max_length])
            n = np.load(folder / f"{name}.lengths{i}.npy")
            lengths.append(np.minimum(n, max_length).astype(np.int32))
        labels = np.load(folder / f"{name}.labels.npy")
        splits[name] = Split(inputs=tuple(inputs), lengths=tuple(lengths), labels=labels)
    return splits


def load_prepared(task_cfg, data_dir: Path, command: str) -> dict[str, Split]:
    """:func:`read_prepared` of the task's :func:`prepared_dir`, cut to ``task.max_length``."""
    return read_prepared(prepared_dir(task_cfg, data_dir), task_cfg.max_length, command)


def prepared_dir(task_cfg, data_dir: Path) -> Path:
    """Where a task's prepared data lives: ``data_dir/prepared/<task.data_subdir>``.

    Keyed by the data source, not the task name, so tasks that share data (Text
    at 4000 and at 1000) share one prepared folder.
    """
    return Path(data_dir) / "prepared" / task_cfg.data_subdir
