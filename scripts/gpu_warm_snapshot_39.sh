#!/usr/bin/env bash
# One device call (thirty-ninth session): the prefetcher warmed up at load (06c67d0). The
# cache's CUDA tests; then `specter generate` on DeepSeek-V2-Lite at 24 GB with the cells37
# bench file's hot set, HumanEval/1, 64 tokens, each iteration traced: --depth 3; --depth auto
# with a fresh depth-costs folder (its first run, then primed by it); --depth 2.
#
#   SPECTER_GIT_COMMIT=<hash> bash scripts/gpu_warm_snapshot_39.sh   (carry .whl)
# shellcheck source=scripts/gpu-call.sh
source "$(dirname "${BASH_SOURCE[0]}")/gpu-call.sh"
begin=$(date +%s)
cuda_tests_to gpu-tests-2026-12-04-warm39.txt packages/specter-cache/tests/test_expert_cache_cuda.py
echo "  at $(($(date +%s) - begin)) s"
SPECTER_CACHE_DIR=$(mktemp -d)
export SPECTER_CACHE_DIR
humaneval_prompt 1
results=benchmarks/results/bench-deepseek-v2-lite-2026-12-04-cells37-24gb.jsonl
iteration_trace 24gb-k3 100 --gpu-memory-gb 24 --hot-experts "$results" --depth 3
echo "  at $(($(date +%s) - begin)) s"
iteration_trace 24gb-auto-first 100 --gpu-memory-gb 24 --hot-experts "$results"
echo "  at $(($(date +%s) - begin)) s"
cp "$SPECTER_CACHE_DIR"/depth-costs/*.json "$out/" 2>/dev/null
iteration_trace 24gb-auto-primed 100 --gpu-memory-gb 24 --hot-experts "$results"
echo "  at $(($(date +%s) - begin)) s"
iteration_trace 24gb-k2 100 --gpu-memory-gb 24 --hot-experts "$results" --depth 2
echo "  at $(($(date +%s) - begin)) s"
python3 - "$out"/*.json <<'PY'
import json, sys
for path in sys.argv[1:]:
    costs = json.load(open(path))["costs"]
    print(path.rsplit("/", 1)[-1][:40], {k: {n: round(v * 1e3, 2) for n, v in costs[k].items()}
                                         for k in ("draft", "verify")})
PY
