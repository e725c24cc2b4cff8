"""The record fields that training records (:mod:`lra.train.loop`) and benchmark records
(:mod:`lra.measure.bench`) share, each built in one place.

* :func:`run_fields`: what ran and from what (model, task, seed, setting/variant/protocol,
  layers, precision, code version, config and its hash, start time);
* :func:`setup_fields`: how the step is laid out (devices and batch split, ``grad_accum``,
  ``remat``, the softmax path);
* :func:`compiled_fields`: what compiling gave (compile seconds and cache use, parameters,
  FLOPs per train step, compiled memory);
* :func:`memory_fields`: the measured peak memory and its source.
"""

from lra.device import measure
from lra.models.encoder import remat_policy
from lra.record import store
from lra.train.compile import Compiled
from lra.train.describe import layers_description, softmax_implementations


def run_fields(
    cfg, kind: str, *, setting: dict, config: dict, code_version: str, started_at: str
) -> dict:
    """``kind`` ("train" or "bench"), the model, task and seed of ``cfg``, its ``setting``
    (:func:`lra.config.setting.describe_setting`), the resolved ``config`` and its hash."""
    return {
        "schema_version": store.SCHEMA_VERSION,
        "kind": kind,
        "model": cfg.model.name,
        "task": cfg.task.name,
        "seed": int(cfg.seed),
        **setting,
        **layers_description(cfg),
        "precision": cfg.trainer.precision,
        "code_version": code_version,
        "config_hash": store.config_hash(config),
        "started_at": started_at,
        "config": config,
    }


def setup_fields(cfg, topology) -> dict:
    """The mesh and batch split of ``topology`` (:mod:`lra.train.parallel`), the memory
    settings and the softmax path (known before anything compiles)."""
    return {
        **topology.describe(),
        "grad_accum": int(cfg.trainer.grad_accum),
        "remat": remat_policy(cfg.trainer.remat),
        "softmax_implementation": softmax_implementations(cfg),
    }


def compiled_fields(compiled: Compiled, compile_cache: dict) -> dict:
    """Compile seconds, the compile cache's ``{"dir", "hits", "misses"...}``, parameters,
    FLOPs per train step and the train step's compiled memory."""
    return {
        "compile_seconds": compiled.compile_seconds,
        "compile_cache": compile_cache,
        "num_params": compiled.num_params,
        "flops_per_step": compiled.flops_per_step,
        "compiled_memory_bytes": measure.compiled_memory_bytes(compiled.train_step),
    }


def memory_fields(compiled: Compiled, peak_before: int | None) -> dict:
    """The device's peak memory (``peak_before``: its peak after compiling, before any
    step ran) or, where none is measured, the compiled estimate; and which it is."""
    memory, source = measure.peak_memory(compiled.train_step, before=peak_before)
    return {"peak_memory_bytes": memory, "memory_source": source}
