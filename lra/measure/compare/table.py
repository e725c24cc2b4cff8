"""What the twin programs print and write: compare_pytorch's markdown table (min-max over rounds
per cell) and the JSON of raw numbers."""

from __future__ import annotations

import json
from pathlib import Path

from lra.atomic import write_atomic


def write_json(path: Path, payload: dict) -> None:
    """``payload`` as indented JSON at ``path`` (atomically)."""
    write_atomic(path, json.dumps(payload, indent=2) + "\n")


def cores(value) -> str:
    return "?" if value is None else f"{value:.2f}"


def span(values, scale=1.0) -> str:
    if not values:
        return "n/a"
    lo, hi = min(values) / scale, max(values) / scale
    return f"{lo:.3g}" if f"{lo:.3g}" == f"{hi:.3g}" else f"{lo:.3g}-{hi:.3g}"


def markdown_table(rows) -> str:
    lines = [
        "| model | length | attention dropout | harness steps/s | PyTorch steps/s "
        "| ratio harness/PyTorch | harness GFLOP/s | other cores busy (max) |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for row in rows:
        flops = row["harness_flops_per_sec"]
        loads = [c for c in row["harness_other_cores"] + row["torch_other_cores"] if c is not None]
        lines.append(
            f"| {row['model']} | {row['length']} | {row['attention_dropout']:g} "
            f"| {span(row['harness_steps_per_sec'])} | {span(row['torch_steps_per_sec'])} "
            f"| {span(row['ratio'])} | {'n/a' if flops is None else span(flops, 1e9)} "
            f"| {cores(max(loads) if loads else None)} |"
        )
    return "\n".join(lines) + "\n"
