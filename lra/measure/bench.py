"""Speed and memory of one model at one sequence length, on synthetic inputs.

No data is needed: inputs are random tokens of the task's vocabulary at the
full length (every position real), so every model does the same work. The
measurement is the one the training loop uses (:mod:`lra.device.measure`): steps are
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
import time
from concurrent.futures.process import BrokenProcessPool

import jax
import numpy as np
from hydra.core.hydra_config import HydraConfig
from omegaconf import OmegaConf

from lra.config import schema
from lra.config.compose import compose_config
from lra.config.setting import describe_setting, group_choices
from lra.device import measure
from lra.device.compile_cache import CacheCounter, configure_compile_cache
from lra.device.machine_load import summarize_windows
from lra.device.measure import WindowTimer
from lra.record import store
from lra.train import parallel
from lra.train.compile import abstract_batch, compile_steps
from lra.train.fields import compiled_fields, memory_fields, run_fields, setup_fields


def synthetic_batch(task_cfg, batch_size: int, length: int, seed: int = 0) -> dict:
    """A full-length batch of random tokens in the shape of ``task_cfg``'s inputs."""
    rng = np.random.default_rng(seed)
    num_inputs = 2 if task_cfg.dual else 1
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


def device_batch(task_cfg, topology, batch_size: int, length: int):
    """:func:`synthetic_batch` placed on ``topology``'s mesh (this process's rows of it)."""
    rows = slice(
        topology.process_index * topology.per_process_batch,
        (topology.process_index + 1) * topology.per_process_batch,
    )
    local = jax.tree.map(lambda x: x[rows], synthetic_batch(task_cfg, batch_size, length))
    return topology.put(local)


def _timed_windows(run_steps, windows: int, steps_per_window: int) -> WindowTimer:
    """``windows`` timed windows of ``steps_per_window`` steps each, with their loads."""
    timer = WindowTimer()
    for _ in range(windows):
        timer.start()
        timer.stop(steps_per_window, run_steps(steps_per_window))
    return timer


def time_train_and_eval(
    compiled, batch, *, warmup_steps: int, windows: int, steps_per_window: int
) -> dict:
    """Train and eval steps/sec of ``compiled`` (:class:`lra.train.compile.Compiled`) on
    ``batch``: ``warmup_steps`` untimed (awaited), then ``windows`` timed windows of
    ``steps_per_window`` steps each, summarised with their loads
    (:func:`lra.device.machine_load.summarize_windows`)."""
    state = compiled.state

    def train(n):
        nonlocal state
        for _ in range(n):
            state, metrics = compiled.train_step(state, batch, compiled.dropout_key)
        return state

    # Dispatch is asynchronous: await the warm-up, or window 1 pays for it.
    jax.block_until_ready(train(warmup_steps))
    trained = _timed_windows(train, windows, steps_per_window)

    def infer(n):
        return [compiled.eval_step(state.params, batch) for _ in range(n)]

    jax.block_until_ready(infer(warmup_steps))
    inferred = _timed_windows(infer, windows, steps_per_window)
    return {
        **summarize_windows(trained.windows, trained.loads, "train"),
        **summarize_windows(inferred.windows, inferred.loads, "eval"),
    }


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
    cache_dir = configure_compile_cache(cfg.compile_cache)  # before the first compile
    topology = parallel.make_topology(cfg.trainer.mesh, batch_size, int(cfg.trainer.grad_accum))
    batch = device_batch(cfg.task, topology, batch_size, length)
    out = {
        "length": int(length),
        "batch_size": int(batch_size),
        **setup_fields(cfg, topology),
        "status": "ok",
    }
    try:
        example = abstract_batch(cfg.task, batch_size, topology.batch_sharding)
        cache = CacheCounter()
        compiled = compile_steps(cfg, example, topology=topology)
        out.update(compiled_fields(compiled, {"dir": cache_dir, **cache.counts()}))
        peak_before = measure.device_peak_bytes()  # compiling may have set it (GPU autotuner)
        if time_steps:
            out.update(
                time_train_and_eval(
                    compiled,
                    batch,
                    warmup_steps=warmup_steps,
                    windows=windows,
                    steps_per_window=steps_per_window,
                )
            )
            out["achieved_flops_per_sec"] = (
                out["flops_per_step"] * out["train_steps_per_sec"]
                if out.get("flops_per_step") and out.get("train_steps_per_sec")
                else None
            )
        out.update(memory_fields(compiled, peak_before))
    except Exception as err:  # XLA raises its own runtime error types
        if not measure.is_out_of_memory(err):
            raise
        out.update(status="oom", error=str(err).splitlines()[0][:300])
    return out


def measure_cell(cfg_container: dict, length: int, batch_size: int, options: dict) -> dict:
    """:func:`measure_length` plus :func:`lra.device.measure.environment`, from a plain config.

    Module-level so a spawned process can run it.
    """
    measure.configure_cpu_memory_analysis()
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
MEASUREMENT_KEYS = ("lengths", "batch_size", "bench.", "models", "rounds")


def model_configs(cfg, overrides: list[str] | None = None) -> list:
    """One config per model of ``cfg.models`` (the command's other overrides kept), or
    ``[cfg]`` when ``models`` is null. ``overrides`` defaults to the running Hydra app's."""
    names = cfg.get("models")
    if not names:
        return [cfg]
    if overrides is None:
        overrides = list(HydraConfig.get().overrides.task) if HydraConfig.initialized() else []
    kept = [o for o in overrides if o.split("=")[0].lstrip("+~") not in ("model", "models")]
    return [compose_config("bench", [*kept, f"model={name}"]) for name in names]


IMPLEMENTATION_KEY = "model.attention_options.softmax.implementation"


def with_softmax_paths(
    cfg, configs: list, names: list, overrides: list[str] | None = None
) -> tuple[list, list]:
    """``configs`` and ``names`` plus, per config whose model has softmax layers, one config
    per implementation of ``cfg.bench.softmax_paths`` (the command's overrides kept, the
    implementation forced with ``++model.attention_options.softmax.implementation=...``), so
    one sweep measures the Transformer on both paths (issue 31, part 4). A forced path that is
    the config's own is not added twice."""
    from lra.train.describe import softmax_implementations

    paths = list(cfg.bench.get("softmax_paths") or [])
    if not paths:
        return configs, names
    if overrides is None:
        overrides = list(HydraConfig.get().overrides.task) if HydraConfig.initialized() else []
    out_configs, out_names = list(configs), list(names)
    for config, name in zip(configs, names, strict=True):
        if softmax_implementations(config) is None:
            continue  # no softmax layer: nothing to force
        own = ((config.model.get("attention_options") or {}).get("softmax") or {}).get(
            "implementation", "auto"
        )
        kept = [o for o in overrides if o.split("=")[0].lstrip("+~") not in ("models",)]
        if name is not None:
            kept = [o for o in kept if o.split("=")[0].lstrip("+~") != "model"]
            kept.append(f"model={name}")
        kept = [o for o in kept if o.split("=")[0].lstrip("+~") != IMPLEMENTATION_KEY]
        for path in paths:
            if path == own:
                continue
            forced = compose_config("bench", [*kept, f"++{IMPLEMENTATION_KEY}={path}"])
            out_configs.append(forced)
            out_names.append(name)
    return out_configs, out_names


def _merge_rounds(outs: list[dict]) -> dict:
    """One cell's measurements over several rounds: static figures from the first round,
    every round's windows (with their loads) pooled for the speed figures."""
    merged = dict(outs[0])
    if merged["status"] != "ok" or len(outs) == 1:
        return merged
    for kind in ("train", "eval"):
        rates, loads = [], []
        for out in outs:
            rates += out[f"{kind}_steps_per_sec_windows"]
            loads += [
                {"other_cores": c, "load_average": a}
                for c, a in zip(
                    out[f"{kind}_window_other_cores"],
                    out[f"{kind}_window_load_average"],
                    strict=True,
                )
            ]
        merged.update(summarize_windows(rates, loads, kind))
        merged[f"{kind}_steps_per_sec_rounds"] = [out[f"{kind}_steps_per_sec"] for out in outs]
    merged["compile_seconds_rounds"] = [out.get("compile_seconds") for out in outs]
    if merged.get("flops_per_step") and merged.get("train_steps_per_sec"):
        merged["achieved_flops_per_sec"] = merged["flops_per_step"] * merged["train_steps_per_sec"]
    return merged


def _describe(config: dict, model: str | None) -> dict:
    """The setting of one model's benchmark config; with ``models``, its reference is
    composed from ``model=<that model>`` (the app's own choice is the default model)."""
    choices = group_choices(config)
    if model is not None:
        choices = {**choices, "model": model}
    return describe_setting(config, config_name="bench", choices=choices, ignore=MEASUREMENT_KEYS)


def run_benchmark(cfg, *, on_record=None, overrides: list[str] | None = None) -> list[dict]:
    """Measure ``cfg.model`` (or every model of ``cfg.models``) at each of ``cfg.lengths``;
    write and return one record per model and length.

    With several models or ``rounds`` > 1 the cells are measured round-robin: in each
    round, for each length, every model once, so a change of the machine's load falls
    on all models alike instead of on whichever model ran at the time; a cell's record
    pools its windows over the rounds and keeps each round's median. An out-of-memory
    cell is recorded with ``status: "oom"`` (and not measured again in later rounds) and
    the sweep goes on; ``status: "failed"`` marks a measurement process that died.
    """
    schema.validate(cfg, "bench")  # lengths, batch size, rounds: the schema's checks
    lengths, rounds = [int(n) for n in cfg.lengths], int(cfg.rounds)
    results_dir = store.ensure_writable(cfg.results_dir)
    options = {
        "warmup_steps": int(cfg.bench.warmup_steps),
        "windows": int(cfg.bench.windows),
        "steps_per_window": int(cfg.bench.steps_per_window),
    }
    code_version = store.code_version()
    configs = model_configs(cfg, overrides)
    names = list(cfg.get("models") or [None])
    configs, names = with_softmax_paths(cfg, configs, names, overrides)
    settings = [  # one reference compose per model, not one per record
        _describe(OmegaConf.to_container(c, resolve=True), name)
        for c, name in zip(configs, names, strict=True)
    ]
    order = "round-robin" if len(configs) > 1 or rounds > 1 else "single"
    measured: dict[tuple[int, int], list[dict]] = {}
    started: dict[tuple[int, int], tuple[str, float]] = {}
    records = []
    for round_index in range(rounds):
        for length in lengths:
            for index, model_cfg in enumerate(configs):
                cell, outs = (index, length), measured.setdefault((index, length), [])
                if outs and outs[0]["status"] != "ok":
                    continue  # an OOM or a crash is not measured again (its record is written)
                started.setdefault(cell, (store.utc_now(), time.perf_counter()))
                config = OmegaConf.to_container(model_cfg, resolve=True)
                config["task"]["max_length"] = length
                config["results_dir"] = str(results_dir)
                measure_one = _measure_isolated if cfg.bench.isolate else measure_cell
                outs.append(measure_one(config, length, int(cfg.batch_size), options))
                if round_index < rounds - 1 and outs[0]["status"] == "ok":
                    continue  # written once its last round has run
                record = _bench_record(
                    model_cfg,
                    settings[index],
                    config,
                    _merge_rounds(outs),
                    started[cell],
                    code_version,
                )
                record.update(rounds=len(outs), sweep_order=order)
                record["record_path"] = str(store.write_record(record, results_dir))
                records.append(record)
                if on_record is not None:
                    on_record(record)
    return records


def _bench_record(
    cfg, setting: dict, config: dict, out: dict, started: tuple[str, float], code_version: str
) -> dict:
    """The record of one model at one length: the fields every record has
    (:mod:`lra.train.fields`), the measurement ``out`` and how it was taken."""
    shared = run_fields(
        cfg,
        "bench",
        setting=setting,
        config=config,
        code_version=code_version,
        started_at=started[0],
    )
    return {
        **shared,
        **out,
        "isolated": bool(cfg.bench.isolate),
        "wall_seconds": time.perf_counter() - started[1],
    }
