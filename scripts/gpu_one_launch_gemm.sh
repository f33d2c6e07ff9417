#!/usr/bin/env bash
# One device call (sixteenth session): the batch-invariant GEMM in one launch (split-K partials
# summed by each tile's last arrival, no reduction kernel) and DeepSeek-V2's fused q/kv_a
# projection. In order:
#   1. specter-kernels' CUDA invariance tests (the new split path, its determinism over 200
#      launches and its CUDA-graph replays);
#   2. the tile sweep of DeepSeek-V2-Lite's linear shapes with the new kernel, written as a
#      tuned-tile file under $OUT (shapes not swept keep their shipped tiles);
#   3. step times, every expert resident, graphs replayed: the tree before this session
#      (unpacked under .ab/old by `git archive <base> packages scripts | tar -x -C .ab/old`)
#      and this tree with the new tiles, with the draft's linears on cuBLAS and on the
#      invariant GEMM; each also decodes plainly and speculatively and checks equal tokens.
#
#   SPECTER_GIT_COMMIT=<hash> bash scripts/gpu_one_launch_gemm.sh   (carry .ab and .whl)
# shellcheck source=scripts/gpu-call.sh
source "$(dirname "${BASH_SOURCE[0]}")/gpu-call.sh"
new_path="$PYTHONPATH"
old_path="${PYTHONPATH//$PWD\/packages/$PWD/.ab/old/packages}"
CUDA_TESTS_TIMEOUT=150 cuda_tests_to gpu-tests-one-launch.txt \
    packages/specter-kernels/tests/invariant/test_gpu_batch_invariance.py
timeout 330 python3 scripts/sweep_invariant_matmul.py --shapes dsv2 --max-seconds 300 \
    --max-seconds-per-shape 36 --out "$out/sweep-one-launch.jsonl" \
    --write-config "$out/invariant_matmul_nvidia_h200.json" 2>&1 | grep -v "^\s*$" | tail -14
PYTHONPATH="$old_path" resident_steps old 32
export SPECTER_INVARIANT_MATMUL_CONFIGS="$out/invariant_matmul_nvidia_h200.json"
PYTHONPATH="$new_path" resident_steps new 32
PYTHONPATH="$new_path" resident_steps new-invdraft 32 --invariant-draft-linears
