"""``<results_dir>/tune/<study>.study.json``: a study as plain data, for people and ``lra-report``.

Rewritten atomically after every trial and after the final runs, so the report (which imports
neither Optuna nor JAX) draws the tuning table and the equal-budget figure from it: the study's
settings and search space, every trial (number, state, value, values tried, run key, seconds),
the best-so-far curve, the best trial, and the final runs' validation and test accuracies.
"""

import json
from pathlib import Path

from lra.atomic import write_atomic
from lra.tune import study as studies

SUFFIX = ".study.json"


def summary_path(ctx) -> Path:
    return studies.tune_dir(ctx.cfg) / f"{ctx.name}{SUFFIX}"


def _trial(t) -> dict:
    return {
        "number": t.number,
        "state": t.state.name,
        "value": t.value if t.state.name == "COMPLETE" else None,
        "params": t.user_attrs.get(studies.OVERRIDES),
        "run_dir": t.user_attrs.get(studies.RUN_DIR),
        "seconds": t.duration.total_seconds() if t.duration else None,
        "error": t.user_attrs.get("error"),
    }


def _final(record: dict) -> dict:
    return {
        "seed": record["seed"],
        "run_key": record["run_key"],
        "val_accuracy": record["val_accuracy"],
        "test_accuracy": record["test_accuracy"],
        "wall_seconds": record.get("wall_seconds"),
    }


def study_summary(ctx, study, finals: list[dict] | None = None) -> dict:
    top = studies.best(study)
    return {
        "study": ctx.name,
        "storage": ctx.storage_spec,
        "model": ctx.base["model"]["name"],
        "task": ctx.base["task"]["name"],
        "protocol": ctx.base.get("protocol") or "lra_official",
        "settings": studies.study_settings(ctx.cfg, ctx.space),
        "search": ctx.space.describe(),
        "search_files": list(ctx.space.files),
        **studies.counts(study),
        "best": None
        if top is None
        else {
            "trial": top.number,
            "value": top.value,
            "params": top.user_attrs.get(studies.OVERRIDES),
        },
        "trials": [_trial(t) for t in sorted(studies.counted(study), key=lambda t: t.number)],
        "curve": studies.best_so_far(study),
        "finals": [_final(r) for r in finals or []],
    }


def write_summary(ctx, study, finals: list[dict] | None = None) -> tuple[Path, dict]:
    """Write the study file; its path and what it holds."""
    path, data = summary_path(ctx), study_summary(ctx, study, finals)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, json.dumps(data, indent=2, default=str) + "\n")
    return path, data
