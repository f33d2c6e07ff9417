#!/usr/bin/env bash
# One device call (thirty-seventh session): the thirty-sixth session's CPU-only commits on the
# GPU. The models' CUDA tests of the hot-set and pruned drafts; `specter generate` at 24 GB
# with a bench results file (cells37: its hot set and the pruned experts its record names,
# c186d55) on HumanEval/1; `specter generate` at 10 GB, where only a pruned draft fits beside
# one slot a layer (auto prunes there, 345881e), with --depth auto and with --depth 2.
#
#   SPECTER_GIT_COMMIT=<hash> bash scripts/gpu_generate_file_37.sh   (carry .whl)
# shellcheck source=scripts/gpu-call.sh
source "$(dirname "${BASH_SOURCE[0]}")/gpu-call.sh"
begin=$(date +%s)
CUDA_TESTS_TIMEOUT=200 cuda_tests_to gpu-tests-generate-file-37.txt \
    packages/specter-models/tests/test_cuda.py -k "hot or pruned"
echo "== tests at $(($(date +%s) - begin)) s"
python3 -c "from specter_bench.prompt_sources import load_humaneval; \
print(load_humaneval(2)[1].text, end='')" >"$out/prompt.txt"
results=benchmarks/results/bench-deepseek-v2-lite-2026-12-04-cells37-24gb.jsonl
generate_record file-24gb 150 --gpu-memory-gb 24 --hot-experts "$results"
generate_record auto-10gb 150 --gpu-memory-gb 10 --depth auto
generate_record depth2-10gb 150 --gpu-memory-gb 10 --depth 2
echo "  at $(($(date +%s) - begin)) s"
