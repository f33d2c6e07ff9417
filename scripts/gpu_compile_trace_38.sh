#!/usr/bin/env bash
# One device call (thirty-eighth session): which Triton kernels `specter generate` compiles
# in which phase (scripts/compile_trace_probe.py), on a fresh Triton cache and then on the
# cache the first run filled: the built-in default model, then DeepSeek-V2-Lite at 24 GB
# with a bench results file's hot set and pruned experts on HumanEval/1, 64 tokens.
#
#   SPECTER_GIT_COMMIT=<hash> bash scripts/gpu_compile_trace_38.sh   (carry .whl)
# shellcheck source=scripts/gpu-call.sh
source "$(dirname "${BASH_SOURCE[0]}")/gpu-call.sh"
TRITON_CACHE_DIR=$(mktemp -d)
export TRITON_CACHE_DIR
python3 -c "from specter_bench.prompt_sources import load_humaneval; \
print(load_humaneval(2)[1].text, end='')" >"$out/prompt.txt"
results=benchmarks/results/bench-deepseek-v2-lite-2026-12-04-cells37-24gb.jsonl
compile_trace default-first 200 --max-new-tokens 64
compile_trace default-second 200 --max-new-tokens 64
compile_trace dsv2-24gb-first 260 --model deepseek-v2-lite --max-new-tokens 64 \
    --prompt-file "$out/prompt.txt" --gpu-memory-gb 24 --hot-experts "$results"
compile_trace dsv2-24gb-second 200 --model deepseek-v2-lite --max-new-tokens 64 \
    --prompt-file "$out/prompt.txt" --gpu-memory-gb 24 --hot-experts "$results"
