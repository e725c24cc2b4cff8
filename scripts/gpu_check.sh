#!/usr/bin/env bash
# The harness's first run on a GPU (issue 11, item 7): every device check in one script, all
# output under results/<device>/ (device = the GPU's name as a slug, e.g. results/nvidia-h200/).
#
# What it runs, in order (each step under `timeout`; a failing step is recorded and the next
# one runs; only "no GPU" stops the script, with exit status 3):
#   1. finds a Python whose JAX sees a GPU (see "Python" below)
#   2. environment.txt  nvidia-smi, Python/JAX/jaxlib/Flax versions, jax.devices(), the
#                       memory_stats() of device 0, the XLA/JAX environment variables
#   3. tests.txt        pytest on the device-touching tests (test_parallel, test_measure,
#                       test_bench, test_train) with JAX_PLATFORMS=cuda (timeout 150 s; up to
#                       10 failures, each named; 4 pytest-xdist workers where it is installed)
#   4. data.txt, train_fp32.txt, train_bf16.txt
#                       lra-data task=listops_tiny (generated locally, seconds), then 200 steps
#                       of the Transformer with fused softmax attention
#                       (jax.nn.dot_product_attention: cuDNN flash attention on the GPU) in fp32
#                       and in bf16; records in runs/
#   5. preflight.txt    the pre-flight memory check against the GPU's memory: task=listops at the
#                       official setting (fits -> then fails on the missing data, expected), and
#                       at trainer.batch_size=2048 (does not fit -> the error names the
#                       grad_accum/remat overrides found by compiling)
#   6. bench.txt        lra-bench of the Transformer in bf16 without attention dropout (cuDNN's
#                       fused attention under `implementation: auto`) at 1024 and 4096, records
#                       in bench_bf16/; then of the Figure-1 models at lengths 1024, 2048, 4096
#                       (bench.windows=3) in one process, round-robin, until the deadline
#                       less step 7's share (LRA_GPU_CHECK_MEMORY_S);
#                       records in bench/.
#      compare_pytorch.txt/.json
#                       if time is left and PyTorch imports: scripts/compare_pytorch.py with the
#                       twin on CUDA (transformer, transnormer_t2, performer at 1024 and 4096)
#   6c. plan.txt, plan/ lra-plan experiment=figure1 seed=0,1,2 (issue 40): each official cell's
#                       fit, a timed step and its projected GPU-hours, in the time steps 6 and
#                       6b leave before step 7 (LRA_GPU_CHECK_PLAN_S, default 120 s, reserved);
#                       plan.json is rewritten after every cell, so a cut-short plan keeps its
#                       cells (the dry run: 2 tiny cells)
#   7. memory_settings.txt
#                       scripts/memory_settings.py (issue 29): compiled memory of one official
#                       ListOps train step (XLA's memory analysis, compiles only) under
#                       trainer.grad_accum 1 and 4 x trainer.remat none, block, attention,
#                       dots_no_batch, for the Transformer and TransNormer T2, one process each
#                       with half of the last LRA_GPU_CHECK_MEMORY_S (default 160 s) of the
#                       deadline, which steps 6 and 6b leave to it; one JSON line per cell, in
#                       that order, so a process cut short keeps the cells it finished. The
#                       CPU's table: results/cpu/memory_settings.md.
#   8. summary.txt      each step's exit status, verdict and seconds (also printed)
# Hydra's run folders (with each step's lra.log) go to hydra/.
#
# How long: about 9 minutes on one H200; no step starts after LRA_GPU_CHECK_DEADLINE_S
# (default 540 s) and each step's timeout is cut to the time left, so the script ends within
# about 9 minutes even when steps hang. First run (2026-12-04, H200, 510 s deadline):
# results/nvidia-h200/README.md says what it found and what changed since.
#
# How to run (from anywhere; it works in the repository root):
#   scripts/gpu_check.sh                          # on the GPU machine
#   LRA_GPU_CHECK_DRY_RUN=1 scripts/gpu_check.sh  # CPU dry run: no GPU needed, results in
#                                                 # results/cpu-dry-run/ (delete it after)
# The dry run checks the script, not the harness: 20 training steps, lra-bench of 2 models at
# length 256 with batch 2 and 1-step windows, the pre-flight's fitting path through
# trainer.memory_limit_gb=200 and its search on listops_tiny at batch 2048 with a 0.5 GB limit
# (a CPU compiles the official model's variants too slowly) with a 240 s timeout, the memory
# settings of listops_tiny (grad_accum 1, remat none and block; 120 s reserved), and a 900 s
# deadline; about 10 minutes on 2 loaded cores. The tests keep their 150 s timeout, which a CPU
# runs past.
# Under this workplace's device tool, with the wheels below carried:
#   run(command="bash scripts/gpu_check.sh", carry=[".whl"], timeout_s=590)
# If $OUT is set (the device tool's folder of files that come back), results/<device>/ is packed
# into $OUT/gpu_check_<device>.tar.gz (checkpoints left out) after every step, with
# $OUT/summary.txt, so a run cut short still returns what it finished.
#
# Python (first that exists):
#   - $LRA_PYTHON, if set;
#   - .venv/bin/python;
#   - python3 on PATH if it already imports jax and the harness's dependencies, after installing
#     any wheels in $LRA_WHEELS (default .whl/) with `pip install --no-index --no-deps --target`
#     into a temporary folder on PYTHONPATH. The lent H200 machine's python3 has jax (CUDA 13
#     plugin), flax, optax, orbax-checkpoint, pytest, numpy, matplotlib, tqdm and pillow, but not
#     hydra-core, omegaconf or antlr4-python3-runtime: carry those as wheels, made here with
#       python3 -m pip download --no-deps --only-binary=:all: -d .whl \
#         hydra-core==1.3.2 omegaconf==2.3.0
#       python3 -m pip wheel --no-deps -w .whl antlr4-python3-runtime==4.9.3   # sdist only
#     (pure Python, well under 1 MiB; add `/.whl/` to .git/info/exclude and name `.whl` in carry);
#   - else it creates .venv and runs `pip install -e '.[test]' 'jax[cuda12]'` (LRA_JAX_CUDA=cuda13
#     for jax[cuda13]). That needs the package index, which the lent machine cannot reach, and the
#     .venv built on the CPU machine (about 1 GiB, CPU-only jax) cannot be carried (64 MiB limit)
#     and would not see the GPU anyway: a venv for this script needs jax[cuda12] or jax[cuda13].
# The chosen Python must report jax.default_backend() == "gpu"; if not, the script says so and
# exits 3 (skipped in the dry run). Exit status otherwise: 0 if every step gave what it should
# (the pre-flight steps by their message, not their exit status), else 1.
# The lra-* commands run as `$PY -c 'from lra.cli import ..._main'` from the repository root, so
# they need no console scripts (whose first line names the path the venv was built at).
set -uo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root" || exit 2

dry_run="${LRA_GPU_CHECK_DRY_RUN:-0}"
[[ $dry_run == 0 ]] && dry_run=""
if [[ -n $dry_run ]]; then
  deadline="${LRA_GPU_CHECK_DEADLINE_S:-900}"   # a loaded 2-core CPU is slow; still bounded
  lengths="[256]"
  bf16_lengths="[256]"
  models=(transformer performer)
  bench_extra=(batch_size=2 bench.warmup_steps=1 bench.steps_per_window=1)  # as figure1.sh --tiny
  preflight_timeout=240  # the batch-2048 search compiles ~8 variants: ~2 minutes on 2 loaded cores
  train_steps=20
  eval_every=10
  compare_models=transformer
  compare_lengths=256
  compare_extra=(--batch-size 2 --rounds 1 --steps 1 --warmup 1 --attention-dropout 0)
  memory_task=listops_tiny  # a CPU compiles each official ListOps cell in 10-60 s
  memory_remats=none,block  # a loaded CPU: about 20 s a cell even for listops_tiny
  memory_accums=(1)
  memory_s="${LRA_GPU_CHECK_MEMORY_S:-120}"
  plan_args=(model=transformer,performer task=listops_tiny seed=0,1)
else
  deadline="${LRA_GPU_CHECK_DEADLINE_S:-540}"
  lengths="[1024,2048,4096]"
  bf16_lengths="[1024,4096]"
  bench_extra=()
  preflight_timeout=120
  models=(transformer transnormer_t1 transnormer_t2 performer cosformer flash ls linformer
    nystromformer)
  train_steps=200
  eval_every=100
  compare_models=transformer,transnormer_t2,performer
  compare_lengths=1024,4096
  compare_extra=(--rounds 2 --steps 5 --warmup 2)
  memory_task=listops
  memory_remats=none,block,attention,dots_no_batch
  memory_accums=(1 4)
  memory_s="${LRA_GPU_CHECK_MEMORY_S:-160}"  # H200: 7.5-17.3 s to compile a train step
  plan_args=(experiment=figure1 seed=0,1,2)
fi
plan_s="${LRA_GPU_CHECK_PLAN_S:-120}"  # step 6c's share, left to it by steps 6 and 6b
memory_models=(transformer transnormer_t2)
min_step_s=15      # a step with less time left than this is skipped
min_bench_s=30     # likewise a benchmarked model

say() { printf '[%4ds] %s\n' "$SECONDS" "$*"; }

tmp="$(mktemp -d -t lra-gpu-check.XXXXXX)"
trap 'rm -rf "$tmp"' EXIT

# ---------------------------------------------------------------- 1. Python
needed_modules="jax, flax, optax, orbax.checkpoint, hydra, omegaconf, numpy, tqdm, PIL"
needed_modules+=", matplotlib, pytest"
has_modules() { "$1" -c "import $needed_modules" >/dev/null 2>&1; }

py=""
py_source=""
if [[ -n ${LRA_PYTHON:-} ]]; then
  py="$LRA_PYTHON"; py_source="LRA_PYTHON"
elif [[ -x .venv/bin/python ]]; then
  py="$root/.venv/bin/python"; py_source=".venv"
elif command -v python3 >/dev/null 2>&1 && python3 -c "import jax" >/dev/null 2>&1; then
  wheels="${LRA_WHEELS:-.whl}"
  if ! has_modules python3 && compgen -G "$wheels/*.whl" >/dev/null; then
    say "installing the carried wheels in $wheels/ (no index) into $tmp/site"
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
      --target "$tmp/site" "$wheels"/*.whl || say "warning: installing the wheels failed"
    export PYTHONPATH="$tmp/site${PYTHONPATH:+:$PYTHONPATH}"
  fi
  if has_modules python3; then
    py="$(command -v python3)"; py_source="python3 on PATH (with PYTHONPATH=${PYTHONPATH:-})"
  fi
fi
if [[ -z $py ]]; then
  # Needs the package index (PyPI): on the lent GPU machine nothing outside can be reached, so
  # there the caller must provide the packages (see the header) instead.
  say "no .venv and no python3 with the harness's dependencies: creating .venv (needs PyPI)"
  if python3 -m venv .venv \
    && .venv/bin/pip install -q -e '.[test]' "jax[${LRA_JAX_CUDA:-cuda12}]"; then
    py="$root/.venv/bin/python"; py_source=".venv (created now)"
  else
    echo "error: could not create .venv with jax[${LRA_JAX_CUDA:-cuda12}] (no package index?);" \
      "set LRA_PYTHON or carry wheels in .whl/ (see the header of $0)" >&2
    exit 3
  fi
fi
# Run from the repository root with it first on the path: the harness imports from this copy
# even if a venv's editable install points at another checkout.
export PYTHONPATH="$root${PYTHONPATH:+:$PYTHONPATH}"
say "python: $py ($py_source)"

if [[ -n $dry_run ]]; then
  export JAX_PLATFORMS=cpu
  device="cpu-dry-run"
else
  unset JAX_PLATFORMS                                 # let JAX pick the GPU
  export XLA_PYTHON_CLIENT_PREALLOCATE="${XLA_PYTHON_CLIENT_PREALLOCATE:-false}"  # bench and test
  # subprocesses share the GPU with their parent: take memory as needed, not 75% at start
  backend="$("$py" -c 'import jax; print(jax.default_backend())' 2>&1 | tail -n 1)"
  if [[ $backend != gpu ]]; then
    cat >&2 <<EOF
error: no GPU for JAX: $py ($py_source) gives jax.default_backend() = '$backend'.
A venv built on a CPU machine has CPU-only jax; the GPU needs jax with CUDA
(pip install 'jax[cuda12]' or 'jax[cuda13]'), or the machine's own python3 with the harness's
missing packages carried as wheels in .whl/ (see the header of $0). Nothing was run.
EOF
    exit 3
  fi
  name="$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -n 1)"
  if [[ -z $name ]]; then
    name="$("$py" -c 'import jax; print(jax.devices()[0].device_kind)' 2>/dev/null | tail -n 1)"
  fi
  device="$(printf '%s' "${name:-unknown-gpu}" | tr '[:upper:]' '[:lower:]' \
    | sed -e 's/^[[:space:]]*//' -e 's/[[:space:]]*$//' -e 's/[[:space:]]\{1,\}/-/g' \
      -e 's/[^a-z0-9._-]//g')"
  device="${device:-unknown-gpu}"
fi
out="results/$device"
mkdir -p "$out"
say "device: $device; results in $out/; no step starts after ${deadline}s"

# The lra-* entry points under $py (argv[0] set so messages name the command).
entry() {
  printf 'import sys; sys.argv[0] = "lra-%s"; from lra.cli import %s_main as m; m()' "$1" "$1"
}
lra_train=("$py" -c "$(entry train)")
lra_data=("$py" -c "$(entry data)")
lra_bench=("$py" -c "$(entry bench)")
lra_plan=("$py" -c 'import sys; sys.argv[0] = "lra-plan"; from lra.plan.main import plan_main; plan_main()')

# ---------------------------------------------------------------- bookkeeping
step_names=()
step_status=()
step_verdict=()
step_seconds=()
all_ok=1

write_summary() {
  local i
  {
    echo "gpu_check on $device (${dry_run:+dry run, }python: $py_source)"
    echo "elapsed ${SECONDS}s of a ${deadline}s deadline"
    printf '%-22s %-8s %-8s %s\n' step status seconds verdict
    for i in "${!step_names[@]}"; do
      printf '%-22s %-8s %-8s %s\n' "${step_names[$i]}" "${step_status[$i]}" \
        "${step_seconds[$i]}" "${step_verdict[$i]}"
    done
  } >"$out/summary.txt"
}

pack_out() {  # copy what exists so far into the device tool's $OUT, if there is one
  [[ -n ${OUT:-} && -d ${OUT:-} ]] || return 0
  tar -czf "$OUT/gpu_check_$device.tar.gz" --exclude=checkpoints -C results "$device" 2>/dev/null
  cp "$out/summary.txt" "$OUT/summary.txt" 2>/dev/null
  return 0
}

record() {  # record NAME STATUS SECONDS VERDICT OK(0/1)
  step_names+=("$1"); step_status+=("$2"); step_seconds+=("$3"); step_verdict+=("$4")
  [[ $5 == 1 ]] || all_ok=0
  say "$1: status $2, ${3}s${4:+, $4}"
  write_summary
  pack_out
}

last_rc=0
last_seconds=0
# run_step NAME TIMEOUT_S OUTFILE CMD...: append the command and its output to OUTFILE under
# `timeout` (cut to the time left before the deadline); skipped if under min_step_s are left.
run_step() {
  local name=$1 limit=$2 file=$3 left start rc
  shift 3
  left=$((deadline - SECONDS))
  if ((left < min_step_s)); then
    echo "# $name: skipped, ${left}s left before the ${deadline}s deadline" >>"$file"
    last_rc=skipped
    last_seconds=0
    return
  fi
  ((limit > left)) && limit=$left
  start=$SECONDS
  say "$name (timeout ${limit}s) -> $file"
  {
    echo "# $name: timeout ${limit}s"
    printf '$'; printf ' %q' "$@"; echo
  } >>"$file"
  timeout -k 10 "$limit" "$@" >>"$file" 2>&1
  rc=$?
  echo "# exit status $rc after $((SECONDS - start))s" >>"$file"
  last_rc=$rc
  last_seconds=$((SECONDS - start))
}

# run_and_record NAME TIMEOUT_S OUTFILE CMD...: run_step, then record with verdict ok/failed.
run_and_record() {
  local name=$1
  run_step "$@"
  case $last_rc in
    0) record "$name" 0 "$last_seconds" ok 1 ;;
    skipped) record "$name" skipped 0 "past the deadline" 0 ;;
    124|137) record "$name" "$last_rc" "$last_seconds" "timed out" 0 ;;
    *) record "$name" "$last_rc" "$last_seconds" failed 0 ;;
  esac
}

# ---------------------------------------------------------------- 2. environment
cat >"$tmp/environment.py" <<'PY'
import os, platform, sys
import jax, jaxlib, flax
print("python", sys.version.replace("\n", " "), "at", sys.executable)
print("platform", platform.platform())
print("jax", jax.__version__, "jaxlib", jaxlib.__version__, "flax", flax.__version__)
for name in ("optax", "orbax.checkpoint", "hydra", "omegaconf", "numpy"):
    try:
        module = __import__(name, fromlist=["_"])
        print(name, getattr(module, "__version__", "?"))
    except Exception as err:
        print(name, "not importable:", err)
print("default backend", jax.default_backend())
print("devices", jax.devices())
device = jax.devices()[0]
print("device 0", device.platform, repr(device.device_kind))
try:
    stats = device.memory_stats()
except Exception as err:
    stats = f"unavailable: {err}"
print("memory_stats of device 0:")
if isinstance(stats, dict):
    for key in sorted(stats):
        print(f"  {key}: {stats[key]}")
else:
    print(" ", stats)
for key in sorted(os.environ):
    if key.startswith(("JAX_", "XLA_", "CUDA_", "TF_", "NVIDIA_", "PYTHONPATH")):
        print(f"env {key}={os.environ[key]}")
PY
rm -f "$out/environment.txt"
{
  echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo "host: $(hostname)  cores: $(nproc)"
  echo "code: $(git -C "$root" rev-parse HEAD 2>/dev/null || echo 'no git')" \
    "$(git -C "$root" status --porcelain 2>/dev/null | grep -q . && echo '(uncommitted changes)')"
  echo "python used: $py ($py_source)"
  echo
} >"$out/environment.txt"
env_start=$SECONDS
if command -v nvidia-smi >/dev/null 2>&1; then
  run_step nvidia-smi 30 "$out/environment.txt" nvidia-smi
  smi_rc=$last_rc
else
  echo "# nvidia-smi: not on PATH" >>"$out/environment.txt"
  smi_rc=$([[ -n $dry_run ]] && echo 0 || echo 127)
fi
run_step python 90 "$out/environment.txt" "$py" "$tmp/environment.py"
if [[ $smi_rc == 0 && $last_rc == 0 ]]; then
  record environment 0 $((SECONDS - env_start)) ok 1
else
  record environment "$smi_rc/$last_rc" $((SECONDS - env_start)) "nvidia-smi/python failed" 0
fi

# ---------------------------------------------------------------- 3. tests
tests=()
missing=()
for f in tests/test_parallel.py tests/test_measure.py tests/test_bench.py tests/test_train.py; do
  if [[ -f $f ]]; then tests+=("$f"); else missing+=("$f"); fi
done
rm -f "$out/tests.txt"
((${#missing[@]})) && echo "# not in this checkout, not run: ${missing[*]}" >>"$out/tests.txt"
# tests/conftest.py sets JAX_PLATFORMS=cpu unless it is set: name the GPU explicitly.
test_platform=$([[ -n $dry_run ]] && echo cpu || echo cuda)
# Not -x: the first H200 run stopped at its first failure and so said nothing of the other
# tests. Up to 10 failures, each named (-rfE); in 4 processes where pytest-xdist is there.
workers=()
"$py" -c "import xdist" >/dev/null 2>&1 && workers=(-n "$([[ -n $dry_run ]] && echo 2 || echo 4)")
if ((${#tests[@]})); then
  run_and_record tests 150 "$out/tests.txt" \
    env JAX_PLATFORMS="$test_platform" "$py" -m pytest -q --maxfail=10 -rfE -p no:cacheprovider \
    "${workers[@]}" "${tests[@]}"
else
  record tests skipped 0 "no test files found" 0
fi

# ---------------------------------------------------------------- 4. data + training
data_dir="$tmp/data"
rm -f "$out/data.txt"
run_and_record data 90 "$out/data.txt" \
  "${lra_data[@]}" task=listops_tiny "data_dir=$data_dir" "hydra.run.dir=$out/hydra/data"
for precision in fp32 bf16; do
  file="$out/train_$precision.txt"
  rm -f "$file"
  # attention_options is {} in configs/model/transformer.yaml: a new key needs Hydra's '+'.
  run_and_record "train_$precision" 120 "$file" \
    "${lra_train[@]}" task=listops_tiny model=transformer "trainer.precision=$precision" \
    +model.attention_options.softmax.implementation=fused task.arch.attention_dropout=0 \
    "trainer.num_steps=$train_steps" "trainer.eval_every=$eval_every" trainer.progress=false \
    trainer.resume=never "results_dir=$out/runs" "data_dir=$data_dir" \
    "hydra.run.dir=$out/hydra/train_$precision"
done

# ---------------------------------------------------------------- 5. pre-flight
# Only the pre-flight's own lines matter: "pre-flight: the train step needs X of Y (source)"
# (fits; the run then stops on the missing data: expected), or "... needs X but <source> is Y;
# compiling lower-memory settings" (or "compiling the steps ran out of device memory", as
# batch 2048 did on the H200: the GPU autotuner allocates while compiling) followed by the
# error naming what fits (or that nothing does).
empty_dir="$tmp/empty"
mkdir -p "$empty_dir"
: >"$out/preflight.txt"
preflight() {  # preflight NAME EXPECT(any|not-fit) OVERRIDES...
  local name=$1 expect=$2 lines new verdict why fix ok=0
  shift 2
  lines=$(wc -l <"$out/preflight.txt")
  run_step "$name" "$preflight_timeout" "$out/preflight.txt" \
    "${lra_train[@]}" model=transformer "data_dir=$empty_dir" "results_dir=$tmp/preflight_runs" \
    trainer.progress=false "hydra.run.dir=$out/hydra/$name" "$@"
  new=$(tail -n +"$((lines + 1))" "$out/preflight.txt")
  if grep -q "these overrides fit\|no grad_accum/remat setting fits" <<<"$new"; then
    why=$(grep -o "per device (XLA compiled memory analysis)\|do not compile in the device.s \
memory" <<<"$new")
    fix=$(grep -o 'these overrides fit.*\|no grad_accum/remat setting fits' <<<"$new")
    verdict="does not fit ($(head -n 1 <<<"$why")); $(head -n 1 <<<"$fix" \
      | sed 's/; trainer.preflight=false.*//')"
    ok=1
  elif grep -q "^pre-flight: .* but \|^pre-flight: compiling the steps ran out" <<<"$new"; then
    verdict="does not fit; the search for fitting settings did not finish"
  elif grep -q "^pre-flight: the .* step needs" <<<"$new"; then
    verdict="fits: $(grep -o 'needs .*' <<<"$new" | head -n 1)"
    [[ $expect != not-fit ]] && ok=1
  elif [[ $last_rc == skipped ]]; then
    verdict="past the deadline"
  else
    verdict="no pre-flight line"
  fi
  record "$name" "$last_rc" "$last_seconds" "$verdict" "$ok"
}
if [[ -n $dry_run ]]; then
  # A CPU compiles the official model's lower-memory variants too slowly for the timeout: the
  # fitting path with a memory limit that fits, the search on listops_tiny at batch 2048.
  preflight preflight_official any task=listops trainer.memory_limit_gb=200
  preflight preflight_batch2048 not-fit task=listops_tiny trainer.batch_size=2048 \
    trainer.memory_limit_gb=0.5
else
  preflight preflight_official any task=listops
  preflight preflight_batch2048 not-fit task=listops trainer.batch_size=2048
fi

# ---------------------------------------------------------------- 6. benchmark
# First the Transformer in bf16 without attention dropout, where `implementation: auto` picks
# cuDNN's fused attention (issue 15, item 3; its records' softmax_implementation says which
# ran). Then every Figure-1 model as lra-bench runs it by default (float32), in one process,
# round-robin (each length: every model), until memory_s (step 7's share) before the deadline.
# One process, not one per length (bench.isolate=false): on the H200 each cell compiled for
# 10-17 s (XLA's GPU autotuning), and one fresh process per length ran only 2-3 lengths of a
# model per minute. A cell whose
# steps did not raise the process's device peak records its compiled memory instead
# (memory_source says which), so no cell reports another's memory.
rm -f "$out/bench.txt"
count_records() { find "$1" -name '*.json' 2>/dev/null | wc -l; }
bench_step() {  # bench_step NAME TIMEOUT_S RESULTS_DIR OVERRIDES...
  local name=$1 limit=$2 dir=$3 verdict ok=0
  shift 3
  run_step "$name" "$limit" "$out/bench.txt" "${lra_bench[@]}" "$@" "results_dir=$dir" \
    bench.windows=3 "${bench_extra[@]}" "hydra.run.dir=$out/hydra/$name"
  case $last_rc in
    0) verdict="ok, $(count_records "$dir") records"; ok=1 ;;
    skipped) verdict="past the deadline" ;;
    124|137) verdict="timed out after $(count_records "$dir") records" ;;
    *) verdict="failed after $(count_records "$dir") records" ;;
  esac
  record "$name" "$last_rc" "$last_seconds" "$verdict" "$ok"
}
bench_step bench_transformer_bf16 90 "$out/bench_bf16" model=transformer trainer.precision=bf16 \
  task.arch.attention_dropout=0 "lengths=$bf16_lengths"
bench_limit=$((deadline - memory_s - plan_s - SECONDS))  # leaves plan_s and memory_s
((bench_limit > 600)) && bench_limit=600
if ((bench_limit < min_bench_s)); then
  record bench skipped 0 "past the ${deadline}s deadline less ${memory_s}s" 0
else
  bench_step bench "$bench_limit" "$out/bench" "models=[$(IFS=,; echo "${models[*]}")]" \
    "lengths=$lengths" bench.isolate=false
fi

# ---------------------------------------------------------------- 6b. PyTorch side by side
# If time is left and the machine's Python has PyTorch: scripts/compare_pytorch.py on the GPU
# (twin on CUDA), which checks the twin's logits first and then times both train steps
# alternately (issue 15). Not counted against the verdict when PyTorch is missing.
rm -f "$out/compare_pytorch.txt"
if ! "$py" -c "import torch" >/dev/null 2>&1; then
  echo "# no PyTorch under $py: not run" >"$out/compare_pytorch.txt"
  record compare_pytorch skipped 0 "no PyTorch" 1
elif ((deadline - memory_s - plan_s - SECONDS < min_bench_s)); then
  record compare_pytorch skipped 0 "past the ${deadline}s deadline less ${memory_s}+${plan_s}s" 1
else
  compare_limit=$((deadline - memory_s - plan_s - SECONDS))  # leaves plan_s and memory_s
  ((compare_limit > 120)) && compare_limit=120
  run_and_record compare_pytorch "$compare_limit" "$out/compare_pytorch.txt" \
    "$py" scripts/compare_pytorch.py --models "${compare_models}" --lengths "$compare_lengths" \
    "${compare_extra[@]}" --out "$out/compare_pytorch.json"
fi

# ---------------------------------------------------------------- 6c. the campaign's plan
# lra-plan (issue 40) of the official Figure-1 campaign on this GPU: each cell compiled at its
# run's shapes, its fit, a timed step, its projected wall time and GPU-hours. It writes plan.json
# and plan.md after every cell, so a plan cut short by the timeout keeps the cells it measured
# (in the sweep's order: every task of the Transformer first).
rm -rf "$out/plan.txt" "$out/plan"
plan_limit=$((deadline - memory_s - SECONDS))  # what 6 and 6b left, less step 7's share
run_step plan "$((plan_limit > min_step_s ? plan_limit : min_step_s))" "$out/plan.txt" \
  "${lra_plan[@]}" "${plan_args[@]}" "out_dir=$out/plan" "results_dir=$out/plan_runs" \
  plan.isolate=false plan.windows=1 plan.steps_per_window=2
planned=$("$py" -c 'import json, sys
try:
    p = json.load(open(sys.argv[1]))
    print("%d of %d cells, %.3g GPU-hours" % (len(p["cells"]), p["cells_planned"], p["total_device_hours"]))
except Exception:
    print("no plan.json")' "$out/plan/plan.json" 2>/dev/null)
case $last_rc in
  0) record plan 0 "$last_seconds" "ok, $planned" 1 ;;
  skipped) record plan skipped 0 "past the deadline" 0 ;;
  124|137) record plan "$last_rc" "$last_seconds" "its time limit reached after $planned" 1 ;;
  *) record plan "$last_rc" "$last_seconds" "failed after $planned" 0 ;;
esac

# ---------------------------------------------------------------- 7. memory settings
# What trainer.grad_accum and trainer.remat save on this device (issue 29): per model one
# process of scripts/memory_settings.py, which compiles each cell from shapes (no data) and
# prints a JSON line per cell as it finishes; each gets half of the time left (at least the
# memory_s the steps before left it, unless they ran late).
rm -f "$out/memory_settings.txt"
for i in "${!memory_models[@]}"; do
  model=${memory_models[$i]}
  limit=$(((deadline - SECONDS) / (${#memory_models[@]} - i)))
  run_step "memory_$model" "$((limit > min_step_s ? limit : min_step_s))" \
    "$out/memory_settings.txt" "$py" scripts/memory_settings.py --remat "$memory_remats" \
    "task=$memory_task" "model=$model" -- "${memory_accums[@]}"
  cells=$(grep -c "\"model\": \"$model\"" "$out/memory_settings.txt")
  want=$(( ${#memory_accums[@]} * $(tr ',' '\n' <<<"$memory_remats" | wc -l) ))
  case $last_rc in
    0) record "memory_$model" 0 "$last_seconds" "ok, $cells of $want cells" 1 ;;
    skipped) record "memory_$model" skipped 0 "past the deadline" 0 ;;
    124|137) record "memory_$model" "$last_rc" "$last_seconds" \
      "timed out after $cells of $want cells" 0 ;;
    *) record "memory_$model" "$last_rc" "$last_seconds" "failed after $cells of $want cells" 0 ;;
  esac
done

# ---------------------------------------------------------------- 8. summary
write_summary
pack_out
echo
cat "$out/summary.txt"
[[ $all_ok == 1 ]] && exit 0 || exit 1
