#!/usr/bin/env bash
# One device call (under 9 minutes) for the ninth session's launch cuts (one-launch
# routed-pair sums with the cast, unaligned one-row expert launches, no zeroing of a
# fully written per-pair accumulator), with an A/B of the step times against a base tree:
#
#   git archive --format=tar -o .ab/base.tar <base commit> packages   # the A side
#   SPECTER_GIT_COMMIT=<hash> bash scripts/gpu_launches.sh            # carry .ab and .whl
#
# 1. CUDA tests of the changed kernels (bits against the references, batch invariance) and
#    of the models (exactness, graphs, hot sets; the models' full output, tracebacks of
#    failures included, in gpu-tests-models-full.txt);
# 2. DeepSeek-V2-Lite's resident step times after a 480-token prompt (window 512) with
#    kernel counts, base / this tree / this tree / base, each in its own process.
# shellcheck source=scripts/gpu-call.sh
source "$(dirname "${BASH_SOURCE[0]}")/gpu-call.sh"
timeout 150 python3 -m pytest -q -p no:cacheprovider packages/specter-kernels/tests/test_gpu.py \
    -k "grouped or sum_routed or w4a16" 2>&1 | tail -3 | tee "$out/gpu-tests-kernels.txt"
timeout 100 python3 -m pytest -q -p no:cacheprovider \
    packages/specter-kernels/tests/invariant/test_gpu_batch_invariance.py 2>&1 | tail -2 \
    | tee "$out/gpu-tests-invariance.txt"
timeout 220 python3 -m pytest -q -p no:cacheprovider packages/specter-models/tests/test_cuda.py \
    -rfE --tb=short 2>&1 | tee "$out/gpu-tests-models-full.txt" | tail -3 | tee "$out/gpu-tests-models.txt"
new_path="$PYTHONPATH"
base_path="$new_path"
if [ -f .ab/base.tar ]; then
    rm -rf /tmp/specter-base && mkdir -p /tmp/specter-base && tar -xf .ab/base.tar -C /tmp/specter-base
    base_path="${new_path//$SPECTER_ROOT\/packages//tmp/specter-base/packages}"
fi
for side in base new new base; do
    path="$new_path"
    [ "$side" = base ] && path="$base_path"
    PYTHONPATH="$path" timeout 110 python3 scripts/gpu_step_graphs.py \
        --skip eager,fused,rotary,routers,mla,mlp,budget --kernels --prompt-len 480 \
        --tag "launches-$side" --out "$out/steps-launches-$side.jsonl" 2>&1 \
        | grep -E '"kind": "(step|decode_equal)"|Error' | cut -c1-220
done
