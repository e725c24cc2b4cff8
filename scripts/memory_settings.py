"""Compiled memory of one train step under the settings that trade compute for memory.

For each ``trainer.grad_accum`` given and each ``trainer.remat`` policy of ``--remat``
(comma-separated; default ``none``), compiles the train step of the composed ``lra-train``
config from shapes alone (no data, nothing runs) and prints one JSON line: the per-device
compiled memory (XLA's memory analysis), the compile time, FLOPs.

    python scripts/memory_settings.py task=listops model=transformer -- 1 2 4 8
    python scripts/memory_settings.py --remat none,block,attention task=listops -- 1
    python scripts/memory_settings.py --rss 3 --remat block task=listops_tiny -- 1

``--cpu-scheduler memory`` compiles under XLA CPU's memory-aware scheduler
(``measure.CPU_REMAT_FLAG``) for the whole process; the default, ``concurrency``, is XLA's
own (and what ``lra-train`` uses: results/cpu/memory_settings.md has why). ``--rss N``
also runs N train steps on random tokens per row and prints the process's peak resident
memory (``ru_maxrss``) above what it was before the row: a check on the analysis (run one
row per process, since the peak never falls).
"""

import json
import resource
import sys

from lra.device import measure


def _option(args: list[str], name: str, default: str) -> tuple[list[str], str]:
    if name not in args:
        return args, default
    at = args.index(name)
    return args[:at] + args[at + 2 :], args[at + 1]


ARGS, REMATS = _option(sys.argv[1:], "--remat", "none")
ARGS, SCHEDULER = _option(ARGS, "--cpu-scheduler", "concurrency")
ARGS, RSS_STEPS = _option(ARGS, "--rss", "0")
measure.configure_cpu_memory_analysis()
if SCHEDULER == "memory":
    measure.configure_cpu_remat()

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

from lra.config.compose import compose_config  # noqa: E402
from lra.train import parallel  # noqa: E402
from lra.train.compile import abstract_batch, compile_train_variant  # noqa: E402


def _peak_rss_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux: KiB


def _run_steps(cfg, compiled, topology, steps: int) -> None:
    """``steps`` train steps of ``compiled`` on random tokens of the config's shapes."""
    spec = abstract_batch(cfg.task, topology.global_batch, topology.batch_sharding)
    key = jax.random.key(0)
    length = int(cfg.task.max_length)
    batch = {
        "tokens": tuple(
            jax.random.randint(key, s.shape, 1, int(cfg.task.vocab_size), jnp.int32)
            for s in spec["tokens"]
        ),
        "lengths": tuple(jnp.full(s.shape, length, jnp.int32) for s in spec["lengths"]),
        "labels": jnp.zeros(spec["labels"].shape, jnp.int32),
        "weights": jnp.ones(spec["weights"].shape, jnp.float32),
    }
    batch = jax.device_put(batch, topology.batch_sharding)
    state = compiled.state
    for _ in range(steps):
        state, metrics = compiled.train_step(state, batch, compiled.dropout_key)
    jax.block_until_ready(metrics)


def main(overrides: list[str], accums: list[int], remats: list[str], rss_steps: int) -> None:
    cfg = compose_config("config", overrides)
    batch = int(cfg.trainer.batch_size)
    for remat in remats:
        for k in accums:
            topology = parallel.make_topology(cfg.trainer.mesh, batch, k)
            before = _peak_rss_bytes()
            compiled = compile_train_variant(
                cfg, topology, grad_accum=k, remat=remat, count_flops=True
            )
            row = {
                "model": cfg.model.name,
                "task": cfg.task.name,
                "batch_size": batch,
                "grad_accum": k,
                "remat": remat,
                "cpu_scheduler": SCHEDULER,
                "compiled_memory_gb": measure.compiled_memory_bytes(compiled.train_step) / 1e9,
                "compile_seconds": round(compiled.compile_seconds["train"], 1),
                "gflops_per_step": (compiled.flops_per_step or 0) / 1e9,
            }
            if rss_steps:
                compiled_rss = _peak_rss_bytes()
                _run_steps(cfg, compiled, topology, rss_steps)
                row["peak_rss_gb_before_steps"] = compiled_rss / 1e9
                row["peak_rss_gb_after_steps"] = _peak_rss_bytes() / 1e9
                row["peak_rss_rise_gb"] = (_peak_rss_bytes() - max(before, compiled_rss)) / 1e9
            print(json.dumps({**row, **measure.environment()}), flush=True)


if __name__ == "__main__":
    split = ARGS.index("--") if "--" in ARGS else len(ARGS)
    main(
        ARGS[:split],
        [int(k) for k in ARGS[split + 1 :]] or [1],
        REMATS.split(","),
        int(RSS_STEPS),
    )
