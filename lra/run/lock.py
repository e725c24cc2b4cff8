"""One trainer per run folder.

:class:`RunLock` holds an exclusive ``fcntl.flock`` on ``<run folder>/lock`` for the
life of a run and writes the holder (host, PID, start time) into the file. A second
process on the same folder cannot take the lock and stops with an error naming the
holder. The kernel drops a flock when its process dies, however it dies (SIGKILL
included), so a lock file left behind by a dead process is simply taken over; the
takeover is reported in :attr:`RunLock.took_over`.
"""

import fcntl
import json
import os
import socket
from pathlib import Path

from lra.errors import LRAError

LOCK_FILE = "lock"


class RunLocked(LRAError):
    """Another live process holds the run folder."""


def _holder(path: Path) -> dict:
    try:
        return json.loads(path.read_text() or "{}")
    except (OSError, ValueError):
        return {}


def try_flock(path: Path) -> int | None:
    """An open descriptor of ``path`` (created if missing) holding its exclusive ``flock``, or
    None when another process holds it (non-blocking)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    return fd


class RunLock:
    """``with RunLock(folder): ...`` holds ``folder/lock`` or raises :class:`RunLocked`."""

    def __init__(self, folder: str | Path, started_at: str = ""):
        self.path = Path(folder) / LOCK_FILE
        self.started_at = started_at
        self.took_over: dict | None = None
        self._fd: int | None = None

    def __enter__(self) -> "RunLock":
        fd = try_flock(self.path)
        if fd is None:
            who = _holder(self.path)
            raise RunLocked(
                f"run folder {self.path.parent} is in use by another trainer "
                f"(host {who.get('host', '?')}, PID {who.get('pid', '?')}, since "
                f"{who.get('started_at', '?')}); wait for it to finish or stop that process"
            ) from None
        previous = _holder(self.path)
        if previous:
            self.took_over = previous  # the flock was free: its holder is gone
        me = {"host": socket.gethostname(), "pid": os.getpid(), "started_at": self.started_at}
        os.ftruncate(fd, 0)
        os.pwrite(fd, (json.dumps(me) + "\n").encode(), 0)
        os.fsync(fd)
        self._fd = fd
        return self

    def __exit__(self, *exc) -> None:
        if self._fd is None:
            return
        try:
            os.ftruncate(self._fd, 0)  # an empty lock file: nobody holds the run
            fcntl.flock(self._fd, fcntl.LOCK_UN)
        finally:
            os.close(self._fd)
            self._fd = None
