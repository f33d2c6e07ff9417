#!/usr/bin/env bash
# Sourced by the one-device-call scripts (gpu_*.sh): strict mode, the repository root as
# the working folder, compiled Triton kernels, the GPU machine's environment
# (scripts/gpu-env.sh) and $out, the folder results go to ($OUT on the device machine).
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.." || exit 1
export TRITON_INTERPRET=0
# shellcheck source=/dev/null
source scripts/gpu-env.sh
out="${OUT:-/tmp/specter-out}"
mkdir -p "$out"
