"""Speed and memory of one model at one sequence length, on synthetic inputs.

No data is needed: inputs are random tokens of the task's vocabulary at the
full length (every position real), so every model does the same work. The
measurement is the one the training loop uses (:mod:`lra.measure`): steps are
compiled ahead of time, warm-up steps are not timed, and each timed window
ends with the device work awaited. Speed is the median over windows, reported
with the per-window values.

:func:`run_benchmark` (the ``lra-bench`` app) measures one model at every length
of ``cfg.lengths`` and writes one record per length (``kind: "bench"``). With
``bench.isolate`` each length runs in a fresh process, so the device's peak
memory statistic (a process-wide high-water mark on GPU) belongs to that length
alone and an out-of-memory crash cannot take the sweep down.
"""

import concurrent.futures
import multiprocessing
import statistics
import time
from concurrent.futures.process import BrokenProcessPool

import jax
import numpy as np
from omegaconf import OmegaConf

from lra import measure, parallel, results
from lra.errors import ConfigError
from lra.setting import describe_setting
from lra.steps import abstract_batch, compile_steps, layers_description, train_step_flops


def synthetic_batch(task_cfg, batch_size: int, length: int, seed: int = 0) -> dict:
    """A full-length batch of random tokens in the shape of ``task_cfg``'s inputs."""
    rng = np.random.default_rng(seed)
    num_inputs = 2 if task_cfg.get("dual", False) else 1
    tokens = tuple(
        rng.integers(1, task_cfg.vocab_size, size=(batch_size, length)).astype(np.int32)
        for _ in range(num_inputs)
    )
    return {
        "tokens": tokens,
        "lengths": tuple(np.full(batch_size, length, np.int32) for _ in range(num_inputs)),
        "labels": rng.integers(0, task_cfg.num_classes, size=batch_size).astype(np.int32),
        "weights": np.ones(batch_size, np.float32),
    }


def _timed_windows(run_steps, windows: int, steps_per_window: int) -> list[float]:
    rates = []
    for _ in range(windows):
        start = time.perf_counter()
        jax.block_until_ready(run_steps(steps_per_window))
        rates.append(steps_per_window / (time.perf_counter() - start))
    return rates


def measure_length(
    cfg,
    length: int,
    batch_size: int,
    *,
    warmup_steps: int = 2,
    windows: int = 3,
    steps_per_window: int = 5,
    time_steps: bool = True,
) -> dict:
    """Compile the train and eval steps of ``cfg`` at ``length`` and measure them.

    The batch is split over every device of ``trainer.mesh`` (as in training), so
    the speed is that of the whole mesh and the memory that of one device.

    Returns ``status`` ("ok" or "oom"), ``num_params``, ``flops_per_step``,
    ``compiled_memory_bytes``, ``peak_memory_bytes`` with ``memory_source``, and
    (when ``time_steps``) the median train and eval steps/sec with their windows.
    """
    cfg = OmegaConf.merge(cfg, {"task": {"max_length": int(length)}})
    grad_accum = int(cfg.trainer.get("grad_accum", 1))
    topology = parallel.make_topology(cfg.trainer.get("mesh"), batch_size, grad_accum)
    rows = slice(
        topology.process_index * topology.per_process_batch,
        (topology.process_index + 1) * topology.per_process_batch,
    )
    local = jax.tree.map(lambda x: x[rows], synthetic_batch(cfg.task, batch_size, length))
    batch = topology.put(local)
    out = {
        "length": int(length),
        "batch_size": int(batch_size),
        **topology.describe(),
        "grad_accum": grad_accum,
        "remat": bool(cfg.trainer.get("remat", False)),
        "status": "ok",
    }
    try:
        example = abstract_batch(cfg.task, batch_size, topology.batch_sharding)
        compiled = compile_steps(cfg, example, topology=topology)
        out.update(
            compile_seconds=compiled.compile_seconds,
            num_params=compiled.num_params,
            flops_per_step=train_step_flops(compiled.train_step, grad_accum),
            compiled_memory_bytes=measure.compiled_memory_bytes(compiled.train_step),
        )
        if time_steps:
            state = compiled.state

            def train(n):
                nonlocal state
                for _ in range(n):
                    state, metrics = compiled.train_step(state, batch, compiled.dropout_key)
                return state

            train(warmup_steps)
            train_rates = _timed_windows(train, windows, steps_per_window)

            def infer(n):
                return [compiled.eval_step(state.params, batch) for _ in range(n)]

            infer(warmup_steps)
            eval_rates = _timed_windows(infer, windows, steps_per_window)
            out.update(
                train_steps_per_sec=statistics.median(train_rates),
                train_steps_per_sec_windows=train_rates,
                eval_steps_per_sec=statistics.median(eval_rates),
                eval_steps_per_sec_windows=eval_rates,
            )
        memory, source = measure.peak_memory(compiled.train_step)
        out.update(peak_memory_bytes=memory, memory_source=source)
    except Exception as err:  # XLA raises its own runtime error types
        if not measure.is_out_of_memory(err):
            raise
        out.update(status="oom", error=str(err).splitlines()[0][:300])
    return out


def measure_cell(cfg_container: dict, length: int, batch_size: int, options: dict) -> dict:
    """:func:`measure_length` plus :func:`lra.measure.environment`, from a plain config.

    Module-level so a spawned process can run it.
    """
    measure.configure_cpu_memory_analysis()
    if cfg_container["trainer"].get("remat"):
        measure.configure_cpu_remat()
    out = measure_length(OmegaConf.create(cfg_container), length, batch_size, **options)
    return {**out, **measure.environment()}


def _measure_isolated(cfg_container: dict, length: int, batch_size: int, options: dict) -> dict:
    context = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(1, mp_context=context) as pool:
        try:
            return pool.submit(measure_cell, cfg_container, length, batch_size, options).result()
        except BrokenProcessPool as err:  # killed, e.g. by the host's OOM killer
            return {
                "length": int(length),
                "batch_size": int(batch_size),
                "status": "failed",
                "error": f"measurement process died: {err}",
            }


# Keys that say how a model is measured, not which model: not overrides of its setting.
MEASUREMENT_KEYS = ("lengths", "batch_size", "bench.")


def _check_bench(cfg) -> list[int]:
    lengths = list(cfg.lengths)
    if not lengths or any(int(n) <= 0 for n in lengths):
        raise ConfigError(f"lengths must be a non-empty list of positive ints, got {lengths}")
    if int(cfg.batch_size) <= 0:
        raise ConfigError(f"batch_size must be positive, got {cfg.batch_size}")
    return [int(n) for n in lengths]


def run_benchmark(cfg, *, on_record=None) -> list[dict]:
    """Measure ``cfg.model`` at each of ``cfg.lengths``; write and return one record each.

    An out-of-memory length is recorded with ``status: "oom"`` and the sweep goes
    on; ``status: "failed"`` marks a measurement process that died.
    """
    lengths = _check_bench(cfg)
    results_dir = results.ensure_writable(cfg.results_dir)
    options = {
        "warmup_steps": int(cfg.bench.warmup_steps),
        "windows": int(cfg.bench.windows),
        "steps_per_window": int(cfg.bench.steps_per_window),
    }
    code_version = results.code_version()
    setting = describe_setting(
        OmegaConf.to_container(cfg, resolve=True), config_name="bench", ignore=MEASUREMENT_KEYS
    )
    records = []
    for length in lengths:
        started_at, start = results.utc_now(), time.perf_counter()
        config = OmegaConf.to_container(cfg, resolve=True)
        config["task"]["max_length"] = length
        config["results_dir"] = str(results_dir)
        if cfg.bench.isolate:
            out = _measure_isolated(config, length, int(cfg.batch_size), options)
        else:
            out = measure_cell(config, length, int(cfg.batch_size), options)
        record = {
            "schema_version": results.SCHEMA_VERSION,
            "kind": "bench",
            "model": cfg.model.name,
            "task": cfg.task.name,
            "seed": int(cfg.seed),
            **setting,
            **layers_description(cfg),
            **out,
            "precision": cfg.trainer.precision,
            "isolated": bool(cfg.bench.isolate),
            "code_version": code_version,
            "config_hash": results.config_hash(config),
            "started_at": started_at,
            "wall_seconds": time.perf_counter() - start,
            "config": config,
        }
        record["record_path"] = str(results.write_record(record, results_dir))
        records.append(record)
        if on_record is not None:
            on_record(record)
    return records
