#!/usr/bin/env bash
# One device call (thirty-second session): streamed plain decoding's fill candidates sent in
# one packed copy from a pinned buffer (StreamRecord.pinned_uploads, the new default) against
# three copies from pageable memory (--pageable-uploads, the old path), Qwen1.5-MoE at 14 GB
# (scripts/plain_step_probe.py: TPOT over 64 tokens, then 16 under torch.profiler with each
# copy kind's device time and the host's CUDA runtime calls), arms alternated, one process
# each; then the models' CUDA tests of streamed fills and pipelined records.
#
#   SPECTER_GIT_COMMIT=b6d6997 bash scripts/gpu_uploads_32.sh   (carry .whl)
# Runs at b6d6997 only: the packed uploads measured no faster (3.55 against 3.53 ms a token)
# and were removed with --pageable-uploads; the probe's profiled numbers there still held the
# prompt's prefill (its loads were the "copy-engine time" per token), subtracted since.
# shellcheck source=scripts/gpu-call.sh
source "$(dirname "${BASH_SOURCE[0]}")/gpu-call.sh"
begin=$(date +%s)
for arm in pageable pinned pageable pinned; do
    flag=""
    [ "$arm" = pageable ] && flag="--pageable-uploads"
    # shellcheck disable=SC2086
    timeout 120 python3 scripts/plain_step_probe.py --model qwen1.5-moe --budget-gb 14 $flag \
        --out "$out/plain-step-uploads.jsonl" >"$out/log-probe.txt" 2>&1
    echo "== $arm (rc $?) at $(($(date +%s) - begin)) s"
    tail -n 1 "$out/plain-step-uploads.jsonl" | python3 -c "import json,sys; \
d=json.loads(sys.stdin.read()); print({k: d[k] for k in ('tpot_ms','pinned_uploads',\
'pipelined_records','hit_rate','profiled_wall_ms_per_token','kernel_busy_ms_per_token',\
'copy_busy_ms_per_token')}); print(d['copies_ms_per_token'], d['copies_per_token']); \
print(d['runtime_ms_per_token']); print(d['runtime_calls_per_token'])"
done
CUDA_TESTS_TIMEOUT=150 cuda_tests_to gpu-tests.txt packages/specter-models/tests/test_cuda.py \
    -k "stream or pipelined or fill"
echo "done at $(($(date +%s) - begin)) s"
