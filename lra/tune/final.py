"""The final runs of an ``lra-tune`` study: the best trial's values, ``tune.final_seeds`` seeds.

They are ordinary runs that evaluate the test split, once, at the selected checkpoint. Seeds
are ``seed, seed+1, ..., seed+N-1`` (``seed``: the trials' own). Each record carries a ``tuning``
block (:func:`tuning_block`) and the variant ``<model>+tuned[n_trials=N]``, so the report keeps
tuned rows apart from untuned ones and never averages the two. Several workers of one study
share the final runs: a run folder another worker trains is left to it, and the worker waits
for its record.
"""

import logging
import time

from lra.run.lock import RunLocked
from lra.tune import study as studies
from lra.tune.search import apply, space_hash

log = logging.getLogger("lra.tune")


def tuning_block(ctx, study) -> dict:
    """What a final run's record says of the search that chose its values."""
    top = studies.best(study)
    c = studies.counts(study)
    return {
        "study": ctx.name,
        "storage": ctx.storage_spec,
        "n_trials": ctx.n_trials,
        "completed": c["completed"],
        "pruned": c["pruned"],
        "failed": c["failed"],
        "best_trial": top.number,
        "best_params": dict(top.user_attrs[studies.OVERRIDES]),
        "best_value": float(top.value),
        "search_hash": space_hash(ctx.space),
        "search_files": list(ctx.space.files),
        "sampler": str(ctx.cfg.tune.sampler),
        "pruner": str(ctx.cfg.tune.pruner),
        **studies.pruning_settings(ctx.cfg.tune),
        "protocol": ctx.base.get("protocol") or "lra_official",
    }


def tuned_variant(model: str, n_trials: int) -> str:
    return f"{model}+tuned[n_trials={n_trials}]"


def final_seeds(ctx) -> list[int]:
    first = int(ctx.base["seed"])
    return [first + i for i in range(int(ctx.cfg.tune.final_seeds))]


def run_finals(ctx, study) -> list[dict]:
    """Train (or find finished) the final runs; their records in seed order."""
    from lra.train.loop import train_and_evaluate

    block = tuning_block(ctx, study)
    extra = {
        "tuning": block,
        "variant": tuned_variant(ctx.base["model"]["name"], ctx.n_trials),
        # The base protocol's table, as a row of its own (the variant says it was tuned).
        "protocol": block["protocol"],
    }
    values = block["best_params"]
    records, waiting = {}, final_seeds(ctx)
    while waiting:
        left = []
        for seed in waiting:
            cfg = apply(ctx.train_cfg, {**values, "seed": seed, "trainer.evaluate_test": True})
            try:
                records[seed] = train_and_evaluate(cfg, record_extra=extra)
            except RunLocked:
                left.append(seed)  # another worker trains it: wait for its record
        if left:
            time.sleep(float(ctx.cfg.tune.poll_seconds))
        waiting = left
    return [records[s] for s in sorted(records)]
