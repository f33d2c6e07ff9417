#!/usr/bin/env bash
# One device call: an A/B of specter-cache before the batched prefetch (8ab2acf, unpacked
# under ab_old/ by `git archive 8ab2acf packages/specter-cache/src/specter_cache | tar -x -C
# ab_old`) and after it, DeepSeek-V2-Lite's specter at 24 GB, fixed K = 6, 3 HumanEval
# prompts x 64 tokens, one process each (old, new, old); then a host profile of the new code.
#
#   SPECTER_GIT_COMMIT=<hash> bash scripts/gpu_prefetch_batch_ab.sh
# shellcheck source=scripts/gpu-call.sh
source "$(dirname "${BASH_SOURCE[0]}")/gpu-call.sh"
new_path="$PYTHONPATH"
old_path="$PWD/ab_old/packages/specter-cache/src:$PYTHONPATH"
PYTHONPATH="$old_path" ab_specter_24gb prefetch-ab-old-1
PYTHONPATH="$new_path" ab_specter_24gb prefetch-ab-new
PYTHONPATH="$old_path" ab_specter_24gb prefetch-ab-old-2
hot=$(ls "$out"/bench-deepseek-v2-lite-prefetch-ab-new.jsonl)
timeout 150 python3 scripts/profile_decode_host.py --budget-gb 24 --depth 6 --humaneval 0 \
    --miss-path stream --hot-experts "$hot" --top 25 >"$out/profile-host-24gb-k6.txt" 2>&1
grep -E "^K=|tottime|expert_cache|prefetch|copy_engine|routing_counter" \
    "$out/profile-host-24gb-k6.txt" | cut -c1-160 | head -40
