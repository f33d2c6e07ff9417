#!/usr/bin/env bash
# One device call (about 7 minutes) at the eighth session's code: the models' CUDA tests,
# then Qwen1.5-MoE's lru and specter at 14 GB and unlimited (2 HumanEval prompts x 64
# tokens), the fused routers and gate/up MLPs being its share of the fusions:
#
#   SPECTER_GIT_COMMIT=<hash> bash scripts/gpu_qwen_fused.sh
# shellcheck source=scripts/gpu-call.sh
source "$(dirname "${BASH_SOURCE[0]}")/gpu-call.sh"
timeout 120 python3 -m pytest -q -p no:cacheprovider packages/specter-models/tests/test_cuda.py \
    -W "default::RuntimeWarning" 2>&1 | grep -E "passed|failed|switched off" | cut -c1-220 \
    | tee "$out/gpu-tests-models.txt"
timeout 300 python3 -m specter_bench bench --experiment tpot --num-prompts 2 --out "$out" \
    --tag qwen-fused --max-minutes 4.2 --model qwen1.5-moe --systems lru,specter \
    --budgets 14,unlimited --max-new-tokens 64 2>&1 | tr '\r' '\n' | grep -v -E ': +[0-9]+%' \
    >"$out/log-qwen-fused.txt"
grep -E '^\| qwen|Error|skipped' "$out/log-qwen-fused.txt" | head -12
