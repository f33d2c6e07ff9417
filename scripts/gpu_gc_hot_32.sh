#!/usr/bin/env bash
# One device call (thirty-second session):
# 1. scripts/capture_gc_probe.py: which cyclic garbage, collected during a thread_local
#    capture, invalidates it; and the same with the collector paused (as captures run now).
# 2. Every CUDA test of specter-cache and specter-models (the captures now pause the
#    collector; the 31st session's models run failed one capture test, order-dependent).
# 3. DeepSeek-V2-Lite at 24 GB: `specter` with 36 (the coarse search's count), 38 and 39
#    pinned experts a layer (the refined search's range), one load each, 3 HumanEval prompts
#    x 64 tokens (the hot-count sweep; its record carries the replay's loads per count).
#
#   SPECTER_GIT_COMMIT=<hash> bash scripts/gpu_gc_hot_32.sh   (carry .whl)
# shellcheck source=scripts/gpu-call.sh
source "$(dirname "${BASH_SOURCE[0]}")/gpu-call.sh"
begin=$(date +%s)
timeout 60 python3 scripts/capture_gc_probe.py --out "$out/capture-gc.jsonl" 2>&1 | tail -14
echo "probe done at $(($(date +%s) - begin)) s"
CUDA_TESTS_TIMEOUT=40 cuda_tests_to gpu-tests.txt packages/specter-cache/tests/test_expert_cache_cuda.py
CUDA_TESTS_TIMEOUT=200 cuda_tests_to gpu-tests.txt packages/specter-models/tests/test_cuda.py
echo "tests done at $(($(date +%s) - begin)) s"
tpot_cells 280 24 specter hot32-24gb 4.2 --experiment hot-sweep --hot-counts 36,38,39 \
    --sweep-prompts 3
tr '\r' '\n' <"$out/log-hot32-24gb.txt" | grep -E "hot|pinned" | tail -12 | cut -c1-220
echo "done at $(($(date +%s) - begin)) s"
