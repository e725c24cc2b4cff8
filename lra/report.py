"""The report: leaderboard, efficiency table and Figure 1 from the results store.

Everything here is computed from the records in ``results_dir`` (one JSON per
run, see :mod:`lra.results`) and nothing else, and every number can be traced
back to the record files it came from (``sources.json``).

* **Leaderboard** (``leaderboard.md``, ``leaderboard.csv``): one row per model,
  one column per task. A cell is the mean and sample standard deviation
  (ddof=1, empty for one seed) of ``test_accuracy`` in percent over the seeds of
  that model and task, with the seed count. Test accuracy is taken at the
  checkpoint each record's ``selection`` rule picked (named in the caption).
  When one model/task/seed has several records, the newest by ``started_at``
  counts and the others are counted in a footnote. The LRA average is the mean
  of the five task means (ListOps, Text, Retrieval, Image, Pathfinder) and is
  left empty unless all five cells exist; Path-X is its own column and never
  part of the average.
* **Efficiency** (``efficiency.md``): from benchmark records (``kind="bench"``,
  written by ``lra-bench``), training and inference steps/sec (median over timed
  windows) and peak memory per model and sequence length, as in the LRA paper's
  efficiency table: each cell also relative to the Transformer at the same
  length (speed as x-times, memory as a fraction). OOM cells read "OOM". The
  last column is the log-log slope of peak memory against length (least
  squares over the lengths that ran): about 1 for linear memory, 2 for
  quadratic. One table per setting (task, batch size, precision, device).
* **Figure 1** (:mod:`lra.figure`): TransNormer's Figure 1 (Qin et al. 2022).
* **Learning curves** (:mod:`lra.curves`, ``curves.{png,svg}``, option ``curves``):
  validation accuracy against training step, one panel per task, one line per
  model (mean over the seeds of the same records as the leaderboard cells), from
  each run's ``metrics.jsonl``; records without one are skipped with a note.
* **Sources** (``sources.json``): for every cell, the record files, seeds,
  code versions and config hashes it came from, and the records it superseded.

A report covers either the official tasks or their tiny CPU variants
(``tasks="official"|"tiny"``; ``"auto"`` picks official when training records
on official tasks exist). Tiny-task numbers are labelled as such everywhere.
"""

import csv
import io
import json
import statistics
import sys
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import numpy as np

from lra import CONFIG_DIR
from lra.errors import ConfigError, DataError, LRAError
from lra.results import read_records, write_atomic

OFFICIAL_TASKS = ("listops", "text", "retrieval", "image", "pathfinder")
TASK_SETS = {
    "official": (OFFICIAL_TASKS, "pathx"),
    "tiny": (tuple(f"{t}_tiny" for t in OFFICIAL_TASKS), "pathx_tiny"),
}
TINY_NOTE = "tiny-task CPU numbers, not LRA scores"
BASELINE = "transformer"
MIB = 2**20


# ---------------------------------------------------------------- records


def record_name(record: dict, root: str | Path | None = None) -> str:
    """How a record is named in the report: its path relative to ``root``, else its file name."""
    path = record.get("path")
    if not path:
        return f"config_hash={record.get('config_hash')}"
    if root is not None:
        try:
            return str(Path(path).resolve().relative_to(Path(root).resolve()))
        except ValueError:
            pass
    return Path(path).name


def _started(record: dict) -> float:
    """``started_at`` as a UTC timestamp (naive times read as UTC; unparsable = oldest)."""
    try:
        when = datetime.fromisoformat(record.get("started_at") or "")
    except ValueError:
        return float("-inf")
    return (when if when.tzinfo else when.replace(tzinfo=UTC)).timestamp()


def newest_by(records, key) -> tuple[dict, dict]:
    """Group ``records`` by ``key(record)``: ``(newest record, older records)`` per key."""
    groups = defaultdict(list)
    for record in records:
        groups[key(record)].append(record)
    kept, superseded = {}, {}
    for k, group in groups.items():
        group.sort(key=lambda r: (_started(r), str(r.get("path", ""))))
        kept[k], superseded[k] = group[-1], group[:-1]
    return kept, superseded


def _seed_order(seed):
    return (0, seed, "") if isinstance(seed, int) else (1, 0, str(seed))


def train_records(records):
    return [
        r
        for r in records
        if r.get("kind", "train") == "train" and r.get("test_accuracy") is not None
    ]


def bench_records(records):
    return [r for r in records if r.get("kind") == "bench" and r.get("length") is not None]


def resolve_task_set(records, tasks: str = "auto") -> str:
    """``"official"`` or ``"tiny"``: ``tasks`` itself, or for ``"auto"`` official if any exist."""
    if tasks in TASK_SETS:
        return tasks
    if tasks != "auto":
        raise ConfigError(f"tasks={tasks!r} is not one of auto, official, tiny")
    official = set(OFFICIAL_TASKS) | {TASK_SETS["official"][1]}
    return "official" if any(r["task"] in official for r in train_records(records)) else "tiny"


# ---------------------------------------------------------------- leaderboard


@dataclass
class Cell:
    """One model on one task: test accuracy (%) per seed and the records behind it."""

    values: list[float]
    seeds: list
    records: list[dict]
    superseded: list[dict] = field(default_factory=list)

    @property
    def n(self) -> int:
        return len(self.values)

    @property
    def mean(self) -> float:
        return statistics.fmean(self.values)

    @property
    def std(self) -> float | None:
        return statistics.stdev(self.values) if self.n > 1 else None


@dataclass
class Row:
    model: str
    cells: dict[str, Cell]
    average: float | None


@dataclass
class Leaderboard:
    task_set: str
    tasks: tuple[str, ...]
    pathx: str
    rows: list[Row]
    selections: list[str]
    devices: list[str]
    other_tasks: list[str]

    @property
    def tiny(self) -> bool:
        return self.task_set == "tiny"

    @property
    def average_name(self) -> str:
        return "tiny_average" if self.tiny else "lra_average"

    def row(self, model: str) -> Row | None:
        return next((r for r in self.rows if r.model == model), None)


def leaderboard(records, tasks: str = "auto") -> Leaderboard:
    """The leaderboard over the official or tiny task set (see the module docstring)."""
    task_set = resolve_task_set(records, tasks)
    five, pathx = TASK_SETS[task_set]
    shown = (*five, pathx)
    runs = train_records(records)
    kept, older = newest_by(
        [r for r in runs if r["task"] in shown], lambda r: (r["model"], r["task"], r.get("seed"))
    )
    by_cell = defaultdict(list)
    for key in sorted(kept, key=lambda k: (k[0], k[1], _seed_order(k[2]))):
        by_cell[key[:2]].append(key)
    rows = []
    for model in sorted({k[0] for k in kept}):
        cells = {}
        for task in shown:
            keys = by_cell.get((model, task))
            if keys:
                recs = [kept[k] for k in keys]
                cells[task] = Cell(
                    values=[100.0 * float(r["test_accuracy"]) for r in recs],
                    seeds=[k[2] for k in keys],
                    records=recs,
                    superseded=[o for k in keys for o in older[k]],
                )
        complete = all(t in cells for t in five)
        average = statistics.fmean(cells[t].mean for t in five) if complete else None
        rows.append(Row(model, cells, average))
    rows.sort(key=lambda r: (r.average is None, -(r.average or 0.0), r.model))
    used = list(kept.values())
    return Leaderboard(
        task_set=task_set,
        tasks=five,
        pathx=pathx,
        rows=rows,
        selections=sorted({str(r.get("selection")) for r in used}),
        devices=sorted({str(r.get("device")) for r in used}),
        other_tasks=sorted({r["task"] for r in runs} - set(shown)),
    )


def _fmt(value, digits=2) -> str:
    return "" if value is None else f"{value:.{digits}f}"


def _cell_text(cell: Cell | None) -> str:
    if cell is None:
        return ""
    std = f" ± {cell.std:.2f}" if cell.std is not None else ""
    mark = " †" if cell.superseded else ""
    return f"{cell.mean:.2f}{std} (n={cell.n}){mark}"


def leaderboard_markdown(lb: Leaderboard) -> str:
    tiny = f" ({TINY_NOTE})" if lb.tiny else ""
    avg_label = "Tiny avg (not LRA)" if lb.tiny else "LRA avg"
    head = ["Model", *lb.tasks, avg_label, lb.pathx]
    lines = [
        f"# Leaderboard{tiny}",
        "",
        f"Test accuracy (%) per task: mean ± sample standard deviation over seeds (n = seeds)"
        f"{tiny}. Checkpoint selection: {', '.join(lb.selections) or 'n/a'}. "
        f"Device(s): {', '.join(lb.devices) or 'n/a'}. "
        f"{avg_label} = mean of the five task means ({', '.join(lb.tasks)}), empty unless all "
        f"five exist; {lb.pathx} is reported separately and is not in the average. "
        "Empty cell = no record.",
        "",
        "| " + " | ".join(head) + " |",
        "|" + "---|" * len(head),
    ]
    for row in lb.rows:
        cells = [_cell_text(row.cells.get(t)) for t in lb.tasks]
        px = _cell_text(row.cells.get(lb.pathx))
        lines.append("| " + " | ".join([row.model, *cells, _fmt(row.average), px]) + " |")
    superseded = sum(len(c.superseded) for r in lb.rows for c in r.cells.values())
    lines.append("")
    if superseded:
        lines.append(
            f"† {superseded} older record(s) with the same model, task and seed were superseded "
            "by the newest one (by started_at); sources.json lists them."
        )
    if lb.other_tasks:
        lines.append(f"Records on tasks outside this set, not shown: {', '.join(lb.other_tasks)}.")
    lines.append("Record files, seeds and code versions behind every cell: sources.json.")
    return "\n".join(lines) + "\n"


def leaderboard_csv(lb: Leaderboard) -> str:
    """CSV with explicit mean, std and n columns per task; empty cells stay empty."""

    def triple(cell):
        if cell is None:
            return ["", "", ""]
        std = "" if cell.std is None else repr(round(cell.std, 6))
        return [repr(round(cell.mean, 6)), std, str(cell.n)]

    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    head = ["model"]
    for t in (*lb.tasks, lb.average_name, lb.pathx):
        head += [t] if t == lb.average_name else [f"{t}_mean", f"{t}_std", f"{t}_n"]
    writer.writerow(head)
    for row in lb.rows:
        values = [row.model]
        for t in lb.tasks:
            values += triple(row.cells.get(t))
        values.append("" if row.average is None else repr(round(row.average, 6)))
        values += triple(row.cells.get(lb.pathx))
        writer.writerow(values)
    return out.getvalue()


# ---------------------------------------------------------------- efficiency


def memory_slope(lengths, memories) -> float | None:
    """Least-squares slope of log(memory) against log(length); None with < 2 lengths."""
    pairs = [(float(n), float(m)) for n, m in zip(lengths, memories, strict=True) if m]
    if len({n for n, _ in pairs}) < 2:
        return None
    x, y = np.log([p[0] for p in pairs]), np.log([p[1] for p in pairs])
    return float(np.polyfit(x, y, 1)[0])


SETTING_KEYS = ("task", "batch_size", "precision", "device", "platform")


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
    by_setting = defaultdict(list)
    for r in bench_records(records):
        by_setting[tuple(r.get(k) for k in SETTING_KEYS)].append(r)
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


def _speed_cell(table, model, length, key) -> str:
    status = table.status(model, length)
    if status is None:
        return ""
    if status != "ok":
        return status.upper()
    value, rel = table.value(model, length, key), table.relative(model, length, key)
    if value is None:
        return ""
    return f"{value:.2f}" + ("" if model == BASELINE or rel is None else f" ({rel:.2f}x)")


def _memory_cell(table, model, length) -> str:
    status = table.status(model, length)
    if status is None:
        return ""
    if status != "ok":
        return status.upper()
    value = table.value(model, length, "peak_memory_bytes")
    rel = table.relative(model, length, "peak_memory_bytes")
    if value is None:
        return ""
    return f"{value / MIB:.1f}" + ("" if model == BASELINE or rel is None else f" ({rel:.2f})")


def efficiency_markdown(tables: list[EfficiencyTable], tiny: bool = False) -> str:
    note = f" ({TINY_NOTE})" if tiny else ""
    lines = [f"# Efficiency{note}", ""]
    if not tables:
        lines.append(
            "No benchmark records (kind=bench) in the results store. Produce them with lra-bench."
        )
        return "\n".join(lines) + "\n"
    lines += [
        "From benchmark records on synthetic full-length inputs. Steps/sec is the median over "
        "timed windows (the windows are in each record). In parentheses: relative to the "
        f"Transformer ({BASELINE}) at the same length, speed as x-times its steps/sec and memory "
        "as a fraction of its peak memory, as in the LRA paper's efficiency table. OOM = out of "
        "memory at that length. Slope = least-squares slope of log peak memory against log "
        "length over the lengths that ran (1 = linear, 2 = quadratic). Records: sources.json.",
        "",
    ]
    for t in tables:
        s = t.setting
        lines += [
            f"## {s['task']}, batch size {s['batch_size']}, {s['precision']}, "
            f"device {s['device']} ({s['platform']}){note}",
            "",
            f"Peak memory source: {', '.join(t.memory_sources) or 'n/a'}.",
            "",
        ]
        cols = [str(n) for n in t.lengths]
        for title, key in (
            ("Training steps per second", "train_steps_per_sec"),
            ("Inference steps per second", "eval_steps_per_sec"),
        ):
            lines += [f"### {title}", "", "| Model | " + " | ".join(cols) + " |"]
            lines.append("|" + "---|" * (len(cols) + 1))
            for m in t.models:
                cells = [_speed_cell(t, m, n, key) for n in t.lengths]
                lines.append(f"| {m} | " + " | ".join(cells) + " |")
            lines.append("")
        lines += ["### Peak memory (MiB)", "", "| Model | " + " | ".join(cols) + " | Slope |"]
        lines.append("|" + "---|" * (len(cols) + 2))
        for m in t.models:
            cells = [_memory_cell(t, m, n) for n in t.lengths]
            lines.append(f"| {m} | " + " | ".join(cells) + f" | {_fmt(t.slope(m))} |")
        lines.append("")
    return "\n".join(lines)


# ---------------------------------------------------------------- sources


def _trace(records, root) -> dict:
    return {
        "records": [record_name(r, root) for r in records],
        "seeds": [r.get("seed") for r in records],
        "code_versions": sorted({str(r.get("code_version")) for r in records}),
        "config_hashes": [r.get("config_hash") for r in records],
    }


def sources(lb: Leaderboard, tables: list[EfficiencyTable], fig=None, root=None) -> dict:
    """The records behind every reported number, by section (leaderboard, efficiency, figure1)."""
    board = {}
    for row in lb.rows:
        entry = {}
        for task, cell in row.cells.items():
            entry[task] = {
                **_trace(cell.records, root),
                "superseded": [record_name(r, root) for r in cell.superseded],
            }
        if row.average is not None:
            entry[lb.average_name] = {"mean_of": list(lb.tasks)}
        board[row.model] = entry
    eff = []
    for t in tables:
        cells = defaultdict(dict)
        for (model, length), rec in sorted(t.cells.items()):
            cells[model][str(length)] = {
                **_trace([rec], root),
                "status": rec.get("status", "ok"),
                "superseded": [record_name(r, root) for r in t.superseded[(model, length)]],
            }
        eff.append({"setting": t.setting, "relative_to": BASELINE, "cells": dict(cells)})
    out = {"task_set": lb.task_set, "leaderboard": board, "efficiency": eff}
    if fig is not None:
        out["figure1"] = fig.sources(root)
    return out


# ---------------------------------------------------------------- files and CLI


def load_records(results_dir: str | Path) -> list[dict]:
    """The training and benchmark records in ``results_dir``; a clear error when there are none."""
    folder = Path(results_dir).expanduser().resolve()
    records = read_records(folder) if folder.is_dir() else []
    if not train_records(records) and not bench_records(records):
        raise DataError(
            f"no training or benchmark records in results_dir {folder} (looked for *.json "
            "records in it and its subfolders). Produce them with e.g. "
            "'lra-train model=transformer task=listops_tiny results_dir=<dir>' (training) and "
            "lra-bench (speed and memory), or point results_dir=... at a folder that holds them."
        )
    return records


def run_report(
    results_dir,
    out_dir,
    tasks: str = "auto",
    figure_length: int = 2048,
    reference_csv=None,
    show_reference: bool = True,
    models=None,
    curves: bool = True,
) -> list[Path]:
    """Read ``results_dir`` and write every report file into ``out_dir``; return their paths.

    ``models`` (a list of model names) keeps only those models' records; None keeps all.
    ``curves`` draws the learning curves (:mod:`lra.curves`); its notes (records skipped,
    or that nothing could be drawn) are printed, one line each.
    """
    from lra import curves as learning
    from lra import figure

    records = load_records(results_dir)
    if models:
        wanted = set(models)
        records = [r for r in records if r.get("model") in wanted]
        if not records:
            raise ConfigError(
                f"no records of the models {sorted(wanted)} in results_dir {results_dir}; "
                "check the model names or drop models=..."
            )
    root = Path(results_dir).expanduser().resolve()
    lb = leaderboard(records, tasks)
    tables = efficiency(records)
    fig = figure.figure1(
        lb,
        tables,
        length=figure_length,
        reference_csv=reference_csv if show_reference else None,
    )
    out = Path(out_dir)
    written = [
        write_atomic(out / "leaderboard.md", leaderboard_markdown(lb)),
        write_atomic(out / "leaderboard.csv", leaderboard_csv(lb)),
        write_atomic(out / "efficiency.md", efficiency_markdown(tables, lb.tiny)),
        *figure.write_figure1(fig, out),
    ]
    trace = sources(lb, tables, fig, root)
    if curves:
        found = learning.learning_curves(lb)
        written += learning.write_curves(found, out)
        for note in found.notes(root):
            print(note, flush=True)
        trace["curves"] = found.trace(root)
    trace["results_dir"] = str(root)
    text = json.dumps(trace, indent=2, sort_keys=True, default=str)
    written.append(write_atomic(out / "sources.json", text + "\n"))
    return written


def _report(cfg) -> None:
    for path in run_report(
        cfg.results_dir,
        cfg.out_dir,
        tasks=str(cfg.tasks),
        figure_length=int(cfg.figure_length),
        reference_csv=cfg.reference_csv,
        show_reference=bool(cfg.show_reference),
        models=list(cfg.models) if cfg.get("models") else None,
        curves=bool(cfg.get("curves", True)),
    ):
        print(f"wrote {path}", flush=True)


def report_main():
    """``lra-report``: leaderboard, efficiency table, Figure 1 and sources from the store."""
    import hydra

    @hydra.main(version_base="1.3", config_path=CONFIG_DIR, config_name="report")
    def _report_app(cfg):
        try:
            return _report(cfg)
        except LRAError as err:
            print(f"error: {err}", file=sys.stderr, flush=True)
            sys.exit(2)

    _report_app()
