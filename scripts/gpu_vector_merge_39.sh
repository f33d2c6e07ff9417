#!/usr/bin/env bash
# One device call (thirty-ninth session): the MLA chunks' merge reading CHUNK_BLOCK chunks at
# once (SPECTER_MLA_VECTOR_MERGE, on by default) against the walk. The kernels' MLA CUDA
# tests and the models' exactness/graph CUDA tests; the attention block per layer at 264-2100
# keys (scripts/bench_mla_projection.py: chunk 64 walked, 64 and 32 vector); then
# DeepSeek-V2-Lite unlimited plain decoding (`lru`, 3 HumanEval prompts x 64 tokens), arms in
# turn: vector, walk, vector. One process an arm.
#
#   SPECTER_GIT_COMMIT=<hash> bash scripts/gpu_vector_merge_39.sh   (carry .whl)
# shellcheck source=scripts/gpu-call.sh
source "$(dirname "${BASH_SOURCE[0]}")/gpu-call.sh"
begin=$(date +%s)
CUDA_TESTS_TIMEOUT=120 cuda_tests_to gpu-tests-2026-12-04-merge39.txt \
    packages/specter-kernels/tests/test_gpu.py -k "mla"
CUDA_TESTS_TIMEOUT=200 cuda_tests_to gpu-tests-2026-12-04-merge39.txt \
    packages/specter-models/tests/test_cuda.py \
    -k "speculation_is_exact or graphed_speculation or batch_invariant_rows or value_projection or prologue"
echo "== tests at $(($(date +%s) - begin)) s"
timeout 120 python3 scripts/bench_mla_projection.py --lengths 264,512,1100,2100 --rows 1,5 \
    --points 64:serial,64:vector,32:vector --out "$out/mla-merge-2026-12-04.jsonl" \
    >"$out/log-mla-merge.txt" 2>&1
python3 - "$out/mla-merge-2026-12-04.jsonl" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
for part in ("attention_w_uv", "block_fused"):
    for r in rows:
        if r["part"] == part:
            print(part, r["split"], r["merge"], "L", r["L"], "T", r["T"], round(r["us"], 2))
PY
echo "== kernels at $(($(date +%s) - begin)) s"
switch_arms SPECTER_MLA_VECTOR_MERGE merge vector walk
