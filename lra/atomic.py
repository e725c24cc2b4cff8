"""Files and folders that appear whole or not at all: write under a temporary name in the same
folder, then rename (``os.replace`` is atomic within one file system).

- :func:`write_atomic`: a file's bytes or text, fsynced before the rename;
- :func:`atomic_file`: a temporary path to write a file by any means (a tar stream, a PNG
  encoder), renamed onto the target when the block ends without an error;
- :func:`atomic_folder`: a fresh temporary folder to fill, swapped in for the target (an
  existing target is moved aside first, then deleted).

On any error the temporary file or folder is removed and the target is left as it was. What
appears gets the mode a plain ``open`` or ``mkdir`` would give it (0666 or 0777 less the
umask), not the private 0600 / 0700 of ``tempfile``, so records and data on a shared file
system stay readable by the group, as the user's umask says.
Temporary files are named ``.<name>.tmp-<random>`` beside the target, so a reader that skips
dot-files never sees one and a clean-up can find strays with ``.*.tmp-*``. The bottom layer:
nothing here imports the rest of the harness.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path


def _umask() -> int:
    """The process's umask (read by setting it and putting it back)."""
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def _temporary_file(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.tmp-")
    os.fchmod(fd, 0o666 & ~_umask())
    os.close(fd)
    return Path(tmp)


@contextlib.contextmanager
def atomic_file(path: str | Path) -> Iterator[Path]:
    """Yield a temporary path beside ``path``; on success it is renamed to ``path``."""
    path = Path(path)
    tmp = _temporary_file(path)
    try:
        yield tmp
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def write_atomic(path: str | Path, data: str | bytes) -> Path:
    """Write ``data`` (text as UTF-8) to ``path`` through a temporary file, fsync and rename.

    A reader never sees a half-written file; on any error the temporary file is removed.
    """
    path = Path(path)
    with atomic_file(path) as tmp, open(tmp, "wb") as handle:
        handle.write(data.encode() if isinstance(data, str) else data)
        handle.flush()
        os.fsync(handle.fileno())
    return path


@contextlib.contextmanager
def atomic_folder(folder: str | Path) -> Iterator[Path]:
    """Yield a new empty folder beside ``folder``; on success it replaces ``folder`` (an
    existing one is renamed aside, the new one renamed in, the old one deleted)."""
    folder = Path(folder)
    folder.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=folder.parent, prefix=f".{folder.name}.tmp-"))
    tmp.chmod(0o777 & ~_umask())
    try:
        yield tmp
        if folder.exists():
            old = Path(tempfile.mkdtemp(dir=folder.parent, prefix=f".{folder.name}.old-"))
            os.replace(folder, old)
            os.replace(tmp, folder)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, folder)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
