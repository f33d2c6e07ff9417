#!/usr/bin/env bash
# Prepared in the thirty-second session, run in the thirty-third (gpu_probes_33.sh and
# gpu_tiles_ab_33.sh call it; docs/benchmarks.md, "Thirty-third session"): how fast
# the per-pair (batch-invariant) expert kernels read missing experts in place at wider K
# steps. A streamed plain step spends 8.9 of its 9.7 ms in those kernels at DeepSeek-V2-Lite
# 24 GB (about 32 GB/s; a plain zero-copy read reaches 41-45): with block_k 128 each program
# reads 256-byte runs of a weight row from the host. scripts/streamed_gemm_probe.py at 1 and
# 7 rows with 1, 2 and 6 experts streamed, per-pair tiles only (block_n/stages/warps/block_k).
#
#   SPECTER_GIT_COMMIT=<hash> bash scripts/gpu_streamed_tiles_33.sh   (carry .whl)
# shellcheck source=scripts/gpu-call.sh
source "$(dirname "${BASH_SOURCE[0]}")/gpu-call.sh"
begin=$(date +%s)
timeout "${TILES_TIMEOUT:-380}" python3 scripts/streamed_gemm_probe.py --rows "${TILES_ROWS:-1,7}" --streamed "${TILES_STREAMED:-1,2,6}" --staging 0 \
    --configs "" --per-pair-configs \
    "${TILES_CONFIGS:-32/4/4/128,32/4/4/256,32/3/4/512,16/4/4/256,16/3/4/512,64/4/4/256}" \
    --out "$out/streamed-tiles.jsonl" 2>&1 | python3 -c "import json,sys
for line in sys.stdin:
    try: d = json.loads(line)
    except ValueError: print(line.rstrip()[:200]); continue
    print(d['rows'], d['streamed'], d['tile'], round(d['resident_ms'], 4), round(d['streamed_ms'], 4),
          round(d['streamed_gb_per_s'], 1), d['equal'])"
echo "done at $(($(date +%s) - begin)) s"
