"""The efficiency tables as data, from benchmark records (``kind="bench"``, by ``lra-bench``).

Training and inference steps/sec (median over timed windows) and peak memory per model and
sequence length, as in the LRA paper's efficiency table, each also relative to the
Transformer at the same length. One table per setting: task, batch size, precision,
device, platform and protocol (the models' options differ between protocols), so a table
compares only measurements made alike. Within a table the newest record per model and
length counts. :func:`memory_slope` is the log-log slope of peak memory against length.

Softmax paths (issue 31, part 4): a benchmark record names how its softmax layers ran
(``softmax_implementation``: ``plain``, ``chunked``, ``fused`` or ``cudnn``; None for a model
without softmax layers). A model with softmax layers gets one row per requested
implementation (``model.attention_options.softmax.implementation``, default ``auto``),
labelled with the path that ran, e.g. ``transformer (plain)`` and ``transformer (chunked)``,
so a circle or a row never hides which path was measured. The rows' baseline for relative
values is the Transformer on the plain path when it was measured (the LRA paper's
Transformer computes the full L x L matrix), else the Transformer's only row.
"""

from dataclasses import dataclass

import numpy as np

from lra.config.setting import CUSTOM
from lra.report.load import BASELINE, bench_records, newest_by

SETTING_KEYS = ("task", "batch_size", "precision", "device", "platform", "protocol")
IMPLEMENTATION_KEY = "model.attention_options.softmax.implementation"


def softmax_path(record: dict) -> str | None:
    """The path the record's softmax layers ran in training (None: no softmax layer)."""
    paths = record.get("softmax_implementation")
    if isinstance(paths, dict):
        return paths.get("train") or paths.get("eval")
    return paths if isinstance(paths, str) else None


def requested_implementation(record: dict) -> str:
    """The softmax implementation the record's config asked for (``auto`` unless overridden)."""
    overrides = record.get("overrides") or {}
    if overrides.get(IMPLEMENTATION_KEY):
        return str(overrides[IMPLEMENTATION_KEY])
    config = record.get("config") if isinstance(record.get("config"), dict) else {}
    options = ((config.get("model") or {}).get("attention_options") or {}).get("softmax") or {}
    return str(options.get("implementation") or "auto")


def row_labels(records) -> dict[int, str]:
    """``{id(record): row label}``: the model name, with the softmax path(s) that ran in
    parentheses for a model with softmax layers (see the module docstring)."""
    groups: dict = {}
    for r in records:
        groups.setdefault((r["model"], requested_implementation(r)), []).append(r)
    labels, used = {}, {}
    for (model, requested), recs in sorted(groups.items(), key=lambda kv: kv[0][1] == "auto"):
        paths = sorted({p for p in map(softmax_path, recs) if p})
        if not paths:
            label = model
        else:
            label = f"{model} ({'/'.join(paths)})"
            if label in used.values():  # auto took the same path as a forced run
                label = f"{model} ({requested}: {'/'.join(paths)})"
        used[(model, requested)] = label
        labels.update({id(r): label for r in recs})
    return labels


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
    models: list[str]  # row labels (the model name, plus its softmax path for softmax models)
    cells: dict[tuple[str, int], dict]
    superseded: dict[tuple[str, int], list[dict]]
    baseline: str = BASELINE  # the row relative values are relative to

    def model_of(self, label: str) -> str:
        """The model name of a row."""
        return next((c["model"] for (m, _), c in self.cells.items() if m == label), label)

    def rows_of(self, model: str) -> list[str]:
        """The row labels of ``model`` (several for a model on several softmax paths)."""
        return [m for m in self.models if self.model_of(m) == model]

    def path(self, label: str, length: int) -> str | None:
        cell = self.cells.get((label, length))
        return None if cell is None else softmax_path(cell)

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
        mine, base = self.value(model, length, key), self.value(self.baseline, length, key)
        return None if mine is None or not base else mine / base

    def slope(self, model: str) -> float | None:
        lengths = [n for n in self.lengths if self.value(model, n, "peak_memory_bytes")]
        return memory_slope(lengths, [self.value(model, n, "peak_memory_bytes") for n in lengths])

    @property
    def memory_sources(self) -> list[str]:
        return sorted(
            {str(c["memory_source"]) for c in self.cells.values() if c.get("memory_source")}
        )


def setting_of(record) -> tuple:
    """The :data:`SETTING_KEYS` of a benchmark record. A run whose only override forces the
    softmax path (``lra-bench bench.softmax_paths``) has protocol ``custom`` in its record but
    belongs to the table of the protocol it was asked under: the same model and options,
    another way of computing the same attention, a row of its own (``transformer (plain)``)."""
    setting = {k: record.get(k) for k in SETTING_KEYS}
    overrides = record.get("overrides") or {}
    chosen = (record.get("config") or {}).get("protocol")
    if setting["protocol"] == CUSTOM and chosen and set(overrides) == {IMPLEMENTATION_KEY}:
        setting["protocol"] = chosen
    return tuple(setting.values())


def efficiency(records) -> list[EfficiencyTable]:
    """One :class:`EfficiencyTable` per setting of the benchmark records (:func:`setting_of`),
    largest first."""
    by_setting: dict = {}
    for r in bench_records(records):
        by_setting.setdefault(setting_of(r), []).append(r)
    tables = []
    for key, recs in by_setting.items():
        labels = row_labels(recs)
        kept, older = newest_by(recs, lambda r, lab=labels: (lab[id(r)], int(r["length"])))
        models = sorted({m for m, _ in kept}, key=lambda m: (not m.startswith(BASELINE), m))
        table = EfficiencyTable(
            setting=dict(zip(SETTING_KEYS, key, strict=True)),
            lengths=sorted({n for _, n in kept}),
            models=models,
            cells=kept,
            superseded=older,
        )
        table.baseline = baseline_row(table)
        table.models.sort(key=lambda m: (m != table.baseline, table.model_of(m) != BASELINE, m))
        tables.append(table)
    tables.sort(key=lambda t: (-len(t.cells), str(t.setting)))
    return tables


def baseline_row(table: EfficiencyTable) -> str:
    """The Transformer row of ``table``: on the plain path when measured, else its first row."""
    rows = table.rows_of(BASELINE)
    plain = [m for m in rows if {table.path(m, n) for n in table.lengths} - {None} == {"plain"}]
    plain.sort(key=lambda m: "(auto: " in m)  # a forced plain run before auto's plain choice
    return (plain or rows or [BASELINE])[0]
