#!/usr/bin/env bash
# One device call (prepared in the twelfth session, not yet run): scripts/zero_copy_probe.py
# (a plain zero-copy read) beside scripts/streamed_gemm_probe.py (the grouped FP16 kernel's
# rate on experts streamed from pinned memory at 1 and 7 rows, per-pair and at five tile
# shapes, with the bits checked against resident slots).
#
#   SPECTER_GIT_COMMIT=<hash> bash scripts/gpu_streamed_gemm.sh
# shellcheck source=scripts/gpu-call.sh
source "$(dirname "${BASH_SOURCE[0]}")/gpu-call.sh"
timeout 120 python3 scripts/zero_copy_probe.py --experts 1,4 | tee "$out/zero-copy-probe.txt"
timeout 300 python3 scripts/streamed_gemm_probe.py --out "$out/streamed-gemm-probe.jsonl" \
    2>&1 | grep -vE "Warning|warn" | cut -c1-220
