"""Downloading, checking and reading the source archives of the Text and Image tasks.

Shared by every task that starts from a published archive (IMDB's
``aclImdb_v1.tar.gz``, the CIFAR-10 binary version ``cifar-10-binary.tar.gz``):

* :func:`download` fetches a URL with ``urllib`` into ``dest``. Bytes go to
  ``dest.part`` first; an interrupted download resumes from there with an HTTP
  ``Range`` request (and restarts when the server ignores it); the file is
  checked against its SHA-256 and only then renamed to ``dest``. A network
  failure raises :class:`~lra.errors.DataError` naming the URL and where to put
  a hand-fetched copy, and keeps the ``.part`` file for the next attempt.
* :func:`sha256_file` / :func:`verify_sha256` check a file's digest.
* :func:`iter_tar_members` streams the regular files of a (compressed) tar
  archive as ``(name, bytes)`` without extracting anything to disk. A member
  with an absolute path or a ``..`` component is refused (the whole archive is
  rejected, never silently skipped), and a truncated or corrupt archive is
  reported as a :class:`~lra.errors.DataError` that says to delete and
  re-download it.
* :func:`tfds_examples` reads a data set through tensorflow-datasets when that
  package is installed and can provide it, else returns None so the caller falls
  back to the archive.
"""

from __future__ import annotations

import bz2
import gzip
import hashlib
import http.client
import logging
import lzma
import os
import re
import tarfile
import urllib.error
import urllib.request
import zlib
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path, PurePosixPath
from typing import BinaryIO

from tqdm import tqdm

from lra.errors import DataError

logger = logging.getLogger(__name__)

CHUNK_BYTES = 1 << 20
USER_AGENT = "lra-harness/0.1 (urllib)"

# Errors that mean "the network or the server failed", as opposed to a bug.
_NETWORK_ERRORS = (
    urllib.error.URLError,  # includes HTTPError
    http.client.HTTPException,  # includes IncompleteRead, RemoteDisconnected
    TimeoutError,
    ConnectionError,
    ValueError,  # a malformed URL
)


def sha256_file(path: Path) -> str:
    """The hex SHA-256 digest of the file at ``path``."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(CHUNK_BYTES):
            digest.update(chunk)
    return digest.hexdigest()


def verify_sha256(path: Path, expected: str) -> str:
    """Raise DataError unless ``path`` has SHA-256 ``expected``; returns the digest."""
    actual = sha256_file(path)
    if actual.lower() != str(expected).strip().lower():
        raise DataError(
            f"checksum mismatch for {path}: expected sha256 {expected}, got {actual}. "
            f"The file is incomplete, corrupt or a different file: check it, or delete it "
            f"and download it again"
        )
    return actual


def download(
    url: str,
    dest: Path,
    *,
    sha256: str | None,
    progress: bool = True,
    timeout: float = 60.0,
) -> Path:
    """Download ``url`` to ``dest`` (checked against ``sha256`` when given); returns ``dest``.

    An existing ``dest`` that matches is returned without any network access
    (one that does not match raises DataError). Otherwise the bytes go to
    ``dest.part``, resuming a previous partial download with an HTTP Range
    request; the finished file is verified and renamed into place. Network
    failures raise DataError naming ``url`` and ``dest``; the ``.part`` file is
    kept so the next call resumes. A download whose checksum is wrong is
    deleted, since resuming it cannot repair it.
    """
    dest = Path(dest)
    if dest.is_file():
        if sha256:
            verify_sha256(dest, sha256)
        return dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    part = dest.with_name(dest.name + ".part")
    try:
        _fetch(url, part, desc=dest.name, progress=progress, timeout=timeout)
    except _NETWORK_ERRORS as err:
        if isinstance(err, urllib.error.HTTPError):
            reason = f"HTTP {err.code} {err.reason}"
        else:
            reason = getattr(err, "reason", None) or err
        raise DataError(
            f"could not download {url} ({reason}); fetch it by hand and put it at {dest}"
        ) from err
    if sha256:
        actual = sha256_file(part)
        if actual != str(sha256).strip().lower():
            part.unlink()
            raise DataError(
                f"downloaded {url} but its sha256 is {actual}, expected {sha256}: the server "
                f"sent a different or damaged file. It was deleted; run again to retry, or "
                f"fetch it by hand, check it and put it at {dest}"
            )
    os.replace(part, dest)
    return dest


def _range_start(content_range: str | None) -> int | None:
    """The first byte of a ``Content-Range: bytes A-B/N`` header, or None."""
    match = re.match(r"\s*bytes\s+(\d+)-", content_range or "")
    return int(match.group(1)) if match else None


def _fetch(url: str, part: Path, *, desc: str, progress: bool, timeout: float) -> None:
    """Download ``url`` into ``part``, resuming what ``part`` already holds."""
    offset = part.stat().st_size if part.is_file() else 0
    request = urllib.request.Request(url, headers={"User-Agent": USER_AGENT})
    if offset:
        request.add_header("Range", f"bytes={offset}-")
    try:
        response = urllib.request.urlopen(request, timeout=timeout)
    except urllib.error.HTTPError as err:
        if err.code == 416 and offset:  # nothing past offset: .part is already complete
            err.close()
            logger.info("%s: the partial download %s is already complete", url, part)
            return
        raise
    with response:
        resumed = (
            offset > 0
            and response.status == 206
            and _range_start(response.headers.get("Content-Range")) == offset
        )
        if offset and not resumed:
            logger.info("%s: the server ignored the Range request; restarting", url)
            offset = 0
        length = response.headers.get("Content-Length")
        total = offset + int(length) if length and length.isdigit() else None
        with (
            open(part, "ab" if resumed else "wb") as out,
            tqdm(
                total=total,
                initial=offset,
                unit="B",
                unit_scale=True,
                unit_divisor=1024,
                desc=desc,
                disable=not progress,
            ) as bar,
        ):
            while chunk := response.read(CHUNK_BYTES):
                out.write(chunk)
                bar.update(len(chunk))
    size = part.stat().st_size
    if total is not None and size < total:  # the connection closed early
        raise http.client.IncompleteRead(b"", total - size)


def check_member_name(name: str, archive: Path) -> PurePosixPath:
    """The member name as a relative path; DataError if it is absolute or climbs out (``..``)."""
    path = PurePosixPath(name)
    if path.is_absolute() or name.startswith(("/", "\\")) or ".." in path.parts:
        raise DataError(
            f"archive {archive} has a member with an unsafe path {name!r} (absolute or "
            f"containing '..'); refusing to read it. Check where the archive came from, "
            f"delete it and download it again"
        )
    return path


def iter_tar_members(
    archive: Path, select: Callable[[PurePosixPath], bool] | None = None
) -> Iterator[tuple[PurePosixPath, bytes]]:
    """Stream the regular files of a tar archive (any compression) as ``(path, bytes)``.

    Members are read in archive order, one at a time, nothing is written to
    disk. ``select(path)`` (when given) picks the members whose bytes are
    read; the others are skipped cheaply. Every member name is checked with
    :func:`check_member_name`, selected or not. Directories, links and devices
    are not yielded. A truncated or corrupt archive raises DataError.
    """
    archive = Path(archive)
    if not archive.is_file():
        raise DataError(f"archive {archive} does not exist")
    try:
        with _decompressed(archive) as stream:
            with tarfile.open(fileobj=stream, mode="r|") as tar:
                for member in tar:
                    path = check_member_name(member.name, archive)
                    if not member.isfile() or (select is not None and not select(path)):
                        continue
                    handle = tar.extractfile(member)
                    data = handle.read() if handle is not None else b""
                    if len(data) != member.size:
                        raise tarfile.ReadError(f"member {member.name} ends early")
                    yield path, data
            # Read to the end so the compressed stream's own check (gzip: CRC and size
            # trailer) runs: tar alone cannot tell a cut at a member boundary from the end.
            while stream.read(CHUNK_BYTES):
                pass
    except (tarfile.TarError, EOFError, zlib.error, lzma.LZMAError, OSError) as err:
        raise DataError(
            f"archive {archive} is truncated or corrupt ({type(err).__name__}: {err}); "
            f"delete it and download it again"
        ) from err


def _decompressed(archive: Path) -> BinaryIO:
    """A binary stream of the archive's decompressed bytes (gzip, bzip2, xz or none),
    by magic number. The compressed formats raise EOFError when the file is cut short."""
    with open(archive, "rb") as f:
        magic = f.read(6)
    if magic.startswith(b"\x1f\x8b"):
        return gzip.open(archive, "rb")
    if magic.startswith(b"BZh"):
        return bz2.open(archive, "rb")
    if magic.startswith(b"\xfd7zXZ\x00"):
        return lzma.open(archive, "rb")
    return open(archive, "rb")


def source_archive(source, data_dir: Path, filename: str) -> Path:
    """The original archive a task reads, per its ``task.source`` config.

    ``source.archive`` when set (a local file), else ``data_dir/downloads/<filename>``,
    downloaded from ``source.url`` when absent. Either is checked against
    ``source.sha256`` when that is set; a mismatch raises DataError.
    """
    expected = source.get("sha256")
    expected = None if expected in (None, "") else str(expected)
    if source.get("archive"):
        path = Path(str(source.archive)).expanduser()
        if not path.is_file():
            raise DataError(
                f"task.source.archive={path} does not exist; fix the path, or download "
                f"{source.get('url') or filename} and point task.source.archive at it"
            )
        if expected:
            verify_sha256(path, expected)
        return path
    dest = Path(data_dir) / "downloads" / filename
    url = source.get("url")
    if not url:
        if not dest.is_file():
            raise DataError(
                f"no source archive: task.source.url is not set; put {filename} at {dest} "
                f"or set task.source.archive=/path/to/{filename}"
            )
        if expected:
            verify_sha256(dest, expected)
        return dest
    return download(str(url), dest, sha256=expected)


def tfds_examples(name: str, splits: Sequence[str]) -> dict[str, list[dict]] | None:
    """All examples of ``splits`` of tensorflow-datasets data set ``name``, or None.

    Tries ``tfds.data_source`` on an existing copy (array_record, no TensorFlow
    needed once the data set is prepared under ``~/tensorflow_datasets`` or
    ``$TFDS_DATA_DIR``), then ``tfds.load`` when TensorFlow is installed (which
    may download and build it). Any failure (tfds not installed, data set not
    prepared, no network) returns None and is logged, so the caller reads the
    original archive instead.
    """
    try:
        import tensorflow_datasets as tfds
    except ImportError:
        return None
    try:
        sources = tfds.data_source(name, split=list(splits), download=False)
        return {
            s: [src[i] for i in range(len(src))] for s, src in zip(splits, sources, strict=True)
        }
    except Exception as err:  # noqa: BLE001 - any tfds failure means: use the archive
        logger.info("tfds.data_source(%r) unavailable (%s)", name, err)
    try:
        import tensorflow  # noqa: F401

        out = {}
        for s in splits:
            out[s] = list(tfds.as_numpy(tfds.load(name, split=s, shuffle_files=False)))
        return out
    except Exception as err:  # noqa: BLE001
        logger.info("tfds.load(%r) unavailable (%s); reading the original archive", name, err)
    return None


def read_source(
    task_cfg,
    data_dir: Path,
    *,
    archive_name: str,
    fixture_archive: Callable,
    from_tfds: Callable[[], dict | None],
    tfds_name: str,
    read_archive: Callable[[Path], dict],
    tfds_allowed: bool = True,
) -> tuple[dict, dict]:
    """``(raw splits, where they came from)`` of a task read from an archive (Text, Image).

    In order: the tiny task's synthetic fixture (``source.fixture``: ``fixture_archive(task_cfg,
    data_dir)``); else TensorFlow Datasets (``from_tfds()``) unless ``source.archive`` is set,
    ``source.tfds`` is false or ``tfds_allowed`` is false; else the official archive
    (:func:`source_archive`, ``archive_name``), read by ``read_archive``. The second value holds
    ``source`` and, for an archive, its path and SHA-256, for the prepared folder's metadata.
    """
    source = task_cfg.source
    raw, meta, archive = None, {}, None
    if source.get("fixture"):
        archive = fixture_archive(task_cfg, data_dir)
    else:
        if not source.get("archive") and source.get("tfds", True) and tfds_allowed:
            raw = from_tfds()
            meta["source"] = f"tfds:{tfds_name}"
        if raw is None:
            archive = source_archive(source, data_dir, archive_name)
    if raw is None:
        logger.info("reading %s", archive)
        raw = read_archive(archive)
        kind = "synthetic fixture" if source.get("fixture") else "archive"
        meta.update(
            source=f"{kind} {archive}", archive=str(archive), archive_sha256=sha256_file(archive)
        )
    return raw, meta
