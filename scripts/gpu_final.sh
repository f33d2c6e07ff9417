#!/usr/bin/env bash
# One device call (about 10 minutes) at the session's final code: the CUDA tests of the
# invariant kernels and of the models (exactness, graphs, hot sets), DeepSeek-V2-Lite's
# resident step times, then the issue's target cells with the Belady bound (the default
# experiment: hf, lru, spec-lru, specter at 24 GB and unlimited, 2 HumanEval prompts x 64
# tokens):
#
#   SPECTER_GIT_COMMIT=<hash> bash scripts/gpu_final.sh
# shellcheck source=scripts/gpu-call.sh
source "$(dirname "${BASH_SOURCE[0]}")/gpu-call.sh"
timeout 100 python3 -m pytest -q -p no:cacheprovider \
    packages/specter-kernels/tests/invariant/test_gpu_batch_invariance.py 2>&1 | tail -2 \
    | tee "$out/gpu-tests-kernels.txt"
timeout 200 python3 -m pytest -q -p no:cacheprovider packages/specter-models/tests/test_cuda.py \
    2>&1 | tail -2 | tee "$out/gpu-tests-models.txt"
timeout 100 python3 scripts/gpu_step_graphs.py --skip eager,fused,rotary,budget --tag final \
    --out "$out/steps-final.jsonl" 2>&1 | grep -E '"kind": "(step|decode|decode_equal)"' \
    | cut -c1-160
SPECTER_BENCH_MINUTES="${BENCH_MINUTES:-6.3}" timeout 460 bash scripts/gpu_bench.sh \
    deepseek-v2-lite --experiment default --systems hf,lru,spec-lru,specter \
    --budgets 24,unlimited --num-prompts 2 --max-new-tokens 64 --depths 4 --hot-counts 32 \
    >/dev/null 2>&1
tr '\r' '\n' <"$out/log-deepseek-v2-lite.txt" | grep -E '^\| deep|Error|skipped' | head -24
