"""scripts/softmax_paths.py, the plain-vs-chunked benchmark, at a small length."""

import re
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "softmax_paths.py"


def test_it_times_both_paths_and_the_chunked_one_needs_less_memory():
    out = subprocess.run(
        [sys.executable, str(SCRIPT), "--lengths", "512", "--dropouts", "0.1"]
        + ["--rounds", "1", "--blocks", "64"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr
    rows = [line for line in out.stdout.splitlines() if line.startswith("| 512 | 0.1 |")]
    assert [row.split("|")[3].strip() for row in rows] == ["plain", "chunked (block 64)"]
    memory = [int(re.search(r"(\d+) MiB", row).group(1)) for row in rows]
    rates = [float(row.split("|")[4].split("/")[1]) for row in rows]
    assert memory[1] < memory[0] and all(rate > 0 for rate in rates)
