#!/usr/bin/env bash
# One device call (thirty-sixth session): the fused per-pair expert MLP (gate/up, SwiGLU and a
# slice of down in one launch, then the slices' sum) against the shipped two-launch per-pair
# path, one routed layer at DeepSeek-V2-Lite's shapes (scripts/fused_mlp_probe.py), PDL on
# and off.
#
#   SPECTER_GIT_COMMIT=<hash> bash scripts/gpu_fused_mlp_36.sh   (carry .whl; the kernel and the
#   probe are in commit e2331c3 only: check it out first)
# shellcheck source=scripts/gpu-call.sh
source "$(dirname "${BASH_SOURCE[0]}")/gpu-call.sh"
begin=$(date +%s)
for pdl in early 0; do
    SPECTER_KERNELS_PDL=$pdl timeout 240 python3 scripts/fused_mlp_probe.py \
        ${FUSED_CONFIGS:+--configs "$FUSED_CONFIGS"} \
        --out "$out/fused-mlp-pdl-$pdl.jsonl" >"$out/log-fused-$pdl.txt" 2>&1
    echo "== fused MLP, PDL $pdl (rc $?) at $(($(date +%s) - begin)) s"
    tail -n 30 "$out/log-fused-$pdl.txt" | cut -c1-220
done
