"""Learning curves beside Figure 1: validation accuracy against training step.

``curves.png`` / ``curves.svg`` hold one panel per task of the report's task set
(official or tiny, in the leaderboard's column order, only tasks with a curve).
In each panel, x = training step, y = validation accuracy in percent (like the
leaderboard), one line per leaderboard row (a model under one setting, named by the
row's label): the mean of ``val/accuracy`` over that row's seeds at each step where
every one of those seeds has a value. The legend names the number of seeds when it
is more than one. One figure per leaderboard table, i.e. per protocol (render step,
see :mod:`lra.report.load` for the chain).

The runs are exactly those behind the leaderboard cells (the report's filters,
then the newest record per model, task, setting and seed). Each run's values come from
``metrics.jsonl`` in the run folder its record names (``run_dir``); lines of the
same step are merged. A record without ``run_dir``, whose metrics file is
missing, or whose file holds no ``val/accuracy`` is skipped, with a note.
Drawn with matplotlib's Agg canvas (no pyplot, no display needed).
"""

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

import matplotlib
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.ticker import MaxNLocator

from lra.report.figure import save_figure
from lra.report.leaderboard import Leaderboard
from lra.report.load import TINY_NOTE, record_name, relative_to_root, run_folders
from lra.track.jsonl import METRICS_FILE, read_metrics

VAL_KEY = "val/accuracy"
MARKERS = ("o", "s", "^", "D", "v", "P", "X")


class Curve(NamedTuple):
    """One model on one task: steps, mean validation accuracy (%) at them, number of seeds."""

    steps: list[int]
    accuracy: list[float]
    n: int


@dataclass
class Curves:
    """``series[task][row label]`` is a :class:`Curve`; ``sources`` and ``skipped`` trace it."""

    task_set: str
    series: dict[str, dict[str, Curve]]
    protocol: str = ""
    sources: dict[str, dict[str, dict]] = field(default_factory=dict)
    skipped: list[tuple[dict, str]] = field(default_factory=list)

    def notes(self, root=None) -> list[str]:
        """One line per skipped record, or one line in all when nothing can be drawn."""
        if not self.series:
            return [
                f"curves: no learning curves drawn: none of the {len(self.skipped)} selected "
                f"training record(s) has a {METRICS_FILE} with {VAL_KEY} in its run_dir"
            ]
        return [f"curves: skipped {record_name(r, root)}: {why}" for r, why in self.skipped]

    def trace(self, root=None) -> dict:
        """The ``curves`` section of ``sources.json``."""
        out = {
            "protocol": self.protocol,
            "y": f"{VAL_KEY} in percent, mean over seeds at steps every seed has",
            "drawn": bool(self.series),
            "tasks": {
                task: {
                    model: {
                        "records": [record_name(r, root) for r in src["records"]],
                        "metrics_files": [
                            relative_to_root(p, root) or str(p) for p in src["metrics_files"]
                        ],
                        "seeds": src["seeds"],
                        "n": self.series[task][model].n,
                    }
                    for model, src in models.items()
                }
                for task, models in self.sources.items()
            },
        }
        out["skipped"] = [{"record": record_name(r, root), "why": w} for r, w in self.skipped]
        return out


def metrics_path(record: dict) -> tuple[Path | None, str]:
    """``(metrics file, "")`` of a training record, or ``(None, why it has none)``.

    The file is ``metrics.jsonl`` in the folder the record was read from, when that folder
    has the run folder's name (a store that was moved or copied, e.g. committed results, uses
    its own files), else in the ``run_dir`` the record names.
    """
    run_dir = record.get("run_dir")
    if not run_dir:
        return None, "no run_dir in the record"
    candidates = run_folders(record)
    for folder in candidates:
        if (folder / METRICS_FILE).is_file():
            return folder / METRICS_FILE, ""
    if not any(folder.is_dir() for folder in candidates):
        return None, f"run folder {run_dir} not found"
    return None, f"no {METRICS_FILE} in {run_dir}"


def val_accuracy(lines: list[dict]) -> dict[int, float]:
    """``{step: validation accuracy in %}`` from metrics lines, lines of one step merged."""
    merged: dict[int, dict] = {}
    for line in lines:
        if isinstance(line, dict) and isinstance(line.get("step"), int):
            merged.setdefault(line["step"], {}).update(line)
    return {
        s: 100.0 * float(v[VAL_KEY])
        for s, v in sorted(merged.items())
        if isinstance(v.get(VAL_KEY), int | float)
    }


def mean_curve(runs: list[dict[int, float]]) -> Curve:
    """The mean over ``runs`` (one ``{step: value}`` per seed) at the steps all of them have."""
    steps = sorted(set.intersection(*(set(r) for r in runs))) if runs else []
    return Curve(steps, [sum(r[s] for r in runs) / len(runs) for s in steps], len(runs))


def learning_curves(lb: Leaderboard) -> Curves:
    """The curves of every leaderboard cell (same records), reading each run's metrics file."""
    curves = Curves(lb.task_set, {}, protocol=lb.protocol)
    for task in (*lb.tasks, lb.pathx):
        for row in lb.rows:
            cell = row.cells.get(task)
            if cell is None:
                continue
            runs, used = [], {"records": [], "metrics_files": [], "seeds": []}
            for record, seed in zip(cell.records, cell.seeds, strict=True):
                path, why = metrics_path(record)
                series = {}
                if path:
                    try:
                        series = val_accuracy(read_metrics(path))
                    except (OSError, UnicodeDecodeError) as err:
                        why = f"{path} unreadable ({err})"
                    else:
                        why = "" if series else f"no {VAL_KEY} in {path}"
                if why:
                    curves.skipped.append((record, why))
                    continue
                runs.append(series)
                used["records"].append(record)
                used["metrics_files"].append(path)
                used["seeds"].append(seed)
            curve = mean_curve(runs)
            if curve.steps:
                curves.series.setdefault(task, {})[row.label] = curve
                curves.sources.setdefault(task, {})[row.label] = used
            elif runs:
                curves.skipped += [(r, "no step shared by all seeds") for r in used["records"]]
    return curves


def _seeds_label(ns: list[int]) -> str:
    lo, hi = min(ns), max(ns)
    if hi == 1:
        return ""
    return f" (mean of {hi} seeds)" if lo == hi else f" (mean of {lo}-{hi} seeds, by task)"


def draw_curves(curves: Curves) -> Figure:
    """One panel per task, one line per row (same colour in every panel), legend outside."""
    tasks = list(curves.series)
    models = list(dict.fromkeys(m for t in tasks for m in curves.series[t]))
    ncols = min(3, len(tasks))
    nrows = math.ceil(len(tasks) / ncols)
    fig = Figure(figsize=(4.6 * ncols + 2.4, 3.4 * nrows + 0.6), layout="constrained")
    FigureCanvasAgg(fig)
    colors = matplotlib.colormaps["tab10"]
    style = {
        m: {
            "color": colors(i % 10),
            "marker": MARKERS[i % len(MARKERS)],
            "linestyle": ("-", "--", ":")[i // 10 % 3],
        }
        for i, m in enumerate(models)
    }
    for i, task in enumerate(tasks):
        ax = fig.add_subplot(nrows, ncols, i + 1)
        for model, c in curves.series[task].items():
            ax.plot(c.steps, c.accuracy, markersize=3.5, gid=model, **style[model])
        ax.set_title(task, fontsize=10)
        ax.set_xlabel("Training step")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_ylabel("Validation accuracy (%)")
        ax.grid(alpha=0.3)
    ns = {m: [curves.series[t][m].n for t in tasks if m in curves.series[t]] for m in models}
    handles = [Line2D([], [], **style[m]) for m in models]
    labels = [f"{m}{_seeds_label(ns[m])}" for m in models]
    fig.legend(handles, labels, loc="outside right center", fontsize=8, title="Model")
    title = "Learning curves: validation accuracy vs training step (mean over seeds)"
    if curves.protocol:
        title += f", protocol {curves.protocol}"
    fig.suptitle(title + (f"\n({TINY_NOTE})" if curves.task_set == "tiny" else ""), fontsize=11)
    return fig


def write_curves(curves: Curves, out_dir, stem: str = "curves") -> list[Path]:
    """Write ``<stem>.png`` and ``<stem>.svg`` (text kept as text); nothing when no curve."""
    if not curves.series:
        return []
    return save_figure(draw_curves(curves), out_dir, stem)
