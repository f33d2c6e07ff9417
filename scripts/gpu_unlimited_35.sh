#!/usr/bin/env bash
# One device call (thirty-fifth session): where DeepSeek-V2-Lite's all-resident plain step
# (the unlimited cell) is furthest from the memory's rate. The routed-expert layer alone
# (scripts/routed_layer_probe.py: the per-pair launch per tile, cuBLAS and a device copy of
# the same bytes) with PDL off and on, then the whole step's kernels in launch order
# (plain_step_probe.py --sequence) with PDL off (each kernel's own time) and on.
#
#   SPECTER_GIT_COMMIT=<hash> bash scripts/gpu_unlimited_35.sh   (carry .whl)
# shellcheck source=scripts/gpu-call.sh
source "$(dirname "${BASH_SOURCE[0]}")/gpu-call.sh"
begin=$(date +%s)
for pdl in 0 early; do
    SPECTER_KERNELS_PDL=$pdl timeout 150 python3 scripts/routed_layer_probe.py \
        --out "$out/routed-layer-pdl-$pdl.jsonl" >"$out/log-routed-$pdl.txt" 2>&1
    echo "== routed layer, PDL $pdl (rc $?) at $(($(date +%s) - begin)) s"
    cut -c1-160 "$out/log-routed-$pdl.txt" | tail -n 14
done
for pdl in 0 early; do
    step_sequence unlimited "$pdl"
done
echo "all done at $(($(date +%s) - begin)) s"
