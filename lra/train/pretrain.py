"""Self-pretraining: ``lra-train pretrain=masked|causal`` as two resumable runs in one command.

Amos, Berant & Gupta, "Never Train from Scratch: Fair Comparison of Long-Sequence Models
Requires Data-Driven Priors" (ICLR 2024): denoising pretraining on each task's own training
inputs, then fine-tuning. Reference code IdoAmos/not-from-scratch (a PyTorch S4 fork that
hands a checkpoint path from one run to the next by hand; read, not copied).

:func:`pretrain_then_finetune` runs, through the training loop's own
:func:`lra.train.loop.run_stage` (run folder, lock, checkpoints, resume, skip when done):

1. the pretraining stage, :func:`pretrain_config`: the run's config with ``stage: pretrain``
   and ``trainer.learning_rate/schedule/warmup_steps/num_steps`` replaced by
   ``pretrain.*`` (``decay_steps`` null), ``pretrain.mask_ratio`` resolved. Its identity is
   its own settings, the task, the model, the trainer keys that shape pretraining (batch
   size, precision, dropout generator, clipping, decay, ...) and the seed, but none of the
   fine-tuning's optimizer keys: a sweep over those reuses one pretraining per seed. It
   trains :class:`lra.models.pretrain.TokenPredictor` on :mod:`lra.train.objective`, reads
   only the train and validation splits, selects the lowest validation loss and writes a
   record of kind ``pretrain``;
2. the fine-tuning stage, :func:`finetune_config`: the run's config plus ``init: {kind,
   pretrain_run}`` (the pretraining run's key, so its identity follows the pretraining's).
   A fresh classifier's encoder (embeddings, layers, norms) is replaced by the pretraining
   run's selected parameters (:func:`initial_state`): every encoder parameter is checked by
   path and shape first, and anything missing or mismatched is one ConfigError naming it,
   never a partial load. The token embedding is cut to the classifier's vocabulary (the
   mask token's row is dropped) and the pretraining head is dropped. Two classifier
   parameters have no counterpart by design and keep their fresh values: the CLS vector
   (``pooling=cls``) and the CLS position's row of a learned position table (the pretrained
   rows move one down, as the CLS token shifts every token by one).

The fine-tuning record carries ``init`` (:func:`init_fields`); a run from scratch carries
``init: {kind: scratch}`` without any change to its config or identity. In a parallel sweep
over fine-tuning settings, the jobs that find the shared pretraining run locked by another
job wait for it and then reuse it (:func:`_shared_stage`).
"""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path

import jax
import numpy as np
from flax import nnx
from omegaconf import OmegaConf

import lra.models
from lra.errors import ConfigError
from lra.record import store
from lra.run.lock import RunLocked
from lra.train.objective import IMAGE_LIKE, mask_ratio_for

log = logging.getLogger("lra.train.pretrain")

# The trainer keys the pretraining stage takes from pretrain.* (or drops).
STAGE_TRAINER_KEYS = ("learning_rate", "schedule", "warmup_steps", "num_steps", "decay_steps")
_SKIP_PATHS = (("embedder", "cls"),)  # classifier-only: stays fresh (module docstring)


def objective_of(cfg) -> str:
    pretrain = cfg.get("pretrain")
    return "none" if pretrain is None else str(pretrain.objective)


def is_two_stage(cfg) -> bool:
    """Whether ``cfg`` asks for self-pretraining (and is not itself one of the stages)."""
    return objective_of(cfg) != "none" and cfg.get("stage") is None and cfg.get("init") is None


def check_pretraining(cfg) -> None:
    """Config errors of self-pretraining, before anything compiles: a causal objective with
    a mechanism that has no causal mode, an L1 pixel target on a task without pixels."""
    objective = objective_of(cfg)
    if objective == "causal":
        kwargs = OmegaConf.to_container(cfg.model, resolve=True)
        num_layers = int(
            (kwargs["arch_overrides"] or {}).get("num_layers", cfg.task.arch.num_layers)
        )
        schedule = lra.models.resolve_schedule(kwargs["attention"], num_layers)
        try:
            lacking = [
                name for name in dict.fromkeys(schedule) if not lra.models.supports_causal(name)
            ]
        except lra.models.RegistryError as err:
            raise ConfigError(f"cannot build model {cfg.model.name!r}: {err}") from err
        if lacking:
            raise ConfigError(
                f"pretrain=causal needs a causal mode in every layer, and {', '.join(lacking)} "
                f"(model {cfg.model.name}) has none; use pretrain=masked, or one of "
                f"{', '.join(lra.models.registry.causal_mechanisms())}"
            )
    if cfg.pretrain.pixel_target == "l1" and str(cfg.task.dataset) not in IMAGE_LIKE:
        raise ConfigError(
            f"pretrain.pixel_target=l1 needs pixel inputs (tasks {', '.join(IMAGE_LIKE)}); "
            f"task {cfg.task.name} has tokens: use pretrain.pixel_target=classify"
        )


def _plain(cfg) -> dict:
    config = OmegaConf.to_container(cfg, resolve=True)
    config.pop("init", None)
    config.pop("stage", None)
    return config


def pretrain_config(cfg):
    """The pretraining stage's config (see the module docstring)."""
    config = _plain(cfg)
    pretrain, trainer = config["pretrain"], config["trainer"]
    trainer.update(
        learning_rate=pretrain["learning_rate"],
        schedule=pretrain["schedule"],
        warmup_steps=pretrain["warmup_steps"],
        num_steps=pretrain["num_steps"],
        decay_steps=None,
    )
    if pretrain["objective"] == "masked":
        pretrain["mask_ratio"] = mask_ratio_for(cfg.pretrain, cfg.task)
    else:
        pretrain["mask_ratio"] = None
    config["stage"] = "pretrain"
    return OmegaConf.create(config)


def finetune_config(cfg, pretrain_run: str):
    """The fine-tuning stage's config: ``cfg`` with ``init`` naming the pretraining run."""
    config = _plain(cfg)
    config["init"] = {"kind": objective_of(cfg), "pretrain_run": pretrain_run}
    return OmegaConf.create(config)


def pretrain_then_finetune(cfg, run_stage) -> dict:
    """Stage 1 then stage 2 (each resumed, or skipped when done); the fine-tuning record,
    with ``pretrain_record_path`` and ``pretrain_skipped`` (stage 1 was done before)."""
    check_pretraining(cfg)
    first = _shared_stage(run_stage, pretrain_config(cfg))
    log.info(
        f"pretraining {first['run_key']}: {'done before' if first.get('skipped') else 'done'}; "
        f"selected step {first['selected_step']} (val loss {first['selected_val_loss']:.4f})"
    )
    second = run_stage(finetune_config(cfg, first["run_key"]))
    return {
        **second,
        "pretrain_record_path": first["record_path"],
        "pretrain_skipped": bool(first.get("skipped")),
    }


def _shared_stage(run_stage, stage_cfg, poll_seconds: float = 5.0) -> dict:
    """``run_stage(stage_cfg)``; while another job of a sweep holds the pretraining run (a
    parallel sweep over fine-tuning settings shares it), wait for it, then reuse its record."""
    while True:
        try:
            return run_stage(stage_cfg)
        except RunLocked as err:
            log.info(f"waiting for the pretraining run another job is training: {err}")
            time.sleep(poll_seconds)


def _pretrain_folder(cfg) -> Path:
    return Path(store.ensure_writable(cfg.results_dir)) / str(cfg.init.pretrain_run)


def _pretrain_record(cfg) -> dict:
    from lra.run.folder import RECORD_FILE

    path = _pretrain_folder(cfg) / RECORD_FILE
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        raise ConfigError(
            f"init.pretrain_run={cfg.init.pretrain_run}: no finished pretraining run in "
            f"{path.parent} (run lra-train with pretrain={cfg.init.kind} to make it)"
        ) from None


def init_fields(cfg) -> dict:
    """The record's ``init``: ``{kind: scratch}``, or the pretraining it started from."""
    init = cfg.get("init")
    if init is None:
        return {"kind": "scratch"}
    record = _pretrain_record(cfg)
    return {
        "kind": str(init.kind),
        "pretrain_run": str(init.pretrain_run),
        "pretrain_steps": record["num_steps"],
        "objective": record["objective"],
        "mask_ratio": record["mask_ratio"],
        "selected_step": record["selected_step"],
        "selected_val_loss": record["selected_val_loss"],
    }


def _flat(tree) -> dict[tuple[str, ...], object]:
    """``{path of names: leaf}`` of a parameter tree (nnx.State or nested dicts)."""
    out = {}
    for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]:
        names = []
        for part in path:
            key = getattr(part, "key", getattr(part, "idx", getattr(part, "name", part)))
            names.append(str(key))
        if names and names[-1] == "value":  # nnx.Variable's own attribute
            names.pop()
        out[tuple(names)] = leaf
    return out


def _selected_params(cfg) -> dict:
    """The pretraining run's selected (lowest validation loss) parameters, as host arrays."""
    import orbax.checkpoint as ocp

    from lra.run.checkpoint import Checkpoints

    _pretrain_record(cfg)  # finished, or a clear error
    ckpts = Checkpoints(_pretrain_folder(cfg), keep=int(cfg.trainer.keep_checkpoints))
    try:
        step = ckpts.latest_step()
        if step is None or not (ckpts.folder / str(step) / "best").is_dir():
            raise ConfigError(
                f"the pretraining run {cfg.init.pretrain_run} holds no selected parameters "
                f"in {ckpts.folder}"
            )
        restored = ckpts._restore(step, best=ocp.args.StandardRestore())["best"]
    finally:
        ckpts.close()
    return _flat(restored)


def load_encoder(params, pretrained: dict, where: str):
    """``params`` (a classifier's nnx.State) with its ``encoder`` subtree taken from
    ``pretrained`` (``{path: array}`` of the pretraining model); checked first, all or
    nothing (module docstring)."""
    ours = _flat(params)
    chosen, problems = {}, []
    for path, leaf in ours.items():
        if path[0] != "encoder" or path[1:] in _SKIP_PATHS:
            continue
        name = "/".join(path)
        if path not in pretrained:
            problems.append(f"{name} is missing")
            continue
        source = np.asarray(pretrained[path])
        shape = tuple(np.shape(leaf))
        if path[1:] == ("embedder", "embedding") and source.shape[1:] == shape[1:]:
            source = source[: shape[0]]  # drop the mask token's row
        elif path[1:] == ("embedder", "pos") and source.shape[0] + 1 == shape[0]:
            source = np.concatenate([np.asarray(leaf)[:1], source])  # the CLS position's row
        if source.shape != shape:
            problems.append(f"{name} has shape {source.shape} there, {shape} here")
            continue
        chosen[path] = source.astype(np.asarray(leaf).dtype)
    if problems:
        raise ConfigError(
            f"cannot load the pretrained encoder of {where}: {problems[0]}"
            + (f" (and {len(problems) - 1} more)" if len(problems) > 1 else "")
            + "; the pretraining and fine-tuning models must share the encoder's architecture"
        )
    leaves, treedef = jax.tree_util.tree_flatten(params)
    leaves = [chosen.get(key, leaf) for leaf, key in zip(leaves, ours, strict=True)]
    return jax.tree_util.tree_unflatten(treedef, leaves)


def initial_state(cfg, state):
    """The fine-tuning stage's fresh train state with the pretrained encoder loaded."""
    params = load_encoder(
        nnx.State(state.params) if not isinstance(state.params, nnx.State) else state.params,
        _selected_params(cfg),
        f"pretraining run {cfg.init.pretrain_run}",
    )
    params = jax.tree.map(lambda new, old: jax.device_put(new, old.sharding), params, state.params)
    return state._replace(params=params)
