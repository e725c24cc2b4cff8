"""``lra-check-attention --all``: the conformance checks of every built-in mechanism, as one
markdown table (``results/cpu/conformance.md``).

One row per mechanism: checks passed, the failed ones, the declared memory class and the
measured slope of compiled memory against length, whether it claims the same outputs without
padding, the parameter count at the Text setting relative to softmax attention, and the
seconds the checks took.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Sequence

from lra.measure.conformance import MEMORY_LENGTHS, Report, check_attention

HEAD = [
    "| mechanism | checks passed | failed | memory class | memory slope | "
    "same without padding | params at Text vs softmax | s |",
    "|---|---|---|---|---|---|---|---|",
]


def row(report: Report, seconds: float) -> str:
    """The table row of one mechanism's report."""
    checks = {c.name: c for c in report.checks}
    counted = [c for c in report.checks if c.passed is not None]
    memory = checks["memory class"].value
    declared = re.search(r"declared '(\w+)'", memory)
    slope = re.search(r"slope ([\d.]+)", memory)
    params = re.search(r"= ([\d.]+x [^(]+)", checks["parameters at the Text setting"].value)
    return (
        f"| {report.mechanism} | {sum(bool(c.passed) for c in counted)}/{len(counted)} | "
        f"{', '.join(report.failed()) or '-'} | {declared.group(1) if declared else '?'} | "
        f"{slope.group(1) if slope else '?'} | "
        f"{'yes' if checks['same without padding'].passed else 'not claimed'} | "
        f"{params.group(1).strip() if params else '?'} | {seconds:.0f} |"
    )


def conformance_table(
    names: Sequence[str],
    memory_lengths: Sequence[int] = MEMORY_LENGTHS,
    on_row: Callable[[str], None] = lambda line: None,
) -> tuple[str, bool]:
    """(the markdown table of ``names``, whether every mechanism passed); ``on_row`` sees
    each row as it is done."""
    lines, passed = list(HEAD), True
    for name in names:
        start = time.perf_counter()
        report = check_attention(name, memory_lengths=memory_lengths)
        passed &= report.passed
        lines.append(row(report, time.perf_counter() - start))
        on_row(lines[-1])
    return "\n".join(lines) + "\n", passed


def preamble(memory_lengths: Sequence[int]) -> str:
    """The line the written table starts with: what made it and how."""
    return (
        "`lra-check-attention --all`: the conformance checks of every built-in mechanism "
        f"(width 32, 2 heads; memory slope over lengths {'/'.join(map(str, memory_lengths))}; "
        "seconds on this machine's CPU).\n\n"
    )
