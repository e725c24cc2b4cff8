"""Measure one stage of one sweep cell, as its run would compile and step it, without its data.

:func:`measure_stage` runs in a fresh process (:func:`measure_isolated`), so each cell's compile,
memory statistics and an out-of-memory crash belong to that cell alone, as ``lra-bench``'s
``bench.isolate`` does. It

1. compiles the train and eval steps at the run's real shapes and settings (the task's
   ``max_length``, ``trainer.batch_size``, precision, remat, ``grad_accum``, the data-parallel
   mesh) exactly as ``lra-train`` does (:func:`lra.train.memory.compile_or_explain`), and reads
   their compiled memory and FLOPs;
2. asks the pre-flight (:func:`lra.train.memory.preflight`) whether they fit the device, and
   where they do not keeps its message, which names the ``grad_accum``/``remat`` overrides that
   fit (each one compiled and measured);
3. where they fit, times ``plan.warmup_steps`` untimed then ``plan.windows`` windows of
   ``plan.steps_per_window`` train steps and as many eval steps, on synthetic batches of the
   task's shapes (:func:`lra.measure.bench.time_train_and_eval`, ``lra-bench``'s measurement);
4. saves one real checkpoint of the train state (orbax, the run's
   :class:`lra.run.checkpoint.Checkpoints`) into a temporary folder under ``results_dir``, the
   file system the run's checkpoints go to, and times it to the end of the write (before the
   timed steps, which donate the state's buffers).

No data file is opened: the batches are random tokens of the task's vocabulary.
"""

import multiprocessing
import signal
import tempfile
import time

import jax
from omegaconf import OmegaConf

from lra.device import measure
from lra.device.compile_cache import CacheCounter, configure_compile_cache
from lra.measure.bench import device_batch, time_train_and_eval
from lra.record import store
from lra.run.checkpoint import Checkpoints, Progress
from lra.train import parallel
from lra.train.compile import abstract_batch
from lra.train.fields import compiled_fields, setup_fields
from lra.train.memory import compile_or_explain, preflight
from lra.train.preflight import OutOfMemory, device_memory


def _checkpoint_seconds(state, results_dir: str) -> float:
    """Seconds to save ``state`` (and its parameters as the best) as one checkpoint, to the end
    of the write, in a temporary folder under ``results_dir``."""
    folder = store.ensure_writable(results_dir)
    with tempfile.TemporaryDirectory(prefix=".lra-plan-", dir=folder) as tmp:
        ckpts = Checkpoints(tmp, keep=1)
        start = time.perf_counter()
        ckpts.save(1, state, state.params, Progress(step=1))
        ckpts.wait()
        seconds = time.perf_counter() - start
        ckpts.close()
    return seconds


def measure_stage(config: dict, options: dict) -> dict:
    """Compile, fit-check, time and checkpoint one stage's config (plain data); see the module.

    Returns ``fits``, ``advice`` (the pre-flight's message when it does not fit),
    ``device_memory_bytes`` and its source, :func:`lra.train.fields.compiled_fields`
    (``compile_seconds``, ``num_params``, ``flops_per_step``, ``compiled_memory_bytes``),
    ``eval_compiled_memory_bytes``, ``state_bytes``, ``checkpoint_seconds``, the timed train and
    eval steps/sec with their windows (when it fits) and the device's description.
    """
    measure.configure_cpu_memory_analysis()
    cfg = OmegaConf.create(config)
    cache_dir = configure_compile_cache(cfg.compile_cache)  # before the first compile
    trainer = cfg.trainer
    batch_size, length = int(trainer.batch_size), int(cfg.task.max_length)
    topology = parallel.make_topology(trainer.mesh, batch_size, int(trainer.grad_accum))
    limit, source = device_memory(trainer.memory_limit_gb)
    out = {
        **setup_fields(cfg, topology),
        "batch_size": batch_size,
        "length": length,
        "device_memory_bytes": limit,
        "device_memory_source": source,
        **measure.environment(),
    }
    example = abstract_batch(cfg.task, batch_size, topology.batch_sharding)
    cache = CacheCounter()
    try:
        compiled = compile_or_explain(cfg, example, topology)
    except OutOfMemory as err:  # compiling itself ran out of device memory
        return {**out, "fits": False, "advice": str(err)}
    out.update(compiled_fields(compiled, {"dir": cache_dir, **cache.counts()}))
    out["eval_compiled_memory_bytes"] = measure.compiled_memory_bytes(compiled.eval_step)
    out["state_bytes"] = int(sum(leaf.nbytes for leaf in jax.tree.leaves(compiled.state)))
    try:
        preflight(cfg, compiled, topology)
        out.update(fits=True, advice=None)
    except OutOfMemory as err:
        return {**out, "fits": False, "advice": str(err)}
    # Before the timed steps, which donate the state's buffers.
    out["checkpoint_seconds"] = _checkpoint_seconds(compiled.state, str(cfg.results_dir))
    batch = device_batch(cfg.task, topology, batch_size, length)
    out.update(time_train_and_eval(compiled, batch, **options))
    return out


def _child(target, config: dict, options: dict, conn) -> None:
    try:
        conn.send(("ok", target(config, options)))
    except BaseException as err:  # noqa: BLE001 - handed to the parent, which raises it
        conn.send(("error", err))
    finally:
        conn.close()


def _died(exitcode: int | None) -> str:
    """Why a measuring process ended without an answer, from its exit code."""
    if exitcode is not None and exitcode < 0:
        number = -exitcode
        try:
            name = signal.Signals(number).name
        except ValueError:
            name = f"signal {number}"
        if number == signal.SIGKILL:
            return (
                f"the measuring process was killed ({name}): most likely the host ran out of "
                "memory; lower the memory with trainer.grad_accum=2 (or more)"
            )
        return (
            f"the measuring process crashed ({name}, twice): a fault in the compiler or the "
            "runtime, not a verdict on the memory; its output above has the stack trace"
        )
    return f"the measuring process ended with exit status {exitcode} and no answer"


def measure_isolated(config: dict, options: dict, target=measure_stage) -> dict:
    """``target(config, options)`` (:func:`measure_stage`, or :func:`lra.plan.tpu.measure_stage`)
    in a fresh spawned process. A process killed by the host (SIGKILL: its out-of-memory killer)
    is a cell that does not fit; one that crashes (e.g. SIGSEGV in a compiler) is tried once
    more, then reported as a crash, never as a fit verdict (``fits`` False with the reason, and
    ``crashed`` True)."""
    context = multiprocessing.get_context("spawn")
    for _ in range(2):
        receive, send = context.Pipe(duplex=False)
        child = context.Process(target=_child, args=(target, config, options, send))
        child.start()
        send.close()
        try:
            status, value = receive.recv()
        except EOFError:  # it died before answering
            child.join()
            if child.exitcode == -signal.SIGKILL:
                break
            continue
        finally:
            receive.close()
        child.join()
        if status == "error":
            raise value
        return value
    return {
        "fits": False,
        "crashed": child.exitcode != -signal.SIGKILL,
        "exitcode": child.exitcode,
        "advice": _died(child.exitcode),
    }
