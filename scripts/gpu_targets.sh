#!/usr/bin/env bash
# One device call (about 9 minutes): re-tune the invariant GEMM inside CUDA graphs, profile
# DeepSeek-V2-Lite's draft and target steps with the new tiles, then the issue's target
# cells (hf, lru, spec-lru, specter at 24 GB and unlimited, 2 HumanEval prompts x 64
# tokens) in one run with them:
#
#   SPECTER_GIT_COMMIT=<hash> bash scripts/gpu_targets.sh
#
# The tiles go to $OUT/invariant_matmul_nvidia_h200.json (ship them in
# packages/specter-kernels/src/specter_kernels/invariant/tuned/ so later runs use them).
# shellcheck source=scripts/gpu-call.sh
source "$(dirname "${BASH_SOURCE[0]}")/gpu-call.sh"
tiles="$out/invariant_matmul_nvidia_h200.json"
python3 scripts/sweep_invariant_matmul.py --out "$out/invariant-matmul-graph-sweep.jsonl" \
    --write-config "$tiles" --max-seconds 60 2>&1 | grep -v "Error" >"$out/log-sweep.txt"
cut -c1-150 "$out/log-sweep.txt"
export SPECTER_INVARIANT_MATMUL_CONFIGS="$tiles"
timeout 90 python3 scripts/profile_draft_step.py --top 30 >"$out/profile-draft-step.txt" 2>&1
timeout 120 python3 scripts/profile_target_step.py --rows 1,5 --top 40 \
    >"$out/profile-target-step.txt" 2>&1
grep -E "kernels|per forward|graph" "$out"/profile-*-step.txt | head -12
timeout "${BENCH_SECONDS:-400}" python3 -m specter_bench bench --model deepseek-v2-lite \
    --experiment tpot --systems hf,lru,spec-lru,specter --budgets 24,unlimited \
    --num-prompts 2 --max-new-tokens 64 --out "$out" --tag targets \
    --max-minutes "${BENCH_MINUTES:-6.2}" 2>&1 | tr '\r' '\n' \
    | grep -v -E '^deepseek-v2-lite: +[0-9]+%' >"$out/log-targets.txt"
grep -E '^\| deep|Error|skipped' "$out/log-targets.txt" | head -20
