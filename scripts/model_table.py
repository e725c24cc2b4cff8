"""Per-model size, FLOPs, compiled memory and CPU speed at the Text-task model size.

For every configs/model/*.yaml: parameter count, FLOPs per train step at length 1024,
compiled memory of a train step at lengths 1024 / 4096 / 8192, and train steps/sec at 1024
(median of timed windows), with batch 2 and the Text model of REFERENCE section 1 (4 layers,
width 256, 4 heads, MLP 1024, byte vocabulary, 2 classes). Synthetic inputs; no data needed.

    python scripts/model_table.py [--out results/cpu/model_table] [model ...]

Writes <out>.json (one entry per model and length) and <out>.md, and prints the table.
"""

import argparse
import json
from pathlib import Path

from lra.device import measure

measure.configure_cpu_memory_analysis()

import jax  # noqa: E402

from lra.config.compose import CONFIG_DIR, compose_config  # noqa: E402
from lra.measure.bench import measure_length  # noqa: E402

TEXT_MODEL = [
    "task.arch.num_layers=4",
    "task.arch.dim=256",
    "task.arch.qkv_dim=256",
    "task.arch.num_heads=4",
    "task.arch.mlp_dim=1024",
    "task.vocab_size=257",
    "task.num_classes=2",
]
LENGTHS = (1024, 4096, 8192)
SPEED_LENGTH = 1024
BATCH = 2


def model_names() -> list[str]:
    return sorted(p.stem for p in (Path(CONFIG_DIR) / "model").glob("*.yaml"))


def measure_model(name: str) -> list[dict]:
    cfg = compose_config("config", [f"model={name}", *TEXT_MODEL])
    rows = []
    for length in LENGTHS:
        row = measure_length(
            cfg, length, BATCH, time_steps=length == SPEED_LENGTH, windows=3, steps_per_window=3
        )
        rows.append(dict(row, model=name, device=jax.devices()[0].device_kind))
        print(json.dumps(rows[-1]), flush=True)
    return rows


def markdown(rows: list[dict]) -> str:
    by_model: dict[str, dict[int, dict]] = {}
    for row in rows:
        by_model.setdefault(row["model"], {})[row["length"]] = row

    def mib(row):
        if row.get("status") == "oom":
            return "OOM"
        return f"{row['compiled_memory_bytes'] / 2**20:,.0f}"

    lines = [
        "| model | params | GFLOPs/step @1024 | memory MiB @1024 | @4096 | @8192 "
        "| train steps/s @1024 |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for name, cells in sorted(by_model.items()):
        first = cells[SPEED_LENGTH]
        lines.append(
            f"| {name} | {first['num_params']:,} | {first['flops_per_step'] / 1e9:,.1f} | "
            + " | ".join(mib(cells[n]) for n in LENGTHS)
            + f" | {first.get('train_steps_per_sec', float('nan')):.2f} |"
        )
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("models", nargs="*", default=None)
    parser.add_argument("--out", default="results/cpu/model_table")
    args = parser.parse_args()
    rows = [row for name in (args.models or model_names()) for row in measure_model(name)]
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(rows, indent=1) + "\n")
    table = markdown(rows)
    header = (
        f"Text-task model size (4 layers, width 256), batch {BATCH}, synthetic inputs, "
        f"device {rows[0]['device']}. Memory: XLA compiled memory analysis of one train step. "
        f"Speed: median of 3 windows of 3 steps after 2 warm-up steps.\n\n"
    )
    out.with_suffix(".md").write_text(header + table)
    print(table)


if __name__ == "__main__":
    main()
