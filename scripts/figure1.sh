#!/usr/bin/env bash
# TransNormer's Figure 1, end to end: prepare the data, train every Figure-1 model on every
# task, benchmark speed and memory over sequence lengths, and write the report.
#
#   scripts/figure1.sh [--tiny] [--out DIR] [--seeds 0,1,2] [--skip-train] [--skip-bench] [--overwrite]
#
#   (default)  official tasks at their official settings (lra-train -m experiment=figure1),
#              lra-bench at the Figure-1 setting (Text, batch 20, 6 layers, d_model 128,
#              lengths 1024..5120); an accelerator job. Output: results/figure1/.
#   --tiny     the same pipeline on the tiny tasks on a CPU (experiment=figure1_tiny), the
#              benchmark at lengths 1024..4096 with batch 2, 3 one-step timing windows and
#              2 round-robin rounds.
#              Output: results/local/cpu-tiny/ (not committed). Tiny-task CPU numbers, not
#              LRA scores. The committed evidence is regenerated with
#              --out results/cpu-tiny --overwrite.
#   --overwrite  allow writing into a folder that holds committed (git-tracked) results;
#              without it the script refuses before doing any work.
#
# The lra-* commands come from the active environment (or from $LRA_BIN/, e.g. .venv/bin/).
# Records land in OUT/runs and OUT/bench; the report (leaderboard, efficiency, figure1,
# sources.json) in OUT.
set -euo pipefail

tiny=0
out=""
seeds="0"
train=1
bench=1
overwrite=0
while [[ $# -gt 0 ]]; do
  case "$1" in
    --tiny) tiny=1 ;;
    --out) out="$2"; shift ;;
    --seeds) seeds="$2"; shift ;;
    --skip-train) train=0 ;;
    --skip-bench) bench=0 ;;
    --overwrite) overwrite=1 ;;
    *) echo "error: unknown option $1 (see the header of $0)" >&2; exit 2 ;;
  esac
  shift
done

bin="${LRA_BIN:+${LRA_BIN%/}/}"
models=transformer,flash_quad,flash,ls,performer,cosformer,linformer,nystromformer,reformer,transnormer_t1,transnormer_t2
if [[ $tiny == 1 ]]; then
  out="${out:-results/local/cpu-tiny}"
  tasks=(listops_tiny text_tiny retrieval_tiny image_tiny pathfinder_tiny pathx_tiny)
  experiment=figure1_tiny
  bench_args=(lengths=[1024,2048,3072,4096] batch_size=2 bench.warmup_steps=1 bench.windows=3
    bench.steps_per_window=1 rounds=2)
  report_args=(tasks=tiny figure_length=1024)
else
  out="${out:-results/figure1}"
  tasks=(listops text retrieval image pathfinder pathx)
  experiment=figure1
  bench_args=()
  report_args=(tasks=official)
fi

if [[ $overwrite == 0 ]] && git -C "$(dirname "$0")" rev-parse --git-dir >/dev/null 2>&1 \
  && [[ -d $out ]] && [[ -n $(git ls-files -- "$out" 2>/dev/null | head -1) ]]; then
  echo "error: $out holds committed results; add --overwrite to replace them, or choose" \
    "another folder with --out DIR" >&2
  exit 2
fi

if [[ $train == 1 ]]; then
  for task in "${tasks[@]}"; do
    "${bin}lra-data" "task=$task"
  done
  "${bin}lra-train" -m "experiment=$experiment" "seed=$seeds" "results_dir=$out/runs" \
    trainer.progress=false
fi
if [[ $bench == 1 ]]; then
  # Round-robin over the models (lra/measure/bench.py), so a change of the machine's load falls on
  # every model alike; the tiny run pools two rounds.
  "${bin}lra-bench" "models=[$models]" protocol=transnormer "results_dir=$out/bench" \
    "${bench_args[@]}"
fi
"${bin}lra-report" "results_dir=$out" "out_dir=$out" "models=[$models]" "${report_args[@]}"
