"""LRA Text: IMDB movie-review sentiment at the byte level (REFERENCE sections 1 and 5).

Data: the Large Movie Review Dataset (Maas et al., 2011, "Learning Word Vectors
for Sentiment Analysis"), 25,000 labelled training and 25,000 labelled test
reviews. LRA (Tay et al., 2020) classifies each review from its raw bytes.

Sources, tried in this order by :func:`prepare`:

1. ``task.source.fixture`` set (the ``text_tiny`` task): a small synthetic
   archive in the official layout is built under ``data_dir/fixtures/``
   (:mod:`lra.data.synthetic_archives`) and read like the real one.
2. ``task.source.archive`` set: that local ``aclImdb_v1.tar.gz``.
3. tensorflow-datasets ``imdb_reviews`` when ``task.source.tfds`` is true and
   tfds is installed and can provide it (see :func:`~lra.data.archives.tfds_examples`).
4. ``data_dir/downloads/aclImdb_v1.tar.gz``, downloaded from ``task.source.url``
   when absent and checked against ``task.source.sha256``.

Archive format (``aclImdb_v1.tar.gz``, gzip tar): reviews are the members
``aclImdb/{train,test}/{pos,neg}/<id>_<rating>.txt``, one UTF-8 review per
file; ``pos`` is label 1 and ``neg`` label 0. Everything else (``train/unsup``,
``imdb.vocab``, ``*.feat``, ``urls_*.txt``, ``README``) is ignored. Each text is
stripped of surrounding whitespace, as tensorflow-datasets does, so both
sources give the same bytes. Within a split, reviews are sorted by member path,
so the result does not depend on the archive's member order.

Prepared form (:mod:`lra.data.store`): splits train (25,000) and val = test
(the same 25,000 test reviews, stored as the official LRA code uses them),
``tokens uint16[N, stored_length]``
with token = byte + 1 and 0 = padding (:func:`~lra.data.encoding.encode_bytes`),
``lengths int32[N]``, ``labels int32[N]``. Reviews are stored at
``task.source.stored_length`` (4000) bytes; the task's ``max_length`` (4000, or
1000 as in the official config) cuts them at load time, so both lengths share
one prepared folder. ``meta.json`` records the source, the archive's SHA-256
and the time taken. Preparation reads one compressed stream, so
``num_workers`` is not used.

IMDB has no validation split: the stored val (the test reviews, kept so the
store has the same three splits as every task) is not what a run validates on.
The validation split is chosen at load time by ``task.val_source``
(:func:`lra.data.tasks.load_task`): ``train`` (the default)
holds out a fixed, seeded ``task.val_fraction`` of the stored train split and
trains on the rest; ``test`` validates on the test reviews, as the official
LRA code does.
"""

from __future__ import annotations

import time
from pathlib import Path, PurePosixPath

import numpy as np

from lra.data.archives import iter_tar_members, read_source, tfds_examples
from lra.data.encoding import encode_bytes
from lra.data.split import Split
from lra.data.store import is_prepared, prepared_dir, write_prepared
from lra.data.synthetic_archives import write_imdb_archive
from lra.errors import DataError

ARCHIVE_NAME = "aclImdb_v1.tar.gz"
SPLITS = ("train", "test")
LABELS = {"neg": 0, "pos": 1}
NUM_CLASSES = 2


def review_key(path: PurePosixPath) -> tuple[str, int] | None:
    """``(split, label)`` of a labelled review member ``.../{train,test}/{pos,neg}/*.txt``."""
    parts = path.parts
    if len(parts) < 3 or not parts[-1].endswith(".txt"):
        return None
    split, folder = parts[-3], parts[-2]
    if split in SPLITS and folder in LABELS:
        return split, LABELS[folder]
    return None


def read_imdb_archive(archive: Path) -> dict[str, tuple[list[bytes], np.ndarray]]:
    """Read an ``aclImdb_v1.tar.gz`` as ``{"train", "test"} -> (texts, int32 labels)``.

    Texts are whitespace-stripped bytes, sorted by member path within a split.
    """
    rows: dict[str, list[tuple[str, int, bytes]]] = {s: [] for s in SPLITS}
    for path, data in iter_tar_members(archive, select=lambda p: review_key(p) is not None):
        split, label = review_key(path)
        rows[split].append((str(path), label, data.strip()))
    out = {}
    for split in SPLITS:
        found = rows[split]
        if {label for _, label, _ in found} != {0, 1}:
            raise DataError(
                f"archive {archive} has no reviews under {split}/pos/*.txt and "
                f"{split}/neg/*.txt; it is not the IMDB archive {ARCHIVE_NAME} (Maas et al. "
                f"2011). Point task.source.archive at the right file, or delete it to download "
                f"it again"
            )
        found.sort(key=lambda row: row[0])
        out[split] = ([text for _, _, text in found], np.array([r[1] for r in found], np.int32))
    return out


def _from_tfds() -> dict[str, tuple[list[bytes], np.ndarray]] | None:
    examples = tfds_examples("imdb_reviews", SPLITS)
    if examples is None:
        return None
    out = {}
    for split in SPLITS:
        texts, labels = [], []
        for ex in examples[split]:
            text = ex["text"]
            texts.append(text.encode("utf-8") if isinstance(text, str) else bytes(text))
            labels.append(int(ex["label"]))
        out[split] = (texts, np.array(labels, np.int32))
    return out


def fixture_archive(task_cfg, data_dir: Path) -> Path:
    """Build the synthetic archive of a tiny task under ``data_dir/fixtures/``; returns it."""
    fixture = task_cfg.source.fixture
    num, seed = int(fixture.num_per_class), int(fixture.seed)
    path = Path(data_dir) / "fixtures" / f"aclImdb_{task_cfg.data_subdir}_n{num}_s{seed}.tar.gz"
    return write_imdb_archive(path, num_per_class=num, seed=seed)


def prepare(task_cfg, data_dir: Path, num_workers: int | None = None) -> Path:
    """Prepare LRA Text into ``prepared_dir(task_cfg, data_dir)``; returns that folder.

    A folder that is already prepared is returned at once. ``num_workers`` is
    accepted for the common interface and not used.
    """
    del num_workers
    data_dir = Path(data_dir)
    folder = prepared_dir(task_cfg, data_dir)
    if is_prepared(folder):
        return folder
    start = time.perf_counter()
    source = task_cfg.source
    raw, meta = read_source(
        task_cfg,
        data_dir,
        archive_name=ARCHIVE_NAME,
        fixture_archive=fixture_archive,
        from_tfds=_from_tfds,
        tfds_name="imdb_reviews",
        read_archive=read_imdb_archive,
    )

    stored_length = int(source.stored_length)
    encoded = {}
    for split in SPLITS:
        texts, labels = raw[split]
        tokens, lengths = encode_bytes(texts, stored_length)
        encoded[split] = Split(inputs=(tokens,), lengths=(lengths,), labels=labels)
        meta[f"{split}_truncated"] = int(sum(len(t) > stored_length for t in texts))
    splits = {"train": encoded["train"], "val": encoded["test"], "test": encoded["test"]}
    meta.update(
        dataset="imdb_reviews (Maas et al. 2011)",
        encoding="utf-8 byte + 1, 0 = padding",
        labels="neg=0 pos=1",
        val_is_test=True,
        seconds=round(time.perf_counter() - start, 3),
    )
    return write_prepared(folder, splits, meta)
