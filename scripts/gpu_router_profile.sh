#!/usr/bin/env bash
# One device call (twenty-second session): the router's logits one program per expert and
# the invariant GEMV. The CUDA router tests and the models' exact-speculation tests, then
# DeepSeek-V2-Lite's resident steps profiled kernel by kernel (scripts/profile_steps.py),
# with the draft's linears on cuBLAS (the default) and through the invariant GEMV, then the
# unlimited cell (hf, lru, specter, one process).
#
#   SPECTER_GIT_COMMIT=<hash> bash scripts/gpu_router_profile.sh   (carry .whl)
# shellcheck source=scripts/gpu-call.sh
source "$(dirname "${BASH_SOURCE[0]}")/gpu-call.sh"
begin=$(date +%s)
CUDA_TESTS_TIMEOUT=90 cuda_tests_to gpu-tests-router.txt packages/specter-kernels/tests/test_gpu.py \
    -k "router"
CUDA_TESTS_TIMEOUT=120 cuda_tests_to gpu-tests-router.txt packages/specter-models/tests/test_cuda.py \
    -k "speculation_is_exact or batch_invariant_rows"
echo "tests done at $(($(date +%s) - begin)) s"
for arm in cublas gemv; do
    extra=()
    [ "$arm" = gemv ] && extra=(--invariant-draft-linears)
    timeout 150 python3 scripts/profile_steps.py --rows 1,5 --top 14 --tag "profile-$arm" \
        --out "$out/profile-$arm.jsonl" "${extra[@]}" >"$out/log-profile-$arm.txt" 2>&1
    grep -E "rows=|router|_invariant|nvjet" "$out/log-profile-$arm.txt" | cut -c1-120
done
echo "profiles done at $(($(date +%s) - begin)) s"
tpot_cells 200 unlimited hf,lru,specter router-unlimited 2.9
echo "done at $(($(date +%s) - begin)) s"
