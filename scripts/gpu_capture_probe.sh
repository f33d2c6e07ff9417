#!/usr/bin/env bash
# One device call (twenty-ninth session): why the models' CUDA tests selected with
# `-k stream` fail four where `-k "stream or budget"` passes (twenty-eighth session), with
# scripts/capture_sync_guard.py reporting any host sync under capture; then, with
# HELD_AB=1, the fixed K = 1 held-copy A/B; then `specter generate` at 24 GB with the
# CLI's defaults and --depth 0.
#
#   SPECTER_GIT_COMMIT=<hash> bash scripts/gpu_capture_probe.sh   (carry .whl)
# shellcheck source=scripts/gpu-call.sh
source "$(dirname "${BASH_SOURCE[0]}")/gpu-call.sh"
begin=$(date +%s)
export PYTHONPATH="$PWD/scripts:$PYTHONPATH"
models=packages/specter-models/tests/test_cuda.py
for sel in "stream" "stream and phimoe and misses" "stream or budget"; do
    tag=$(echo "$sel" | tr ' ' '-')
    timeout 240 python3 -m pytest -q -p no:cacheprovider -p capture_sync_guard -rfE \
        --tb=long "$models" -k "$sel" >"$out/tests-$tag.txt" 2>&1
    echo "== -k '$sel' at $(($(date +%s) - begin)) s"
    grep -E "passed|failed" "$out/tests-$tag.txt" | tail -2
    grep -c "CAPTURE-SYNC" "$out/tests-$tag.txt"
done
grep -m3 -A16 "CAPTURE-SYNC" "$out/tests-stream.txt" | cut -c1-220
grep -E "^E " "$out/tests-stream.txt" | sort | uniq -c | sort -rn | head -8 | cut -c1-220
if [ "${HELD_AB:-0}" = 1 ]; then
    tpot_cells 200 24 specter,specter-held held-k1-24gb 3.0 --depth 1
fi
timeout 150 python3 -m specter_bench generate --model deepseek-v2-lite --gpu-memory-gb 24 \
    --depth 0 --max-new-tokens 64 --json --no-stream \
    "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n" \
    >"$out/generate-depth0-24gb.txt" 2>"$out/generate-depth0-24gb.err"
tail -n 1 "$out/generate-depth0-24gb.txt" | cut -c1-900
tail -n 3 "$out/generate-depth0-24gb.err"
echo "generate done at $(($(date +%s) - begin)) s"
