#!/usr/bin/env bash
# The real install, as a new user gets it: build the wheel, install it (not editable) into a
# fresh virtualenv, and from an empty folder prepare the tiny ListOps task, train on it for a
# few steps, build the report, and check the import layers (pyproject.toml's import-linter
# contracts, on the installed package, where lra.models sits inside lra). Exit 0 if all pass.
#
#   bash scripts/check_wheel.sh            # what .ci/run and the GitHub workflow run first
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT="$PWD"
SCRATCH="$(mktemp -d)"
trap 'rm -rf "$SCRATCH"' EXIT

python3 -m venv "$SCRATCH/venv"
BIN="$SCRATCH/venv/bin"
"$BIN/pip" install --quiet --upgrade pip
# The build's output is kept in a log that is shown only if the build fails.
"$BIN/pip" wheel --quiet --no-deps --wheel-dir "$SCRATCH/dist" . >"$SCRATCH/wheel.log" 2>&1 || {
    cat "$SCRATCH/wheel.log" >&2
    exit 1
}
"$BIN/pip" install --quiet "$SCRATCH"/dist/lra_harness-*.whl import-linter
if "$BIN/python" -c "import models" 2>/dev/null; then
    echo "check_wheel: the wheel installs a top-level 'models' package" >&2
    exit 1
fi
mkdir "$SCRATCH/empty"
cd "$SCRATCH/empty"
"$BIN/lra-data" task=listops_tiny data_dir=data
"$BIN/lra-train" task=listops_tiny data_dir=data results_dir=runs \
    trainer.num_steps=20 trainer.eval_every=10 trainer.warmup_steps=2 trainer.progress=false
test -f runs/*/record.json
"$BIN/lra-report" results_dir=runs out_dir=report figure=false
test -f report/leaderboard.md
"$BIN/lint-imports" "$ROOT/pyproject.toml"
echo "check_wheel: the wheel installs, trains, reports and keeps its import layers"
