"""LRA Pathfinder and Path-X: read image folders in the official layout into the store.

Source: the Pathfinder task (Linsley et al. 2018, "Learning long-range spatial
dependencies with horizontal gated recurrent units") as used by Long-Range
Arena (Tay et al. 2020): is there a path between the two marker discs? Pathfinder
is 32x32 (1024 tokens) and Path-X 128x128 (16384 tokens), both at difficulty
``curv_contour_length_14`` ("hard"); REFERENCE sections 1, 2 and 4.

Folder layout (the release archive's, and what :mod:`lra.data.pathfinder_gen`
writes): ``pathfinder{res}/{difficulty}/imgs/<batch>/sample_<i>.png`` and
``metadata/<batch>.npy``. Despite the suffix a metadata file is text: one line
per image, space separated, field 0 = subdirectory (``imgs/<batch>``), field 1
= file name, field 3 = label (0 or 1); for example
``imgs/0 sample_0.png 0 0 1.0 6 2 2 0.5 1 1``. (A real ``.npy`` holding a 2-D
string array is read too.) Entries are sorted by batch number, then sample
index, numerically, so the order never depends on the file system.

Images are read with Pillow as 8-bit grayscale. Tokens are the pixel values
0..255, row major, ``uint8[N, side * side]``; 0 (black) is a real pixel, so
every row has the full length. An empty (0-byte), missing or undecodable image
is skipped and counted, with a warning naming the first few (the official
archive has one empty image, ``pathfinder32/curv_baseline/imgs/0/sample_172.png``);
more than ``max(100, 1%)`` of them means the folder is incomplete, an error. An
image of the wrong size is an error naming the file. ``resize_to`` (tiny
variants only) downsamples by averaging ``res/resize_to`` square blocks.

Decoding one 32-px PNG takes about 0.13 ms (about 7,600 images/s on one core
here; 128-px: about 3,900/s), so large folders are decoded in a pool of
``num_workers`` processes.

:func:`prepare` reads ``pathfinder{res}/{difficulty}`` of an extracted
``lra_release`` in ``data_dir`` (either nesting level) or, when there is none,
generates the folder with :func:`lra.data.pathfinder_gen.write_pathfinder`
(resumable: a killed ``lra-data`` continues where it stopped), then splits the
images by a seeded permutation into 80% / 10% / 10% train / val / test and
writes the prepared store (:mod:`lra.data.store`). Preparing holds the pixel
array once (rows are permuted in place): 200 MB for 200k Pathfinder images,
3.3 GB for 200k Path-X images.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import re
import sys
import time
import warnings
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path

import numpy as np

from lra.data.release import release_candidates
from lra.data.split import Split
from lra.data.store import is_prepared, prepared_dir, write_prepared
from lra.data.workers import worker_count
from lra.errors import ConfigError, DataError

logger = logging.getLogger(__name__)

DIFFICULTY_NAMES = ("curv_baseline", "curv_contour_length_9", "curv_contour_length_14")
VOCAB_SIZE = 256
NUM_CLASSES = 2
#: val and test are each ``n // 10`` images; train is the rest (80% for n divisible by 10).
HOLDOUT_DIVISOR = 10
#: Images per task handed to a decoding process.
DECODE_CHUNK = 2000
#: Folders with fewer images are decoded in this process (a pool costs ~1 s to start).
POOL_MIN_IMAGES = 20000
#: Skipped images tolerated: more than max(this, 1% of the folder) is an error.
MAX_SKIPPED_ABS = 100
DATASET_NAME = "LRA Pathfinder / Path-X (Linsley et al. 2018; Tay et al. 2020)"
_NUMPY_MAGIC = b"\x93NUMPY"


def _say(message: str, progress: bool) -> None:
    if progress:
        print(message, file=sys.stderr, flush=True)
    else:
        logger.info(message)


def _natural_key(text: str) -> tuple:
    """Sort key comparing runs of digits as numbers: ``imgs/2 < imgs/10``."""
    parts = re.split(r"(\d+)", text)
    return tuple(int(p) if i % 2 else p for i, p in enumerate(parts))


# ---------------------------------------------------------------------------
# Metadata


def _metadata_rows(path: Path) -> list[list[str]]:
    data = path.read_bytes()
    if data.startswith(_NUMPY_MAGIC):
        try:
            array = np.load(path, allow_pickle=False)
        except (ValueError, OSError) as err:
            raise DataError(f"cannot read metadata file {path}: {err}") from None
        if array.ndim != 2 or array.dtype.kind not in "US":
            raise DataError(
                f"metadata file {path} is a .npy array of {array.dtype} {array.shape}; "
                "expected text lines or a 2-D string array"
            )
        return [[str(x) for x in row] for row in array.tolist()]
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise DataError(
            f"metadata file {path} is neither text lines nor a .npy string array"
        ) from None
    return [line.split() for line in text.splitlines()]


def read_metadata(folder: Path) -> list[tuple[str, int]]:
    """``(path relative to folder, label)`` of every image listed in ``folder/metadata``,
    sorted by batch number then sample index; duplicates listed once."""
    folder = Path(folder)
    meta_dir = folder / "metadata"
    files = sorted(meta_dir.glob("*.npy"), key=lambda p: _natural_key(p.name))
    if not files:
        raise DataError(
            f"{meta_dir} holds no metadata files (*.npy); {folder} is not a Pathfinder folder "
            "in the official layout (imgs/<batch>/sample_<i>.png + metadata/<batch>.npy)"
        )
    entries: dict[tuple[str, str], int] = {}
    for path in files:
        for lineno, fields in enumerate(_metadata_rows(path), 1):
            if not fields:
                continue
            if len(fields) < 4:
                raise DataError(
                    f"{path}, line {lineno}: expected at least 4 space-separated fields "
                    f"(subdir, file name, _, label), found {len(fields)}"
                )
            try:
                label = float(fields[3])
            except ValueError:
                label = -1.0
            if label not in (0.0, 1.0):
                raise DataError(f"{path}, line {lineno}: label {fields[3]!r} is not 0 or 1")
            entries.setdefault((fields[0], fields[1]), int(label))
    ordered = sorted(entries.items(), key=lambda e: (_natural_key(e[0][0]), _natural_key(e[0][1])))
    return [(f"{subdir}/{name}", label) for (subdir, name), label in ordered]


# ---------------------------------------------------------------------------
# Images


def _block_average(image: np.ndarray, side: int) -> np.ndarray:
    factor = image.shape[0] // side
    blocks = image.reshape(side, factor, side, factor).astype(np.uint32).sum(axis=(1, 3))
    area = factor * factor
    return ((blocks + area // 2) // area).astype(np.uint8)


def _decode_chunk(
    args: tuple[list[str], int, int | None],
) -> tuple[np.ndarray, np.ndarray, list[tuple[int, str]]]:
    """Decode PNGs -> ``(uint8[n, side*side], bool[n] ok, [(index, reason)] skipped)``."""
    from PIL import Image

    paths, resolution, resize_to = args
    side = resize_to or resolution
    tokens = np.zeros((len(paths), side * side), np.uint8)
    ok = np.zeros(len(paths), bool)
    skipped: list[tuple[int, str]] = []
    for i, path in enumerate(paths):
        try:
            if os.path.getsize(path) == 0:
                skipped.append((i, "empty file"))
                continue
            with Image.open(path) as image:
                size = image.size
                if size != (resolution, resolution):
                    raise DataError(
                        f"{path} is {size[0]}x{size[1]} pixels; expected "
                        f"{resolution}x{resolution} for pathfinder{resolution}"
                    )
                pixels = np.asarray(image if image.mode == "L" else image.convert("L"))
        except FileNotFoundError:
            skipped.append((i, "missing"))
            continue
        except (OSError, SyntaxError, ValueError, EOFError) as err:
            skipped.append((i, f"unreadable ({type(err).__name__}: {err})"))
            continue
        if resize_to:
            pixels = _block_average(pixels, resize_to)
        tokens[i] = pixels.reshape(-1)
        ok[i] = True
    return tokens, ok, skipped


def _decode_all(jobs: list, workers: int, progress: bool):
    total = sum(len(job[0]) for job in jobs)
    bar = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(total=total, desc="decoding images", unit="img", file=sys.stderr)
    try:
        if workers <= 1 or len(jobs) <= 1:
            for job in jobs:
                result = _decode_chunk(job)
                if bar is not None:
                    bar.update(len(job[0]))
                yield result
            return
        # "spawn": the caller may have started JAX threads, which fork would copy.
        ctx = multiprocessing.get_context("spawn")
        with ProcessPoolExecutor(max_workers=min(workers, len(jobs)), mp_context=ctx) as pool:
            try:
                for job, result in zip(jobs, pool.map(_decode_chunk, jobs), strict=True):
                    if bar is not None:
                        bar.update(len(job[0]))
                    yield result
            except BrokenProcessPool as err:
                raise DataError(
                    "Pathfinder decoding processes died; if you call this from a script, "
                    "guard the call with `if __name__ == '__main__':` (workers are "
                    f"spawned), or set num_workers=1 ({err})"
                ) from err
    finally:
        if bar is not None:
            bar.close()


def read_pathfinder_folder(
    folder: Path,
    resolution: int,
    *,
    resize_to: int | None = None,
    num_workers: int | None = None,
    progress: bool = False,
) -> tuple[np.ndarray, np.ndarray, int]:
    """Read one difficulty folder of the official layout.

    Returns ``(tokens uint8[N, side*side], labels int32[N], skipped)`` with
    ``side = resize_to or resolution``, rows in metadata order (batch, then
    sample index) minus the ``skipped`` empty, missing or unreadable images
    (warned about). A wrong-size image raises :class:`DataError`.
    ``num_workers`` (None = all cores) decoding processes are used for folders
    of at least ``POOL_MIN_IMAGES`` images.
    """
    folder = Path(folder)
    resolution = int(resolution)
    if resize_to is not None:
        resize_to = int(resize_to)
        if resize_to < 1 or resolution % resize_to:
            raise ConfigError(
                f"resize_to={resize_to} must divide the resolution {resolution} "
                "(images are downsampled by averaging square blocks)"
            )
        if resize_to == resolution:
            resize_to = None
    side = resize_to or resolution
    entries = read_metadata(folder)
    paths = [str(folder / rel) for rel, _ in entries]
    labels_all = np.array([label for _, label in entries], np.int32)
    n = len(paths)
    workers = worker_count(num_workers)
    if n < POOL_MIN_IMAGES:
        workers = 1
    jobs = [(paths[i : i + DECODE_CHUNK], resolution, resize_to) for i in range(0, n, DECODE_CHUNK)]
    tokens = np.empty((n, side * side), np.uint8)
    keep = np.zeros(n, bool)
    skipped: list[tuple[str, str]] = []
    cursor = 0
    start = 0
    for chunk_tokens, ok, chunk_skipped in _decode_all(jobs, workers, progress):
        count = int(ok.sum())
        tokens[cursor : cursor + count] = chunk_tokens[ok]
        keep[start : start + len(ok)] = ok
        skipped.extend((paths[start + i], reason) for i, reason in chunk_skipped)
        cursor += count
        start += len(ok)
    if skipped:
        shown = "; ".join(f"{path} ({reason})" for path, reason in skipped[:5])
        message = (
            f"skipped {len(skipped)} of {n} Pathfinder images in {folder} that are empty, "
            f"missing or unreadable: {shown}{' ...' if len(skipped) > 5 else ''}"
        )
        if len(skipped) > max(MAX_SKIPPED_ABS, n // 100) or cursor == 0:
            raise DataError(
                f"{message}; the folder looks incomplete: re-extract the archive or delete "
                "the generated folder and prepare again"
            )
        warnings.warn(message, stacklevel=2)
        logger.warning(message)
    return tokens[:cursor], labels_all[keep], len(skipped)


# ---------------------------------------------------------------------------
# Splitting and preparing


def split_indices(n: int, seed: int) -> dict[str, np.ndarray]:
    """Seeded 80/10/10 split of ``range(n)``: ``{"train", "val", "test"} -> sorted int64 indices``.

    val and test get ``n // 10`` examples each, train the rest; the same
    ``(n, seed)`` always gives the same split.
    """
    order = np.random.default_rng(int(seed)).permutation(n)
    holdout = n // HOLDOUT_DIVISOR
    n_train = n - 2 * holdout
    return {
        "train": np.sort(order[:n_train]),
        "val": np.sort(order[n_train : n_train + holdout]),
        "test": np.sort(order[n_train + holdout :]),
    }


def permute_rows_in_place(array: np.ndarray, order: np.ndarray) -> None:
    """``array[:] = array[order]`` for a permutation ``order``, holding one row extra, not
    a second copy of ``array`` (follows the permutation's cycles)."""
    done = np.zeros(len(order), bool)
    for start in range(len(order)):
        if done[start]:
            continue
        done[start] = True
        if order[start] == start:
            continue
        saved = array[start].copy()
        j = start
        while order[j] != start:
            array[j] = array[order[j]]
            j = int(order[j])
            done[j] = True
        array[j] = saved


def find_pathfinder_dir(data_dir: Path, resolution: int, difficulty: str) -> Path | None:
    """``pathfinder{res}/{difficulty}`` with a ``metadata`` folder under ``data_dir``
    (directly or at either ``lra_release`` nesting level), else None."""
    for candidate in release_candidates(data_dir, f"pathfinder{resolution}/{difficulty}"):
        if (candidate / "metadata").is_dir():
            return candidate
    return None


def _check_source(src) -> tuple[int, str]:
    resolution = int(src.resolution)
    difficulty = str(src.difficulty)
    if difficulty not in DIFFICULTY_NAMES:
        raise ConfigError(
            f"task.source.difficulty={difficulty!r} is not one of {', '.join(DIFFICULTY_NAMES)}"
        )
    if resolution < 1:
        raise ConfigError(f"task.source.resolution must be positive, got {resolution}")
    return resolution, difficulty


def _source_folder(task_cfg, data_dir: Path, num_workers: int | None) -> tuple[Path, dict]:
    src = task_cfg.source
    resolution, difficulty = _check_source(src)
    explicit = src.get("folder")
    if explicit:
        folder = Path(str(explicit)).expanduser()
        if not (folder / "metadata").is_dir():
            raise DataError(
                f"task.source.folder={folder} has no metadata folder; point it at a "
                f"pathfinder{resolution}/{difficulty} folder of the official layout"
            )
        return folder, {"source_kind": "task.source.folder"}
    if src.get("use_release", True):
        found = find_pathfinder_dir(data_dir, resolution, difficulty)
        if found is not None:
            return found, {"source_kind": "extracted lra_release"}
        why = f"no pathfinder{resolution}/{difficulty} folder of an lra_release under {data_dir}"
    else:
        why = "task.source.use_release=false"
    from lra.data.pathfinder_gen import write_pathfinder

    root = Path(data_dir) / str(src.get("generated_root") or "generated")
    num_images = int(src.num_images)
    seed = int(src.seed)
    generation = {
        "root": str(root),
        "num_images": num_images,
        "seed": seed,
        "images_per_batch": int(src.get("images_per_batch") or 1000),
    }
    _say(
        f"{why}: generating {num_images} pathfinder{resolution}/{difficulty} images under "
        f"{root} (resumable: if stopped, run the same command again)",
        True,
    )
    folder = write_pathfinder(
        root,
        resolution,
        difficulty,
        num_images,
        seed=seed,
        images_per_batch=generation["images_per_batch"],
        num_workers=num_workers,
        progress=True,
    )
    return Path(folder), {
        "source_kind": "generated (lra.data.pathfinder_gen)",
        "generation": generation,
    }


def prepare(task_cfg, data_dir: Path, num_workers: int | None = None) -> Path:
    """Prepare Pathfinder / Path-X into ``data_dir/prepared/<task.data_subdir>``; returns it.

    Does nothing when that folder is already prepared (delete it to re-prepare).
    """
    data_dir = Path(data_dir)
    out = prepared_dir(task_cfg, data_dir)
    if is_prepared(out):
        return out
    src = task_cfg.source
    resolution, difficulty = _check_source(src)
    resize_to = src.get("resize_to")
    side = int(resize_to or resolution)
    if side * side != int(task_cfg.max_length):
        raise ConfigError(
            f"task.max_length={task_cfg.max_length} does not match the {side}x{side} images "
            f"({side * side} pixels) that task.source describes"
        )
    start = time.perf_counter()
    folder, meta = _source_folder(task_cfg, data_dir, num_workers)
    _say(f"reading Pathfinder images from {folder}", True)
    tokens, labels, skipped = read_pathfinder_folder(
        folder, resolution, resize_to=resize_to, num_workers=num_workers, progress=True
    )
    n = len(labels)
    if n < HOLDOUT_DIVISOR:
        raise DataError(
            f"{folder} has only {n} readable images; a train/val/test split needs at least "
            f"{HOLDOUT_DIVISOR}"
        )
    split_seed = int(src.get("split_seed", 0))
    index = split_indices(n, split_seed)
    # Reorder rows in place (train, then val, then test) so the splits are views, not copies:
    # Path-X holds 3.3 GB of pixels for 200k images.
    order = np.concatenate([index["train"], index["val"], index["test"]])
    permute_rows_in_place(tokens, order)
    labels = labels[order]
    splits = {}
    start_row = 0
    for name in ("train", "val", "test"):
        rows = slice(start_row, start_row + len(index[name]))
        lengths = np.full(len(index[name]), side * side, np.int32)
        splits[name] = Split(inputs=(tokens[rows],), lengths=(lengths,), labels=labels[rows])
        start_row = rows.stop
    meta = {
        **meta,
        "dataset": DATASET_NAME,
        "source": str(folder),
        "resolution": resolution,
        "difficulty": difficulty,
        "resize_to": None if resize_to is None else int(resize_to),
        "images_read": n,
        "skipped_images": skipped,
        "split": "seeded permutation: val, test = n // 10 each, train the rest",
        "split_seed": split_seed,
        "encoding": "grayscale pixel 0..255, row major; every pixel is a real token",
        "seconds": round(time.perf_counter() - start, 3),
    }
    return write_prepared(out, splits, meta)
