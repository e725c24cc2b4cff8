"""The training loop's periodic actions, one function each (big_vision's ``itstime`` style).

After every step the loop (:func:`lra.train.loop._train`) calls:

* :func:`log_and_validate` when :func:`log_due`: the mean training metrics of the steps
  since the last log line (stopping on a non-finite loss), a validation pass every
  ``trainer.eval_every`` steps and at the last (keeping the best parameters), one history
  entry, the trackers and the progress display;
* :func:`checkpoint_and_stop`: a checkpoint every ``trainer.checkpoint_every`` steps, every
  ``trainer.checkpoint_minutes`` and at the last step, and on a stop signal a checkpoint
  then :class:`Interrupted`.

Both run outside the timed windows (:class:`lra.train.state.LoopState`).
"""

import logging
import math

import jax
import numpy as np

from lra.errors import LRAError
from lra.run.checkpoint import host_copy
from lra.run.signals import Interrupted, StopSignals
from lra.train.eval_loop import evaluate
from lra.train.state import LoopContext, LoopState

log = logging.getLogger("lra.train.loop")


class TrainingDiverged(LRAError):
    """The loss became NaN or infinite."""


def itstime(step: int, every: int, last: int | None = None) -> bool:
    """Whether ``step`` is one of every ``every`` steps (0 = never), or the ``last``."""
    return bool(every) and step % every == 0 or step == last


def eval_due(ctx: LoopContext, step: int) -> bool:
    return itstime(step, int(ctx.trainer.eval_every), last=ctx.num_steps)


def log_due(ctx: LoopContext, step: int) -> bool:
    return step == 1 or eval_due(ctx, step) or itstime(step, int(ctx.trainer.log_every))


def train_means(pending: list, step: int) -> dict:
    """Mean loss and accuracy of the steps since the last log line; stop on a non-finite loss."""
    host = jax.device_get(pending)
    losses = [float(m["loss"]) for m in host]
    first = step - len(pending) + 1
    for i, loss in enumerate(losses):
        if not math.isfinite(loss):
            raise TrainingDiverged(
                f"the training loss became {loss} at step {first + i}; lower "
                "trainer.learning_rate, set trainer.grad_clip=1.0, or use trainer.precision=fp32"
            )
    return {
        "loss": float(np.mean(losses)),
        "accuracy": float(np.mean([float(m["accuracy"]) for m in host])),
    }


def log_and_validate(ctx: LoopContext, loop: LoopState, step: int) -> None:
    """Log the steps since the last log line (and validate when due): one history entry."""
    loop.close_window()
    train = train_means(loop.pending, step)
    loop.pending = []
    rate = loop.train_timer.windows[-1] if loop.timed else None
    entry = {"step": step, "train_loss": train["loss"]}
    scalars = {
        "train/loss": train["loss"],
        "train/accuracy": train["accuracy"],
        "train/learning_rate": float(ctx.learning_rate(step - 1)),
    }
    if rate:
        scalars["train/steps_per_sec"] = rate
    if eval_due(ctx, step):
        val = validate(ctx, loop, step)
        entry.update(val_accuracy=val["accuracy"], val_loss=val["loss"])
        scalars.update({"val/accuracy": val["accuracy"], "val/loss": val["loss"]})
    loop.progress.history.append(entry)
    ctx.trackers.log(step, scalars)
    ctx.display.update(step, train["loss"], train["accuracy"], rate, entry.get("val_accuracy"))
    if ctx.on_validate is not None and "val_accuracy" in entry:
        ctx.on_validate(step, entry["val_accuracy"])  # may raise: lra-tune's pruner
    loop.open_window()


def validate(ctx: LoopContext, loop: LoopState, step: int) -> dict:
    """Evaluate on the validation split (``trainer.eval_batches`` of it); keep the best
    parameters under ``trainer.selection=best_val`` (ties go to the earlier step). A
    pretraining stage (``ctx.select_on_loss``) keeps the lowest validation loss: its
    ``progress.best_accuracy`` then holds minus that loss."""
    val = evaluate(
        ctx.compiled.eval_step,
        loop.train.params,
        ctx.splits["val"],
        int(ctx.trainer.batch_size),
        ctx.trainer.eval_batches,
        loop.eval_timer,
        ctx.topology,
    )
    log.info(f"step {step}: val accuracy {val['accuracy']:.4f} loss {val['loss']:.4f}")
    progress = loop.progress
    if ctx.select_on_loss:
        score, better = (
            -val["loss"],
            progress.best_step == 0 or -val["loss"] > progress.best_accuracy,
        )
    else:
        score = val["accuracy"]
        better = ctx.trainer.selection == "best_val" and score > progress.best_accuracy
    if better:
        progress.best_accuracy, progress.best_step = score, step
        loop.best_params = host_copy(loop.train.params)
    return val


def checkpoint_and_stop(ctx: LoopContext, loop: LoopState, step: int) -> None:
    """Save a checkpoint when one is due, at the last step or on a stop signal; after a
    stop signal's save raise :class:`Interrupted`."""
    # Every process must take the same branch: a stop or a due save on any is on all.
    stopping, due = ctx.topology.any_process(ctx.stop.requested, ctx.ckpts.due(step))
    if not (step == ctx.num_steps or stopping or due):
        return
    loop.close_window()
    save(ctx, loop, step)
    if stopping:
        raise stopped(ctx.stop, step, ctx.num_steps, f"checkpoint saved in {ctx.ckpts.folder}")
    loop.open_window()


def save(ctx: LoopContext, loop: LoopState, step: int) -> None:
    """Start saving the checkpoint of ``step``; count the seconds the loop was blocked."""
    progress = loop.checkpoint_note(step)
    progress.checkpoint_seconds += ctx.ckpts.save(step, loop.train, loop.best_params, progress)
    progress.checkpoint_saves += 1


def stopped(stop: StopSignals, step: int, num_steps: int, saved: str) -> Interrupted:
    """The error that ends a session stopped by a signal at ``step`` (``saved``: what was)."""
    return Interrupted(
        f"stopped by {stop.name} at step {step} of {num_steps}; {saved}; "
        "rerun the same command to resume",
        stop.received,
        stop.deferred(),
    )
