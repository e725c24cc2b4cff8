"""Examples/sec of the batch pipeline at each task's official batch size and length.

For each official task this writes a synthetic prepared task of the official shape into the
store (``--rows`` rows per split, random tokens; the rows of a memory-mapped file are read
the same way whatever they hold), loads it memory-mapped as ``lra-train`` does, and times
``train_batches`` through ``prefetch`` (host gather, int32 conversion, device put) for
``--batches`` batches after a warm-up. It reports examples/sec and the most train steps/sec
that rate can feed at the official batch size, next to the fastest training rate reported
for any Figure-1 model (TransNormer T2, 29.41 steps/s at length 1K, batch 20, A6000;
REFERENCE section 6) expressed in examples/sec, i.e. the consumption the pipeline must beat
on a GPU; and, when ``--train-steps`` > 0, the train steps/sec of the Transformer at the
official setting measured on this machine (skipped where the compiled step needs more
memory than ``--max-memory-gb``).

    python scripts/pipeline_throughput.py [--rows 4096] [--batches 50] [--out FILE.md]
"""

import argparse
import os
import platform
import statistics
import tempfile
import time
from pathlib import Path

import jax
import numpy as np

from lra.config.compose import compose_config
from lra.data import store
from lra.data.pipeline import prefetch, train_batches
from lra.data.split import Split

TASKS = ["listops", "text", "retrieval", "image", "pathfinder", "pathx"]
FASTEST_REPORTED_STEPS_PER_SEC = 29.41  # TransNormer T2, 1K, batch 20 (REFERENCE section 6)


def task_config(name: str):
    return compose_config("config", [f"task={name}", "model=transformer"])


def synthetic_split(rows: int, length: int, vocab: int, num_inputs: int, rng) -> Split:
    dtype = store.token_dtype(vocab - 1)
    inputs = tuple(rng.integers(0, vocab, (rows, length)).astype(dtype) for _ in range(num_inputs))
    lengths = tuple(rng.integers(length // 2, length + 1, rows).astype(np.int32) for _ in inputs)
    return Split(inputs, lengths, rng.integers(0, 2, rows).astype(np.int32))


def pipeline_rate(split: Split, batch_size: int, batches: int, warmup: int = 5) -> float:
    stream = prefetch(train_batches(split, batch_size, seed=0))
    for _ in range(warmup):
        next(stream)
    start = time.perf_counter()
    for _ in range(batches):
        batch = next(stream)
    batch["tokens"][0].block_until_ready()
    return batches * batch_size / (time.perf_counter() - start)


def train_rate(cfg, steps: int, max_memory_gb: float) -> str:
    from lra.measure.bench import measure_length

    out = measure_length(
        cfg, cfg.task.max_length, cfg.trainer.batch_size, time_steps=False, warmup_steps=0
    )
    if out["status"] != "ok" or out["compiled_memory_bytes"] > max_memory_gb * 2**30:
        gb = (out.get("compiled_memory_bytes") or 0) / 2**30
        return f"not run ({gb:.1f} GB compiled)"
    timed = measure_length(
        cfg,
        cfg.task.max_length,
        cfg.trainer.batch_size,
        warmup_steps=1,
        windows=1,
        steps_per_window=steps,
    )
    return f"{timed['train_steps_per_sec'] * cfg.trainer.batch_size:.1f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=4096)
    parser.add_argument("--batches", type=int, default=50)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--train-steps", type=int, default=0)
    parser.add_argument("--max-memory-gb", type=float, default=16.0)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    from lra.device import measure

    measure.configure_cpu_memory_analysis()  # before JAX starts a backend: full CPU memory count
    rng = np.random.default_rng(0)
    lines = [
        "| task | batch | length x inputs | pipeline examples/s (median of "
        f"{args.repeats}) | steps/s it can feed | GPU need: 29.41 steps/s x batch "
        "(examples/s) | headroom |"
        + (" CPU train examples/s (Transformer) |" if args.train_steps else ""),
        "|---|---:|---:|---:|---:|---:|---:|" + ("---:|" if args.train_steps else ""),
    ]
    with tempfile.TemporaryDirectory() as tmp:
        for name in TASKS:
            cfg = task_config(name)
            task, batch = cfg.task, int(cfg.trainer.batch_size)
            inputs = 2 if task.get("dual", False) else 1
            rows = max(args.rows, 2 * batch)
            split = synthetic_split(rows, task.max_length, task.vocab_size, inputs, rng)
            folder = store.write_prepared(
                Path(tmp) / name, {"train": split, "val": split, "test": split}, {}
            )
            loaded = store.read_prepared(folder, task.max_length, "n/a")["train"]
            rates = [pipeline_rate(loaded, batch, args.batches) for _ in range(args.repeats)]
            rate = statistics.median(rates)
            need = FASTEST_REPORTED_STEPS_PER_SEC * batch
            cpu = (
                f" {train_rate(cfg, args.train_steps, args.max_memory_gb)} |"
                if args.train_steps
                else ""
            )
            lines.append(
                f"| {name} | {batch} | {task.max_length} x {inputs} | {rate:,.0f} | "
                f"{rate / batch:,.1f} | {need:,.0f} | {rate / need:.1f}x |{cpu}"
            )
            print(lines[-1], flush=True)
    header = (
        f"Batch pipeline throughput (`python scripts/pipeline_throughput.py --rows {args.rows} "
        f"--batches {args.batches} --repeats {args.repeats}`), {platform.node()}, "
        f"{os.cpu_count()} CPU cores, JAX {jax.__version__} on {jax.devices()[0].platform}.\n"
        "Synthetic prepared data of each task's official shape, read memory-mapped, batches "
        "gathered, converted to int32 and put on the device through the prefetch thread. "
        "'GPU need' is the fastest training rate reported for any Figure-1 model (29.41 "
        "steps/s, TransNormer T2 at length 1K, batch 20, A6000) times the task's official "
        "batch: an upper bound on what a training step consumes.\n\n"
    )
    text = header + "\n".join(lines) + "\n"
    print(text)
    if args.out:
        Path(args.out).write_text(text)


if __name__ == "__main__":
    main()
