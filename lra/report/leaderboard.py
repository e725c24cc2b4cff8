"""The leaderboard as data: one table per protocol, one row per setting, one cell per task.

Records share a cell only when model, task and ``setting`` agree; within a cell the newest
record per seed counts (older ones are kept as superseded), and the cell is the mean and
sample standard deviation (ddof=1, None for one seed) of ``test_accuracy`` in percent over
the seeds, with their number. Nothing is ever averaged across settings or protocols.

Rows: a row is one model under one ``variant`` (the model name plus what was overridden).
Where one model, variant and task have several settings (the config files changed between
runs, say), each gets its own row, labelled with the variant and the short setting hash(es)
of its cells, and keyed by the values that tell those settings apart, so rows line up
across tasks. Each row lists, per task, the config keys whose values differ from the
model's other settings on that task (:attr:`Row.differs`).

Parameter budget: each cell's parameter count relative to the Transformer's (model
``transformer``, same task, same protocol; the default-variant row when there are
several); a row is over budget when any of its ratios exceeds :data:`PARAM_BUDGET` (LRA
compares models at about the Transformer's size).

The LRA average is the mean of the five task means (ListOps, Text, Retrieval, Image,
Pathfinder), None unless all five cells exist; Path-X is never in it.
"""

import hashlib
import json
import statistics
from dataclasses import dataclass, field

from lra.config.identity import result_config
from lra.errors import ConfigError
from lra.report.load import (
    BASELINE,
    TASK_SETS,
    newest_by,
    protocol_order,
    resolve_task_set,
    seed_order,
    started,
    train_records,
)

PARAM_BUDGET = 1.10
ABSENT = "<absent>"


@dataclass
class Cell:
    """One row on one task: test accuracy (%) per seed and the records behind it."""

    values: list[float]
    seeds: list
    records: list[dict]
    superseded: list[dict] = field(default_factory=list)
    setting: str = ""

    @property
    def n(self) -> int:
        return len(self.values)

    @property
    def mean(self) -> float:
        return statistics.fmean(self.values)

    @property
    def std(self) -> float | None:
        return statistics.stdev(self.values) if self.n > 1 else None

    @property
    def num_params(self) -> int | None:
        return next((r["num_params"] for r in self.records if r.get("num_params")), None)

    @property
    def val_sources(self) -> list[str]:
        return sorted({str(r.get("val_source")) for r in self.records})

    @property
    def val_test(self) -> bool:
        """Selection saw the test split (the records' validation split was the test split)."""
        return "test" in self.val_sources

    def by_seed(self) -> dict:
        return dict(zip(self.seeds, self.values, strict=True))


@dataclass
class Row:
    model: str
    variant: str
    label: str
    cells: dict[str, Cell]
    average: float | None = None
    # task -> {config key: this row's value}, the keys that differ from the model's other
    # settings on that task; empty when the model has one setting there.
    differs: dict[str, dict] = field(default_factory=dict)
    # task -> num_params / the Transformer's on that task (same protocol).
    params_ratio: dict[str, float] = field(default_factory=dict)

    @property
    def default(self) -> bool:
        """The model's own setting (no override, no second setting of the same variant)."""
        return self.label == self.model

    @property
    def max_params_ratio(self) -> float | None:
        return max(self.params_ratio.values()) if self.params_ratio else None

    @property
    def over_budget(self) -> bool:
        ratio = self.max_params_ratio
        return ratio is not None and ratio > PARAM_BUDGET + 1e-9

    @property
    def val_test(self) -> bool:
        return any(c.val_test for c in self.cells.values())

    @property
    def settings(self) -> dict[str, str]:
        return {task: c.setting for task, c in self.cells.items()}


@dataclass
class Leaderboard:
    """One protocol's table over the official or tiny task set."""

    task_set: str
    tasks: tuple[str, ...]
    pathx: str
    rows: list[Row]
    selections: list[str]
    devices: list[str]
    other_tasks: list[str]
    protocol: str = ""
    # task -> label of the Transformer row the parameter ratios on that task are relative to.
    baselines: dict[str, str] = field(default_factory=dict)

    @property
    def tiny(self) -> bool:
        return self.task_set == "tiny"

    @property
    def average_name(self) -> str:
        return "tiny_average" if self.tiny else "lra_average"

    @property
    def six_average_name(self) -> str:
        return "tiny_six_average" if self.tiny else "six_average_fail50"

    @property
    def shown(self) -> tuple[str, ...]:
        return (*self.tasks, self.pathx)

    def row(self, label: str) -> Row | None:
        """The row labelled ``label`` (a model's default row is labelled with its name)."""
        return next((r for r in self.rows if r.label == label), None)

    def rows_of(self, model: str) -> list[Row]:
        return [r for r in self.rows if r.model == model]


# ---------------------------------------------------------------- settings


def flat_config(record: dict) -> dict[str, str]:
    """The result-relevant config of a record as ``{dotted key: JSON value}``."""
    out = {}

    def walk(prefix, value):
        if isinstance(value, dict) and value:
            for k, v in value.items():
                walk(f"{prefix}.{k}" if prefix else str(k), v)
        else:
            out[prefix] = json.dumps(value, sort_keys=True, default=str)

    config = record.get("config")
    walk("", result_config(config) if isinstance(config, dict) else {})
    return out


def differing(configs: dict[str, dict[str, str]]) -> dict[str, dict[str, str]]:
    """``{setting: {key: value}}`` of the keys whose values are not the same in every config."""
    if len(configs) < 2:
        return {s: {} for s in configs}
    keys = set().union(*configs.values())
    differ = sorted(k for k in keys if len({c.get(k, ABSENT) for c in configs.values()}) > 1)
    return {s: {k: c.get(k, ABSENT) for k in differ} for s, c in configs.items()}


def _short(setting: str) -> str:
    return setting[:6]


def _signature(values: dict[str, str]) -> str:
    text = json.dumps(sorted(values.items()))
    return hashlib.sha256(text.encode()).hexdigest()[:10]


# ---------------------------------------------------------------- the table


def _cells(runs, shown):
    """``{(model, variant, task, setting): Cell}``: the newest record per seed in each."""
    kept, older = newest_by(
        [r for r in runs if r["task"] in shown],
        lambda r: (r["model"], r["variant"], r["task"], r["setting"], r.get("seed")),
    )
    grouped: dict = {}
    for key in sorted(kept, key=lambda k: (*k[:4], seed_order(k[4]))):
        grouped.setdefault(key[:4], []).append(key)
    return {
        cell_key: Cell(
            values=[100.0 * float(kept[k]["test_accuracy"]) for k in keys],
            seeds=[k[4] for k in keys],
            records=[kept[k] for k in keys],
            superseded=[o for k in keys for o in older[k]],
            setting=cell_key[3],
        )
        for cell_key, keys in grouped.items()
    }


def _rows(cells: dict, shown, five) -> list[Row]:
    configs: dict = {}  # (model, task) -> {setting: flat config of its newest record}
    for (model, _variant, task, setting), cell in cells.items():
        newest = max(cell.records, key=started)
        configs.setdefault((model, task), {})[setting] = flat_config(newest)
    vs_model = {key: differing(c) for key, c in configs.items()}

    by_row: dict = {}
    for (model, variant, task, setting), cell in cells.items():
        siblings = {
            s: configs[(model, task)][s]
            for (m, v, t, s) in cells
            if (m, v, t) == (model, variant, task)
        }
        signature = _signature(differing(siblings)[setting]) if len(siblings) > 1 else ""
        by_row.setdefault((model, variant, signature), {})[task] = cell

    rows = []
    for (model, variant, signature), row_cells in by_row.items():
        label = variant
        if signature:
            hashes = [_short(row_cells[t].setting) for t in shown if t in row_cells]
            label = f"{variant} @{','.join(hashes)}"
        differs = {
            t: vs_model[(model, t)][c.setting]
            for t, c in row_cells.items()
            if vs_model[(model, t)][c.setting]
        }
        complete = all(t in row_cells for t in five)
        average = statistics.fmean(row_cells[t].mean for t in five) if complete else None
        ordered = {t: row_cells[t] for t in shown if t in row_cells}
        rows.append(Row(model, variant, label, ordered, average, differs))
    return rows


def baseline_row(rows: list[Row], task: str) -> Row | None:
    """The Transformer row parameter counts on ``task`` are compared with: its default row,
    else its row with the most seeds on that task."""
    candidates = [
        r for r in rows if r.model == BASELINE and task in r.cells and r.cells[task].num_params
    ]
    if not candidates:
        return None
    return min(
        candidates,
        key=lambda r: (not r.default, r.variant != BASELINE, -r.cells[task].n, r.label),
    )


def _param_ratios(rows: list[Row], shown) -> dict[str, str]:
    """Fill in every row's ``params_ratio``; return ``{task: label of the baseline row}``."""
    baselines = {}
    for task in shown:
        base = baseline_row(rows, task)
        if base is None:
            continue
        baselines[task] = base.label
        base_params = base.cells[task].num_params
        for row in rows:
            cell = row.cells.get(task)
            if cell is not None and cell.num_params:
                row.params_ratio[task] = cell.num_params / base_params
    return baselines


def leaderboards(records, tasks: str = "auto") -> list[Leaderboard]:
    """One :class:`Leaderboard` per protocol of the training records on the task set."""
    task_set = resolve_task_set(records, tasks)
    five, pathx = TASK_SETS[task_set]
    shown = (*five, pathx)
    runs = train_records(records)
    other_tasks = sorted({r["task"] for r in runs} - set(shown))
    protocols = sorted({r["protocol"] for r in runs if r["task"] in shown}, key=protocol_order)
    boards = []
    for protocol in protocols:
        mine = [r for r in runs if r["protocol"] == protocol]
        cells = _cells(mine, shown)
        rows = _rows(cells, shown, five)
        rows.sort(key=lambda r: (r.average is None, -(r.average or 0.0), r.model, r.label))
        board = Leaderboard(
            task_set=task_set,
            tasks=five,
            pathx=pathx,
            rows=rows,
            selections=sorted({str(r.get("selection")) for c in cells.values() for r in c.records}),
            devices=sorted({str(r.get("device")) for c in cells.values() for r in c.records}),
            other_tasks=other_tasks,
            protocol=protocol,
        )
        board.baselines = _param_ratios(rows, shown)
        boards.append(board)
    return boards


def leaderboard(records, tasks: str = "auto", protocol: str | None = None) -> Leaderboard:
    """The one table of ``protocol`` (None: the only protocol there is).

    An empty table when there is no training record on the task set; a
    :class:`~lra.errors.ConfigError` when records of several protocols exist and none is named.
    """
    boards = leaderboards(records, tasks)
    if protocol is not None:
        boards = [b for b in boards if b.protocol == protocol]
    if len(boards) > 1:
        raise ConfigError(
            f"records of several protocols ({', '.join(b.protocol for b in boards)}); "
            "a table holds one: name it with protocol=..."
        )
    if boards:
        return boards[0]
    task_set = resolve_task_set(records, tasks)
    five, pathx = TASK_SETS[task_set]
    return Leaderboard(task_set, five, pathx, [], [], [], [], protocol or "")
