"""A run's projected wall time, from one stage's measurements (:mod:`lra.plan.measure`).

One stage of ``num_steps`` train steps at ``train_steps_per_sec``, plus what the training loop
does around them (:mod:`lra.train.loop`, :mod:`lra.train.hooks`):

- validation: one pass every ``trainer.eval_every`` steps and at the last step, each of
  ``ceil(val examples / batch_size)`` eval steps (at most ``trainer.eval_batches``), at the
  measured eval steps/sec;
- the test pass at the selected checkpoint (not in a pretraining stage, nor with
  ``trainer.evaluate_test=false``) and the selected model's validation predictions (one more
  validation pass; not in a pretraining stage);
- compilation: the measured compile seconds of the train and eval steps (and of the FLOP count);
- checkpoints: one every ``trainer.checkpoint_every`` steps, every
  ``trainer.checkpoint_minutes`` of training and at the end, each taking the measured save time.

Self-pretraining (``pretrain=masked|causal``) adds its pretraining stage's projection to the
fine-tuning stage's. Device-hours are the projected seconds x the devices of the run's mesh x
the cell's seeds.
"""

import math

from lra.plan.split_sizes import eval_examples


def _passes(num_steps: int, every: int) -> int:
    """Validation passes of a run: at each multiple of ``every`` and at the last step."""
    if every <= 0:
        return 1
    return num_steps // every + (1 if num_steps % every else 0)


def project_stage(cfg, measured: dict, *, pretraining: bool = False) -> dict:
    """Seconds per part (``train``, ``validation``, ``test``, ``compile``, ``checkpoints``) of
    one stage of config ``cfg``, and their ``total``; None where the stage was not timed."""
    if not measured.get("fits") or not measured.get("train_steps_per_sec"):
        return {"total": None}
    trainer = cfg.trainer
    num_steps, batch = int(trainer.num_steps), int(trainer.batch_size)
    val_examples, test_examples = eval_examples(cfg.task)
    val_batches = math.ceil(val_examples / batch)
    if trainer.get("eval_batches") is not None:
        val_batches = min(val_batches, int(trainer.eval_batches))
    eval_rate = measured["eval_steps_per_sec"]
    train = num_steps / measured["train_steps_per_sec"]
    val_passes = _passes(num_steps, int(trainer.eval_every)) + (0 if pretraining else 1)
    validation = val_passes * val_batches / eval_rate
    tested = not pretraining and bool(trainer.get("evaluate_test", True))
    test = math.ceil(test_examples / batch) / eval_rate if tested else 0.0
    minutes = float(trainer.get("checkpoint_minutes") or 0)
    every = int(trainer.get("checkpoint_every") or 0)
    saves = 1 + (num_steps // every if every else 0)
    if minutes:
        saves += int((train + validation) // (60 * minutes))
    parts = {
        "train": train,
        "validation": validation,
        "test": test,
        "compile": float(sum((measured.get("compile_seconds") or {}).values())),
        "checkpoints": saves * float(measured.get("checkpoint_seconds") or 0.0),
    }
    return {**parts, "total": sum(parts.values())}


def add_stages(stages: list[dict]) -> dict:
    """The parts of several stages' projections added up (None if any stage has none)."""
    if any(stage["total"] is None for stage in stages):
        return {"total": None}
    keys = [key for key in stages[0]]
    return {key: sum(stage[key] for stage in stages) for key in keys}
