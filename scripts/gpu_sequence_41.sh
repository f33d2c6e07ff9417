#!/usr/bin/env bash
# One device call, written in the fortieth session for the next one (not yet run): where the
# all-resident plain step's 2.07-2.11 ms go at the current code (the thirty-fifth session's
# kernel-by-kernel sequence was taken at 2.15-2.36 ms, before the 32-key MLA chunks, the
# block merge and the absorbed queries). DeepSeek-V2-Lite, every expert resident, plain
# decoding: one decode token's kernels in launch order with each one's median time and the
# idle gap before it (scripts/plain_step_probe.py --sequence), PDL off (each kernel's own
# time) and early (the shipped mode), one process each.
#
#   SPECTER_GIT_COMMIT=<hash> bash scripts/gpu_sequence_41.sh   (carry .whl)
# shellcheck source=scripts/gpu-call.sh
source "$(dirname "${BASH_SOURCE[0]}")/gpu-call.sh"
begin=$(date +%s)
for pdl in 0 early; do
    step_sequence unlimited41 "$pdl"
done
echo "all done at $(($(date +%s) - begin)) s"
