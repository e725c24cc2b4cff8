"""``lra-plan``: what a sweep will cost, cell by cell, before it starts (issue 40).

``lra-plan <the overrides of lra-train -m>`` expands the sweep as Hydra's basic sweeper would
(:mod:`lra.config.sweep`), measures each distinct cell once in a fresh process
(:mod:`lra.plan.measure`: compile at the run's shapes, the pre-flight's fit check, timed steps on
synthetic batches, one timed checkpoint; no data file is opened), projects each run's wall time
(:mod:`lra.plan.project`) and writes ``plan.json`` and ``plan.md`` into ``out_dir``
(:mod:`lra.plan.output`). Self-pretraining cells (``pretrain=masked|causal``) are measured as
both their stages.

The plan's own options (everything else is a sweep override):

- ``out_dir=<folder>``: where ``plan.json`` and ``plan.md`` go (default: the current folder);
- ``jobs=<N>``: parallel runs the wall-time total assumes (devices or SLURM jobs; default 1);
- ``budget_hours=<H>``: mark the cells, in the sweep's order, that fit H device-hours;
- ``memory_gb=<GB>``: the device memory every cell's fit is judged against (default: what the
  device has, as the pre-flight reads it; on a CPU the available RAM);
- ``plan.warmup_steps``, ``plan.windows``, ``plan.steps_per_window``: the timing (default 1, 2, 2);
- ``device=tpu:<generation>:<topology>`` (e.g. ``tpu:v5e:2x2``, ``tpu:v4:2x2x1``,
  ``tpu:v6e:2x2``): compile each cell for that TPU slice from this host instead of measuring
  here (the ``tpu-aot`` extra; per-device memory and fit, and roofline ESTIMATES of the
  speed: :mod:`lra.plan.tpu`);
- ``plan.isolate=false``: measure in this process (the tests; a cell's memory statistics and
  compile cache then carry over to the next);
- ``tune.n_trials=N`` (with ``tune.final_seeds=F``, default 3, and any other ``tune.*`` key of
  ``lra-tune``): plan the ``lra-tune`` studies of the cells instead of their runs, one study per
  seed: N validation-only trials counted whole, then F final runs (:mod:`lra.plan.tuning`);
- ``plan.resume=false``: measure every cell again. By default a ``plan.json`` already in
  ``out_dir`` (a plan cut short, or one of another sweep) lends the cells it measured at the
  same code version, device and timing options; only crashed cells are measured again, and
  a reused cell takes this sweep's seeds.
"""

import json
import logging
import sys
import time
from pathlib import Path

from omegaconf import OmegaConf

from lra.atomic import write_atomic
from lra.config.identity import result_hash, run_key
from lra.config.sweep import group_cells, sweep_jobs
from lra.errors import ConfigError
from lra.plan import tuning
from lra.plan.output import plan_json, plan_markdown, totals
from lra.plan.project import add_stages, project_stage
from lra.run.exit_status import report_errors

log = logging.getLogger("lra.plan")

#: The plan's options, their types and defaults (the other arguments are sweep overrides).
OPTIONS = {
    "out_dir": (str, "."),
    "jobs": (int, 1),
    "budget_hours": (float, None),
    "memory_gb": (float, None),
    "plan.warmup_steps": (int, 1),
    "plan.windows": (int, 2),
    "plan.steps_per_window": (int, 2),
    "plan.isolate": (bool, True),
    "plan.resume": (bool, True),
    "device": (str, None),
}


def split_arguments(argv: list[str]) -> tuple[dict, list[str]]:
    """``(the plan's options, the sweep's overrides)`` of ``lra-plan``'s arguments."""
    options = {key: default for key, (_, default) in OPTIONS.items()}
    overrides, tune_args = [], []
    for arg in argv:
        key, _, value = arg.partition("=")
        if key.startswith("tune."):
            tune_args.append(arg)
            continue
        if key not in OPTIONS:
            overrides.append(arg)
            continue
        kind = OPTIONS[key][0]
        try:
            if kind is bool:
                options[key] = {"true": True, "false": False}[value.lower()]
            else:
                options[key] = None if value in ("null", "") and kind is float else kind(value)
        except (ValueError, KeyError):
            raise ConfigError(f"{arg}: {key} takes a {kind.__name__} (e.g. {key}=2)") from None
        if kind in (int, float) and options[key] is not None and options[key] <= 0:
            raise ConfigError(f"{arg}: {key} must be above 0")
    options["tune"] = tuning.tune_options(tune_args)
    return options, overrides


def _cell_config(cell):
    """The composed, schema-checked training config of a cell (its first seed)."""
    from lra.config import schema
    from lra.config.compose import compose_config

    seed = cell.seeds[0]
    cfg = compose_config("config", [*cell.overrides, *([f"seed={seed}"] * isinstance(seed, int))])
    schema.validate(cfg, "config")
    return cfg


def _stages(cfg) -> list[tuple[str, object]]:
    """``(stage name, its config)`` of a run: ``train``, or self-pretraining's two stages."""
    from lra.train import pretrain

    if pretrain.is_two_stage(cfg):
        first = pretrain.pretrain_config(cfg)
        # The fine-tuning stage names its pretraining run as lra-train does (its run key).
        key = run_key(OmegaConf.to_container(first, resolve=True))
        return [("pretrain", first), ("finetune", pretrain.finetune_config(cfg, key))]
    return [("train", cfg)]


def plan_cell(cell, options: dict) -> dict:
    """Measure and project one cell; the entry of ``plan.json``'s ``cells``."""
    from lra.plan import measure, tpu

    if options["device"] is not None:
        target, timing = tpu.measure_stage, {"device": options["device"]}
    else:
        target = measure.measure_stage
        timing = {
            "warmup_steps": options["plan.warmup_steps"],
            "windows": options["plan.windows"],
            "steps_per_window": options["plan.steps_per_window"],
        }
    cfg = _cell_config(cell)
    stages, projections = [], []
    stage_list = _stages(cfg)
    if options["tune"] is not None and len(stage_list) > 1:
        tuning.refuse_two_stage(cell.name)
    for name, stage_cfg in stage_list:
        config = OmegaConf.to_container(stage_cfg, resolve=True)
        if options["memory_gb"] is not None:
            config["trainer"]["memory_limit_gb"] = options["memory_gb"]
        if options["plan.isolate"]:
            measured = measure.measure_isolated(config, timing, target)
        else:
            measured = target(config, timing)
        projected = project_stage(stage_cfg, measured, pretraining=name == "pretrain")
        setting = result_hash(config)  # the records' ``setting``: lra-report matches on it
        stages.append({"stage": name, "setting": setting, **measured, "projected": projected})
        projections.append(projected)
        if not measured.get("fits"):
            break  # a stage that does not fit: the next is not measured
    last = stages[-1]
    projected = add_stages(projections) if len(projections) == len(stage_list) else None
    seconds = None if projected is None else projected["total"]
    devices = int(last.get("num_devices") or 1)
    study = None
    if options["tune"] is not None:
        trial_cfg = OmegaConf.merge(stage_list[-1][1], {"trainer": {"evaluate_test": False}})
        trial = project_stage(trial_cfg, last)["total"]
        study = tuning.price_study(options["tune"], trial, seconds)
    entry = {
        "name": cell.name,
        "overrides": list(cell.overrides),
        "seeds": list(cell.seeds),
        "setting": result_hash(OmegaConf.to_container(stage_list[-1][1], resolve=True)),
        "model": str(cfg.model.name),
        "task": str(cfg.task.name),
        "steps_per_sec": last.get("train_steps_per_sec"),
        "eval_steps_per_sec": last.get("eval_steps_per_sec"),
        "compiled_memory_bytes": max(
            (s.get("compiled_memory_bytes") or 0 for s in stages), default=None
        )
        or None,
        "device_memory_bytes": last.get("device_memory_bytes"),
        "fits": all(s.get("fits") for s in stages),
        "crashed": any(s.get("crashed") for s in stages),
        "advice": next((s["advice"] for s in stages if not s.get("fits")), None),
        "projected_seconds": seconds,
        "projected_parts": projected,
        "devices_per_run": devices,
        "stages": stages,
    }
    if study is not None:
        entry["tuning"] = study
    return {**entry, "device_hours": device_hours(entry, cell.seeds)}


def device_hours(entry: dict, seeds: list) -> float | None:
    """A cell's device-hours: its runs' (or, in a tuning plan, its studies') seconds x the
    devices of a run x its seeds."""
    study = entry.get("tuning")
    seconds = entry.get("projected_seconds") if study is None else study["study_seconds"]
    devices = entry.get("devices_per_run") or 1
    return None if seconds is None else seconds * devices * len(seeds) / 3600


def _measured_options(options: dict) -> dict:
    """The options a cell's measurement depends on (``plan.json``'s ``options``)."""
    return {
        "warmup_steps": options["plan.warmup_steps"],
        "windows": options["plan.windows"],
        "steps_per_window": options["plan.steps_per_window"],
        "memory_gb": options["memory_gb"],
        "isolate": options["plan.isolate"],
        "device": options["device"],
    }


def _lent(earlier: dict, options: dict) -> dict:
    """An earlier cell as this plan prices it: re-priced for this plan's budget (a tuning plan
    takes only cells an earlier tuning plan projected a trial for)."""
    tune = options["tune"]
    if tune is None:
        return {k: v for k, v in earlier.items() if k != "tuning"}
    return {
        **earlier,
        "tuning": tuning.price_study(
            tune, earlier["tuning"]["trial_seconds"], earlier.get("projected_seconds")
        ),
    }


def earlier_cells(out_dir: Path, code: str, options: dict) -> dict[tuple, dict]:
    """The cells an earlier ``plan.json`` in ``out_dir`` measured that this plan may reuse.

    Keyed by the cell's overrides. Only a plan of the same code version (not ``-dirty``: a
    modified checkout is not one version), device and timing options lends its cells, and
    a crashed cell is never lent (it is measured again).
    """
    path = out_dir / "plan.json"
    if not options["plan.resume"] or not path.is_file() or code.endswith("-dirty"):
        return {}
    try:
        earlier = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}  # unreadable: this plan measures every cell and replaces it
    same = earlier.get("code_version") == code and {
        k: v for k, v in earlier.get("options", {}).items() if k != "isolate"
    } == {k: v for k, v in _measured_options(options).items() if k != "isolate"}
    if not same:
        return {}
    tuned = options["tune"] is not None
    return {
        tuple(c["overrides"]): _lent(c, options)
        for c in earlier.get("cells", [])
        if not c.get("crashed") and (c.get("tuning") is not None or not tuned)
    }


def with_seeds(entry: dict, seeds: list) -> dict:
    """A measured cell lent to a sweep with other seeds: its device-hours recounted."""
    return {
        **entry,
        "seeds": list(seeds),
        "device_hours": device_hours(entry, seeds),
        "reused": True,
    }


def _cell_line(index: int, count: int, entry: dict) -> str:
    head = f"[{index}/{count}] {entry['name']} (seeds {len(entry['seeds'])})"
    if entry.get("reused"):
        head += " (measured by the earlier plan)"
    if not entry["fits"]:
        return f"{head}: DOES NOT FIT: {entry['advice']}"
    if entry["projected_seconds"] is None:
        return f"{head}: fits, not timed"
    study = entry.get("tuning")
    cost = f"{entry['projected_seconds'] / 60:.1f} min a run"
    if study is not None and study["study_seconds"] is not None:
        cost = (
            f"{study['trial_seconds'] / 60:.1f} min a trial, {cost}, "
            f"{study['study_seconds'] / 3600:.2f} h a study"
        )
    return (
        f"{head}: {entry['steps_per_sec']:.3g} steps/s, "
        f"{(entry['compiled_memory_bytes'] or 0) / 2**30:.2f} GiB, "
        f"{cost}, {entry['device_hours']:.3g} device-h"
    )


def make_plan(argv: list[str]) -> dict:
    """The plan of ``lra-plan argv``, written to ``out_dir``; returns it."""
    from lra.record import store

    options, overrides = split_arguments(argv)
    if options["device"] is not None:
        from lra.plan.tpu import parse_device

        parse_device(options["device"])  # a bad device= fails before any cell is measured
    out_dir = Path(options["out_dir"])
    if out_dir.exists() and not out_dir.is_dir():
        raise ConfigError(f"out_dir={out_dir} is a file; name a folder for plan.json and plan.md")
    cells = group_cells(sweep_jobs(overrides))
    out_dir.mkdir(parents=True, exist_ok=True)
    created, start = store.utc_now(), time.perf_counter()
    code = store.code_version()
    earlier = earlier_cells(out_dir, code, options)
    entries = []
    for index, cell in enumerate(cells, 1):
        lent = earlier.get(tuple(cell.overrides))
        entries.append(plan_cell(cell, options) if lent is None else with_seeds(lent, cell.seeds))
        print(_cell_line(index, len(cells), entries[-1]), flush=True)
        # After every cell: a plan cut short (a lease's time limit) keeps what it measured.
        plan = _plan(argv, options, entries, len(cells), created, code, start)
        write_atomic(out_dir / "plan.json", plan_json(plan))
        write_atomic(out_dir / "plan.md", plan_markdown(plan))
    print(
        f"{plan['total_device_hours']:.3g} device-hours, {len(plan['not_fitting'])} cell(s) do "
        f"not fit; wrote {out_dir / 'plan.md'} and {out_dir / 'plan.json'}",
        flush=True,
    )
    return plan


def _plan(argv, options, entries, count, created, code, start) -> dict:
    """The plan's data after ``entries`` of ``count`` cells (``complete`` once all are in)."""
    # The device as the first stage that reached it names it (a crashed cell names none).
    stages = [s for e in entries for s in e["stages"]]
    first = next((s for s in stages if s.get("platform")), stages[0])
    return {
        "command": " ".join(["lra-plan", *argv]),
        "created_at": created,
        "code_version": code,
        "plan_seconds": time.perf_counter() - start,
        "complete": len(entries) == count,
        "cells_planned": count,
        "device": {
            "description": first.get("device"),
            "platform": first.get("platform"),
            "device_count": first.get("device_count"),
            "jax_version": first.get("jax_version"),
            "estimate": first.get("estimate"),
        },
        "options": _measured_options(options),
        "tune": options["tune"],
        **totals(entries, options["jobs"], options["budget_hours"]),
        "cells": entries,
    }


def plan_main() -> None:
    """``lra-plan``: see the module docstring."""
    logging.basicConfig(level=logging.WARNING)
    argv = sys.argv[1:]
    if any(a in ("-h", "--help") for a in argv):
        print(__doc__)
        return
    report_errors(make_plan, argv)
