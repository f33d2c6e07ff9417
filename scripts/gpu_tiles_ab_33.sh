#!/usr/bin/env bash
# One device call (thirty-third session): the per-pair tile for experts read in place.
# 1. scripts/streamed_gemm_probe.py (gpu_streamed_tiles_33.sh) at 1 and 7 rows, 1 and 6
#    experts streamed: the shipped 32 columns x 128 against 16 x 256 and neighbours (the first
#    call measured 1 streamed expert of 1 row at 34.7 GB/s shipped, 51.1 GB/s at 16/4/4/256).
# 2. DeepSeek-V2-Lite at 24 GB, `specter` at K = 6 (ab_specter_24gb), the shipped tile then
#    SPECTER_PER_PAIR_TILE=16/4/4/256, one process each; then plain streamed decoding
#    (`specter-plain-fill`) with each, while the call's time lasts.
#
#   SPECTER_GIT_COMMIT=<hash> bash scripts/gpu_tiles_ab_33.sh   (carry .whl)
# shellcheck source=scripts/gpu-call.sh
source "$(dirname "${BASH_SOURCE[0]}")/gpu-call.sh"
begin=$(date +%s)
elapsed() { echo $(($(date +%s) - begin)); }
NEW=${NEW_TILE:-16/4/4/256}
TILES_ROWS=1,7 TILES_STREAMED=1,6 TILES_TIMEOUT=80 \
    TILES_CONFIGS="32/4/4/128,16/4/4/256,16/3/4/512,32/4/4/256,16/4/2/256,16/5/4/256" \
    bash scripts/gpu_streamed_tiles_33.sh
echo "probe done at $(elapsed) s"
ab_specter_24gb tiles33-shipped
echo "shipped done at $(elapsed) s"
(export SPECTER_PER_PAIR_TILE=$NEW && ab_specter_24gb tiles33-new)
echo "new done at $(elapsed) s"
if [ "$(elapsed)" -lt 420 ]; then
    (export SPECTER_PER_PAIR_TILE=$NEW && tpot_cells 70 24 specter-plain-fill tiles33-plain-new 1.0)
    echo "plain new done at $(elapsed) s"
fi
if [ "$(elapsed)" -lt 500 ]; then
    tpot_cells 70 24 specter-plain-fill tiles33-plain-shipped 1.0
    echo "plain shipped done at $(elapsed) s"
fi
