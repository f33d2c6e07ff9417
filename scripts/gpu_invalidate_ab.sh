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
run() {
    local tag=$1
    timeout 170 python3 -m specter_bench bench --experiment tpot --num-prompts 3 --depth 6 \
        --tag "$tag" --max-minutes 2.4 --model deepseek-v2-lite --systems specter \
        --budgets 24 --max-new-tokens 64 --out "$out" >"$out/log-$tag.txt" 2>&1
    python3 -c "import specter_cache; print('$tag', specter_cache.__file__)"
    tr '\r' '\n' <"$out/log-$tag.txt" | grep -E '^\| deep|Error' | head -2 | cut -c1-200
}
timeout 60 python3 scripts/copy_queue_probe.py | tee "$out/copy-queue-probe.jsonl"
PYTHONPATH="$new_path" run inval-ab-fill-1
PYTHONPATH="$old_path" run inval-ab-copy
PYTHONPATH="$new_path" run inval-ab-fill-2
