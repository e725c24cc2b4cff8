"""``plan.json`` and ``plan.md``: a sweep's cells, what each costs, and the totals.

Pure data in, text out (no JAX). The totals: device-hours of every cell with a projection,
the wall time of the sweep on ``jobs`` parallel runs (devices or SLURM jobs), its seeds'
runs taken in the sweep's order by whichever worker is free first (as a launcher hands them
out), and the cells that do not fit. With ``budget_hours`` each cell says whether it fits a
budget of that many device-hours, the cells taken in the sweep's order. A tuning plan
(``tune.n_trials``, :mod:`lra.plan.tuning`) prices each cell's studies instead of its runs.
"""

import heapq
import json

from lra.plan.tuning import schedule

PLAN_FIELDS = (
    "overrides",
    "seeds",
    "steps_per_sec",
    "compiled_memory_bytes",
    "fits",
    "projected_seconds",
    "device_hours",
)


def wall_seconds(cells: list[dict], jobs: int) -> float:
    """The sweep's wall time on ``jobs`` parallel workers: each cell's runs (one per seed) in
    the sweep's order, each on the worker that frees up first."""
    workers = [0.0] * max(1, int(jobs))
    for cell in cells:
        if cell["device_hours"] is None:
            continue
        for _ in cell["seeds"]:
            if cell.get("tuning") is not None:
                schedule(workers, cell["tuning"])  # a study: its trials, then its finals
            else:
                heapq.heapreplace(workers, workers[0] + cell["projected_seconds"])
    return max(workers)


def _runs(cell: dict) -> int:
    study = cell.get("tuning")
    per_seed = 1 if study is None else study["n_trials"] + study["final_seeds"]
    return per_seed * len(cell["seeds"])


def with_budget(cells: list[dict], budget_hours: float | None) -> None:
    """Mark each cell ``in_budget`` (cumulative device-hours in the sweep's order within the
    budget); a cell with no projection is never in it."""
    spent = 0.0
    for cell in cells:
        if budget_hours is None:
            cell["in_budget"] = None
            continue
        hours = cell["device_hours"]
        cell["in_budget"] = hours is not None and spent + hours <= budget_hours
        if cell["in_budget"]:
            spent += hours


def totals(cells: list[dict], jobs: int, budget_hours: float | None) -> dict:
    """The plan's top level: device-hours, wall time on ``jobs`` workers, the cells that do not
    fit or have no projection, and what a budget affords."""
    with_budget(cells, budget_hours)
    projected = [c for c in cells if c["device_hours"] is not None]
    out = {
        "total_device_hours": sum(c["device_hours"] for c in projected),
        "runs": sum(_runs(c) for c in cells),
        "jobs": int(jobs),
        "wall_hours": wall_seconds(cells, jobs) / 3600,
        "not_fitting": [c["name"] for c in cells if not c["fits"] and not c.get("crashed")],
        "crashed": [c["name"] for c in cells if c.get("crashed")],
        "not_projected": [c["name"] for c in cells if c["fits"] and c["device_hours"] is None],
        "budget_hours": budget_hours,
    }
    if budget_hours is not None:
        kept = [c for c in cells if c["in_budget"]]
        out["in_budget"] = [c["name"] for c in kept]
        out["budget_device_hours"] = sum(c["device_hours"] for c in kept)
    return out


def _gib(num_bytes) -> str:
    return "?" if num_bytes is None else f"{num_bytes / 2**30:.2f} GiB"


def _duration(seconds) -> str:
    if seconds is None:
        return "-"
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:.1f} h"


def _fit(cell: dict) -> str:
    if cell.get("crashed"):
        return "crashed"
    return "yes" if cell["fits"] else "**no**"


def _study_columns(cell: dict) -> str:
    study = cell.get("tuning") or {}
    trial, total = study.get("trial_seconds"), study.get("study_seconds")
    return f"{_duration(trial)} | {_duration(total)} | "


def plan_markdown(plan: dict) -> str:
    """``plan.md``: the table of cells, the totals, and each non-fitting cell's advice."""
    where = plan["device"]
    estimate = where.get("estimate") == "roofline"
    if estimate:
        how = (
            f"Compiled on this host for {plan['options']['device']} ({where['description']}, "
            f"{where['device_count']} devices; no TPU ran) at {plan['created_at']}, code "
            f"{plan['code_version']}. Memory: XLA's memory analysis of the TPU program per "
            "device, against the device's HBM. Speeds are ESTIMATES, not measurements: a "
            "roofline, max(FLOPs / peak bf16 FLOP/s, bytes accessed / HBM bandwidth) per device "
            "from the compiled step's cost analysis and the chip's published figures "
            "(lra/plan/tpu_chips.yaml); checkpoints are not estimated."
        )
    else:
        how = (
            f"Measured on {where['description']} ({where['platform']}, "
            f"{where['device_count']} device(s)) at {plan['created_at']}, code "
            f"{plan['code_version']}. Each cell was compiled at its run's shapes and settings in "
            "a fresh process and timed on synthetic batches "
            f"({plan['options']['warmup_steps']} warm-up step(s), then "
            f"{plan['options']['windows']} window(s) of {plan['options']['steps_per_window']} "
            "step(s))."
        )
    budget = plan["budget_hours"] is not None
    tune = plan.get("tune")
    if tune is not None:
        how += (
            f" Tuning plan: each cell is one lra-tune study per seed, {tune['n_trials']} "
            f"trial(s) then {tune['final_seeds']} final run(s) (lra/plan/tuning.py). A trial is "
            "projected as a validation-only run (no test pass) and counted whole, pruned or not: "
            "with a pruner the study costs at most that."
        )
    lines = [
        f"# Plan: {plan['command']}",
        "",
        how + " Seeds are counted, not measured. Projected wall time per run = train steps / "
        "steps/sec + validation and test passes + compilation + checkpoints "
        "(lra/plan/project.py); device-hours = that x the run's devices x seeds"
        + (" (ESTIMATES)." if estimate else "."),
        "",
        f"| Cell | Seeds | Train steps/s{' (estimate)' if estimate else ''} | Compiled memory / "
        "device | Fits | Projected per run |"
        + (" Per trial | Per study |" if tune else "")
        + " Device-hours |"
        + (" In budget |" if budget else ""),
        "|---|---|---|---|---|---|---|" + ("---|---|" if tune else "") + ("---|" if budget else ""),
    ]
    for cell in plan["cells"]:
        rate = "-" if cell["steps_per_sec"] is None else f"{cell['steps_per_sec']:.3g}"
        hours = "-" if cell["device_hours"] is None else f"{cell['device_hours']:.3g}"
        row = (
            f"| {cell['name']} | {len(cell['seeds'])} | {rate} | "
            f"{_gib(cell['compiled_memory_bytes'])} / {_gib(cell['device_memory_bytes'])} | "
            f"{_fit(cell)} | {_duration(cell['projected_seconds'])} | "
            + (_study_columns(cell) if tune else "")
            + f"{hours} |"
        )
        if budget:
            row += f" {'yes' if cell['in_budget'] else 'no'} |"
        lines.append(row)
    if not plan.get("complete", True):
        lines += [
            "",
            f"**Incomplete: {len(plan['cells'])} of {plan['cells_planned']} cells planned** "
            "(the command stopped before the rest); the totals cover these cells only.",
        ]
    lines += [
        "",
        f"Total: {plan['total_device_hours']:.3g} device-hours over {plan['runs']} runs"
        + (" (trials and final runs)" if tune else "")
        + "; "
        f"{_duration(plan['wall_hours'] * 3600)} of wall time on {plan['jobs']} parallel "
        "job(s) (jobs=N: devices or SLURM jobs).",
    ]
    if plan["budget_hours"] is not None:
        lines.append(
            f"Budget {plan['budget_hours']:g} device-hours: {len(plan['in_budget'])} of "
            f"{len(plan['cells'])} cells fit, in the sweep's order "
            f"({plan['budget_device_hours']:.3g} device-hours)."
        )
    if plan["not_fitting"]:
        lines += ["", f"Cells that do not fit ({len(plan['not_fitting'])}):", ""]
        lines += [
            f"- {c['name']}: {c['advice']}"
            for c in plan["cells"]
            if not c["fits"] and not c.get("crashed")
        ]
    if plan.get("crashed"):
        count = len(plan["crashed"])
        lines += ["", f"Cells not measured, their measuring process crashed ({count}):", ""]
        lines += [f"- {c['name']}: {c['advice']}" for c in plan["cells"] if c.get("crashed")]
    return "\n".join(lines) + "\n"


def plan_json(plan: dict) -> str:
    return json.dumps(plan, indent=2, sort_keys=False) + "\n"
