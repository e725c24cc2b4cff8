"""lra-check-attention over every built-in mechanism, as one markdown table.

    python scripts/conformance_table.py [--out results/cpu/conformance.md]

One row per mechanism: checks passed, the failed ones, the declared memory class and the
measured slope of compiled memory against length (1024, 2048, 4096), and the parameter count
at the Text setting relative to softmax attention. Exits 1 if any mechanism fails.
"""

import argparse
import re
import sys
import time

import lra.models

from lra.measure import conformance  # sets the CPU memory-analysis flag before JAX starts


def row(report: conformance.Report, seconds: float) -> str:
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=None, help="also write the table to this file")
    args = parser.parse_args()
    lines = [
        "| mechanism | checks passed | failed | memory class | memory slope | "
        "same without padding | params at Text vs softmax | s |",
        "|---|---|---|---|---|---|---|---|",
    ]
    failed = False
    for name in lra.models.ATTENTION_NAMES:
        start = time.perf_counter()
        report = conformance.check_attention(name)
        failed |= not report.passed
        lines.append(row(report, time.perf_counter() - start))
        print(lines[-1], flush=True)
    text = "\n".join(lines) + "\n"
    if args.out:
        with open(args.out, "w") as f:
            f.write(
                "`python scripts/conformance_table.py`: lra-check-attention over every built-in "
                "mechanism (width 32, 2 heads; memory slope over lengths 1024/2048/4096; "
                "seconds on a 2-core CPU).\n\n" + text
            )
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
