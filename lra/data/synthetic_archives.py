"""Small synthetic archives in the exact formats of the official Text and Image sources.

The tiny tasks (``text_tiny``, ``image_tiny``) and the tests build these and
then read them through the same parsers as the real archives, so every line of
the archive readers runs without the real data or a network.

* :func:`write_imdb_archive`: an ``aclImdb_v1.tar.gz`` look-alike (Maas et al.
  2011 layout): ``aclImdb/{train,test}/{pos,neg}/<id>_<rating>.txt`` plus the
  files a parser must ignore (``aclImdb/README``, ``aclImdb/imdb.vocab``,
  ``aclImdb/train/unsup/*.txt``, ``aclImdb/train/urls_pos.txt``, directory
  entries). Reviews are English-like sentences drawn from a small vocabulary;
  a positive review uses mostly positive sentiment words and a negative one
  mostly negative words, so the label is learnable from the bytes.
* :func:`write_cifar_archive`: a ``cifar-10-binary.tar.gz`` look-alike
  (Krizhevsky 2009 binary version): ``cifar-10-batches-bin/data_batch_{1..5}.bin``
  and ``test_batch.bin``, each a run of records of ``1 + 3 * S * S`` bytes
  (label byte, then the red, green and blue planes, each ``S x S`` row major),
  plus ``batches.meta.txt`` and ``readme.html``. An image of class ``k`` shows a
  square in cell ``k`` of a 4x4 grid, at a brightness particular to ``k``, over a
  dark noisy background (noise clipped at 0, so real black pixels occur), with a
  dim distractor square elsewhere.

Archives are byte-for-byte reproducible from their arguments (fixed member
order, timestamps and gzip header), so their SHA-256 is stable.
"""

from __future__ import annotations

import gzip
import io
import random
import tarfile
from collections.abc import Iterable
from pathlib import Path

import numpy as np

from lra.atomic import atomic_file

FIXED_MTIME = 1_300_000_000  # any fixed time: the archives must not depend on the clock

POSITIVE_WORDS = (
    "great",
    "wonderful",
    "superb",
    "brilliant",
    "delightful",
    "excellent",
    "charming",
    "moving",
    "beautiful",
    "fantastic",
)
NEGATIVE_WORDS = (
    "awful",
    "boring",
    "terrible",
    "dull",
    "poor",
    "weak",
    "tedious",
    "horrible",
    "stupid",
    "bad",
)
NEUTRAL_WORDS = (
    "the movie film plot story actor actress scene scenes director script camera music "
    "ending character characters was is were are and a an of it this that with but as "
    "i we they watched saw seemed felt really quite rather very some most about from "
    "after before during long short old new first last time people cast role dialogue"
).split()


def write_tar_gz(path: Path, members: Iterable[tuple[str, bytes | None]]) -> Path:
    """Write a gzip-compressed tar of ``members`` (``(name, bytes)``; ``None`` = directory).

    Names are written as given (tests use this to make unsafe names). The file
    appears atomically and is reproducible: fixed mtimes, owner and gzip header.
    """
    path = Path(path)
    with atomic_file(path) as tmp:
        with open(tmp, "wb") as raw:
            with gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0) as gz:
                with tarfile.open(fileobj=gz, mode="w", format=tarfile.GNU_FORMAT) as tar:
                    for name, data in members:
                        info = tarfile.TarInfo(name)
                        info.mtime = FIXED_MTIME
                        if data is None:
                            info.type = tarfile.DIRTYPE
                            info.mode = 0o755
                            tar.addfile(info)
                        else:
                            info.size = len(data)
                            info.mode = 0o644
                            tar.addfile(info, io.BytesIO(data))
    return path


def synthetic_review(rng: random.Random, label: int, *, sentiment_rate: float = 0.3) -> bytes:
    """One review (UTF-8 bytes) whose sentiment words mostly agree with ``label`` (1 = pos)."""
    own, other = (
        (POSITIVE_WORDS, NEGATIVE_WORDS) if label == 1 else (NEGATIVE_WORDS, POSITIVE_WORDS)
    )
    sentences = []
    for _ in range(rng.randint(3, 8)):
        words = []
        for _ in range(rng.randint(5, 12)):
            if rng.random() < sentiment_rate:
                words.append(rng.choice(own if rng.random() < 0.85 else other))
            else:
                words.append(rng.choice(NEUTRAL_WORDS))
        sentences.append(" ".join(words).capitalize() + rng.choice(".!."))
    text = " ".join(sentences)
    if rng.random() < 0.3:  # IMDB reviews carry HTML line breaks
        text = text.replace(". ", ".<br /><br />", 1)
    return text.encode("utf-8")


def imdb_members(num_per_class: int, seed: int) -> list[tuple[str, bytes | None]]:
    """The members of a synthetic aclImdb archive, in a shuffled (unsorted) order."""
    rng = random.Random(seed)
    members: list[tuple[str, bytes | None]] = []
    for split in ("train", "test"):
        for label, folder in ((1, "pos"), (0, "neg")):
            for i in range(num_per_class):
                rating = rng.randint(7, 10) if label else rng.randint(1, 4)
                review = synthetic_review(rng, label) + b"\n"
                members.append((f"aclImdb/{split}/{folder}/{i}_{rating}.txt", review))
    members += [(f"aclImdb/train/unsup/{i}_0.txt", synthetic_review(rng, i % 2)) for i in range(5)]
    members += [
        ("aclImdb/README", b"Large Movie Review Dataset v1.0 (synthetic fixture)\n"),
        ("aclImdb/imdb.vocab", "\n".join(POSITIVE_WORDS + NEGATIVE_WORDS).encode()),
        ("aclImdb/train/urls_pos.txt", b"http://www.imdb.com/title/tt0000000/usercomments\n"),
        ("aclImdb/test/labeledBow.feat", b"9 0:1 1:2\n"),
    ]
    rng.shuffle(members)
    dirs = [f"aclImdb/{s}/{d}" for s in ("train", "test") for d in ("pos", "neg")] + [
        "aclImdb",
        "aclImdb/train",
        "aclImdb/test",
        "aclImdb/train/unsup",
    ]
    return [(d, None) for d in sorted(dirs)] + members


def write_imdb_archive(path: Path, *, num_per_class: int = 150, seed: int = 0) -> Path:
    """Write a synthetic ``aclImdb_v1.tar.gz``: ``num_per_class`` reviews per class and split."""
    return write_tar_gz(path, imdb_members(num_per_class, seed))


def synthetic_images(rng: np.random.Generator, labels: np.ndarray, image_size: int) -> np.ndarray:
    """``uint8[N, 3, S, S]`` RGB planes of learnable class patterns.

    Class ``k`` is a greyish square in cell ``k`` of a 4x4 grid whose brightness lies in
    band ``k`` (about ``95 + 16 k``), over dark noise clipped at 0 (so true black pixels
    occur), plus a dim distractor square (brightness 55-80) in a random cell.
    """
    n, s = len(labels), image_size
    cell = s // 4
    images = rng.normal(20.0, 20.0, size=(n, 3, s, s))
    for i, label in enumerate(labels):
        distractor = int(rng.integers(0, 16))
        level = 95.0 + 16.0 * int(label) + rng.uniform(-5.0, 5.0)
        for cell_index, value in ((distractor, rng.uniform(55.0, 80.0)), (int(label), level)):
            row, col = divmod(cell_index, 4)
            tint = value + rng.uniform(-8.0, 8.0, size=(3, 1, 1))
            patch = images[i, :, row * cell : (row + 1) * cell, col * cell : (col + 1) * cell]
            patch[...] = tint + rng.normal(0.0, 3.0, size=patch.shape)
    return np.clip(np.rint(images), 0, 255).astype(np.uint8)


def cifar_records(labels: np.ndarray, images: np.ndarray) -> bytes:
    """CIFAR binary records: per image, 1 label byte then the R, G, B planes row major."""
    n = len(labels)
    body = images.reshape(n, -1)
    return np.concatenate([labels.astype(np.uint8)[:, None], body], axis=1).tobytes()


def cifar_members(
    *,
    num_per_batch: int,
    num_test: int,
    image_size: int,
    seed: int,
    num_classes: int = 10,
    num_batches: int = 5,
) -> list[tuple[str, bytes | None]]:
    """The members of a synthetic ``cifar-10-binary.tar.gz`` (not in sorted order)."""
    rng = np.random.default_rng(seed)
    root = "cifar-10-batches-bin"
    members: list[tuple[str, bytes | None]] = [(root, None)]
    names = [f"data_batch_{b}.bin" for b in range(1, num_batches + 1)] + ["test_batch.bin"]
    sizes = [num_per_batch] * num_batches + [num_test]
    batches = []
    for name, size in zip(names, sizes, strict=True):
        labels = rng.integers(0, num_classes, size=size).astype(np.uint8)
        images = synthetic_images(rng, labels, image_size)
        batches.append((f"{root}/{name}", cifar_records(labels, images)))
    classes = "airplane automobile bird cat deer dog frog horse ship truck".split()
    members.append((f"{root}/batches.meta.txt", "\n".join(classes).encode() + b"\n\n"))
    members += batches[::-1]  # reversed: the reader must not rely on member order
    members.append((f"{root}/readme.html", b"<html>synthetic CIFAR-10 fixture</html>\n"))
    return members


def write_cifar_archive(
    path: Path,
    *,
    num_per_batch: int = 100,
    num_test: int = 200,
    image_size: int = 32,
    seed: int = 0,
    num_classes: int = 10,
) -> Path:
    """Write a synthetic ``cifar-10-binary.tar.gz`` (5 train batches + test batch)."""
    members = cifar_members(
        num_per_batch=num_per_batch,
        num_test=num_test,
        image_size=image_size,
        seed=seed,
        num_classes=num_classes,
    )
    return write_tar_gz(path, members)
