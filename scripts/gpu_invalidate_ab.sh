#!/usr/bin/env bash
# One device call: scripts/copy_queue_probe.py, then an A/B of the streamed path's map
# invalidations as fill kernels (the working tree) against host-to-device copies (0b6a9b0's
# specter-cache, unpacked first by
#   git archive 0b6a9b0 packages/specter-cache/src/specter_cache | tar -x -C ab_old
# and not committed): DeepSeek-V2-Lite's specter at 24 GB, fixed K = 6, 3 HumanEval prompts
# x 64 tokens, one process each (fill, copy, fill):
#
#   SPECTER_GIT_COMMIT=<hash> bash scripts/gpu_invalidate_ab.sh
# shellcheck source=scripts/gpu-call.sh
source "$(dirname "${BASH_SOURCE[0]}")/gpu-call.sh"
new_path="$PYTHONPATH"
old_path="$PWD/ab_old/packages/specter-cache/src:$PYTHONPATH"
timeout 60 python3 scripts/copy_queue_probe.py | tee "$out/copy-queue-probe.jsonl"
PYTHONPATH="$new_path" ab_specter_24gb inval-ab-fill-1
PYTHONPATH="$old_path" ab_specter_24gb inval-ab-copy
PYTHONPATH="$new_path" ab_specter_24gb inval-ab-fill-2
