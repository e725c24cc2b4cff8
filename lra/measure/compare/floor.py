"""``python scripts/dense_floor.py``: the Figure-1 train step without attention, in the harness
and in its PyTorch twin, next to the full model.

The floor mechanisms are :mod:`lra.measure.dense_floor`'s (``value_only``, ``gau_value_only``);
here are their twins and the program: first the twin's logits must equal the harness's for the
full model and the floor at every length (else exit 1, nothing timed), then round-robin: for
each round, for each length, the full model and the floor, each timed in the harness and then
in the twin. Prints the min-max steps/s over the rounds and the floor's share of the 1.5x
target. Attention dropout is 0 (the floor has no attention weights to drop).
"""

from __future__ import annotations

import os
import sys

import torch

from lra.measure.bench_config import SetupError
from lra.measure.compare.attention import TWIN_ATTENTION, FlashAttention, MultiHead
from lra.measure.compare.table import span, write_json
from lra.measure.compare.timing import Cell
from lra.measure.compare.weights import check_model
from lra.measure.dense_floor import FLOOR, GAU_FLOOR, floor_overrides, register_floor


class TwinGatedValueOnly(FlashAttention):
    """PyTorch twin of :class:`lra.measure.dense_floor.GatedValueOnly`."""

    def forward(self, x, mask):
        u, v, parts = self.project(x)
        return self.out(u * (v + 0 * sum(part.sum(-1, keepdim=True) for part in parts)))


class TwinValueOnly(MultiHead):
    """PyTorch twin of :class:`lra.measure.dense_floor.ValueOnly`."""

    def forward(self, x, mask):
        q, k, v = self.qkv(x)
        b, n = x.shape[:2]
        return self.out((v + 0 * (q + k)).reshape(b, n, -1))


def register_floor_twins() -> None:
    """Register the floor mechanisms in the harness and their twins (idempotent)."""
    register_floor()
    TWIN_ATTENTION.setdefault(FLOOR, TwinValueOnly)
    TWIN_ATTENTION.setdefault(GAU_FLOOR, TwinGatedValueOnly)


def run(args) -> int:
    """The program on parsed options (:func:`lra.measure.compare_cli.parse_floor_args`)."""
    from lra.device import measure

    measure.configure_cpu_memory_analysis()  # as lra-bench, before JAX starts a backend
    register_floor_twins()
    device = torch.device("cpu")
    torch.set_num_threads(len(os.sched_getaffinity(0)))
    floor = floor_overrides(args.model)
    variants = {"full": list(args.overrides), "floor": [*args.overrides, *floor]}
    try:
        for length in args.lengths:
            for name, overrides in variants.items():
                check = check_model(args.model, length, 2, overrides, 1e-4, device)
                print(
                    f"check {args.model} {name} L={length}: max |diff| "
                    f"{check['max_abs_diff']:.2e} {'ok' if check['ok'] else 'DIFFERS'}"
                )
                if not check["ok"]:
                    print(
                        f"error: the twin differs ({name}, L={length}); nothing timed",
                        file=sys.stderr,
                    )
                    return 1
        cells, rates = {}, {}
        for _ in range(args.rounds):
            for length in args.lengths:
                for name, overrides in variants.items():
                    key = (length, name)
                    if key not in cells:
                        cells[key] = Cell(
                            args.model, length, args.batch_size, 0.0, overrides, device
                        )
                        rates[key] = {"harness": [], "torch": []}
                    rates[key]["harness"].append(
                        cells[key].time_harness(args.warmup, args.steps)[0]
                    )
                    rates[key]["torch"].append(cells[key].time_twin(args.warmup, args.steps)[0])
    except SetupError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(
        f"\n{args.model}, batch {args.batch_size}, train steps/s, min-max over {args.rounds} "
        f"rounds of {args.steps} steps; floor = every attention layer {floor[0].split('=')[1]}"
    )
    lines = [
        "| length | harness full | harness floor | PyTorch full | PyTorch floor "
        "| harness floor / (1.5 x PyTorch full) |",
        "|---:|---:|---:|---:|---:|---:|",
    ]
    for length in args.lengths:
        full, bare = rates[(length, "full")], rates[(length, "floor")]
        share = [f / (1.5 * t) for f, t in zip(bare["harness"], full["torch"], strict=True)]
        spans = [span(r) for r in (full["harness"], bare["harness"], full["torch"], bare["torch"])]
        lines.append(f"| {length} | {' | '.join(spans)} | {span(share)} |")
    table = "\n".join(lines) + "\n"
    print(table, end="")
    if args.out:
        rows = [{"length": k[0], "variant": k[1], **v} for k, v in rates.items()]
        write_json(args.out, {"model": args.model, "table": table, "rows": rows})
        print(f"wrote {args.out}")
    return 0
