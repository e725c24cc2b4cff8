"""``metrics.jsonl``: every logged scalar of a run, one JSON object per line, in its run folder.

Each line is ``{"step": S, "time": "<UTC ISO time>", "<name>": value, ...}`` with the
scalar names of :mod:`lra.track`; the end of the run adds one line holding
``"summary": {...}``. Lines are appended and flushed as they come, so a crashed
run keeps what it logged. When a run resumes from step ``S`` the file is first
cut back to the lines of steps up to ``S`` (rewritten atomically), so the steps
logged again appear once.
"""

import json
from pathlib import Path

from lra.atomic import write_atomic
from lra.record.store import utc_now

METRICS_FILE = "metrics.jsonl"


def read_metrics(path: str | Path) -> list[dict]:
    """The lines of a metrics file (a torn last line, from a kill mid-write, is dropped)."""
    lines = []
    for text in Path(path).read_text().splitlines():
        try:
            lines.append(json.loads(text))
        except json.JSONDecodeError:
            continue
    return lines


class JsonLines:
    """The always-on backend."""

    def __init__(self, info):
        self.path = Path(info.run_dir) / METRICS_FILE
        if self.path.exists():
            kept = [
                line
                for line in read_metrics(self.path)
                if "summary" not in line and line.get("step", 0) <= info.resumed_step
            ]
            write_atomic(self.path, "".join(json.dumps(line) + "\n" for line in kept))
        self.handle = self.path.open("a")

    def _write(self, line: dict) -> None:
        self.handle.write(json.dumps(line) + "\n")
        self.handle.flush()

    def log(self, step: int, metrics: dict[str, float]) -> None:
        self._write({"step": int(step), "time": utc_now(), **metrics})

    def summary(self, values: dict) -> None:
        self._write({"time": utc_now(), "summary": values})

    def close(self) -> None:
        self.handle.close()
