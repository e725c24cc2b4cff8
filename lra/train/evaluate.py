"""``lra-eval``: evaluate a saved model of a run folder on one split.

``lra-eval run=<run folder> split=test checkpoint=selected`` rebuilds the model
from the run's ``config.json``, restores the parameters and evaluates them with
the training loop's own evaluation (:mod:`lra.train.eval_loop`: same batch size, same
batches), so on the same backend it reproduces the record's test accuracy exactly. ``checkpoint`` is
``selected`` (the model the run's ``trainer.selection`` picks, from its newest
checkpoint), ``last`` (the newest checkpoint's parameters) or a kept step.
"""

import jax
from omegaconf import OmegaConf

from lra.config.schema import check_value
from lra.config.types import EvalConfig
from lra.data.pipeline import eval_batches
from lra.data.tasks import load_task, resolve_data_dir
from lra.errors import ConfigError
from lra.run.checkpoint import CheckpointError, Checkpoints
from lra.run.folder import read_run_config
from lra.train.compile import compile_steps
from lra.train.eval_loop import evaluate


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
    """Evaluate a run folder's model: ``{"split", "accuracy", "loss", "step", "best"}``."""
    check_value("split", split, EvalConfig)
    cfg = OmegaConf.create(read_run_config(run))
    data_dir = resolve_data_dir(data_dir or cfg.data_dir)
    splits = load_task(cfg.task, data_dir)
    batch_size = int(cfg.trainer.batch_size)
    compiled = compile_steps(cfg, next(eval_batches(splits[split], batch_size)), train=False)
    ckpts = Checkpoints(run, keep=int(cfg.trainer.keep_checkpoints))
    try:
        step, best = _which(ckpts, checkpoint, cfg.trainer.selection)
        params = ckpts.restore_params(step, compiled.state, best=best)
    finally:
        ckpts.close()
    out = evaluate(compiled.eval_step, jax.device_put(params), splits[split], batch_size)
    return {"split": split, **out, "step": step, "best": best}
