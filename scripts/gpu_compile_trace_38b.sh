#!/usr/bin/env bash
# One device call (thirty-eighth session): the capture's argmax warm-up checked. The models'
# CUDA graph tests (with the new first-use test), then scripts/compile_trace_probe.py on a
# fresh Triton cache per configuration (and a second run on the default model's and the
# 24 GB one's filled caches): which kernels each first run's decode still compiles, and its
# TPOT beside the second run's.
#
#   SPECTER_GIT_COMMIT=<hash> bash scripts/gpu_compile_trace_38b.sh   (carry .whl)
# shellcheck source=scripts/gpu-call.sh
source "$(dirname "${BASH_SOURCE[0]}")/gpu-call.sh"
begin=$(date +%s)
cuda_tests_to gpu-tests.txt packages/specter-models/tests/test_cuda.py -k "graph or argmax or capture"
echo "tests at $(($(date +%s) - begin)) s"
python3 -c "from specter_bench.prompt_sources import load_humaneval; \
print(load_humaneval(2)[1].text, end='')" >"$out/prompt.txt"
results=benchmarks/results/bench-deepseek-v2-lite-2026-12-04-cells37-24gb.jsonl
fresh() { TRITON_CACHE_DIR=$(mktemp -d); export TRITON_CACHE_DIR; }
dsv2=(--model deepseek-v2-lite --max-new-tokens 64 --prompt-file "$out/prompt.txt")
fresh
compile_trace default-first 200 --max-new-tokens 64
compile_trace default-second 200 --max-new-tokens 64
fresh
compile_trace dsv2-24gb-first 200 "${dsv2[@]}" --gpu-memory-gb 24 --hot-experts "$results"
compile_trace dsv2-24gb-second 200 "${dsv2[@]}" --gpu-memory-gb 24 --hot-experts "$results"
fresh
compile_trace dsv2-24gb-sampled-first 200 "${dsv2[@]}" --gpu-memory-gb 24 --hot-experts "$results" \
    --temperature 0.8 --seed 1
fresh
compile_trace dsv2-10gb-first 200 "${dsv2[@]}" --gpu-memory-gb 10
fresh
compile_trace dsv2-unlimited-first 200 "${dsv2[@]}"
