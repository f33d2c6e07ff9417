#!/usr/bin/env bash
# One device call: the CUDA tests of the code the eleventh session did not run on the GPU
# (kernels' fills and streaming, the cache, the models' streamed, budget and hot-set
# tests), then scripts/draft_loop_probe.py on DeepSeek-V2-Lite with every expert resident
# and at 24 GB: a draft proposal's time inside the controller against the graphed step.
#
#   SPECTER_GIT_COMMIT=<hash> bash scripts/gpu_draft_probe.sh
# shellcheck source=scripts/gpu-call.sh
source "$(dirname "${BASH_SOURCE[0]}")/gpu-call.sh"
cuda_tests_to gpu-tests-draft-probe.txt packages/specter-kernels/tests/test_gpu.py -k "fills or streamed"
cuda_tests_to gpu-tests-draft-probe.txt packages/specter-cache/tests/test_expert_cache_cuda.py
cuda_tests_to gpu-tests-draft-probe.txt packages/specter-models/tests/test_cuda.py -k "streamed or budget or hot"
for budget in "" 24; do
    timeout 150 python3 scripts/draft_loop_probe.py --depth 4 ${budget:+--budget-gb $budget} \
        --out "$out/draft-loop-probe.jsonl" 2>&1 | grep -vE "Warning|warn" | tail -6
done
