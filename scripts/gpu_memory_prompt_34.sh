#!/usr/bin/env bash
# One device call (thirty-fourth session): where `lru`'s decode at DeepSeek-V2-Lite 24 GB goes
# 0.2 GB over its plan in the bench (23.84 against 23.64 in cells34): memory_peak_probe.py on
# HumanEval/1 (507 tokens, the longest measured prompt) against HumanEval/0 (349), 64 tokens.
#
#   SPECTER_GIT_COMMIT=<hash> bash scripts/gpu_memory_prompt_34.sh   (carry .whl)
# shellcheck source=scripts/gpu-call.sh
source "$(dirname "${BASH_SOURCE[0]}")/gpu-call.sh"
begin=$(date +%s)
for index in 1 0; do
    timeout 200 python3 scripts/memory_peak_probe.py --system lru --prompt-index "$index" \
        --tokens 64 --max-seq-len 704 --largest 10 --out "$out/memory-lru-prompt$index.json" \
        >"$out/log-memory-prompt$index.txt" 2>&1
    echo "== prompt $index (rc $?) at $(($(date +%s) - begin)) s"
    python3 -c "import json; d=json.load(open('$out/memory-lru-prompt$index.json')); \
print('plan', round(d['plan_gb']['expected_peak_bytes'], 3), 'max allocated', \
round(d['max_allocated_gb'], 3)); \
[print(k, round(d[k]['peak_gb'], 3), d[k]['event'], d[k]['by_site'][:4]) for k in ('load+capture', 'whole')]; \
print('\n'.join(d['whole']['largest']))" 2>&1 | cut -c1-900
done
echo "done at $(($(date +%s) - begin)) s"
