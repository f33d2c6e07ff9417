#!/usr/bin/env bash
# One device call (under 9 minutes) for the eighth session's fusions (the fused routers,
# the absorbed MLA attention, the fused gate/up MLPs):
#
#   SPECTER_GIT_COMMIT=<hash> bash scripts/gpu_fusions.sh
#
# 1. CUDA tests of the new kernels and of the models (exactness, graphs, hot sets);
# 2. an in-graph tile sweep of the two new fused gate/up GEMM shapes;
# 3. DeepSeek-V2-Lite's resident step times after a 480-token prompt (window 512), all
#    fusions on, then each new one off, with each step's kernel count.
# shellcheck source=scripts/gpu-call.sh
source "$(dirname "${BASH_SOURCE[0]}")/gpu-call.sh"
timeout 120 python3 -m pytest -q -p no:cacheprovider packages/specter-kernels/tests/test_gpu.py \
    -k "router or mla or silu" 2>&1 | tail -3 | tee "$out/gpu-tests-new-kernels.txt"
timeout 100 python3 -m pytest -q -p no:cacheprovider \
    packages/specter-kernels/tests/invariant/test_gpu_batch_invariance.py 2>&1 | tail -2 \
    | tee "$out/gpu-tests-invariance.txt"
timeout 220 python3 -m pytest -q -p no:cacheprovider packages/specter-models/tests/test_cuda.py \
    2>&1 | tail -3 | tee "$out/gpu-tests-models.txt"
timeout 60 python3 scripts/sweep_invariant_matmul.py --shapes "dsv2 dense gate_up,qwen shared gate_up" \
    --max-seconds 50 --out "$out/sweep-fused-gate-up.jsonl" \
    --write-config "$out/tuned-fused-gate-up.json" 2>&1 | grep -E "N=|wrote" | cut -c1-200
timeout 230 python3 scripts/gpu_step_graphs.py --skip eager,fused,rotary,budget --kernels \
    --prompt-len 480 --tag fusions --out "$out/steps-fusions.jsonl" 2>&1 \
    | grep -E '"kind": "(step|decode|decode_equal)"|Error' | cut -c1-260
