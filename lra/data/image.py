"""LRA Image: CIFAR-10 as sequences of grayscale pixels (REFERENCE sections 1 and 5).

Data: CIFAR-10 (Krizhevsky, 2009, "Learning Multiple Layers of Features from
Tiny Images"): 50,000 training and 10,000 test colour images of 32x32 pixels in
10 classes. LRA (Tay et al., 2020) classifies each image from its 1024
grayscale pixels in row-major order.

Sources, tried in this order by :func:`prepare`:

1. ``task.source.fixture`` set (the ``image_tiny`` task): a small synthetic
   archive in the official binary format is built under ``data_dir/fixtures/``
   (:mod:`lra.data.synthetic_archives`) and read like the real one.
2. ``task.source.archive`` set: that local ``cifar-10-binary.tar.gz``.
3. tensorflow-datasets ``cifar10`` when ``task.source.tfds`` is true and tfds is
   installed and can provide it (32x32 only).
4. ``data_dir/downloads/cifar-10-binary.tar.gz``, downloaded from
   ``task.source.url`` when absent and checked against ``task.source.sha256``.

Archive format (the "CIFAR-10 binary version", gzip tar; no pickle involved):
``cifar-10-batches-bin/data_batch_{1..5}.bin`` (10,000 images each) and
``test_batch.bin`` (10,000). Each file is a run of records of
``1 + 3 * S * S`` bytes (S = ``task.source.image_size``, 32 for CIFAR-10, so
3073): one label byte 0-9, then the red, green and blue planes, each S x S row
major. A file whose size is not a multiple of the record length is rejected.
Training batches are concatenated in numerical order, whatever the member order.

Tokens: grayscale ``trunc((0.2989 R + 0.5870 G + 0.1140 B) / 255 * 255.5)``
(:func:`~lra.data.encoding.grayscale`), values 0-255, vocabulary 256. Every
pixel is a real token, a black pixel (0) included: every length is S * S.

Split: the 50,000 training images are permuted by a generator seeded with
``task.source.split_seed`` and the last ``task.source.val_fraction`` (10%) of
the permutation becomes val (5,000), the rest train (45,000); each subset keeps
the original order. Test is ``test_batch`` (10,000). (The official LRA code
takes the unshuffled slices ``train[:90%]`` / ``train[90%:]`` of tfds.) This
is the task's own validation split (``task.val_source=official``, the only
value Image allows, :mod:`lra.data.tasks`): test is never used for validation.

Prepared form (:mod:`lra.data.store`): ``tokens uint8[N, S*S]``, ``lengths
int32[N]`` (all S*S), ``labels int32[N]``; ``meta.json`` records the source,
the archive's SHA-256, the split seed, the counts and the time taken.
Preparation reads one compressed stream, so ``num_workers`` is not used.
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np

from lra.data.archives import iter_tar_members, read_source, tfds_examples
from lra.data.encoding import grayscale
from lra.data.split import Split
from lra.data.store import is_prepared, prepared_dir, write_prepared
from lra.data.synthetic_archives import write_cifar_archive
from lra.errors import ConfigError, DataError

ARCHIVE_NAME = "cifar-10-binary.tar.gz"
TRAIN_BATCHES = tuple(f"data_batch_{i}.bin" for i in range(1, 6))
TEST_BATCH = "test_batch.bin"
NUM_CLASSES = 10
_CHUNK = 4096  # records converted to grayscale at a time (bounds the float64 temporaries)


def record_length(image_size: int) -> int:
    """Bytes per CIFAR binary record: 1 label byte + 3 planes of ``image_size**2``."""
    return 1 + 3 * image_size * image_size


def decode_records(
    data: bytes, image_size: int, *, member: str, archive: Path, num_classes: int = NUM_CLASSES
) -> tuple[np.ndarray, np.ndarray]:
    """CIFAR binary records -> ``(uint8[N, S*S] grayscale tokens, int32[N] labels)``."""
    size = record_length(image_size)
    if not data or len(data) % size:
        raise DataError(
            f"member {member} of {archive} has {len(data)} bytes, which is not a (non-zero) "
            f"multiple of the {size}-byte record (1 label byte + 3 x {image_size}x{image_size} "
            f"pixels). The archive is not the CIFAR-10 binary version at image size "
            f"{image_size} or it is corrupt: delete it and download it again"
        )
    records = np.frombuffer(data, np.uint8).reshape(-1, size)
    labels = records[:, 0].astype(np.int32)
    if labels.max() >= num_classes:
        raise DataError(
            f"member {member} of {archive} has label {labels.max()}, outside 0..{num_classes - 1}; "
            f"the archive is corrupt or not CIFAR-10: delete it and download it again"
        )
    tokens = np.empty((len(records), image_size * image_size), np.uint8)
    for lo in range(0, len(records), _CHUNK):
        planes = records[lo : lo + _CHUNK, 1:].reshape(-1, 3, image_size, image_size)
        tokens[lo : lo + _CHUNK] = grayscale(planes.transpose(0, 2, 3, 1))
    return tokens, labels


def read_cifar_archive(
    archive: Path, image_size: int = 32, num_classes: int = NUM_CLASSES
) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Read a CIFAR-10 binary archive as ``{"train", "test"} -> (uint8 tokens, int32 labels)``.

    ``train`` holds ``data_batch_1..5`` in that order (all 50,000 images).
    """
    wanted = (*TRAIN_BATCHES, TEST_BATCH)
    found: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    for path, data in iter_tar_members(archive, select=lambda p: p.name in wanted):
        if path.name in found:
            raise DataError(
                f"archive {archive} holds {path.name} twice; it is not the CIFAR-10 binary "
                f"archive {ARCHIVE_NAME}"
            )
        found[path.name] = decode_records(
            data, image_size, member=str(path), archive=archive, num_classes=num_classes
        )
    missing = [name for name in wanted if name not in found]
    if missing:
        raise DataError(
            f"archive {archive} lacks {', '.join(missing)}; it is not the CIFAR-10 binary "
            f"version {ARCHIVE_NAME} (cifar-10-batches-bin/*.bin). Point task.source.archive "
            f"at the right file, or delete it to download it again"
        )
    train = [found[name] for name in TRAIN_BATCHES]
    return {
        "train": (np.concatenate([t for t, _ in train]), np.concatenate([y for _, y in train])),
        "test": found[TEST_BATCH],
    }


def split_train_val(num: int, val_fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Indices ``(train, val)`` of ``num`` training images: a seeded permutation, its last
    ``val_fraction`` is val; each index set is returned sorted."""
    if not 0.0 < val_fraction < 1.0:
        raise ConfigError(f"task.source.val_fraction must be in (0, 1); got {val_fraction}")
    perm = np.random.default_rng(seed).permutation(num)
    num_val = max(1, int(round(num * val_fraction)))
    return np.sort(perm[: num - num_val]), np.sort(perm[num - num_val :])


def _from_tfds() -> dict[str, tuple[np.ndarray, np.ndarray]] | None:
    examples = tfds_examples("cifar10", ("train", "test"))
    if examples is None:
        return None
    out = {}
    for split, rows in examples.items():
        images = np.stack([np.asarray(ex["image"], np.uint8) for ex in rows])
        labels = np.array([int(ex["label"]) for ex in rows], np.int32)
        tokens = np.concatenate(
            [grayscale(images[lo : lo + _CHUNK]) for lo in range(0, len(images), _CHUNK)]
        )
        out[split] = (tokens, labels)
    return out


def fixture_archive(task_cfg, data_dir: Path) -> Path:
    """Build the synthetic archive of a tiny task under ``data_dir/fixtures/``; returns it."""
    fixture, size = task_cfg.source.fixture, int(task_cfg.source.image_size)
    per_batch, num_test, seed = int(fixture.num_per_batch), int(fixture.num_test), int(fixture.seed)
    name = f"cifar_{task_cfg.data_subdir}_s{size}_n{per_batch}x5+{num_test}_seed{seed}.tar.gz"
    return write_cifar_archive(
        Path(data_dir) / "fixtures" / name,
        num_per_batch=per_batch,
        num_test=num_test,
        image_size=size,
        seed=seed,
    )


def _split(tokens: np.ndarray, labels: np.ndarray) -> Split:
    tokens = np.ascontiguousarray(tokens)
    lengths = np.full(len(tokens), tokens.shape[1], np.int32)
    return Split(inputs=(tokens,), lengths=(lengths,), labels=np.asarray(labels, np.int32))


def prepare(task_cfg, data_dir: Path, num_workers: int | None = None) -> Path:
    """Prepare LRA Image into ``prepared_dir(task_cfg, data_dir)``; returns that folder.

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
    image_size = int(source.get("image_size", 32))
    if image_size * image_size != int(task_cfg.max_length):
        raise ConfigError(
            f"task {task_cfg.name}: max_length {task_cfg.max_length} must equal "
            f"task.source.image_size**2 = {image_size * image_size}"
        )
    raw, meta = read_source(
        task_cfg,
        data_dir,
        archive_name=ARCHIVE_NAME,
        fixture_archive=fixture_archive,
        from_tfds=_from_tfds,
        tfds_name="cifar10",
        read_archive=lambda archive: read_cifar_archive(
            archive, image_size, int(task_cfg.num_classes)
        ),
        tfds_allowed=image_size == 32,
    )

    train_tokens, train_labels = raw["train"]
    split_seed, val_fraction = int(source.split_seed), float(source.get("val_fraction", 0.1))
    train_idx, val_idx = split_train_val(len(train_labels), val_fraction, split_seed)
    splits = {
        "train": _split(train_tokens[train_idx], train_labels[train_idx]),
        "val": _split(train_tokens[val_idx], train_labels[val_idx]),
        "test": _split(*raw["test"]),
    }
    meta.update(
        dataset="cifar10 (Krizhevsky 2009), grayscale",
        image_size=image_size,
        split_seed=split_seed,
        val_fraction=val_fraction,
        train_pool=int(len(train_labels)),
        encoding="trunc((0.2989 R + 0.5870 G + 0.1140 B) / 255 * 255.5), row major",
        seconds=round(time.perf_counter() - start, 3),
    )
    return write_prepared(folder, splits, meta)
