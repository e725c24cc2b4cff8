"""Compiled memory of one train step under the settings that trade compute for memory.

For each ``trainer.grad_accum`` given (and with ``--remat``, each with
``trainer.remat=true``), compiles the train step of the composed ``lra-train``
config from shapes alone (no data, nothing runs) and prints one JSON line: the
per-device compiled memory (XLA's memory analysis), the compile time, FLOPs.

    python scripts/memory_settings.py task=listops model=transformer -- 1 2 4 8
    python scripts/memory_settings.py --remat task=listops model=transformer -- 1

On CPU, remat only saves memory under XLA's memory-aware scheduler, which
``--remat`` turns on for the whole process (as ``lra-train trainer.remat=true``
does), so compare remat rows with the non-remat rows of another run.
"""

import json
import sys

from lra.device import measure

measure.configure_cpu_memory_analysis()
REMAT = "--remat" in sys.argv
if REMAT:
    measure.configure_cpu_remat()

from lra.config.compose import compose_config  # noqa: E402
from lra.train import parallel  # noqa: E402
from lra.train.compile import compile_train_variant  # noqa: E402


def main(overrides: list[str], accums: list[int]) -> None:
    cfg = compose_config("config", overrides)
    batch = int(cfg.trainer.batch_size)
    for k in accums:
        topology = parallel.make_topology(cfg.trainer.mesh, batch, k)
        compiled = compile_train_variant(cfg, topology, grad_accum=k, remat=REMAT, count_flops=True)
        print(
            json.dumps(
                {
                    "model": cfg.model.name,
                    "task": cfg.task.name,
                    "batch_size": batch,
                    "grad_accum": k,
                    "remat": REMAT,
                    "compiled_memory_gb": measure.compiled_memory_bytes(compiled.train_step) / 1e9,
                    "compile_seconds": round(compiled.compile_seconds["train"], 1),
                    "gflops_per_step": (compiled.flops_per_step or 0) / 1e9,
                    **measure.environment(),
                }
            ),
            flush=True,
        )


if __name__ == "__main__":
    args = [a for a in sys.argv[1:] if a != "--remat"]
    split = args.index("--") if "--" in args else len(args)
    main(args[:split], [int(k) for k in args[split + 1 :]] or [1])
