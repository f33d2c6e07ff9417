#!/usr/bin/env bash
# One device call for the streamed miss path: the CUDA tests of the kernels, cache and models
# that it touches, then the 24 GB DeepSeek-V2-Lite decode on a HumanEval prompt with the
# benchmark's hot set, acquiring (load) then streaming its missing experts, each its own
# process (scripts/profile_decode_host.py, no cProfile):
#
#   SPECTER_GIT_COMMIT=<hash> bash scripts/gpu_stream.sh
# shellcheck source=scripts/gpu-call.sh
source "$(dirname "${BASH_SOURCE[0]}")/gpu-call.sh"
timeout 90 python3 -m pytest -q -p no:cacheprovider packages/specter-kernels/tests/test_gpu.py \
    -k "grouped or streamed" 2>&1 | tail -2 | tee "$out/gpu-tests-kernels-streamed.txt"
timeout 60 python3 -m pytest -q -p no:cacheprovider \
    packages/specter-cache/tests/test_expert_cache_cuda.py 2>&1 | tail -2 \
    | tee "$out/gpu-tests-cache-streamed.txt"
timeout 150 python3 -m pytest -q -p no:cacheprovider packages/specter-models/tests/test_cuda.py \
    -k "streamed or budget or hot" -rfE --tb=short 2>&1 | tee "$out/gpu-tests-models-full.txt" \
    | tail -2 | tee "$out/gpu-tests-models-streamed.txt"
hot=benchmarks/results/bench-deepseek-v2-lite-2026-12-01-pair-waves.jsonl
for spec in "load 6" "stream 6" "stream auto"; do
    set -- $spec
    timeout 150 python3 scripts/profile_decode_host.py --budget-gb 24 --humaneval 0 --depth "$2" \
        --no-cprofile --hot-experts "$hot" --miss-path "$1" \
        >"$out/profile-decode-host-24gb-$1-$2.txt" 2>&1
    echo "== $1 K=$2"; grep -E "^K=|Error|error" "$out/profile-decode-host-24gb-$1-$2.txt" | cut -c1-330
    grep -E "^cache" "$out/profile-decode-host-24gb-$1-$2.txt" | cut -c1-520
done
