#!/usr/bin/env bash
# One device call (twenty-fourth session): Qwen1.5-MoE's unlimited (hf, lru, specter) and
# 20 GB (specter, lru) cells with the probe skip at the defaults, one process each.
#
#   SPECTER_GIT_COMMIT=<hash> bash scripts/gpu_probe_skip_qwen.sh   (carry .whl)
# shellcheck source=scripts/gpu-call.sh
source "$(dirname "${BASH_SOURCE[0]}")/gpu-call.sh"
begin=$(date +%s)
model_cells qwen1.5-moe 170 unlimited hf,lru,specter qwen-skip-unlimited 2.5
echo "unlimited done at $(($(date +%s) - begin)) s"
model_cells qwen1.5-moe 140 20 specter,lru qwen-skip-20gb 2.0
echo "done at $(($(date +%s) - begin)) s"
