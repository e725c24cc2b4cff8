"""The training loop: ``train_and_evaluate(cfg) -> record``.

One loop for every model and task. It loads the task's splits, builds the
classifier, compiles the train and eval steps ahead of time (so compilation is
never timed and its memory analysis and FLOPs are known before step 1), trains
with periodic validation, evaluates the test split at the selected checkpoint
(``best_val``: the best validation accuracy, ties to the earlier step; or
``last``), and writes one results record (see :mod:`lra.record.store`) into the run
folder.

Each run lives in its run folder (:mod:`lra.run`): a lock keeps one trainer per
folder, checkpoints are saved every ``trainer.checkpoint_every`` steps, every
``trainer.checkpoint_minutes`` and at the end, a stop signal saves one at the next
step boundary, and rerunning the same command resumes from the newest checkpoint
(``trainer.resume``) or, for a finished run, reports it done (``trainer.skip_done``).
A resumed run gives the record an uninterrupted run gives.
"""

import contextlib
import logging
import math
import socket
import time

import jax
import numpy as np
from omegaconf import OmegaConf
from tqdm.contrib.logging import logging_redirect_tqdm

from lra.config.setting import describe_setting
from lra.data.pipeline import eval_batches, prefetch, train_batches
from lra.data.tasks import effective_val_source, load_task, resolve_data_dir
from lra.device import measure
from lra.device.compile_cache import CacheCounter, configure_compile_cache
from lra.errors import ConfigError, DataError, LRAError
from lra.record import store
from lra.run.checkpoint import Checkpoints, host_copy, start_or_resume
from lra.run.folder import RESUME_MODES, RunFolder
from lra.run.lock import RunLock
from lra.run.signals import Interrupted, StopSignals
from lra.track import RunInfo, Trackers, check_loggers, open_trackers, sweep_group
from lra.track.progress import ProgressDisplay
from lra.train import parallel
from lra.train.optim import make_schedule
from lra.train.preflight import OutOfMemory, check_fits, compile_error_summary
from lra.train.steps import (
    abstract_batch,
    attention_sources,
    compile_steps,
    compile_train_variant,
    layers_description,
    softmax_implementations,
)

SELECTIONS = ("best_val", "last")
log = logging.getLogger("lra.train.loop")


class TrainingDiverged(LRAError):
    """The loss became NaN or infinite."""


def _train_means(pending: list, step: int) -> dict:
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


def evaluate(
    eval_step, params, split, batch_size: int, max_batches=None, timer=None, topology=None
) -> dict:
    """Accuracy and mean loss of ``params`` on ``split`` (all of it unless ``max_batches``).

    With a ``topology`` each process reads its rows of every batch and the step's
    sums cover the whole global batch, so every process gets the same totals.
    """
    totals = {"loss_sum": 0.0, "correct": 0.0, "count": 0.0}
    outs, steps = [], 0
    shards, put = (
        ({}, jax.device_put) if topology is None else (topology.shard_args(), topology.put)
    )
    if timer is not None:
        timer.start()
    batches = eval_batches(split, batch_size, max_batches=max_batches, **shards)
    for batch in prefetch(batches, put=put):
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
    for key, allowed in (("selection", SELECTIONS), ("resume", RESUME_MODES)):
        if trainer[key] not in allowed:
            raise ConfigError(
                f"unknown trainer.{key} {trainer[key]!r}; choose one of {', '.join(allowed)}"
            )
    for key, low in (
        ("num_steps", 1),
        ("batch_size", 1),
        ("grad_accum", 1),
        ("eval_every", 1),
        ("log_every", 1),
        ("keep_checkpoints", 1),
        ("checkpoint_every", 0),
        ("checkpoint_minutes", 0),
    ):
        if float(trainer[key]) < low:
            raise ConfigError(f"trainer.{key} must be at least {low}, got {trainer[key]}")


def resolved_config(cfg, data_dir, results_dir) -> dict:
    """The run's config as plain data, with the paths it really uses."""
    config = OmegaConf.to_container(cfg, resolve=True)
    config["data_dir"], config["results_dir"] = str(data_dir), str(results_dir)
    return config


def train_and_evaluate(cfg) -> dict:
    """Train ``cfg.model`` on ``cfg.task`` (resuming its run folder), evaluate, write the record.

    Returns the record with ``record_path`` set to the JSON file written; a run
    already finished (and ``trainer.skip_done``) returns its record with ``skipped``.
    Raises :class:`Interrupted` after saving a checkpoint when a stop signal came.
    """
    session_start, started_at = time.perf_counter(), store.utc_now()
    trainer = cfg.trainer
    _check_trainer(trainer)
    effective_val_source(cfg.task)  # a bad task.val_source fails before any compile
    cache_dir = configure_compile_cache(cfg.get("compile_cache"))  # before the first compile
    check_loggers(cfg.get("logger"))
    parallel.initialize_distributed(cfg.get("distributed"))
    batch_size = int(trainer.batch_size)
    topology = parallel.make_topology(trainer.get("mesh"), batch_size, trainer.get("grad_accum", 1))
    data_dir = resolve_data_dir(cfg.data_dir)  # a data_dir that is a file fails before any write
    results_dir = store.ensure_writable(cfg.results_dir)
    run = RunFolder(results_dir, resolved_config(cfg, data_dir, results_dir))
    if trainer.skip_done and trainer.resume != "never" and (done := run.finished_record()):
        log.info(
            f"{run.key} is already done ({run.record_path}); trainer.skip_done=false reruns it"
        )
        return {**done, "record_path": str(run.record_path), "skipped": True}
    setting = describe_setting(run.config)
    log.info(f"{run.key}: variant {setting['variant']}, protocol {setting['protocol']}")
    if warning := layers_description(cfg)["schedule_warning"]:
        log.warning(f"{cfg.model.name} on {cfg.task.name}: {warning}")

    # Compiled from shapes alone: a step that cannot fit stops the run before any data loads.
    example = abstract_batch(cfg.task, batch_size, topology.batch_sharding)
    cache = CacheCounter()
    compiled = _compile_or_explain(cfg, example, topology)
    compile_cache = {"dir": cache_dir, **cache.counts()}
    if trainer.get("preflight", True):
        _preflight(cfg, compiled, topology)
    peak_before = measure.device_peak_bytes()  # compiling may have set it (GPU autotuner)
    splits = load_task(cfg.task, data_dir)
    _check_lengths(cfg.task, splits)
    lock = RunLock(run.path, started_at) if topology.is_main else contextlib.nullcontext()
    with lock, StopSignals() as stop:
        if getattr(lock, "took_over", None):
            log.warning(f"took over the lock of a stopped trainer: {lock.took_over}")
        if topology.is_main:
            run.claim(trainer.resume)
        topology.barrier("run folder claimed")
        ckpts = Checkpoints(
            run.path,
            keep=trainer.keep_checkpoints,
            every_steps=trainer.checkpoint_every,
            every_minutes=trainer.checkpoint_minutes,
        )
        trackers = None
        try:
            code = store.code_version()  # a git subprocess: once per run
            note = {"at": started_at, "host": socket.gethostname(), "code": code}
            state, best_params, progress = start_or_resume(
                ckpts, compiled.state, trainer.resume, note
            )
            prior_wall = progress.wall_seconds
            if progress.step:
                log.info(f"resuming {run.key} from step {progress.step} ({ckpts.folder})")
            info = _run_info(cfg, run, progress.step)
            trackers = open_trackers(cfg.get("logger"), info) if topology.is_main else Trackers([])
            try:
                state, best_params, progress = _train(
                    cfg,
                    compiled,
                    topology,
                    splits,
                    topology.replicate(state),
                    best_params,
                    progress,
                    ckpts,
                    stop,
                    trackers,
                    session_start,
                )
                kept = ckpts.wait()

                if trainer.selection == "best_val":
                    selected, selected_step = best_params, progress.best_step
                    val_accuracy = progress.best_accuracy
                else:
                    selected, selected_step = state.params, progress.step
                    val_accuracy = progress.history[-1]["val_accuracy"]
                eval_timer = measure.WindowTimer(progress.eval_steps, progress.eval_seconds)
                test = evaluate(
                    compiled.eval_step,
                    topology.replicate(selected),
                    splits["test"],
                    batch_size,
                    None,
                    eval_timer,
                    topology,
                )
            except Exception as err:  # XLA raises its own runtime error types
                if measure.is_out_of_memory(err):
                    raise _out_of_memory(err, compiled) from err
                raise
            record = _record(
                cfg, run, compiled, topology, splits, progress, test, eval_timer, code, peak_before
            )
            record.update(setting, compile_cache=compile_cache)
            record.update(
                val_accuracy=val_accuracy,
                selected_step=selected_step,
                checkpoint_steps=kept,
                wall_seconds=prior_wall + time.perf_counter() - session_start,
            )
            if topology.is_main:
                record["record_path"] = str(run.write_record(record))
            else:
                record["record_path"] = str(run.record_path)  # written by process 0
            trackers.summary(record)
        finally:
            ckpts.close()
            if trackers is not None:
                trackers.close()
    return record


def _check_lengths(task_cfg, splits) -> None:
    for name, split in splits.items():
        if split.max_length != int(task_cfg.max_length):
            raise DataError(
                f"the prepared {name} split of {task_cfg.name} has length {split.max_length}, "
                f"but task.max_length is {task_cfg.max_length}; prepare it again with "
                f"lra-data task={task_cfg.name} rebuild=true"
            )


def _compile_or_explain(cfg, example, topology):
    """:func:`compile_steps`; if compiling runs out of device memory (a GPU's autotuner
    allocates while compiling), the pre-flight search for settings that fit, or with
    ``trainer.preflight=false`` a clean :class:`OutOfMemory`."""
    try:
        return compile_steps(cfg, example, topology=topology)
    except Exception as err:  # XLA raises its own runtime error types
        if not measure.is_out_of_memory(err):
            raise
        if cfg.trainer.get("preflight", True):
            _preflight(cfg, None, topology, compile_error=err)  # raises OutOfMemory
        raise _out_of_memory(err, None) from err


def _steps_bytes(compiled) -> tuple[int | None, str]:
    """Compiled memory of the step that needs more, train or eval, and its name."""
    sizes = {
        f"{name} step": measure.compiled_memory_bytes(step)
        for name, step in (("train", compiled.train_step), ("eval", compiled.eval_step))
        if step is not None
    }
    known = {name: size for name, size in sizes.items() if size is not None}
    if not known:
        return None, "train step"
    name = max(known, key=known.get)
    return known[name], name


def _preflight(cfg, compiled, topology, compile_error=None) -> None:
    """Stop (:class:`OutOfMemory`) if the compiled train or eval step does not fit the device
    (``compile_error``: compiling them already ran out of device memory)."""
    trainer = cfg.trainer

    def measure_bytes(grad_accum: int, remat: bool) -> int | None:
        try:
            variant = compile_train_variant(
                cfg, topology, grad_accum=grad_accum, remat=remat, evaluate=True
            )
        except Exception as err:  # XLA raises its own runtime error types
            if measure.is_out_of_memory(err):
                return None  # does not even compile in the device's memory
            raise
        return _steps_bytes(variant)[0]

    needed, step = (None, "train step") if compiled is None else _steps_bytes(compiled)
    check_fits(
        needed,
        trainer.get("memory_limit_gb"),
        measure_bytes,
        topology.per_device_batch,
        int(trainer.get("grad_accum", 1)),
        bool(trainer.get("remat", False)),
        step=step,
        compile_error=compile_error,
    )


def _out_of_memory(err: BaseException, compiled) -> OutOfMemory:
    needed = None if compiled is None else measure.compiled_memory_bytes(compiled.train_step)
    plan = "" if needed is None else f" (the compiled train step needs {needed / 1e9:.1f} GB)"
    return OutOfMemory(
        f"the device ran out of memory{plan}: {compile_error_summary(err)}; lower the "
        "memory with trainer.grad_accum=2 (or more) or trainer.remat=true, or leave "
        "trainer.preflight=true and trainer.memory_limit_gb=<GB the device has free> to have "
        "the fitting settings found"
    )


def _train(
    cfg,
    compiled,
    topology,
    splits,
    state,
    best_params,
    progress,
    ckpts,
    stop,
    trackers,
    session_start,
):
    """Train from ``progress.step`` to ``trainer.num_steps``: ``(state, best_params, progress)``.

    Steps since the last log line keep their metrics in ``pending``; a checkpoint
    stores them, so a resumed run logs exactly what an uninterrupted one logs.
    The session's first step is an untimed warm-up; saves are outside timed windows.
    """
    trainer = cfg.trainer
    num_steps, batch_size = int(trainer.num_steps), int(trainer.batch_size)
    eval_every, log_every = int(trainer.eval_every), int(trainer.log_every)
    train_timer = measure.WindowTimer(progress.train_steps, progress.train_seconds)
    eval_timer = measure.WindowTimer(progress.eval_steps, progress.eval_seconds)
    prior_wall, pending, timed = progress.wall_seconds, list(progress.pending), None

    def save(step: int) -> None:
        progress.step, progress.pending = (
            step,
            [{k: float(v) for k, v in m.items()} for m in jax.device_get(pending)],
        )
        progress.train_steps, progress.train_seconds = train_timer.steps, train_timer.seconds
        progress.eval_steps, progress.eval_seconds = eval_timer.steps, eval_timer.seconds
        progress.wall_seconds = prior_wall + time.perf_counter() - session_start
        progress.checkpoint_seconds += ckpts.save(step, state, best_params, progress)
        progress.checkpoint_saves += 1

    def stopped(step: int, saved: str) -> Interrupted:
        return Interrupted(
            f"stopped by {stop.name} at step {step} of {num_steps}; {saved}; "
            "rerun the same command to resume",
            stop.received,
            stop.deferred(),
        )

    if stop.requested:
        raise stopped(progress.step, "nothing new to save")
    display = ProgressDisplay(num_steps, progress.step, bool(trainer.progress) and topology.is_main)
    learning_rate = make_schedule(
        trainer.schedule,
        trainer.learning_rate,
        trainer.warmup_steps,
        num_steps,
        trainer.get("decay_steps"),
    )
    batches = prefetch(
        train_batches(
            splits["train"],
            batch_size,
            int(cfg.seed),
            start_step=progress.step,
            **topology.shard_args(),
        ),
        put=topology.put,
    )
    try:
        with logging_redirect_tqdm():
            for step in range(progress.step + 1, num_steps + 1):
                state, metrics = compiled.train_step(state, next(batches), compiled.dropout_key)
                pending.append(metrics)
                if timed is None:  # the warm-up step: await it, then time what follows
                    jax.block_until_ready(state)
                    train_timer.start()
                    timed = 0
                else:
                    timed += 1
                is_eval = step % eval_every == 0 or step == num_steps
                if step == 1 or is_eval or step % log_every == 0:
                    train_timer.stop(timed, state)
                    train = _train_means(pending, step)
                    pending = []
                    rate = train_timer.windows[-1] if timed else None
                    entry = {"step": step, "train_loss": train["loss"]}
                    scalars = {
                        "train/loss": train["loss"],
                        "train/accuracy": train["accuracy"],
                        "train/learning_rate": float(learning_rate(step - 1)),
                    }
                    if rate:
                        scalars["train/steps_per_sec"] = rate
                    if is_eval:
                        val = evaluate(
                            compiled.eval_step,
                            state.params,
                            splits["val"],
                            batch_size,
                            trainer.get("eval_batches"),
                            eval_timer,
                            topology,
                        )
                        log.info(
                            f"step {step}: val accuracy {val['accuracy']:.4f} "
                            f"loss {val['loss']:.4f}"
                        )
                        entry.update(val_accuracy=val["accuracy"], val_loss=val["loss"])
                        scalars.update({"val/accuracy": val["accuracy"], "val/loss": val["loss"]})
                        if (
                            trainer.selection == "best_val"
                            and val["accuracy"] > progress.best_accuracy
                        ):
                            progress.best_accuracy, progress.best_step = val["accuracy"], step
                            best_params = host_copy(state.params)
                    progress.history.append(entry)
                    trackers.log(step, scalars)
                    display.update(
                        step, train["loss"], train["accuracy"], rate, entry.get("val_accuracy")
                    )
                    train_timer.start()
                    timed = 0
                # Every process must take the same branch: a stop or a due save on any is on all.
                stopping, due = topology.any_process(stop.requested, ckpts.due(step))
                if step == num_steps or stopping or due:
                    train_timer.stop(timed, state)
                    save(step)
                    if stopping:
                        raise stopped(step, f"checkpoint saved in {ckpts.folder}")
                    train_timer.start()
                    timed = 0
    finally:
        display.close()
        batches.close()
    return state, best_params, progress


def _run_info(cfg, run, resumed_step: int) -> RunInfo:
    return RunInfo(
        run_dir=run.path,
        run_key=run.key,
        model=cfg.model.name,
        task=cfg.task.name,
        seed=int(cfg.seed),
        config=run.config,
        resumed_step=resumed_step,
        group=sweep_group(),
    )


def _record(
    cfg, run, compiled, topology, splits, progress, test, eval_timer, code_version, peak_before
):
    """The results record of a finished run (selection fields are added by the caller).

    ``peak_before``: the device's peak memory after compiling, before any step ran.
    """
    train_compiled = compiled.train_step
    memory_bytes, memory_source = measure.peak_memory(train_compiled, before=peak_before)
    train_rate = progress.train_steps / progress.train_seconds if progress.train_seconds else None
    return {
        "schema_version": store.SCHEMA_VERSION,
        "kind": "train",
        "model": cfg.model.name,
        "task": cfg.task.name,
        "seed": int(cfg.seed),
        "val_source": effective_val_source(cfg.task),
        "split_sizes": {name: len(split) for name, split in splits.items()},
        "test_accuracy": test["accuracy"],
        "test_loss": test["loss"],
        "test_majority_rate": majority_rate(splits["test"].labels),
        "final_val_accuracy": progress.history[-1]["val_accuracy"],
        "selection": cfg.trainer.selection,
        "num_steps": int(cfg.trainer.num_steps),
        "train_steps_per_sec": train_rate,
        "eval_steps_per_sec": eval_timer.steps_per_sec,
        "peak_memory_bytes": memory_bytes,
        "memory_source": memory_source,
        "compiled_memory_bytes": measure.compiled_memory_bytes(train_compiled),
        "softmax_implementation": softmax_implementations(cfg),
        "flops_per_step": compiled.flops_per_step,
        "num_params": compiled.num_params,
        "compile_seconds": compiled.compile_seconds,
        **topology.describe(),
        "grad_accum": int(cfg.trainer.get("grad_accum", 1)),
        "remat": bool(cfg.trainer.get("remat", False)),
        "attention_sources": attention_sources(cfg),
        **layers_description(cfg),
        **measure.environment(),
        "precision": cfg.trainer.precision,
        "code_version": code_version,
        "config_hash": store.config_hash(run.config),
        "run_key": run.key,
        "run_dir": str(run.path),
        "resumed_from": progress.resumed_from,
        "checkpoint_saves": progress.checkpoint_saves,
        "checkpoint_seconds": progress.checkpoint_seconds,
        "started_at": progress.started_at,
        "history": progress.history,
        "config": run.config,
    }
