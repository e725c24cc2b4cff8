"""A sweep's progress: jobs done out of the total, device-hours spent, and an ETA.

When ``lra-train -m`` starts, :func:`start` writes ``progress.json`` into the sweep folder: the
number of jobs (the sweep expanded as Hydra's basic sweeper does, :mod:`lra.config.sweep`) and the
start time. After each job, :func:`line` reads the rows the jobs have written
(``job_status.json``, :mod:`lra.run.sweep`) and gives one line::

    sweep progress: 7/22 jobs ended (6 done, 1 skipped), 0.031 device-hours spent, ETA 6.2 min

Device-hours are the ended runs' ``wall_seconds`` x their devices, read from their records. The
ETA is the time since the sweep started x the jobs left / the jobs ended: it holds for any
launcher, since it measures the sweep's own pace (parallel jobs included). It works across
processes and SLURM jobs on a shared file system, as the rows do.
"""

import json
import time
from pathlib import Path

from lra.atomic import write_atomic

PROGRESS_FILE = "progress.json"


def start(sweep_dir: str | Path, overrides: list[str]) -> None:
    """Write the sweep's job count and start time (an expansion that fails writes nothing:
    the jobs then report their rows without a total)."""
    from lra.config.sweep import sweep_jobs

    try:
        total = len(sweep_jobs(list(overrides)))
    except Exception:  # noqa: BLE001 - a progress line is never worth failing a sweep for
        return
    folder = Path(sweep_dir)
    folder.mkdir(parents=True, exist_ok=True)
    data = {"total": total, "started": time.time()}
    write_atomic(folder / PROGRESS_FILE, json.dumps(data) + "\n")


def _device_seconds(row: dict) -> float:
    try:
        record = json.loads(Path(row["record"]).read_text())
    except (KeyError, OSError, ValueError):
        return 0.0
    if row.get("status") == "skipped":
        return 0.0  # done before this sweep
    return float(record.get("wall_seconds") or 0.0) * int(record.get("num_devices") or 1)


def _duration(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:.1f} h"


def line(sweep_dir: str | Path, rows: list[dict], now: float | None = None) -> str | None:
    """The progress line after the jobs of ``rows`` ended (None without ``progress.json``)."""
    try:
        data = json.loads((Path(sweep_dir) / PROGRESS_FILE).read_text())
    except (OSError, ValueError):
        return None
    total, ended = int(data["total"]), len(rows)
    counts: dict[str, int] = {}
    for row in rows:
        counts[row["status"]] = counts.get(row["status"], 0) + 1
    spent = sum(_device_seconds(row) for row in rows) / 3600
    elapsed = (time.time() if now is None else now) - float(data["started"])
    left = max(0, total - ended)
    eta = "done" if not left else f"ETA {_duration(elapsed * left / max(1, ended))}"
    states = ", ".join(f"{n} {status}" for status, n in sorted(counts.items()))
    return (
        f"sweep progress: {ended}/{total} jobs ended ({states}), {spent:.3g} device-hours "
        f"spent, {eta}"
    )
