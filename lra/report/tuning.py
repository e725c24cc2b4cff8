"""``lra-tune``'s studies in the report (issue 39, item 5): ``tuning.{md,csv}`` and the
equal-budget figure ``tuning.{png,svg,pdf}``.

``lra-tune`` writes ``<results_dir>/tune/<study>.study.json`` for every Optuna study
(:mod:`lra.tune.summary`): its budget, every trial (state, validation accuracy, values
tried, seconds), the best-so-far curve, the best trial and the final runs. This module reads
those files from the report's results folder(s), recursively, and renders them; it imports
neither Optuna nor JAX.

* ``tuning.md`` / ``tuning.csv``: one row per study (protocol, task, model, study, budget
  ``n_trials``, completed / pruned / failed / running trials, the best validation accuracy,
  its trial, the values it chose, the trials' total seconds, and the final runs' mean test
  accuracy with their number of seeds). Trials select on the validation split only; the
  test column comes from the final runs alone.
* ``tuning.{png,svg,pdf}``: the equal-budget plot, one panel per task, one line per study:
  y = the best validation accuracy so far (percent), x = trials spent (1..n in trial
  order). Pruned, failed and running trials are spent trials: x advances, the line stays
  flat. Drawn on matplotlib's Agg canvas and saved reproducibly
  (:func:`lra.report.figure.save_figure`).

A file that is not valid JSON or is not a study (no ``study`` name or ``trials`` list) is
skipped with a logged warning naming it.
"""

import csv
import io
import json
import logging
import math
import os
from pathlib import Path

import matplotlib
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from lra.record.store import NOT_RECORD_DIRS
from lra.report.figure import save_figure
from lra.report.load import TINY_NOTE, results_dirs

log = logging.getLogger(__name__)

SUFFIX = ".study.json"
STEM = "tuning"
COLUMNS = (
    "protocol",
    "task",
    "model",
    "study",
    "n_trials",
    "completed",
    "pruned",
    "failed",
    "running",
    "best_val_accuracy",
    "best_trial",
    "chosen",
    "trial_seconds",
    "final_test_accuracy",
    "final_seeds",
)
HEADERS = (
    "Protocol",
    "Task",
    "Model",
    "Study",
    "Budget (n_trials)",
    "Completed",
    "Pruned",
    "Failed",
    "Running",
    "Best val acc (%)",
    "Best trial",
    "Chosen values",
    "Trial seconds",
    "Final test acc (%)",
    "Final seeds",
)
CAPTION = (
    "Trials select on the validation split only: the best validation accuracy, its trial and "
    "the chosen values come from the trials, which never evaluate the test split. The final "
    "test accuracy is from the final runs alone (the chosen values trained again with the "
    "final seeds, the test split evaluated once at the selected checkpoint): the mean over "
    "those seeds, empty when a study has no final runs yet. The budget is n_trials; pruned "
    "and failed trials count against it. Trial seconds: the trials' summed durations."
)


# ---------------------------------------------------------------- load


def _study_files(folder: Path) -> list[Path]:
    found = []
    for root, dirs, files in os.walk(folder):
        dirs[:] = [d for d in dirs if d not in NOT_RECORD_DIRS and not d.startswith(".")]
        found += [Path(root) / f for f in files if f.endswith(SUFFIX) and not f.startswith(".")]
    return sorted(found)


def _read_study(path: Path) -> dict | None:
    try:
        data = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        log.warning("tuning: skipped %s: not readable as JSON (%s)", path, err)
        return None
    trials = data.get("trials") if isinstance(data, dict) else None
    if not isinstance(data, dict) or not data.get("study") or not isinstance(trials, list):
        log.warning("tuning: skipped %s: not an lra-tune study (no study or trials list)", path)
        return None
    return {**data, "path": str(path)}


def _as_list(value) -> list[str] | None:
    if value is None or value == "" or value == []:
        return None
    return [value] if isinstance(value, str) else [str(v) for v in value]


def _key(study: dict) -> tuple[str, str, str]:
    return (str(study.get("task") or ""), str(study.get("model") or ""), str(study["study"]))


def load_studies(results_dir, *, models=None, protocols=None) -> list[dict]:
    """Every ``*.study.json`` in the folder(s) ``results_dir`` (recursively, as
    :func:`lra.report.load.results_dirs` resolves them), each file once, sorted by (task,
    model, study), each with its ``path`` added. ``models`` / ``protocols`` (None keeps all)
    apply the report's filters of the same names."""
    wanted_models, wanted_protocols = _as_list(models), _as_list(protocols)
    seen, studies = set(), []
    for folder in results_dirs(results_dir):
        for path in _study_files(folder) if folder.is_dir() else []:
            key = str(path.resolve())
            if key in seen:
                continue
            seen.add(key)
            study = _read_study(path)
            if study is None:
                continue
            if wanted_models and study.get("model") not in wanted_models:
                continue
            if wanted_protocols and study.get("protocol") not in wanted_protocols:
                continue
            studies.append(study)
    return sorted(studies, key=_key)


# ---------------------------------------------------------------- aggregate


def _number(value) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return None if math.isnan(value) else float(value)


def _percent(value) -> float | None:
    value = _number(value)
    return None if value is None else 100.0 * value


def chosen_values(params) -> str:
    """``key=value`` for each of ``params``, floats to 4 significant digits."""
    if not isinstance(params, dict):
        return ""
    shown = [f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in params.items()]
    return ", ".join(shown)


def _count(study: dict, key: str, states: tuple[str, ...]) -> int:
    value = study.get(key)
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    return sum(1 for t in study["trials"] if isinstance(t, dict) and t.get("state") in states)


def study_row(study: dict) -> dict:
    """One study as the row of ``tuning.{md,csv}`` (accuracies in percent, None when absent)."""
    settings = study.get("settings") if isinstance(study.get("settings"), dict) else {}
    best = study.get("best") if isinstance(study.get("best"), dict) else {}
    trials = [t for t in study["trials"] if isinstance(t, dict)]
    seconds = [s for s in (_number(t.get("seconds")) for t in trials) if s is not None]
    finals = study.get("finals") if isinstance(study.get("finals"), list) else []
    tests = [_percent(f.get("test_accuracy")) for f in finals if isinstance(f, dict)]
    tests = [v for v in tests if v is not None]
    return {
        "protocol": study.get("protocol"),
        "task": study.get("task"),
        "model": study.get("model"),
        "study": study["study"],
        "n_trials": settings.get("n_trials"),
        "completed": _count(study, "completed", ("COMPLETE",)),
        "pruned": _count(study, "pruned", ("PRUNED",)),
        "failed": _count(study, "failed", ("FAIL",)),
        "running": _count(study, "running", ("RUNNING", "WAITING")),
        "best_val_accuracy": _percent(best.get("value")),
        "best_trial": best.get("trial"),
        "chosen": chosen_values(best.get("params")) or None,
        "trial_seconds": sum(seconds) if seconds else None,
        "final_test_accuracy": sum(tests) / len(tests) if tests else None,
        "final_seeds": len(tests) if tests else None,
    }


def equal_budget_series(study: dict) -> tuple[list[int], list[float | None]]:
    """The plotted series of a study: x = trials spent (1..n in trial order), y = the best
    validation accuracy (percent) over the completed trials so far, None before the first.

    Read from the study's ``curve`` (its ``trials`` when it has none); the running maximum
    is taken here from each trial's state and value, so only completed trials raise it.
    """
    points = study.get("curve")
    if not isinstance(points, list) or not points:
        points = [{"trial": t.get("number"), **t} for t in study["trials"] if isinstance(t, dict)]
    points = [p for p in points if isinstance(p, dict)]
    points.sort(key=lambda p: p["trial"] if isinstance(p.get("trial"), int) else math.inf)
    xs, ys, top = [], [], None
    for i, point in enumerate(points, start=1):
        value = _percent(point.get("value")) if point.get("state") == "COMPLETE" else None
        if value is not None and (top is None or value > top):
            top = value
        xs.append(i)
        ys.append(top)
    return xs, ys


# ---------------------------------------------------------------- render


def _cell(value, digits: int = 2) -> str:
    if value is None:
        return ""
    return f"{value:.{digits}f}" if isinstance(value, float) else str(value)


def tuning_markdown(studies: list[dict]) -> str:
    """``tuning.md``: the caption and one table row per study."""
    lines = [
        "# Hyperparameter tuning (lra-tune)",
        "",
        CAPTION,
        "",
        "| " + " | ".join(HEADERS) + " |",
        "|" + "---|" * len(HEADERS),
    ]
    for study in studies:
        row = study_row(study)
        cells = {c: _cell(row[c]) for c in COLUMNS}
        cells["study"] = f"`{row['study']}`"
        cells["trial_seconds"] = _cell(row["trial_seconds"], 1)
        lines.append("| " + " | ".join(cells[c].replace("|", "\\|") for c in COLUMNS) + " |")
    return "\n".join(lines) + "\n"


def _csv_value(value):
    if value is None:
        return ""
    return repr(round(value, 6)) if isinstance(value, float) else value


def tuning_csv(studies: list[dict]) -> str:
    """``tuning.csv``: the columns of :data:`COLUMNS`, one line per study, floats to 6 places."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(COLUMNS)
    for study in studies:
        row = study_row(study)
        writer.writerow(_csv_value(row[c]) for c in COLUMNS)
    return out.getvalue()


def _labels(studies: list[dict]) -> list[str]:
    """Each study's legend label: its model, with the study's name where models repeat."""
    models = [str(s.get("model") or "?") for s in studies]
    pairs = zip(models, studies, strict=True)
    return [m if models.count(m) == 1 else f"{m} ({s['study']})" for m, s in pairs]


def draw_tuning(studies: list[dict]) -> Figure:
    """One panel per task, one line per study (best-so-far, flat over pruned/failed trials)."""
    tasks = list(dict.fromkeys(str(s.get("task") or "?") for s in studies))
    models = list(dict.fromkeys(str(s.get("model") or "?") for s in studies))
    ncols = min(3, len(tasks))
    nrows = math.ceil(len(tasks) / ncols)
    fig = Figure(figsize=(4.8 * ncols + 0.6, 3.6 * nrows + 0.7), layout="constrained")
    FigureCanvasAgg(fig)
    colors = matplotlib.colormaps["tab10"]
    for i, task in enumerate(tasks):
        ax = fig.add_subplot(nrows, ncols, i + 1)
        here = [s for s in studies if str(s.get("task") or "?") == task]
        for study, label in zip(here, _labels(here), strict=True):
            xs, ys = equal_budget_series(study)
            j = models.index(str(study.get("model") or "?"))
            ax.plot(
                xs,
                [math.nan if y is None else y for y in ys],
                drawstyle="steps-post",
                marker="o",
                markersize=3,
                color=colors(j % 10),
                linestyle=("-", "--", ":")[j // 10 % 3],
                label=label,
                gid=str(study["study"]),
            )
        ax.set_title(task, fontsize=10)
        ax.set_xlabel("Trials spent")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_ylabel("Best validation accuracy so far (%)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, loc="lower right", title="Model", title_fontsize=7)
    title = "Equal-budget tuning: best validation accuracy so far vs trials spent"
    tiny = f"; {TINY_NOTE}" if all(t.endswith("_tiny") for t in tasks) else ""
    title += f"\n(pruned and failed trials count as spent{tiny})"
    fig.suptitle(title, fontsize=10)
    return fig


def write_tuning_figure(studies: list[dict], out_dir) -> list[Path]:
    """``tuning.{png,svg,pdf}``; nothing when there is no study."""
    if not studies:
        return []
    return save_figure(draw_tuning(studies), out_dir, STEM)
