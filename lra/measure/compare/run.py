"""``python scripts/compare_pytorch.py`` (or ``python -m lra.measure.compare``): check the twin
against the harness, then time both train steps side by side (see the script's docstring)."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import torch

from lra.measure.bench_config import SetupError, compose_bench_config
from lra.measure.compare.table import markdown_table, write_json
from lra.measure.compare.timing import time_cells
from lra.measure.compare.weights import check_model


def _torch_device(choice: str):
    import jax

    on_gpu = jax.default_backend() == "gpu"
    if choice == "auto":
        choice = "cuda" if on_gpu else "cpu"
    if choice == "cuda" and not torch.cuda.is_available():
        raise SetupError(
            "PyTorch cannot see a CUDA device (a CPU-only build?); use --torch-device cpu"
        )
    return torch.device(choice)


def run(args) -> int:
    """The program on parsed options (:func:`lra.measure.compare_cli.parse_compare_args`)."""
    if args.xla_flags == "lra-bench":
        from lra.device import measure

        measure.configure_cpu_memory_analysis()  # before JAX starts a backend
    try:
        return _run(args)
    except SetupError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2


def _run(args) -> int:
    import jax

    from lra.config.compose import CONFIG_DIR
    from lra.device.compile_cache import configure_compile_cache

    known = sorted(p.stem for p in (Path(CONFIG_DIR) / "model").glob("*.yaml"))
    unknown = [m for m in args.models if m not in known]
    if unknown or not args.models:
        raise SetupError(f"unknown --models {unknown}; choose from {', '.join(known)}")
    defaults = compose_bench_config(args.models[0], None, None, args.overrides)
    configure_compile_cache(defaults.get("compile_cache"))  # as lra-bench, before compiling
    lengths = args.lengths or [int(n) for n in defaults.lengths]
    args.batch_size = args.batch_size or int(defaults.batch_size)
    check_lengths = args.check_lengths or lengths
    device = _torch_device(args.torch_device)
    threads = args.threads or len(os.sched_getaffinity(0))
    torch.set_num_threads(threads)
    environment = {
        "jax": jax.__version__,
        "jax_backend": jax.default_backend(),
        "jax_device": jax.devices()[0].device_kind,
        "torch": torch.__version__,
        "torch_device": str(device),
        "torch_threads": threads,
        "xla_flags": os.environ.get("XLA_FLAGS", ""),
        "overrides": list(args.overrides),
    }
    print("setting: " + ", ".join(f"{k}={v}" for k, v in environment.items()), flush=True)

    checks = []
    for model in args.models:
        for length in check_lengths:
            result = check_model(
                model, length, args.check_batch_size, args.overrides, args.tolerance, device
            )
            checks.append(result)
            print(
                f"check {model} L={length} B={args.check_batch_size}: max |diff| = "
                f"{result['max_abs_diff']:.3e} (max |logit| {result['max_abs_logit']:.3g}, "
                f"limit {result['limit']:.3e}) {'ok' if result['ok'] else 'DIFFERS'}",
                flush=True,
            )
    payload: dict[str, Any] = {"environment": environment, "check": checks}
    failed = sorted({f"{c['model']} (L={c['length']})" for c in checks if not c["ok"]})
    if failed:
        print(
            f"error: the PyTorch twin's logits differ from the harness's for {', '.join(failed)}; "
            "nothing timed",
            file=sys.stderr,
        )
        if args.out:
            write_json(args.out, payload)
        return 1
    if args.check_only:
        if args.out:
            write_json(args.out, payload)
        return 0

    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = args.torch_tf32 != "off"
    rows = time_cells(args.models, lengths, args.attention_dropout, args, device)
    table = markdown_table(rows)
    print()
    print(
        f"train steps/s, batch {args.batch_size}, min-max over {args.rounds} round(s) of "
        f"{args.steps} steps; ratio > 1: the harness is faster; other cores busy: CPU "
        "that other processes took while timing (lra.device.machine_load)"
    )
    print(table, end="")
    if args.out:
        payload.update(
            table=table,
            cells=rows,
            options={
                "rounds": args.rounds,
                "steps": args.steps,
                "warmup": args.warmup,
                "batch_size": args.batch_size,
                "lengths": lengths,
                "attention_dropout": args.attention_dropout,
                "models": args.models,
            },
        )
        write_json(args.out, payload)
        print(f"wrote {args.out}")
    return 0
