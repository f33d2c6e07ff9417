#!/usr/bin/env bash
# The whole GPU benchmark of one model in one device call (about 9 minutes), on the GPU
# machine, from the repository root:
#
#   SPECTER_GIT_COMMIT=$(git rev-parse HEAD)   # here; pass it along (the copy has no .git)
#   source scripts/gpu-env.sh && SPECTER_GIT_COMMIT=<hash> bash scripts/gpu_bench.sh deepseek-v2-lite
#
# Models: deepseek-v2-lite (default), qwen1.5-moe, phi-3.5-moe. Extra arguments go to
# `specter bench` (e.g. --num-prompts 2 --max-new-tokens 64). Environment:
#   OUT                   where results go (the device tool's folder; default /tmp/specter-out)
#   SPECTER_BENCH_MINUTES no new measurement starts after this many minutes (default 7.5)
#
# Leaves at most 8 flat files under $OUT:
#   bench-<model>-gpu.jsonl    every record of `--experiment all` (TPOT per system x budget
#                              x prompt, hf-offload last if time is left, routing,
#                              policies, depth sweep, memory), see docs/benchmarks.md
#   log-<model>.txt            the GPU, versions, memory plans and the run's log
#   report-<model>.md          tables (specter report), linking the plots beside it
#   tpot_per_system.png working_set.png policy_hit_rate.png depth_sweep.png
# Then, here: copy bench-<model>-gpu.jsonl to benchmarks/results/bench-<model>-<date>.jsonl
# and run `python scripts/make_report.py benchmarks/results/bench-*.jsonl`.
set -uo pipefail
model="${1:-deepseek-v2-lite}"
shift || true
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
if [ -z "${SPECTER_ROOT:-}" ]; then
    # shellcheck source=/dev/null
    source scripts/gpu-env.sh
fi
out="${OUT:-/tmp/specter-out}"
mkdir -p "$out"
minutes="${SPECTER_BENCH_MINUTES:-7.5}"
log="$out/log-$model.txt"
export PYTHONUNBUFFERED=1

case "$model" in
    deepseek-v2-lite) budgets=(16 24) ;;
    qwen1.5-moe) budgets=(14 20) ;;
    phi-3.5-moe) budgets=(32 40) ;;
    *) budgets=() ;;
esac

{
    echo "== specter gpu_bench: $model, $(date -u +%FT%TZ), commit ${SPECTER_GIT_COMMIT:-unknown}"
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
    free -g | head -2 || true
    for b in "${budgets[@]}"; do
        python3 -m specter_bench info --model "$model" --gpu-memory-gb "$b" || true
    done
} >"$log" 2>&1

python3 -m specter_bench bench --model "$model" --experiment all --out "$out" --tag gpu \
    --max-minutes "$minutes" "$@" 2>&1 | tee -a "$log"
status=${PIPESTATUS[0]}

results="$out/bench-$model-gpu.jsonl"
if [ -f "$results" ]; then
    python3 scripts/make_report.py "$results" --markdown "$out/report-$model.md" \
        --plots-dir "$out" \
        --list-command "SPECTER_GIT_COMMIT=<hash> bash scripts/gpu_bench.sh $model $*" \
        2>&1 | tee -a "$log"
fi
ls -la "$out" | tee -a "$log"
exit "$status"
