#!/usr/bin/env bash
# One device call (about 2 minutes): DeepSeek-V2-Lite at 24 GB, `specter` with its hot set,
# 2 HumanEval prompts x 64 tokens, with the prefetcher counting only evictable slots
# (3012227) and then, in a second process on the same machine, with the old count (pinned
# slots as room; the one line restored in this copy of the tree):
#
#   SPECTER_GIT_COMMIT=<hash> bash scripts/gpu_prefetch_ab.sh
# shellcheck source=scripts/gpu-call.sh
source "$(dirname "${BASH_SOURCE[0]}")/gpu-call.sh"
timeout 40 python3 -m pytest -q -p no:cacheprovider packages/specter-cache/tests \
    -k cuda 2>&1 | tail -1 | tee "$out/gpu-tests-cache.txt"
run() {
    timeout 100 python3 -m specter_bench bench --model deepseek-v2-lite --experiment tpot \
        --systems specter --budgets 24 --num-prompts 2 --max-new-tokens 64 --out "$out" \
        --tag "$1" --max-minutes 1.4 2>&1 | tr '\r' '\n' | grep -v -E ': +[0-9]+%' \
        >"$out/log-$1.txt"
    grep -E '^\| deep.*\| specter \||Error' "$out/log-$1.txt" | head -3
}
run prefetch-evictable
python3 - <<'PY'
from pathlib import Path
p = Path("packages/specter-cache/src/specter_cache/speculative_prefetcher.py")
s = p.read_text()
new = "            remaining += max(0, cache.slots_per_layer[layer] - len(pinned) - held)"
old = "            remaining += cache.slots_per_layer[layer] - (len(experts) - len(new))"
assert new in s
p.write_text(s.replace(new, old))
PY
run prefetch-all-slots
