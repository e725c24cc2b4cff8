"""How many processes a data generator uses: ``num_workers``, or every core this process may
run on (its CPU affinity on Linux, else the CPU count) when that is null."""

from __future__ import annotations

import os


def default_workers() -> int:
    """The cores this process may run on (at least 1)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not on Linux
        return max(1, os.cpu_count() or 1)


def worker_count(num_workers: int | None) -> int:
    """``num_workers`` (at least 1), or :func:`default_workers` for None."""
    return default_workers() if num_workers is None else max(1, int(num_workers))
