"""GFLOP/s of the Figure-1 model's dense matmuls in JAX and PyTorch on this machine.

The linear-attention models' train step is mostly dense layers (projections and the MLP),
so the matmul rate bounds how fast either framework can run it. This times the f32 shapes
of those layers at batch 2 and L = 4096 (rows = 2 * 4097 tokens): [rows, 128] @ [128, 512]
(MLP in), [rows, 512] @ [512, 128] (MLP out), [rows, 128] @ [128, 128] (projections), and
the 1K row count. PyTorch comes from the ``compare`` extra (or PYTHONPATH).

    python scripts/gemm_rate.py [--repeats 20]

Prints one line per shape: the median over ``--repeats`` calls after one warm-up call.
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

SHAPES = [(8194, 128, 512), (8194, 512, 128), (8194, 128, 128), (2050, 128, 512)]


def median_seconds(call, repeats: int) -> float:
    call()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=20)
    args = parser.parse_args(argv)
    import jax
    import jax.numpy as jnp

    try:
        import torch
    except ImportError:
        parser.error("PyTorch is missing: pip install 'lra-harness[compare]'")
    matmul = jax.jit(lambda a, b: a @ b)
    rng = np.random.default_rng(0)
    print(f"jax {jax.__version__}, torch {torch.__version__} on {torch.get_num_threads()} threads")
    for m, k, n in SHAPES:
        a = rng.normal(size=(m, k)).astype(np.float32)
        b = rng.normal(size=(k, n)).astype(np.float32)
        ja, jb = jnp.asarray(a), jnp.asarray(b)
        ta, tb = torch.from_numpy(a), torch.from_numpy(b)
        flops = 2 * m * k * n
        jax_s = median_seconds(lambda a=ja, b=jb: matmul(a, b).block_until_ready(), args.repeats)
        torch_s = median_seconds(lambda a=ta, b=tb: a @ b, args.repeats)
        print(
            f"[{m} x {k}] @ [{k} x {n}]: jax {flops / jax_s / 1e9:.0f} GFLOP/s, "
            f"torch {flops / torch_s / 1e9:.0f} GFLOP/s"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
