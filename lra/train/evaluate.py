"""``lra-eval``: evaluate a saved model of a run folder on one split.

``lra-eval run=<run folder> split=test checkpoint=selected`` rebuilds the model
from the run's ``config.json``, restores the parameters and evaluates them with
the training loop's own evaluation (:mod:`lra.train.eval_loop`: same batch size, same
batches), so on the same backend it reproduces the record's test accuracy exactly. ``checkpoint`` is
``selected`` (the model the run's ``trainer.selection`` picks, from its newest
checkpoint), ``last`` (the newest checkpoint's parameters) or a kept step.

It writes the model's per-example predictions (:mod:`lra.record.predictions`) into the run
folder's ``predictions/eval/``: ``<split>.npz`` for ``checkpoint=selected`` (on the training
backend byte for byte the file the run wrote, ``predictions/<split>.npz``, which it never
overwrites), ``<split>-last.npz`` or ``<split>-step<N>.npz`` otherwise.
"""

import json
from pathlib import Path

from omegaconf import OmegaConf

from lra.config.schema import check_value
from lra.config.types import EvalConfig
from lra.data.tasks import load_task, resolve_data_dir
from lra.errors import ConfigError
from lra.record import predictions
from lra.run.checkpoint import CheckpointError, Checkpoints
from lra.run.folder import RECORD_FILE, read_run_config
from lra.train.compile import abstract_batch, compile_steps
from lra.train.eval_loop import evaluate
from lra.train.parallel import make_topology


def _which(ckpts: Checkpoints, checkpoint, selection: str) -> tuple[int, bool]:
    """``(step, best)``: the checkpoint step to read and whether to take its best params."""
    latest = ckpts.latest_step()
    if latest is None:
        raise CheckpointError(f"{ckpts.folder} holds no checkpoint")
    if checkpoint == "selected":
        return latest, selection == "best_val"
    if checkpoint == "last":
        return latest, False
    try:
        return int(checkpoint), False
    except (TypeError, ValueError):
        raise ConfigError(
            f"checkpoint={checkpoint!r}: choose selected, last or a kept step "
            f"({', '.join(map(str, ckpts.all_steps()))})"
        ) from None


def evaluate_run(run, split: str = "test", checkpoint="selected", data_dir=None) -> dict:
    """Evaluate a run folder's model and write its predictions: ``{"split", "accuracy",
    "loss", "step", "best", "predictions"}`` (``predictions``: the file written, its SHA-256
    and ``same_as_run``, whether that is the SHA-256 the run's record names)."""
    check_value("split", split, EvalConfig)
    cfg = OmegaConf.create(read_run_config(run))
    data_dir = resolve_data_dir(data_dir or cfg.data_dir)
    splits = load_task(cfg.task, data_dir)
    batch_size = int(cfg.trainer.batch_size)
    # Compiled as the run compiled it (its mesh, from the batch's shapes): the same program,
    # so on the same backend the same logits, to the last bit.
    topology = make_topology(cfg.trainer.mesh, batch_size, cfg.trainer.grad_accum)
    example = abstract_batch(cfg.task, batch_size, topology.batch_sharding)
    compiled = compile_steps(cfg, example, topology=topology, train=False)
    ckpts = Checkpoints(run, keep=int(cfg.trainer.keep_checkpoints))
    try:
        step, best = _which(ckpts, checkpoint, cfg.trainer.selection)
        params = ckpts.restore_params(step, compiled.state, best=best)
    finally:
        ckpts.close()
    max_batches = cfg.trainer.eval_batches if split == "val" else None  # as the run validated
    out = evaluate(
        compiled.eval_step,
        topology.replicate(params),
        splits[split],
        batch_size,
        max_batches,
        topology=topology,
        keep_rows=True,
    )
    name = split if checkpoint == "selected" else f"{split}-{_checkpoint_name(checkpoint)}"
    written = predictions.write(
        Path(run) / predictions.FOLDER / "eval" / f"{name}.npz", out.pop("rows")
    )
    written["same_as_run"] = (
        _same_as_run(Path(run), split, written["sha256"]) if checkpoint == "selected" else None
    )
    return {"split": split, **out, "step": step, "best": best, "predictions": written}


def _checkpoint_name(checkpoint) -> str:
    return "last" if checkpoint == "last" else f"step{int(checkpoint)}"


def _same_as_run(run: Path, split: str, digest: str) -> bool | None:
    """Whether ``digest`` is the SHA-256 the run's record names for its ``split``
    predictions (None: the record names none)."""
    path = run / RECORD_FILE
    record = json.loads(path.read_text()) if path.is_file() else {}
    named = record.get("predictions", {}).get(split)
    return None if named is None else named["sha256"] == digest
