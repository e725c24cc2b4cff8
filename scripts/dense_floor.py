"""The dense-layer floor of the Figure-1 train step, in the harness and in its PyTorch twin.

Issue 15 asks the linear-attention models to train at 1.5x a plain PyTorch twin on the CPU.
Their train step is mostly dense layers (Q/K/V/output projections and the MLP), which both
frameworks run through a GEMM library. This script measures how fast each framework runs the
step WITHOUT attention, next to the full model: every layer's mechanism is replaced by
``value_only``, which keeps the four projections (forward and backward) and returns
``out(V + 0 * (Q + K))`` (no mixing over positions; ``0 * (Q + K)`` keeps Q and K in the
gradient, as floats are not folded). Everything else is the model of ``--model``:
embeddings, LayerNorms, MLP, dropout, pooling, loss and AdamW. FLASH and FLASH_quad, whose
gated unit replaces the MLP, get ``gau_value_only`` instead: the unit's projections (U, V,
the shared Z and its offset/scales) and ``out(U * V)``, without the attention that mixes V.
If the harness's floor is below 1.5x the PyTorch twin's full model, no attention
implementation can reach that ratio on this machine.

Built on ``scripts/compare_pytorch.py`` (its twin, logits check and timing cells): first
the twin's logits must equal the harness's for the full model and the floor at every length
(else exit 1, nothing timed), then round-robin: for each round, for each length, the full
model and the floor, each timed in the harness and then in the twin. Prints the min-max
steps/s over the rounds and the floor's share of the 1.5x target::

    PYTHONPATH=<torch> python scripts/dense_floor.py --model transnormer_t2 \\
        --lengths 1024,2048,4096 --rounds 3 --steps 2 --warmup 1 [KEY=VALUE ...]

Overrides after the options go to both (lra-bench's, as in compare_pytorch.py); attention
dropout is 0 (the floor has no attention weights to drop).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import compare_pytorch as cp  # noqa: E402  (a sibling script, not a package)
from lra.models.attention.common import MultiHeadAttention  # noqa: E402
from lra.models.attention.flash import FlashAttention  # noqa: E402
from lra.models.registry import register  # noqa: E402

FLOOR = "value_only"
GAU_FLOOR = "gau_value_only"
# The overrides that turn a model of configs/model into its floor (every layer value_only);
# a model of gated attention units (FLASH: no MLP) gets gau_value_only instead.
FLOOR_OVERRIDES = (f"model.attention={FLOOR}", "model.attention_options={}")
GAU_FLOOR_OVERRIDES = (f"model.attention={GAU_FLOOR}", "model.attention_options={}")
GAU_MODELS = ("flash", "flash_quad")


@register(FLOOR)
class ValueOnly(MultiHeadAttention):
    """out(V + 0 * (Q + K)): the projections of attention without the attention.

    x float[B, L, D] -> float[B, L, D]; Q, K, V float[B, L, H, d] as every mechanism's.
    Padding is not excluded (nothing mixes positions, so nothing reads a padded key).
    """

    kind = FLOOR
    memory_class = "linear"
    same_without_padding = True

    def __call__(self, x, *, mask, deterministic=True, rngs=None):
        self._check_call(x, mask, deterministic, rngs)
        q, k, v = self._qkv(x)
        return self.out(self._merge(v + 0 * (q + k)))


@register(GAU_FLOOR)
class GatedValueOnly(FlashAttention):
    """FLASH's gated unit without attention: out(U * (V + 0 * sum of the Z parts)).

    Keeps every projection of the unit (U, V, the shared Z and its four offset/scales) forward
    and backward, with FLASH's default sizes (expansion 2, shared_dim 128). x float[B, L, D]
    -> float[B, L, D]; U, V float[B, L, e], the Z parts float[B, L, s].
    """

    kind = GAU_FLOOR

    def __call__(self, x, *, mask, deterministic=True, rngs=None):
        self._check_call(x, mask, deterministic, rngs)
        u, v, parts = self._project(x)
        return self.out(u * (v + 0 * sum(part.sum(-1, keepdims=True) for part in parts)))


def floor_overrides(model: str) -> tuple[str, ...]:
    """The overrides that make ``model``'s floor."""
    return GAU_FLOOR_OVERRIDES if model in GAU_MODELS else FLOOR_OVERRIDES


if cp.nn is not None:

    class TwinGatedValueOnly(cp.FlashAttention):
        """PyTorch twin of :class:`GatedValueOnly`."""

        def forward(self, x, mask):
            u, v, parts = self.project(x)
            return self.out(u * (v + 0 * sum(part.sum(-1, keepdim=True) for part in parts)))

    cp.TWIN_ATTENTION[GAU_FLOOR] = TwinGatedValueOnly

    class TwinValueOnly(cp.MultiHead):
        """PyTorch twin of :class:`ValueOnly`."""

        def forward(self, x, mask):
            q, k, v = self.qkv(x)
            b, n = x.shape[:2]
            return self.out((v + 0 * (q + k)).reshape(b, n, -1))

    cp.TWIN_ATTENTION[FLOOR] = TwinValueOnly


def parse_args(argv=None):
    parser = argparse.ArgumentParser(
        prog="dense_floor.py", description=__doc__.splitlines()[0], epilog=cp.INSTALL_HINT
    )
    parser.add_argument("--model", default="transnormer_t2", help="a configs/model name")
    parser.add_argument("--lengths", type=cp._ints, default=[1024, 2048, 4096])
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


def main(argv=None) -> int:
    args = parse_args(argv)
    if cp.TORCH_IMPORT_ERROR is not None:
        print(f"error: dense_floor.py needs PyTorch: {cp.INSTALL_HINT}", file=sys.stderr)
        return 2
    from lra.device import measure

    measure.configure_cpu_memory_analysis()  # as lra-bench, before JAX starts a backend
    device = cp.torch.device("cpu")
    cp.torch.set_num_threads(len(os.sched_getaffinity(0)))
    floor = floor_overrides(args.model)
    variants = {"full": list(args.overrides), "floor": [*args.overrides, *floor]}
    try:
        for length in args.lengths:
            for name, overrides in variants.items():
                check = cp.check_model(args.model, length, 2, overrides, 1e-4, device)
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
                        cells[key] = cp.Cell(
                            args.model, length, args.batch_size, 0.0, overrides, device
                        )
                        rates[key] = {"harness": [], "torch": []}
                    rates[key]["harness"].append(
                        cells[key].time_harness(args.warmup, args.steps)[0]
                    )
                    rates[key]["torch"].append(cells[key].time_twin(args.warmup, args.steps)[0])
    except cp.SetupError as err:
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
        spans = [
            cp._span(r) for r in (full["harness"], bare["harness"], full["torch"], bare["torch"])
        ]
        lines.append(f"| {length} | {' | '.join(spans)} | {cp._span(share)} |")
    table = "\n".join(lines) + "\n"
    print(table, end="")
    if args.out:
        rows = [{"length": k[0], "variant": k[1], **v} for k, v in rates.items()]
        cp._write_json(args.out, {"model": args.model, "table": table, "rows": rows})
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
