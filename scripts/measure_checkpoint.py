"""Checkpoint size and save time of official settings, and checkpointing's cost on a run.

    python scripts/measure_checkpoint.py sizes [task ...]   # default: listops text
    python scripts/measure_checkpoint.py overhead [rounds]  # default job, default saves vs none

``sizes`` builds each task's Transformer (official architecture, no compile, no data),
fills a train state of the real shapes (params, AdamW state, and a best-validation
copy of the params, as a checkpoint holds them) and saves it with the harness's own
:class:`lra.run.checkpoint.Checkpoints` into a temporary folder on this disk: bytes on
disk, seconds the training loop is blocked (host copy + hand-off), seconds until the
write is complete. ``overhead`` runs the default job (listops_tiny, 2000 steps) with
the default checkpoint cadence and with checkpoints only at the end, interleaved
``rounds`` times, and prints steps/s, wall time and save time of each run.
"""

import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import jax
import numpy as np
from flax import nnx

from lra.config.compose import compose_config
from lra.run.checkpoint import Checkpoints, Progress
from lra.train.model import build_model, count_params
from lra.train.optim import make_optimizer
from lra.train.steps import TrainState


def folder_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def sizes(tasks: list[str]) -> None:
    for task in tasks:
        cfg = compose_config("config", [f"task={task}", "model=transformer"])
        abstract = nnx.eval_shape(lambda cfg=cfg: build_model(cfg, nnx.Rngs(params=0)))
        _, params, _ = nnx.split(abstract, nnx.Param, ...)
        rng = np.random.default_rng(0)
        params = jax.tree.map(lambda x, r=rng: r.standard_normal(x.shape).astype(x.dtype), params)
        tx = make_optimizer(cfg.trainer)
        opt_state = jax.tree.map(  # random moments: real ones do not compress either
            lambda x, r=rng: r.random(np.shape(x)).astype(np.asarray(x).dtype), tx.init(params)
        )
        state = TrainState(params, opt_state, np.int32(1000))
        with tempfile.TemporaryDirectory(dir=".") as tmp:
            ckpts = Checkpoints(tmp, keep=2)
            start = time.perf_counter()
            blocked = ckpts.save(1000, state, params, Progress(step=1000))
            ckpts.manager.wait_until_finished()
            total = time.perf_counter() - start
            size = folder_bytes(Path(tmp))
            ckpts.close()
        print(
            json.dumps(
                {
                    "task": task,
                    "num_params": count_params(params),
                    "checkpoint_bytes": size,
                    "checkpoint_mib": round(size / 2**20, 1),
                    "blocked_seconds": round(blocked, 3),
                    "complete_seconds": round(total, 3),
                }
            ),
            flush=True,
        )


def overhead(rounds: int) -> None:
    bin_dir = Path(sys.executable).parent
    subprocess.run([str(bin_dir / "lra-data"), "task=listops_tiny"], check=True)
    settings = {
        "default": [],
        "end_only": ["trainer.checkpoint_every=0", "trainer.checkpoint_minutes=0"],
    }
    for r in range(rounds):
        for name, extra in settings.items():
            with tempfile.TemporaryDirectory(dir=".") as tmp:
                command = [
                    str(bin_dir / "lra-train"),
                    f"results_dir={tmp}",
                    "trainer.progress=false",
                    *extra,
                ]
                subprocess.run(command, check=True, capture_output=True)
                [path] = Path(tmp).glob("*/record.json")
                record = json.loads(path.read_text())
            print(
                json.dumps(
                    {
                        "round": r,
                        "setting": name,
                        "train_steps_per_sec": round(record["train_steps_per_sec"], 2),
                        "wall_seconds": round(record["wall_seconds"], 1),
                        "checkpoint_saves": record["checkpoint_saves"],
                        "checkpoint_seconds": round(record["checkpoint_seconds"], 3),
                        "test_accuracy": record["test_accuracy"],
                    }
                ),
                flush=True,
            )


if __name__ == "__main__":
    what = sys.argv[1] if len(sys.argv) > 1 else "sizes"
    if what == "sizes":
        sizes(sys.argv[2:] or ["listops", "text"])
    elif what == "overhead":
        overhead(int(sys.argv[2]) if len(sys.argv) > 2 else 2)
    else:
        sys.exit(f"unknown measurement {what!r}; choose sizes or overhead")
