"""``lra-plan`` of ``lra-tune`` studies: what a tuning budget costs before it is spent.

``lra-plan <lra-tune's overrides> tune.n_trials=N [tune.final_seeds=F]`` (F defaults as in
``lra-tune``) plans each cell as the studies ``lra-tune`` would run, one per seed of the cell
(the seed names the study): N trials, then F final runs of the chosen values (:mod:`lra.tune`).
The cell is measured once, as for a sweep (:mod:`lra.plan.measure`); the search space's keys
(learning rate, weight decay, dropout, warm-up) do not change a step's shapes, so every trial
runs at the cell's speed.

- A trial is projected as a validation-only run (``trainer.evaluate_test=false``: its train
  steps, validation passes, compilation and checkpoints; no test pass), counted whole: a pruned
  trial stops early, so with ``tune.pruner`` the study's projection is an upper bound.
- A final run is the cell's ordinary run (with its test pass).
- A study: ``N x trial + F x final`` seconds; its device-hours that x the run's devices, and
  the cell's that x its seeds (its studies).
- Wall time on ``jobs`` workers (:func:`schedule`): each study's trials go to whichever worker
  frees up first, as ``lra-tune``'s workers share a study's budget, and its final runs start
  once its last trial has ended.

The other ``tune.*`` keys (sampler, pruner, storage, ...) are checked against ``lra-tune``'s
schema and kept in ``plan.json``; they do not change the projection.
"""

import dataclasses
import heapq
from pathlib import Path

from lra.errors import ConfigError

#: ``lra-tune``'s budget keys this plan prices.
N_TRIALS, FINAL_SEEDS = "tune.n_trials", "tune.final_seeds"


def _default_final_seeds() -> str:
    """``tune.final_seeds`` as ``lra-tune`` defaults it (``configs/tune/default.yaml``)."""
    from omegaconf import OmegaConf

    from lra.config.compose import CONFIG_DIR

    return str(OmegaConf.load(Path(CONFIG_DIR) / "tune" / "default.yaml").final_seeds)


def _tune_keys() -> set[str]:
    from lra.config.types import TuneConfig

    return {f"tune.{f.name}" for f in dataclasses.fields(TuneConfig)}


def _int(arg: str, value: str, least: int) -> int:
    try:
        number = int(value)
    except ValueError:
        number = None
    if number is None or number < least:
        raise ConfigError(f"{arg}: {arg.partition('=')[0]} takes an int of at least {least}")
    return number


def tune_options(tune_args: list[str]) -> dict | None:
    """The ``tune.*`` arguments of ``lra-plan`` as the plan's ``tune`` block (None: no
    ``tune.*`` argument, a plain sweep); one line for a key ``lra-tune`` does not have, a bad
    budget, or ``tune.*`` without ``tune.n_trials``."""
    if not tune_args:
        return None
    known, out = _tune_keys(), {}
    for arg in tune_args:
        key, _, value = arg.partition("=")
        if key not in known:
            raise ConfigError(f"{arg}: lra-tune has no {key}; its keys: {', '.join(sorted(known))}")
        out[key] = value
    if N_TRIALS not in out:
        raise ConfigError(
            f"{tune_args[0]}: a tuning plan needs its budget, {N_TRIALS}=N (the trials of each "
            "study)"
        )
    block = {"n_trials": _int(f"{N_TRIALS}={out[N_TRIALS]}", out[N_TRIALS], 1)}
    final = out.get(FINAL_SEEDS) or _default_final_seeds()
    block["final_seeds"] = _int(f"{FINAL_SEEDS}={final}", final, 0)
    block["other"] = {k: v for k, v in out.items() if k not in (N_TRIALS, FINAL_SEEDS)}
    return block


def refuse_two_stage(cell_name: str) -> None:
    raise ConfigError(
        f"{cell_name}: lra-tune tunes single-stage runs; drop pretrain= from a tuning plan"
    )


def price_study(tune: dict, trial_seconds: float | None, final_seconds: float | None) -> dict:
    """A cell's ``tuning`` entry: one study's trials, final runs and total seconds."""
    known = trial_seconds is not None and final_seconds is not None
    n, f = tune["n_trials"], tune["final_seeds"]
    return {
        "n_trials": n,
        "final_seeds": f,
        "trial_seconds": trial_seconds,
        "final_seconds": final_seconds,
        "study_seconds": n * trial_seconds + f * final_seconds if known else None,
    }


def schedule(workers: list[float], tuning: dict) -> None:
    """Put one study on the heap ``workers`` (each worker's time when it is next free)."""
    ends = 0.0
    for _ in range(tuning["n_trials"]):
        end = workers[0] + tuning["trial_seconds"]
        heapq.heapreplace(workers, end)
        ends = max(ends, end)
    for _ in range(tuning["final_seeds"]):  # the chosen values exist once every trial ended
        heapq.heapreplace(workers, max(workers[0], ends) + tuning["final_seconds"])
