"""The prepared-data store: one compact on-disk format shared by every task.

A prepared task is a folder holding, for each split ``s`` in train/val/test:

* ``s.tokens0.npy`` (and ``s.tokens1.npy`` for two-input tasks): ``uint8[N, L]``
  or ``uint16[N, L]`` token ids, padded with 0 past each row's length,
* ``s.lengths0.npy`` (``s.lengths1.npy``): ``int32[N]`` real lengths,
* ``s.labels.npy``: ``int32[N]`` class ids,

plus ``meta.json``: the format version (:data:`FORMAT_VERSION`), the counts per
split, the stored length, the manifest ``files`` (``{"train.tokens0.npy":
{"bytes": 123, "sha256": "..."}, ...}``, one entry per ``.npy`` written) and
whatever the preparer records (source, checksum, split seed, time taken).
Arrays are read memory-mapped, so a multi-gigabyte task costs no RAM until
batches touch it. A stored length longer than the task's ``max_length`` is cut
at load time (Text is stored at 4000 bytes and can be trained at 1000).

Writing is atomic: everything goes to a temporary sibling folder that is renamed
into place only once complete, so an interrupted preparation never leaves a
folder that looks prepared. ``meta.json`` is the completeness marker; a folder
whose ``meta.json`` has another format version (older ones had no manifest)
counts as not prepared.

Integrity: :func:`read_prepared` first calls :func:`verify_prepared`, which
checks every listed file's size (all files: cheap), then its SHA-256, and
raises DataError naming the damaged file and the command that rebuilds the
folder. Hashing reads every byte once: about 1.35 GB/s on one core here from
the page cache, so some 2.4 s for Path-X's 3.3 GB and 2.2 s for Retrieval's
2.9 GB at every load (from a cold disk, the disk's read speed bounds it; the
data is then in the page cache for training).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np

from lra.atomic import atomic_folder
from lra.data.split import Split
from lra.errors import DataError

#: 2: ``meta.json`` lists every file with its size and SHA-256 (``files``).
FORMAT_VERSION = 2
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
    with atomic_folder(folder) as tmp:
        for name in SPLITS:
            split = splits[name]
            for i, (tokens, lengths) in enumerate(zip(split.inputs, split.lengths, strict=True)):
                np.save(tmp / f"{name}.tokens{i}.npy", tokens)
                np.save(tmp / f"{name}.lengths{i}.npy", np.asarray(lengths, np.int32))
            np.save(tmp / f"{name}.labels.npy", np.asarray(split.labels, np.int32))
        files = {
            path.name: {"bytes": path.stat().st_size, "sha256": file_sha256(path)}
            for path in sorted(tmp.glob("*.npy"))
        }
        full_meta = {
            **meta,
            "files": files,
            "format_version": FORMAT_VERSION,
            "num_inputs": len(splits["train"].inputs),
            "stored_length": int(splits["train"].max_length),
            "counts": {name: len(splits[name]) for name in SPLITS},
        }
        (tmp / META_FILE).write_text(json.dumps(full_meta, indent=2, sort_keys=True) + "\n")
    return folder


def file_sha256(path: Path) -> str:
    """The hex SHA-256 digest of the file at ``path``."""
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def _expected_files(meta: dict) -> list[str]:
    names = []
    for name in SPLITS:
        for i in range(int(meta.get("num_inputs", 0))):
            names += [f"{name}.tokens{i}.npy", f"{name}.lengths{i}.npy"]
        names.append(f"{name}.labels.npy")
    return names


def verify_prepared(folder: Path, rebuild_command: str, splits=None) -> None:
    """Raise DataError unless every file ``meta.json`` lists is intact.

    Checks the sizes of all listed files first (cheap), then their SHA-256.
    The message names each damaged file's full path and what is wrong
    (``is missing``; ``is truncated (has N bytes, expected M)``; ``has N
    bytes, expected M``; ``is corrupted: checksum mismatch``) and ends with
    ``rebuild it with: <rebuild_command>``. A folder that is not prepared in the
    current format (no readable ``meta.json`` of :data:`FORMAT_VERSION`) also
    raises.
    """
    folder = Path(folder)
    meta = read_meta(folder)
    fix = f"rebuild it with: {rebuild_command}"
    if meta is None:
        raise DataError(
            f"{folder} holds no prepared data of format version {FORMAT_VERSION} "
            f"(no readable {META_FILE}); {fix}"
        )
    files = meta.get("files")
    if not isinstance(files, dict) or not all(
        isinstance(entry, dict) and {"bytes", "sha256"} <= entry.keys() for entry in files.values()
    ):
        raise DataError(
            f"prepared data in {folder} is damaged: {folder / META_FILE} has no valid file "
            f"list ('files' with bytes and sha256 per file); {fix}"
        )
    unlisted = [name for name in _expected_files(meta) if name not in files]
    if unlisted:
        raise DataError(
            f"prepared data in {folder} is damaged: {folder / META_FILE} does not list "
            f"{', '.join(unlisted)}; {fix}"
        )
    if splits is not None:  # only these splits' files (self-pretraining never opens test)
        files = {k: v for k, v in files.items() if k.split(".")[0] in splits}
    problems = []
    for name, entry in sorted(files.items()):
        path = folder / name
        expected = int(entry["bytes"])
        try:
            size = path.stat().st_size
        except FileNotFoundError:
            problems.append(f"{path} is missing")
            continue
        if size < expected:
            problems.append(f"{path} is truncated (has {size} bytes, expected {expected})")
        elif size != expected:
            problems.append(f"{path} has {size} bytes, expected {expected}")
    if not problems:
        for name, entry in sorted(files.items()):
            path = folder / name
            actual = file_sha256(path)
            if actual != str(entry["sha256"]).lower():
                problems.append(
                    f"{path} is corrupted: checksum mismatch (sha256 {actual}, "
                    f"expected {entry['sha256']})"
                )
    if problems:
        raise DataError(f"prepared data in {folder} is damaged: {'; '.join(problems)}; {fix}")


def read_prepared(
    folder: Path,
    max_length: int,
    command: str,
    rebuild_command: str | None = None,
    splits: tuple[str, ...] = SPLITS,
) -> dict[str, Split]:
    """Load a prepared folder as ``{"train", "val", "test"} -> Split``, memory-mapped
    (only ``splits``: the files of the others are not opened).

    Rows are cut to ``max_length`` (lengths clipped to match). ``command`` is
    the exact preparation command, named in the error when the folder is not
    prepared. The folder is checked with :func:`verify_prepared` before
    anything is read; a damaged folder's error names ``rebuild_command``
    (default: ``command``).
    """
    folder = Path(folder)
    meta = read_meta(folder)
    if meta is None:
        raise DataError(f"no prepared data in {folder}; prepare it with: {command}")
    verify_prepared(folder, command if rebuild_command is None else rebuild_command, splits)
    wanted, splits = splits, {}
    for name in (s for s in SPLITS if s in wanted):
        inputs, lengths = [], []
        for i in range(meta["num_inputs"]):
            tokens = np.load(folder / f"{name}.tokens{i}.npy", mmap_mode="r")
            inputs.append(tokens[:, :max_length])
            n = np.load(folder / f"{name}.lengths{i}.npy")
            lengths.append(np.minimum(n, max_length).astype(np.int32))
        labels = np.load(folder / f"{name}.labels.npy")
        splits[name] = Split(inputs=tuple(inputs), lengths=tuple(lengths), labels=labels)
    return splits


def load_prepared(
    task_cfg,
    data_dir: Path,
    command: str,
    rebuild_command: str | None = None,
    splits: tuple[str, ...] = SPLITS,
) -> dict[str, Split]:
    """:func:`read_prepared` of the task's :func:`prepared_dir`, cut to ``task.max_length``."""
    return read_prepared(
        prepared_dir(task_cfg, data_dir), task_cfg.max_length, command, rebuild_command, splits
    )


def prepared_dir(task_cfg, data_dir: Path) -> Path:
    """Where a task's prepared data lives: ``data_dir/prepared/<task.data_subdir>``.

    Keyed by the data source, not the task name, so tasks that share data (Text
    at 4000 and at 1000) share one prepared folder.
    """
    return Path(data_dir) / "prepared" / task_cfg.data_subdir
