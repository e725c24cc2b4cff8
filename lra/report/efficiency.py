"""The efficiency tables as data, from benchmark records (``kind="bench"``, by ``lra-bench``).

Training and inference steps/sec (median over timed windows) and peak memory per model and
sequence length, as in the LRA paper's efficiency table, each also relative to the
Transformer at the same length. One table per setting: task, batch size, precision,
device, platform and protocol (the models' options differ between protocols), so a table
compares only measurements made alike. Within a table the newest record per model and
length counts. :func:`memory_slope` is the log-log slope of peak memory against length.
"""

from dataclasses import dataclass

import numpy as np

from lra.report.load import BASELINE, bench_records, newest_by

SETTING_KEYS = ("task", "batch_size", "precision", "device", "platform", "protocol")


def memory_slope(lengths, memories) -> float | None:
    """Least-squares slope of log(memory) against log(length); None with < 2 lengths."""
    pairs = [(float(n), float(m)) for n, m in zip(lengths, memories, strict=True) if m]
    if len({n for n, _ in pairs}) < 2:
        return None
    x, y = np.log([p[0] for p in pairs]), np.log([p[1] for p in pairs])
    return float(np.polyfit(x, y, 1)[0])


@dataclass
class EfficiencyTable:
    """Bench results of one setting: ``cells[(model, length)]`` is the newest record."""

    setting: dict
    lengths: list[int]
    models: list[str]
    cells: dict[tuple[str, int], dict]
    superseded: dict[tuple[str, int], list[dict]]

    def value(self, model: str, length: int, key: str) -> float | None:
        cell = self.cells.get((model, length))
        if cell is None or cell.get("status", "ok") != "ok":
            return None
        return cell.get(key)

    def status(self, model: str, length: int) -> str | None:
        cell = self.cells.get((model, length))
        return None if cell is None else cell.get("status", "ok")

    def windows(self, model: str, length: int, key: str = "train_steps_per_sec") -> list[float]:
        """The per-window speeds behind the median ``key`` (empty when not recorded)."""
        cell = self.cells.get((model, length))
        if cell is None or cell.get("status", "ok") != "ok":
            return []
        return [float(w) for w in cell.get(f"{key}_windows") or [] if w is not None]

    def relative(self, model: str, length: int, key: str) -> float | None:
        """``key`` of ``model`` over the Transformer's at ``length``; None if either is missing."""
        mine, base = self.value(model, length, key), self.value(BASELINE, length, key)
        return None if mine is None or not base else mine / base

    def slope(self, model: str) -> float | None:
        lengths = [n for n in self.lengths if self.value(model, n, "peak_memory_bytes")]
        return memory_slope(lengths, [self.value(model, n, "peak_memory_bytes") for n in lengths])

    @property
    def memory_sources(self) -> list[str]:
        return sorted(
            {str(c["memory_source"]) for c in self.cells.values() if c.get("memory_source")}
        )


def efficiency(records) -> list[EfficiencyTable]:
    """One :class:`EfficiencyTable` per setting of the benchmark records, largest first."""
    by_setting: dict = {}
    for r in bench_records(records):
        by_setting.setdefault(tuple(r.get(k) for k in SETTING_KEYS), []).append(r)
    tables = []
    for key, recs in by_setting.items():
        kept, older = newest_by(recs, lambda r: (r["model"], int(r["length"])))
        models = sorted({m for m, _ in kept}, key=lambda m: (m != BASELINE, m))
        tables.append(
            EfficiencyTable(
                setting=dict(zip(SETTING_KEYS, key, strict=True)),
                lengths=sorted({n for _, n in kept}),
                models=models,
                cells=kept,
                superseded=older,
            )
        )
    tables.sort(key=lambda t: (-len(t.cells), str(t.setting)))
    return tables
