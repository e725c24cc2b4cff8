"""LRA Retrieval: ACL Anthology Network document pairs, byte level, two inputs.

Source: the ACL Anthology Network (AAN; Radev et al. 2013, "The ACL Anthology
Network Corpus") as used by Long-Range Arena (Tay et al. 2020): decide whether
two papers are linked by a citation from their byte-level texts. The official
files are ``tsv_data/new_aan_pairs.{train,eval,test}.tsv`` of the release
archive (REFERENCE section 2), about 147k / 18k / 17k rows; they become the
train / val / test splits.

File format: tab separated, no header, no quoting, one pair per line, columns
``label id1 id2 text1 text2``; the label is a float string (``"1.0"``) cast to
an int and must be 0 or 1. Lines are split on ``"\\t"`` here (never with
:mod:`csv`: quotes and backslashes are ordinary bytes of a document). The
official pipeline reads the files with TensorFlow's CSV reader and exactly five
columns, which rejects a row with a sixth field; this reader does the same: a
row with other than five fields is an error (a document containing a tab would
make the row ambiguous, so it is not silently repaired). A trailing ``"\\n"`` or
``"\\r\\n"`` ends a line; empty lines are skipped. A malformed row raises
:class:`~lra.errors.DataError` naming the file and the 1-based line number.

Encoding (:func:`lra.data.encoding.encode_bytes`): each document is cut to its
first ``stored_length`` bytes (4000 for the benchmark) and every byte ``b``
becomes token ``b + 1`` (0 is padding), so the vocabulary has 257 ids. The
result is a :class:`~lra.data.split.Split` with two inputs,
``inputs = (uint16[N, stored_length], uint16[N, stored_length])``,
``lengths = (int32[N], int32[N])`` and ``labels = int32[N]``.

Files are read as a stream: rows are encoded in fixed-size chunks (bytes beyond
``stored_length`` are dropped at once) and the chunks are copied into the final
arrays at the end, so reading the multi-gigabyte train file needs about the
size of its token arrays (about 2.4 GB for 147k pairs) plus one chunk.

:func:`prepare` finds the files, in this order: ``task.source.tsv_dir``; the
synthetic fixture of the tiny variant (``task.source.fixture``, built by
:mod:`lra.data.synthetic_aan`); ``tsv_data`` in ``data_dir`` at either nesting
level of an extracted ``lra_release``; the three members read straight out of
``lra_release.gz`` (``task.source.archive`` or ``data_dir/downloads/``) without
extracting the rest of the archive; the download of that archive when asked for
with ``+task.source.download=true``. It writes the prepared store
(:mod:`lra.data.store`) under ``data_dir/prepared/<task.data_subdir>``.
"""

from __future__ import annotations

import logging
import sys
import tarfile
import time
import zlib
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import BinaryIO

import numpy as np

from lra.data.encoding import encode_bytes
from lra.data.release import release_candidates
from lra.data.split import Split
from lra.data.store import is_prepared, prepared_dir, write_prepared
from lra.errors import DataError

logger = logging.getLogger(__name__)

#: Prepared split name -> official file name.
SPLIT_FILES = {
    "train": "new_aan_pairs.train.tsv",
    "val": "new_aan_pairs.eval.tsv",
    "test": "new_aan_pairs.test.tsv",
}
TSV_FOLDER = "tsv_data"
ARCHIVE_NAME = "lra_release.gz"
DEFAULT_URL = "https://storage.googleapis.com/long-range-arena/lra_release.gz"
DOCUMENT_BYTES = 4000
NUM_FIELDS = 5
#: Rows encoded together; bounds the bytes held before encoding.
CHUNK_ROWS = 4096
DATASET_NAME = "LRA Retrieval: ACL Anthology Network pairs (Radev et al. 2013; Tay et al. 2020)"


def _say(message: str, progress: bool) -> None:
    if progress:
        print(message, file=sys.stderr, flush=True)
    else:
        logger.info(message)


# ---------------------------------------------------------------------------
# Parsing


def _parse_label(field: bytes, name: str, lineno: int) -> int:
    text = field.decode("ascii", errors="replace").strip()
    try:
        value = float(text)
    except ValueError:
        raise DataError(
            f"{name}, line {lineno}: label {text[:40]!r} is not a number; "
            "expected 0.0 or 1.0 in the first column (columns: label id1 id2 text1 text2)"
        ) from None
    if value not in (0.0, 1.0):
        raise DataError(f"{name}, line {lineno}: label {text[:40]!r} is not 0 or 1")
    return int(value)


def iter_aan_rows(lines: Iterable[bytes], name: str) -> Iterator[tuple[int, bytes, bytes]]:
    """Yields ``(label, text1, text2)`` for every non-empty line of an AAN TSV.

    ``lines`` are raw byte lines (a file opened in binary mode); ``name`` is
    the file named in errors. Raises :class:`DataError` on a malformed row.
    """
    for lineno, line in enumerate(lines, 1):
        if line.endswith(b"\n"):
            line = line[:-1]
            if line.endswith(b"\r"):
                line = line[:-1]
        if not line:
            continue
        fields = line.split(b"\t", NUM_FIELDS)
        if len(fields) != NUM_FIELDS:
            found = line.count(b"\t") + 1
            raise DataError(
                f"{name}, line {lineno}: expected {NUM_FIELDS} tab-separated fields "
                f"(label id1 id2 text1 text2), found {found}; the file is not an AAN pairs "
                "TSV or is damaged (a tab inside a document is not allowed)"
            )
        yield _parse_label(fields[0], name, lineno), fields[3], fields[4]


class _Accumulator:
    """Encodes rows chunk by chunk and joins the chunks once, freeing each as it goes."""

    def __init__(self, stored_length: int, chunk_rows: int | None = None):
        self.length = stored_length
        self.chunk_rows = chunk_rows or CHUNK_ROWS
        self.docs: tuple[list[bytes], list[bytes]] = ([], [])
        self.labels: list[int] = []
        # Encoded chunks: (tokens0, lengths0, tokens1, lengths1, labels).
        self.chunks: list[tuple[np.ndarray, ...] | None] = []
        self.count = 0

    def add(self, label: int, text1: bytes, text2: bytes) -> None:
        self.docs[0].append(text1[: self.length])
        self.docs[1].append(text2[: self.length])
        self.labels.append(label)
        self.count += 1
        if len(self.labels) >= self.chunk_rows:
            self._flush()

    def _flush(self) -> None:
        if not self.labels:
            return
        tokens0, lengths0 = encode_bytes(self.docs[0], self.length)
        tokens1, lengths1 = encode_bytes(self.docs[1], self.length)
        labels = np.asarray(self.labels, np.int32)
        self.chunks.append((tokens0, lengths0, tokens1, lengths1, labels))
        self.docs = ([], [])
        self.labels = []

    def finish(self) -> Split:
        self._flush()
        n = self.count
        dtype = self.chunks[0][0].dtype if self.chunks else np.dtype(np.uint16)
        # np.empty maps large arrays lazily: memory grows as chunks are copied in and freed,
        # so the peak is the final arrays plus one chunk.
        tokens = (np.empty((n, self.length), dtype), np.empty((n, self.length), dtype))
        lengths = (np.empty(n, np.int32), np.empty(n, np.int32))
        labels = np.empty(n, np.int32)
        start = 0
        for i, chunk in enumerate(self.chunks):
            t0, n0, t1, n1, lab = chunk
            stop = start + len(lab)
            tokens[0][start:stop], lengths[0][start:stop] = t0, n0
            tokens[1][start:stop], lengths[1][start:stop] = t1, n1
            labels[start:stop] = lab
            self.chunks[i] = None
            start = stop
        self.chunks = []
        return Split(inputs=tokens, lengths=lengths, labels=labels)


def read_aan_lines(lines: Iterable[bytes], name: str, stored_length: int = DOCUMENT_BYTES) -> Split:
    """Parse the byte lines of one AAN pairs TSV into a two-input :class:`Split`.

    ``name`` is the file named in errors. See the module docstring for the
    format and the encoding. A file without rows is an error.
    """
    if stored_length < 1:
        raise DataError(f"the stored document length must be >= 1, got {stored_length}")
    acc = _Accumulator(int(stored_length))
    for label, text1, text2 in iter_aan_rows(lines, name):
        acc.add(label, text1, text2)
    if acc.count == 0:
        raise DataError(f"{name} holds no rows; expected AAN pairs (label id1 id2 text1 text2)")
    return acc.finish()


class _Progress:
    """Wraps a binary line iterator with a tqdm bar counting bytes."""

    def __init__(self, lines: Iterable[bytes], total: int | None, desc: str, enabled: bool):
        self.lines = lines
        self.total = total
        self.desc = desc
        self.enabled = enabled

    def __iter__(self) -> Iterator[bytes]:
        if not self.enabled:
            yield from self.lines
            return
        from tqdm import tqdm

        with tqdm(
            total=self.total, desc=self.desc, unit="B", unit_scale=True, file=sys.stderr
        ) as bar:
            pending = 0
            for line in self.lines:
                pending += len(line)
                if pending >= 1 << 22:
                    bar.update(pending)
                    pending = 0
                yield line
            bar.update(pending)


def read_aan_tsv(
    path: Path, stored_length: int = DOCUMENT_BYTES, *, progress: bool = False
) -> Split:
    """Read one official ``new_aan_pairs.*.tsv`` file into a two-input :class:`Split`.

    Returns ``inputs = (uint16[N, stored_length],) * 2`` (byte + 1, 0-padded),
    ``lengths = (int32[N],) * 2`` and ``labels = int32[N]``; raises
    :class:`DataError` for a missing file or a malformed row (file and line named).
    """
    path = Path(path)
    try:
        handle = open(path, "rb")
    except OSError as err:
        raise DataError(f"cannot read AAN pairs file {path}: {err.strerror or err}") from None
    with handle:
        size = path.stat().st_size
        lines = _Progress(handle, size, path.name, progress)
        return read_aan_lines(lines, str(path), stored_length)


# ---------------------------------------------------------------------------
# Finding the files


def _has_all_files(folder: Path) -> bool:
    return all((folder / name).is_file() for name in SPLIT_FILES.values())


def find_tsv_dir(data_dir: Path) -> Path | None:
    """The first ``tsv_data`` folder holding the three AAN files under ``data_dir``
    (directly or at either ``lra_release`` nesting level), else None."""
    for candidate in release_candidates(data_dir, TSV_FOLDER):
        if _has_all_files(candidate):
            return candidate
    return None


def read_tsv_dir(
    folder: Path, stored_length: int = DOCUMENT_BYTES, *, progress: bool = False
) -> dict[str, Split]:
    """Read the three files of a ``tsv_data`` folder as ``{"train", "val", "test"} -> Split``."""
    folder = Path(folder)
    missing = [name for name in SPLIT_FILES.values() if not (folder / name).is_file()]
    if missing:
        raise DataError(
            f"{folder} does not hold the AAN files {', '.join(missing)}; point "
            f"task.source.tsv_dir at the folder holding {', '.join(SPLIT_FILES.values())}"
        )
    return {
        split: read_aan_tsv(folder / name, stored_length, progress=progress)
        for split, name in SPLIT_FILES.items()
    }


def _member_split(member_name: str) -> str | None:
    parts = Path(member_name).parts
    if len(parts) >= 2 and parts[-2] == TSV_FOLDER:
        for split, name in SPLIT_FILES.items():
            if parts[-1] == name:
                return split
    return None


def _iter_archive_files(archive: Path) -> Iterator[tuple[str, int, BinaryIO]]:
    """Yields ``(member name, size, binary stream)`` for the AAN members of a tar
    archive, read as one stream in archive order (nothing is extracted to disk).

    Every member name is checked with :func:`lra.data.archives.check_member_name`
    (absolute or ``..`` paths reject the archive). Unlike
    :func:`lra.data.archives.iter_tar_members`, which returns each member as one
    bytes object, the member is handed over as a stream: the AAN train file is
    gigabytes.
    """
    from lra.data.archives import check_member_name

    with tarfile.open(archive, mode="r|*") as tar:
        for member in tar:
            path = check_member_name(member.name, archive)
            if not member.isfile() or _member_split(str(path)) is None:
                continue
            stream = tar.extractfile(member)
            if stream is not None:
                yield str(path), member.size, stream


def read_archive(
    archive: Path, stored_length: int = DOCUMENT_BYTES, *, progress: bool = False
) -> dict[str, Split]:
    """Read the three AAN members straight out of ``lra_release.gz`` (either nesting
    level) in one streaming pass, stopping once all three are read."""
    archive = Path(archive)
    if not archive.is_file():
        raise DataError(
            f"archive {archive} does not exist; set task.source.archive to the path of "
            f"{ARCHIVE_NAME}"
        )
    splits: dict[str, Split] = {}
    _say(f"reading the AAN files out of {archive} (one pass; the archive is large)", progress)
    try:
        for member_name, size, stream in _iter_archive_files(archive):
            split = _member_split(member_name)
            if split in splits:
                continue
            name = f"{archive}:{member_name}"
            lines = _Progress(stream, size, Path(member_name).name, progress)
            splits[split] = read_aan_lines(lines, name, stored_length)
            if len(splits) == len(SPLIT_FILES):
                return splits
    except (tarfile.TarError, EOFError, zlib.error, OSError) as err:
        raise DataError(
            f"archive {archive} is truncated or corrupt ({type(err).__name__}: {err}); "
            "delete it and download it again"
        ) from err
    missing = [SPLIT_FILES[s] for s in SPLIT_FILES if s not in splits]
    raise DataError(
        f"{archive} has no member {TSV_FOLDER}/{', '.join(missing)}; is it the LRA "
        f"release archive {ARCHIVE_NAME}? (download: {DEFAULT_URL})"
    )


# ---------------------------------------------------------------------------
# Preparing


def _missing_source_message(data_dir: Path, url: str) -> str:
    looked = ", ".join(str(p) for p in release_candidates(data_dir, TSV_FOLDER))
    return (
        f"the LRA Retrieval (AAN) files {', '.join(SPLIT_FILES.values())} were not found "
        f"(looked in {looked}, and for {data_dir / 'downloads' / ARCHIVE_NAME}). Either "
        "(1) point task.source.tsv_dir at the folder holding them "
        "(lra-data task=retrieval task.source.tsv_dir=/path/to/tsv_data), "
        "(2) give the path of the release archive "
        f"(lra-data task=retrieval task.source.archive=/path/to/{ARCHIVE_NAME}), or "
        "(3) download the archive (about 7.7 GB) into "
        f"{data_dir / 'downloads'}: lra-data task=retrieval +task.source.download=true "
        f"(from {url})"
    )


def _source_get(task_cfg, key: str, default=None):
    source = task_cfg.get("source") or {}
    value = source.get(key, default)
    return default if value is None else value


def _download(task_cfg, data_dir: Path, progress: bool) -> Path:
    from lra.data import archives

    url = _source_get(task_cfg, "url", DEFAULT_URL)
    dest = data_dir / "downloads" / ARCHIVE_NAME
    return archives.download(url, dest, sha256=_source_get(task_cfg, "sha256"), progress=progress)


def read_source(
    task_cfg, data_dir: Path, *, progress: bool = True
) -> tuple[dict[str, Split], dict]:
    """Find and read the task's AAN files; returns the splits and a ``meta`` dict
    naming the source. The order of the sources is in the module docstring."""
    data_dir = Path(data_dir)
    stored_length = int(_source_get(task_cfg, "stored_length", DOCUMENT_BYTES))
    tsv_dir = _source_get(task_cfg, "tsv_dir")
    fixture = _source_get(task_cfg, "fixture")
    if tsv_dir:
        folder = Path(str(tsv_dir)).expanduser()
        return read_tsv_dir(folder, stored_length, progress=progress), {
            "source": str(folder),
            "source_kind": "tsv_dir",
        }
    if fixture:
        from lra.data.synthetic_aan import write_aan_fixture

        params = dict(fixture)
        folder = write_aan_fixture(data_dir / "fixtures" / task_cfg.data_subdir, **params)
        return read_tsv_dir(folder, stored_length), {
            "source": str(folder),
            "source_kind": "synthetic fixture (lra.data.synthetic_aan); NOT the AAN data",
            "fixture": params,
        }
    folder = find_tsv_dir(data_dir)
    if folder is not None:
        return read_tsv_dir(folder, stored_length, progress=progress), {
            "source": str(folder),
            "source_kind": "extracted lra_release",
        }
    archive = _source_get(task_cfg, "archive")
    if archive:
        archive = Path(str(archive)).expanduser()
    elif (data_dir / "downloads" / ARCHIVE_NAME).is_file():
        archive = data_dir / "downloads" / ARCHIVE_NAME
    elif _source_get(task_cfg, "download", False):
        archive = _download(task_cfg, data_dir, progress)
    else:
        raise DataError(
            _missing_source_message(data_dir, _source_get(task_cfg, "url", DEFAULT_URL))
        )
    return read_archive(archive, stored_length, progress=progress), {
        "source": str(archive),
        "source_kind": "lra_release archive (streamed)",
    }


def prepare(task_cfg, data_dir: Path, num_workers: int | None = None) -> Path:
    """Prepare LRA Retrieval into ``data_dir/prepared/<task.data_subdir>``; returns it.

    Does nothing when that folder is already prepared (delete it to re-prepare).
    ``num_workers`` is unused: reading is bound by one decompressing/parsing stream.
    """
    del num_workers
    data_dir = Path(data_dir)
    out = prepared_dir(task_cfg, data_dir)
    if is_prepared(out):
        return out
    progress = True
    start = time.perf_counter()
    splits, meta = read_source(task_cfg, data_dir, progress=progress)
    meta = {
        **meta,
        "dataset": DATASET_NAME,
        "format": "label id1 id2 text1 text2, tab separated; rows with other than 5 fields "
        "rejected",
        "encoding": "byte + 1, 0 = padding, first stored_length bytes of each document",
        "files": dict(SPLIT_FILES),
        "seconds": round(time.perf_counter() - start, 3),
    }
    return write_prepared(out, splits, meta)
