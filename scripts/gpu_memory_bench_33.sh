#!/usr/bin/env bash
# One device call (thirty-third session): the bench's own memory records after the one-stream
# fix: DeepSeek-V2-Lite at 24 GB, `lru` then `spec-lru` in one process (two stages: the second
# loads after the first's graphs), 3 HumanEval prompts x 64 tokens; prints each stage's
# planned, load and decode peaks.
#
#   SPECTER_GIT_COMMIT=<hash> bash scripts/gpu_memory_bench_33.sh   (carry .whl)
# shellcheck source=scripts/gpu-call.sh
source "$(dirname "${BASH_SOURCE[0]}")/gpu-call.sh"
begin=$(date +%s)
tpot_cells 160 24 lru,spec-lru memory33-24gb 2.5
memory_records "$out/bench-deepseek-v2-lite-memory33-24gb.jsonl"
echo "done at $(($(date +%s) - begin)) s"
