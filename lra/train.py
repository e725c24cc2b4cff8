"""The training loop: ``train_and_evaluate(cfg) -> record``.

One loop for every model and task. It loads the task's splits, builds the
classifier, compiles the train and eval steps ahead of time (so compilation is
never timed and its memory analysis and FLOPs are known before step 1), trains
with periodic validation, evaluates the test split at the selected checkpoint
(``best_val``: the best validation accuracy, ties to the earlier step; or
``last``), and writes one results record (see :mod:`lra.results`).
"""

import math
import time

import jax
import numpy as np
from omegaconf import OmegaConf
from tqdm import tqdm

from lra import measure, results
from lra.data.pipeline import eval_batches, prefetch, train_batches
from lra.data.tasks import load_task, resolve_data_dir
from lra.errors import ConfigError, LRAError
from lra.steps import compile_steps

SELECTIONS = ("best_val", "last")


class TrainingDiverged(LRAError):
    """The loss became NaN or infinite."""


def _flush(pending: list, step: int, bar, timer) -> dict:
    """Fetch the metrics of the steps since the last flush; stop on a non-finite loss."""
    host = jax.device_get(pending)
    losses = [float(m["loss"]) for m in host]
    first = step - len(pending) + 1
    for i, loss in enumerate(losses):
        if not math.isfinite(loss):
            raise TrainingDiverged(
                f"the training loss became {loss} at step {first + i}; lower "
                "trainer.learning_rate, set trainer.grad_clip=1.0, or use trainer.precision=fp32"
            )
    bar.update(len(pending))
    bar.set_postfix(
        loss=f"{np.mean(losses):.4f}",
        acc=f"{np.mean([float(m['accuracy']) for m in host]):.3f}",
        steps_per_sec=f"{timer.windows[-1]:.2f}" if timer.windows else "-",
    )
    return {"step": step, "train_loss": float(np.mean(losses))}


def evaluate(eval_step, params, split, batch_size: int, max_batches=None, timer=None) -> dict:
    """Accuracy and mean loss of ``params`` on ``split`` (all of it unless ``max_batches``)."""
    totals = {"loss_sum": 0.0, "correct": 0.0, "count": 0.0}
    outs, steps = [], 0
    if timer is not None:
        timer.start()
    for batch in prefetch(eval_batches(split, batch_size, max_batches=max_batches)):
        outs.append(eval_step(params, batch))
        steps += 1
    outs = jax.device_get(outs)
    if timer is not None:
        timer.stop(steps)
    for out in outs:
        for k in totals:
            totals[k] += float(out[k])
    return {
        "accuracy": totals["correct"] / totals["count"],
        "loss": totals["loss_sum"] / totals["count"],
    }


def majority_rate(labels: np.ndarray) -> float:
    """Accuracy of always predicting the most common label (the floor a model must beat)."""
    return float(np.bincount(labels).max() / len(labels))


def _check_trainer(trainer) -> None:
    if trainer.selection not in SELECTIONS:
        raise ConfigError(
            f"unknown trainer.selection {trainer.selection!r}; "
            f"choose one of {', '.join(SELECTIONS)}"
        )
    for key in ("num_steps", "batch_size", "eval_every", "log_every"):
        if int(trainer[key]) < 1:
            raise ConfigError(f"trainer.{key} must be at least 1, got {trainer[key]}")


def train_and_evaluate(cfg) -> dict:
    """Train ``cfg.model`` on ``cfg.task``, evaluate, write the record; return it.

    The returned record has ``record_path`` set to the JSON file written.
    """
    started_at = results.utc_now()
    wall_start = time.perf_counter()
    trainer = cfg.trainer
    _check_trainer(trainer)
    results_dir = results.ensure_writable(cfg.results_dir)
    data_dir = resolve_data_dir(cfg.data_dir)
    splits = load_task(cfg.task, data_dir)

    batch_size = int(trainer.batch_size)
    example = next(train_batches(splits["train"], batch_size, int(cfg.seed)))
    compiled = compile_steps(cfg, example)
    state, train_compiled, eval_compiled = compiled.state, compiled.train_step, compiled.eval_step
    dropout_key = compiled.dropout_key

    num_steps = int(trainer.num_steps)
    eval_every, log_every = int(trainer.eval_every), int(trainer.log_every)
    train_timer, eval_timer = measure.WindowTimer(), measure.WindowTimer()
    history, best = [], {"accuracy": -1.0, "step": 0, "params": None}
    pending: list = []
    bar = tqdm(total=num_steps, disable=not trainer.progress, unit="step", dynamic_ncols=True)
    batches = prefetch(train_batches(splits["train"], batch_size, int(cfg.seed)))
    try:
        for step in range(1, num_steps + 1):
            state, metrics = train_compiled(state, next(batches), dropout_key)
            pending.append(metrics)
            is_eval = step % eval_every == 0 or step == num_steps
            if not (step == 1 or is_eval or step % log_every == 0):
                continue
            if step > 1:  # step 1 is the untimed warm-up
                train_timer.stop(len(pending), state)
            entry = _flush(pending, step, bar, train_timer)
            pending = []
            if is_eval:
                val = evaluate(
                    eval_compiled,
                    state.params,
                    splits["val"],
                    batch_size,
                    trainer.get("eval_batches"),
                    eval_timer,
                )
                entry.update(val_accuracy=val["accuracy"], val_loss=val["loss"])
                bar.write(f"step {step}: val accuracy {val['accuracy']:.4f} loss {val['loss']:.4f}")
                if trainer.selection == "best_val" and val["accuracy"] > best["accuracy"]:
                    best = {
                        "accuracy": val["accuracy"],
                        "step": step,
                        "params": jax.device_get(state.params),
                    }
            history.append(entry)
            train_timer.start()
    finally:
        bar.close()
        batches.close()

    final_val = history[-1]["val_accuracy"]
    if trainer.selection == "best_val":
        selected_params, selected_step, val_accuracy = (
            best["params"],
            best["step"],
            best["accuracy"],
        )
    else:
        selected_params, selected_step, val_accuracy = state.params, num_steps, final_val
    test = evaluate(eval_compiled, selected_params, splits["test"], batch_size, None, eval_timer)

    memory_bytes, memory_source = measure.peak_memory(train_compiled)
    config = OmegaConf.to_container(cfg, resolve=True)
    config["data_dir"], config["results_dir"] = str(data_dir), str(results_dir)
    record = {
        "schema_version": results.SCHEMA_VERSION,
        "kind": "train",
        "model": cfg.model.name,
        "task": cfg.task.name,
        "seed": int(cfg.seed),
        "test_accuracy": test["accuracy"],
        "test_loss": test["loss"],
        "test_majority_rate": majority_rate(splits["test"].labels),
        "val_accuracy": val_accuracy,
        "final_val_accuracy": final_val,
        "selection": trainer.selection,
        "selected_step": selected_step,
        "num_steps": num_steps,
        "train_steps_per_sec": train_timer.steps_per_sec,
        "eval_steps_per_sec": eval_timer.steps_per_sec,
        "peak_memory_bytes": memory_bytes,
        "memory_source": memory_source,
        "compiled_memory_bytes": measure.compiled_memory_bytes(train_compiled),
        "flops_per_step": measure.compiled_flops(train_compiled),
        "num_params": compiled.num_params,
        **measure.environment(),
        "precision": trainer.precision,
        "code_version": results.code_version(),
        "config_hash": results.config_hash(config),
        "started_at": started_at,
        "wall_seconds": time.perf_counter() - wall_start,
        "history": history,
        "config": config,
    }
    record["record_path"] = str(results.write_record(record, results_dir))
    return record
