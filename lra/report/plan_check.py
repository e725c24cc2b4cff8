"""How right the plan was: ``lra-plan``'s projections against the records of the runs it planned.

``lra-report plan=<plan.json>`` matches each cell of the plan with the training records of the
same setting (``setting``: the hash of the resolved config less seed, paths and device layout;
for a self-pretraining cell, its fine-tuning stage) and writes ``plan_check.md`` and
``plan_check.csv``: per cell, the projected and the measured

- training time: ``num_steps / train_steps_per_sec`` (the record's timed steps; the plan's
  timed steps on synthetic batches);
- wall time: the record's ``wall_seconds`` (every session of the run, setup and data loading
  included) against the plan's projection of the whole stage;

each as the median over the cell's records, and their ratio measured / projected. The caption
gives the median and the worst ratio over the cells. Pure data: no JAX.
"""

import csv
import io
import json
import statistics
from pathlib import Path

from lra.errors import ConfigError

COLUMNS = (
    "cell",
    "setting",
    "seeds_planned",
    "runs_found",
    "projected_train_seconds",
    "measured_train_seconds",
    "train_ratio",
    "projected_wall_seconds",
    "measured_wall_seconds",
    "wall_ratio",
)


def load_plan(path) -> dict:
    """The plan at ``path`` (``plan.json``, or the folder holding one)."""
    path = Path(path)
    if path.is_dir():
        path = path / "plan.json"
    try:
        plan = json.loads(path.read_text())
    except FileNotFoundError:
        raise ConfigError(f"plan={path}: no such file; lra-plan writes plan.json") from None
    except (OSError, json.JSONDecodeError) as err:
        raise ConfigError(f"plan={path}: cannot read it as JSON ({err})") from None
    if not isinstance(plan, dict) or not isinstance(plan.get("cells"), list):
        raise ConfigError(f"plan={path}: not an lra-plan plan.json (it has no list of cells)")
    return plan


def _ratio(measured, projected):
    return None if not measured or not projected else measured / projected


def _median(values):
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def plan_check(plan: dict, records: list[dict]) -> list[dict]:
    """One row per cell of ``plan``: projected against measured (see the module)."""
    by_setting: dict[str, list[dict]] = {}
    for record in records:
        if record.get("kind") == "train" and record.get("setting"):
            by_setting.setdefault(record["setting"], []).append(record)
    rows = []
    for cell in plan["cells"]:
        found = by_setting.get(cell.get("setting"), [])
        stage = (cell.get("stages") or [{}])[-1].get("projected") or {}
        trained = [
            r["num_steps"] / r["train_steps_per_sec"]
            for r in found
            if r.get("num_steps") and r.get("train_steps_per_sec")
        ]
        measured_train = _median(trained)
        measured_wall = _median([r.get("wall_seconds") for r in found])
        rows.append(
            {
                "cell": cell["name"],
                "setting": cell.get("setting"),
                "seeds_planned": len(cell["seeds"]),
                "runs_found": len(found),
                "projected_train_seconds": stage.get("train"),
                "measured_train_seconds": measured_train,
                "train_ratio": _ratio(measured_train, stage.get("train")),
                "projected_wall_seconds": stage.get("total"),
                "measured_wall_seconds": measured_wall,
                "wall_ratio": _ratio(measured_wall, stage.get("total")),
            }
        )
    return rows


def _summary(rows: list[dict], key: str) -> str:
    ratios = [r[key] for r in rows if r[key] is not None]
    if not ratios:
        return "no cell has both"
    worst = max(ratios, key=lambda x: max(x, 1 / x))
    return f"median {statistics.median(ratios):.2f}, worst {worst:.2f} over {len(ratios)} cells"


def _cell(value) -> str:
    if value is None:
        return "-"
    return f"{value:.2f}" if isinstance(value, float) else str(value)


def plan_check_markdown(plan: dict, rows: list[dict]) -> str:
    lines = [
        "# Plan against records",
        "",
        f"Plan: `{plan.get('command', '?')}` (measured on "
        f"{plan.get('device', {}).get('description')} at {plan.get('created_at')}). "
        "Measured / projected, per cell the median over its "
        "records: training time (num_steps / train steps/sec) "
        f"{_summary(rows, 'train_ratio')}; wall time (the record's wall_seconds against the "
        f"projected stage) {_summary(rows, 'wall_ratio')}. A ratio above 1: the run took longer "
        "than planned.",
        "",
        "| " + " | ".join(COLUMNS) + " |",
        "|" + "---|" * len(COLUMNS),
    ]
    lines += ["| " + " | ".join(_cell(row[c]) for c in COLUMNS) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def plan_check_csv(rows: list[dict]) -> str:
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=COLUMNS, lineterminator="\n")
    writer.writeheader()
    for row in rows:
        writer.writerow({k: "" if row[k] is None else row[k] for k in COLUMNS})
    return out.getvalue()
