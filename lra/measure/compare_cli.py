"""The command lines of the PyTorch-twin programs, ``scripts/compare_pytorch.py`` (also
``python -m lra.measure.compare``) and ``scripts/dense_floor.py``.

Options are parsed before PyTorch is imported, so ``--help`` and a usage error answer without
the ``compare`` extra; then the program's body in :mod:`lra.measure.compare` runs, or, without
PyTorch, one ``error:`` line names the extra and the exit status is 2.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from pathlib import Path

INSTALL_HINT = "pip install 'lra-harness[compare]'"
DEFAULT_MODELS = (
    "transformer",
    "transnormer_t1",
    "transnormer_t2",
    "performer",
    "cosformer",
    "flash",
)


def positive_ints(text: str) -> list[int]:
    """``"1024,2048"`` -> [1024, 2048]; anything else is a usage error."""
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        values = []
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"expected comma-separated positive ints, got {text!r}")
    return values


def _rates(text: str) -> list[float]:
    try:
        values = [float(v) for v in text.split(",") if v.strip()]
    except ValueError:
        values = []
    if not values or any(not 0.0 <= v < 1.0 for v in values):
        raise argparse.ArgumentTypeError(f"expected comma-separated rates in [0, 1), got {text!r}")
    return values


def parse_compare_args(argv=None) -> argparse.Namespace:
    """compare_pytorch.py's options."""
    parser = argparse.ArgumentParser(
        prog="compare_pytorch.py",
        description="Check a PyTorch twin of the harness's classifier against it, then time "
        "both train steps side by side.",
        epilog=f"needs PyTorch: {INSTALL_HINT}",
    )
    parser.add_argument(
        "--models",
        default=",".join(DEFAULT_MODELS),
        help="comma-separated configs/model names (default: %(default)s)",
    )
    parser.add_argument(
        "--lengths",
        type=positive_ints,
        default=None,
        help="comma-separated lengths (default: bench.yaml's lengths)",
    )
    parser.add_argument(
        "--batch-size",
        type=int,
        default=None,
        help="timing batch size (default: bench.yaml's batch_size)",
    )
    parser.add_argument(
        "--check-batch-size",
        type=int,
        default=2,
        help="batch size of the equality check (default: %(default)s)",
    )
    parser.add_argument(
        "--check-lengths",
        type=positive_ints,
        default=None,
        help="lengths of the equality check (default: --lengths)",
    )
    parser.add_argument(
        "--tolerance",
        type=float,
        default=1e-4,
        help="max |diff| allowed per unit of max(1, max |logit|)",
    )
    parser.add_argument("--check-only", action="store_true", help="stop after the check")
    parser.add_argument(
        "--attention-dropout",
        type=_rates,
        default=[0.1, 0.0],
        help="comma-separated task.arch.attention_dropout values timed",
    )
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=5, help="timed steps per round and side")
    parser.add_argument("--warmup", type=int, default=2, help="untimed steps before each timing")
    parser.add_argument(
        "--threads",
        type=int,
        default=None,
        help="PyTorch CPU threads (default: the cores JAX's CPU backend uses)",
    )
    parser.add_argument(
        "--torch-device",
        default="auto",
        choices=("auto", "cpu", "cuda"),
        help="auto: cuda when JAX runs on a GPU, else cpu",
    )
    parser.add_argument(
        "--torch-tf32",
        default="auto",
        choices=("auto", "on", "off"),
        help="TF32 matmuls in PyTorch on CUDA while timing (auto: on, like "
        "JAX's default float32 matmul precision on GPUs); the check uses full "
        "float32 on both sides",
    )
    parser.add_argument(
        "--xla-flags",
        default="lra-bench",
        choices=("lra-bench", "default"),
        help="lra-bench: the CPU XLA flag lra-bench sets (measure."
        "configure_cpu_memory_analysis), so the harness runs as lra-bench "
        "times it; default: XLA's own defaults",
    )
    parser.add_argument(
        "--out", type=Path, default=None, help="write the table, check and raw numbers here as JSON"
    )
    parser.add_argument(
        "overrides",
        nargs="*",
        metavar="KEY=VALUE",
        help="lra-bench config overrides, e.g. protocol=transnormer task.arch.num_layers=2",
    )
    args = parser.parse_args(argv)
    for name in ("rounds", "steps", "check_batch_size"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1")
    if args.warmup < 0:
        parser.error("--warmup must be at least 0")
    if args.batch_size is not None and args.batch_size < 1:
        parser.error("--batch-size must be at least 1")
    args.models = [m.strip() for m in args.models.split(",") if m.strip()]
    return args


def parse_floor_args(argv=None) -> argparse.Namespace:
    """dense_floor.py's options."""
    parser = argparse.ArgumentParser(
        prog="dense_floor.py",
        description="The dense-layer floor of the Figure-1 train step, in the harness and in "
        "its PyTorch twin.",
        epilog=f"needs PyTorch: {INSTALL_HINT}",
    )
    parser.add_argument("--model", default="transnormer_t2", help="a configs/model name")
    parser.add_argument("--lengths", type=positive_ints, default=[1024, 2048, 4096])
    parser.add_argument("--batch-size", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=2, help="timed steps per round and side")
    parser.add_argument("--warmup", type=int, default=1, help="untimed steps before each")
    parser.add_argument("--out", type=Path, default=None, help="write the rows here as JSON")
    parser.add_argument("overrides", nargs="*", metavar="KEY=VALUE")
    args = parser.parse_args(argv)
    if min(args.rounds, args.steps, args.batch_size) < 1 or args.warmup < 0:
        parser.error("--rounds, --steps and --batch-size must be at least 1, --warmup at least 0")
    return args


def _with_torch(program: str, module: str, args) -> int:
    """``module.run(args)``; without PyTorch one ``error:`` line naming the extra, status 2."""
    try:
        body = importlib.import_module(module)
    except ImportError as err:
        if err.name != "torch":
            raise
        print(f"error: {program}: {err}", file=sys.stderr, flush=True)
        return 2
    return body.run(args)


def compare_main(argv=None) -> int:
    """compare_pytorch.py: exit 0 done, 1 the equality check failed, 2 usage or set-up."""
    return _with_torch("compare_pytorch.py", "lra.measure.compare.run", parse_compare_args(argv))


def floor_main(argv=None) -> int:
    """dense_floor.py: exit 0 done, 1 the twin differs (nothing timed), 2 usage or set-up."""
    return _with_torch("dense_floor.py", "lra.measure.compare.floor", parse_floor_args(argv))
