"""Run identity: which settings change a run's result, and the folder that follows.

The run key is ``<model>-<task>-s<seed>-<hash>``, where ``hash`` is the first 10 hex
digits of the SHA-256 of the resolved config *less* everything that cannot change
the numbers a run produces: paths (``data_dir``, ``results_dir``), worker counts,
the progress bar and log cadence, checkpoint cadence, the resume and skip-done
switches, how the run is spread over devices and processes (mesh, distributed,
remat, the pre-flight memory check: the same computation up to float rounding), the
compilation cache, and the seed (already in the key). ``trainer.grad_accum`` stays in: with the
``hash`` dropout generator micro-batches draw the whole batch's masks (issue 29), but with
``rbg``/``threefry`` they draw other ones, and taking it out would move every run's folder. Two
commands that differ only in
those keys share one run folder; any other difference gives another folder, so a
checkpoint can never be resumed under a config it was not made with.

Self-pretraining (``pretrain=masked|causal``, :mod:`lra.train.pretrain`): the ``pretrain`` block
counts only when its objective is not ``none``. The pretraining stage's config carries
``stage: pretrain`` and its own optimizer settings in ``trainer`` (not the fine-tuning ones);
the fine-tuning stage's carries ``init.pretrain_run``, the pretraining run's key, so its
identity follows the pretraining's and not the other way round.
"""

import copy
import hashlib
import json
import re
from pathlib import Path

# Bumped when the keys below change, so old and new hashes never coincide by accident.
IDENTITY_VERSION = 1

# Top-level keys that never change a result.
NON_RESULT_KEYS = (
    "seed",
    "data_dir",
    "results_dir",
    "num_workers",
    "rebuild",
    "logger",
    "hydra",
    "distributed",
    "compile_cache",
)
# trainer.* keys that never change a result (progress display, logging and durability).
NON_RESULT_TRAINER_KEYS = (
    "progress",
    "log_every",
    "checkpoint_every",
    "checkpoint_minutes",
    "keep_checkpoints",
    "resume",
    "skip_done",
    # How the same computation is spread over devices and memory: a run pre-empted on one
    # machine may resume on another with a different device count.
    "mesh",
    "remat",
    "preflight",
    "memory_limit_gb",
)


# task.arch.* keys left out of the identity at these values (added after runs were recorded).
ARCH_DEFAULTS_OUT_OF_IDENTITY = {"norm": "layer", "norm_position": "pre", "norm_momentum": 0.9}


def result_config(config: dict) -> dict:
    """``config`` (a resolved plain dict) without the keys that cannot change the result."""
    kept = {k: copy.deepcopy(v) for k, v in config.items() if k not in NON_RESULT_KEYS}
    pretrain = kept.get("pretrain")
    if isinstance(pretrain, dict) and pretrain.get("objective", "none") == "none":
        # Self-pretraining off (configs/pretrain/none.yaml): its settings cannot change a
        # result, and every run before the key existed keeps its identity.
        del kept["pretrain"]
    arch = (kept.get("task") or {}).get("arch")
    if isinstance(arch, dict):
        # The LRA encoder's norm (the defaults): every run before the keys keeps its identity.
        for key, default in ARCH_DEFAULTS_OUT_OF_IDENTITY.items():
            if arch.get(key, default) == default:
                arch.pop(key, None)
    trainer = kept.get("trainer")
    if isinstance(trainer, dict):
        kept["trainer"] = {k: v for k, v in trainer.items() if k not in NON_RESULT_TRAINER_KEYS}
        if kept["trainer"].get("param_groups", 0) is None:
            # One parameter group (the default): every run before the key keeps its identity.
            del kept["trainer"]["param_groups"]
        if kept["trainer"].get("evaluate_test", True) is True:
            # The test pass (the default): every run before the key keeps its identity. A
            # validation-only run (lra-tune's trial) is another folder than the run that tests.
            kept["trainer"].pop("evaluate_test", None)
    return kept


def result_hash(config: dict) -> str:
    """A short, stable hash of :func:`result_config` (key order does not matter)."""
    payload = {"identity_version": IDENTITY_VERSION, "config": result_config(config)}
    canonical = json.dumps(payload, sort_keys=True, default=str)
    return hashlib.sha256(canonical.encode()).hexdigest()[:10]


def _safe(name) -> str:
    return re.sub(r"[^A-Za-z0-9_.]+", "_", str(name))


def run_key(config: dict) -> str:
    """``<model>-<task>-s<seed>-<hash>`` of a resolved config."""
    model, task = _safe(config["model"]["name"]), _safe(config["task"]["name"])
    return f"{model}-{task}-s{int(config['seed'])}-{result_hash(config)}"


def run_dir(results_dir: str | Path, config: dict) -> Path:
    """The folder of the run that ``config`` describes, inside ``results_dir``."""
    return Path(results_dir) / run_key(config)
