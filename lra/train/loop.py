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

The loop's state is one :class:`lra.train.state.LoopState`; its periodic actions (log and
validate, checkpoint, stop) are :mod:`lra.train.hooks`; the steps are compiled by
:mod:`lra.train.memory` (with the device-memory checks); the record's fields shared with
benchmark records are :mod:`lra.train.fields`.

Self-pretraining (``pretrain=masked|causal``) runs two such runs, :mod:`lra.train.pretrain`:
a pretraining stage (``stage: pretrain``: the per-token model and objective of
:mod:`lra.train.objective`, train and validation inputs only, selection by the lowest
validation loss, a record of kind ``pretrain`` without any test field) and a fine-tuning
stage (``init``: the classifier's encoder starts from the pretraining run's selected
parameters, :func:`lra.train.pretrain.initial_state`).
"""

import contextlib
import logging
import socket
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf
from tqdm.contrib.logging import logging_redirect_tqdm

from lra.config import schema
from lra.config.setting import describe_setting
from lra.data.pipeline import prefetch, train_batches
from lra.data.tasks import effective_val_source, load_task, resolve_data_dir
from lra.device import measure
from lra.device.compile_cache import CacheCounter, configure_compile_cache
from lra.errors import DataError
from lra.record import predictions, store
from lra.run.checkpoint import Checkpoints, start_or_resume
from lra.run.folder import RunFolder
from lra.run.lock import RunLock
from lra.run.signals import StopSignals
from lra.track import RunInfo, Trackers, check_loggers, open_trackers, sweep_group
from lra.track.progress import ProgressDisplay
from lra.train import hooks, parallel
from lra.train.compile import Compiled, abstract_batch
from lra.train.describe import attention_sources, layers_description
from lra.train.eval_loop import evaluate, majority_rate
from lra.train.fields import compiled_fields, memory_fields, run_fields, setup_fields
from lra.train.memory import compile_or_explain, out_of_memory, preflight
from lra.train.model import pretraining, weights_only
from lra.train.optim import describe_param_groups, make_schedule
from lra.train.parallel import Topology
from lra.train.state import LoopContext, LoopState

log = logging.getLogger("lra.train.loop")


def resolved_config(cfg, data_dir, results_dir) -> dict:
    """The run's config as plain data, with the paths it really uses."""
    config = OmegaConf.to_container(cfg, resolve=True)
    config["data_dir"], config["results_dir"] = str(data_dir), str(results_dir)
    return config


@dataclass
class Setup:
    """A run set up for its session: its folder, devices, compiled steps and data."""

    cfg: Any
    run: RunFolder
    topology: Topology
    setting: dict  # lra.config.setting.describe_setting of the run's config
    compiled: Compiled
    compile_cache: dict  # {"dir", "hits", "misses", ...} of compiling the steps
    peak_before: int | None  # the device's peak memory after compiling, before any step
    splits: dict  # split name -> lra.data.store split


def train_and_evaluate(cfg, *, on_validate=None, record_extra: dict | None = None) -> dict:
    """Train ``cfg.model`` on ``cfg.task`` (resuming its run folder), evaluate, write the record.

    Returns the record with ``record_path`` set to the JSON file written; a run
    already finished (and ``trainer.skip_done``) returns its record with ``skipped``.
    Raises :class:`Interrupted` after saving a checkpoint when a stop signal came.
    With ``pretrain.objective`` masked or causal, the two stages of
    :func:`lra.train.pretrain.pretrain_then_finetune` (the fine-tuning stage's record).

    ``on_validate(step, val_accuracy)`` is called after each validation pass (``lra-tune``'s
    pruner: it may raise to end the run there); ``record_extra`` is merged into the record
    (``lra-tune``'s ``tuning`` block). Neither is part of the run's identity. With
    ``trainer.evaluate_test=false`` the run validates only: the test split is never opened and
    the record (of kind ``trial``) has no test field.
    """
    from lra.train import pretrain

    if pretrain.is_two_stage(cfg):
        if on_validate is not None or record_extra:
            raise ValueError("on_validate and record_extra take a single-stage run")
        return pretrain.pretrain_then_finetune(cfg, run_stage)
    return run_stage(cfg, on_validate=on_validate, record_extra=record_extra)


def run_stage(cfg, *, on_validate=None, record_extra: dict | None = None) -> dict:
    """One run of :func:`train_and_evaluate` (a classification run, or one self-pretraining
    stage whose config :mod:`lra.train.pretrain` made)."""
    session_start, started_at = time.perf_counter(), store.utc_now()
    run, topology, cache_dir = _open_run(cfg)
    if done := _finished_record(cfg, run):
        if record_extra and any(done.get(k) != v for k, v in record_extra.items()):
            done = {**done, **record_extra}
            done["record_path"] = str(run.write_record(_without(done, "record_path", "skipped")))
            done["skipped"] = True
        return done
    setup = _set_up(cfg, run, topology, cache_dir)
    lock = RunLock(run.path, started_at) if topology.is_main else contextlib.nullcontext()
    with lock, StopSignals() as stop:
        _claim(setup, lock)
        ckpts = _checkpoints(setup)
        trackers = None
        try:
            code = store.code_version()  # a git subprocess: once per run
            note = {"at": started_at, "host": socket.gethostname(), "code": code}
            loop = _resume(setup, ckpts, note, session_start)
            trackers = _open_trackers(setup, loop.progress.step)
            with _out_of_memory_explained(setup.compiled):
                _train(setup, loop, ckpts, stop, trackers, on_validate)
                kept = ckpts.wait()
                selected, test = _select_and_test(setup, loop)
            record = _record(setup, loop, test, code_version=code)
            record.update(selected, checkpoint_steps=kept, wall_seconds=loop.wall_seconds())
            record.update(record_extra or {})
            record["record_path"] = str(
                run.write_record(record) if topology.is_main else run.record_path
            )
            trackers.summary(record)
        finally:
            ckpts.close()
            if trackers is not None:
                trackers.close()
    return record


def _open_run(cfg) -> tuple[RunFolder, Topology, str | None]:
    """Check the config, start the compile cache and the devices, open the run folder."""
    schema.validate(cfg, "config")  # types, allowed values, ranges: the schema's, as lra-train's
    trainer = cfg.trainer
    effective_val_source(cfg.task)  # a bad task.val_source fails before any compile
    cache_dir = configure_compile_cache(cfg.compile_cache)  # before the first compile
    check_loggers(cfg.get("logger"))
    parallel.initialize_distributed(cfg.distributed)
    topology = parallel.make_topology(trainer.mesh, int(trainer.batch_size), trainer.grad_accum)
    data_dir = resolve_data_dir(cfg.data_dir)  # a data_dir that is a file fails before any write
    results_dir = store.ensure_writable(cfg.results_dir)
    run = RunFolder(results_dir, resolved_config(cfg, data_dir, results_dir))
    return run, topology, cache_dir


def _finished_record(cfg, run: RunFolder) -> dict | None:
    """The record of a finished run, when ``trainer.skip_done`` reports it done."""
    if not cfg.trainer.skip_done or cfg.trainer.resume == "never":
        return None
    if not (done := run.finished_record()):
        return None
    log.info(f"{run.key} is already done ({run.record_path}); trainer.skip_done=false reruns it")
    return {**done, "record_path": str(run.record_path), "skipped": True}


def _set_up(cfg, run: RunFolder, topology: Topology, cache_dir) -> Setup:
    """Describe the run, compile its steps (stopping here if they cannot fit), load its data."""
    setting = describe_setting(run.config)
    log.info(f"{run.key}: variant {setting['variant']}, protocol {setting['protocol']}")
    if warning := layers_description(cfg)["schedule_warning"]:
        log.warning(f"{cfg.model.name} on {cfg.task.name}: {warning}")
    # Compiled from shapes alone: a step that cannot fit stops the run before any data loads,
    # and the pre-flight's verdict comes without the data (scripts/gpu_check.sh step 5 asks it
    # at the official settings on a machine with no LRA data), so missing data is reported
    # after the compile, not before.
    example = abstract_batch(cfg.task, int(cfg.trainer.batch_size), topology.batch_sharding)
    cache = CacheCounter()
    compiled = compile_or_explain(cfg, example, topology)
    compile_cache = {"dir": cache_dir, **cache.counts()}
    if cfg.trainer.preflight:
        preflight(cfg, compiled, topology)
    peak_before = measure.device_peak_bytes()  # compiling may have set it (GPU autotuner)
    # A pretraining stage and a validation-only run (trainer.evaluate_test=false) read the
    # train and validation splits only, never the test split.
    wanted = ("train", "val") if not tests(cfg) else ("train", "val", "test")
    splits = load_task(cfg.task, Path(run.config["data_dir"]), splits=wanted)
    _check_lengths(cfg.task, splits)
    return Setup(cfg, run, topology, setting, compiled, compile_cache, peak_before, splits)


def _claim(setup: Setup, lock) -> None:
    """Claim the run folder (under its lock) for ``trainer.resume``, on every process."""
    if getattr(lock, "took_over", None):
        log.warning(f"took over the lock of a stopped trainer: {lock.took_over}")
    if setup.topology.is_main:
        setup.run.claim(setup.cfg.trainer.resume)
    setup.topology.barrier("run folder claimed")


def _checkpoints(setup: Setup) -> Checkpoints:
    trainer = setup.cfg.trainer
    return Checkpoints(
        setup.run.path,
        keep=trainer.keep_checkpoints,
        every_steps=trainer.checkpoint_every,
        every_minutes=trainer.checkpoint_minutes,
    )


def _resume(setup: Setup, ckpts: Checkpoints, note: dict, session_start: float) -> LoopState:
    """The loop's state from the newest checkpoint (``trainer.resume``), or fresh."""
    fresh = setup.compiled.state
    if setup.cfg.get("init") is not None and ckpts.latest_step() is None:
        from lra.train.pretrain import initial_state

        fresh = initial_state(setup.cfg, fresh)  # the pretrained encoder, checked
    state, best_params, progress = start_or_resume(ckpts, fresh, setup.cfg.trainer.resume, note)
    if progress.step:
        log.info(f"resuming {setup.run.key} from step {progress.step} ({ckpts.folder})")
    state = setup.topology.replicate(state)
    return LoopState.resume(state, best_params, progress, session_start)


def _open_trackers(setup: Setup, resumed_step: int) -> Trackers:
    if not setup.topology.is_main:
        return Trackers([])
    return open_trackers(setup.cfg.get("logger"), _run_info(setup.cfg, setup.run, resumed_step))


@contextlib.contextmanager
def _out_of_memory_explained(compiled: Compiled):
    """Turn the device's out-of-memory error into one clear :class:`OutOfMemory`."""
    try:
        yield
    except Exception as err:  # XLA raises its own runtime error types
        if measure.is_out_of_memory(err):
            raise out_of_memory(err, compiled) from err
        raise


def tests(cfg) -> bool:
    """Whether the run evaluates the test split (not a pretraining stage, not validation-only)."""
    return pretraining(cfg) is None and bool(cfg.trainer.get("evaluate_test", True))


def _without(record: dict, *keys: str) -> dict:
    return {k: v for k, v in record.items() if k not in keys}


def _train(setup: Setup, loop: LoopState, ckpts, stop, trackers, on_validate=None) -> None:
    """Train ``loop`` from its step to ``trainer.num_steps``, with the periodic actions of
    :mod:`lra.train.hooks` after each step.

    Steps since the last log line keep their metrics in ``loop.pending``; a checkpoint
    stores them, so a resumed run logs exactly what an uninterrupted one logs.
    The session's first step is an untimed warm-up; saves are outside timed windows.
    """
    trainer, topology, start = setup.cfg.trainer, setup.topology, loop.progress.step
    num_steps = int(trainer.num_steps)
    if stop.requested:
        raise hooks.stopped(stop, start, num_steps, "nothing new to save")
    ctx = _context(setup, start, ckpts, stop, trackers, on_validate)
    batches = prefetch(
        train_batches(
            setup.splits["train"],
            int(trainer.batch_size),
            int(setup.cfg.seed),
            start_step=start,
            **topology.shard_args(),
        ),
        put=topology.put,
    )
    step_fn, key = setup.compiled.train_step, setup.compiled.dropout_key
    try:
        with logging_redirect_tqdm():
            for step in range(start + 1, num_steps + 1):
                loop.train, metrics = step_fn(loop.train, next(batches), key)
                loop.pending.append(metrics)
                loop.count_step()
                if hooks.log_due(ctx, step):
                    hooks.log_and_validate(ctx, loop, step)
                hooks.checkpoint_and_stop(ctx, loop, step)
    finally:
        ctx.display.close()
        batches.close()


def _context(setup: Setup, start: int, ckpts, stop, trackers, on_validate=None) -> LoopContext:
    trainer, topology = setup.cfg.trainer, setup.topology
    num_steps = int(trainer.num_steps)
    return LoopContext(
        trainer=trainer,
        topology=topology,
        compiled=setup.compiled,
        splits=setup.splits,
        ckpts=ckpts,
        stop=stop,
        trackers=trackers,
        display=ProgressDisplay(num_steps, start, bool(trainer.progress) and topology.is_main),
        learning_rate=make_schedule(
            trainer.schedule,
            trainer.learning_rate,
            trainer.warmup_steps,
            num_steps,
            trainer.decay_steps,
        ),
        select_on_loss=pretraining(setup.cfg) is not None,
        on_validate=on_validate,
    )


def _select_and_test(setup: Setup, loop: LoopState) -> tuple[dict, dict]:
    """The model ``trainer.selection`` picks (``val_accuracy``, ``selected_step``) and its
    accuracy and loss on the test split."""
    progress, topology = loop.progress, setup.topology
    if pretraining(setup.cfg) is not None:  # the lowest validation loss; no test split
        return {
            "selected_val_loss": -progress.best_accuracy,
            "selected_step": progress.best_step,
        }, {}
    if setup.cfg.trainer.selection == "best_val":
        params, step, val_accuracy = loop.best_params, progress.best_step, progress.best_accuracy
    else:
        params, step = loop.train.params, progress.step
        val_accuracy = progress.history[-1]["val_accuracy"]
    params, batch_size = topology.replicate(params), int(setup.cfg.trainer.batch_size)
    test = None
    if tests(setup.cfg):
        test = evaluate(
            setup.compiled.eval_step,
            params,
            setup.splits["test"],
            batch_size,
            None,
            loop.eval_timer,
            topology,
            keep_rows=True,
        )
    # The selected model's validation predictions: the validation pass again (untimed, the
    # same trainer.eval_batches), as the record's val_accuracy was measured.
    val = evaluate(
        setup.compiled.eval_step,
        params,
        setup.splits["val"],
        batch_size,
        setup.cfg.trainer.eval_batches,
        None,
        topology,
        keep_rows=True,
    )
    if val["accuracy"] != val_accuracy:
        log.warning(
            f"the selected model's validation accuracy is {val['accuracy']:.6f} evaluated again, "
            f"{val_accuracy:.6f} when it was selected (a backend that is not deterministic)"
        )
    selected = {"val_accuracy": val_accuracy, "selected_step": step}
    if topology.is_main:
        evaluated = {"test": test, "val": val} if test is not None else {"val": val}
        selected["predictions"] = _write_predictions(setup.run.path, **evaluated)
    return selected, test


def _write_predictions(folder: Path, **evaluated: dict) -> dict:
    """Write each split's predictions into the run folder: what the record names of them."""
    named = {}
    for split, result in evaluated.items():
        relative = predictions.relative_path(split)
        named[split] = {**predictions.write(folder / relative, result["rows"]), "file": relative}
    return named


def _check_lengths(task_cfg, splits) -> None:
    for name, split in splits.items():
        if split.max_length != int(task_cfg.max_length):
            raise DataError(
                f"the prepared {name} split of {task_cfg.name} has length {split.max_length}, "
                f"but task.max_length is {task_cfg.max_length}; prepare it again with "
                f"lra-data task={task_cfg.name} rebuild=true"
            )


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


def _record(setup: Setup, loop: LoopState, test: dict, *, code_version: str) -> dict:
    """The results record of a finished run (selection fields are added by the caller)."""
    cfg, run, progress, splits = setup.cfg, setup.run, loop.progress, setup.splits
    train_rate = progress.train_steps / progress.train_seconds if progress.train_seconds else None
    objective = pretraining(cfg)
    if objective is None and test is None:  # validation only (trainer.evaluate_test=false)
        result = {
            "final_val_accuracy": progress.history[-1]["val_accuracy"],
            "selection": cfg.trainer.selection,
        }
    elif objective is None:
        from lra.train.pretrain import init_fields

        result = {
            "init": init_fields(cfg),
            "test_accuracy": test["accuracy"],
            "test_loss": test["loss"],
            "test_majority_rate": majority_rate(splits["test"].labels),
            "final_val_accuracy": progress.history[-1]["val_accuracy"],
            "selection": cfg.trainer.selection,
        }
    else:
        result = {
            "objective": objective.objective,
            "mask_ratio": objective.mask_ratio if objective.objective == "masked" else None,
            "pixel_target": cfg.pretrain.pixel_target,
            "final_val_loss": progress.history[-1]["val_loss"],
            "selection": "lowest_val_loss",
        }
    return {
        **run_fields(
            cfg,
            "pretrain" if objective else ("train" if test is not None else "trial"),
            setting=setup.setting,
            config=run.config,
            code_version=code_version,
            started_at=progress.started_at,
        ),
        **setup_fields(cfg, setup.topology),
        **compiled_fields(setup.compiled, setup.compile_cache),
        **memory_fields(setup.compiled, setup.peak_before),
        **measure.environment(),
        "val_source": effective_val_source(cfg.task),
        "split_sizes": {name: len(split) for name, split in splits.items()},
        **result,
        "num_steps": int(cfg.trainer.num_steps),
        "param_groups": describe_param_groups(
            cfg.trainer, weights_only(setup.compiled.state.params)
        ),
        "train_steps_per_sec": train_rate,
        "eval_steps_per_sec": loop.eval_timer.steps_per_sec,
        "attention_sources": attention_sources(cfg),
        "run_key": run.key,
        "run_dir": str(run.path),
        "resumed_from": progress.resumed_from,
        "checkpoint_saves": progress.checkpoint_saves,
        "checkpoint_seconds": progress.checkpoint_seconds,
        "history": progress.history,
    }
