#!/usr/bin/env bash
# One device call (seventeenth session): this session's machines decode DeepSeek-V2-Lite's
# 24 GB `lru` at 25-32 ms per token, against 17-19 ms in the sixteenth session's runs, with
# almost no transfer stall and no garbage collection or allocator calls to speak of. Code or
# machine? `lru` alone at 24 GB, 2 HumanEval prompts x 64 tokens, one process each:
#   1. this tree with SPECTER_KERNELS_PDL=0 (eager launches without the PDL attribute);
#   2. this tree (PDL `wait`, the default);
#   3. the tree at the end of the sixteenth session (57215e0, under .ab/old);
#   4. the tree of the sixteenth session's targets run (34c3e22, under .ab/p);
# then Qwen1.5-MoE unlimited `lru` and `specter` at this tree (plain steps queued ahead).
#
#   SPECTER_GIT_COMMIT=<hash> bash scripts/gpu_lru_ab.sh   (carry .ab and .whl)
# shellcheck source=scripts/gpu-call.sh
source "$(dirname "${BASH_SOURCE[0]}")/gpu-call.sh"
new_path="$PYTHONPATH"
SPECTER_KERNELS_PDL=0 tpot_cells 95 24 lru lru-ab-pdl0 1.2 --num-prompts 2
tpot_cells 95 24 lru lru-ab-new 1.2 --num-prompts 2
PYTHONPATH="${new_path//$PWD\/packages/$PWD/.ab/old/packages}" \
    tpot_cells 95 24 lru lru-ab-57215e0 1.2 --num-prompts 2
PYTHONPATH="${new_path//$PWD\/packages/$PWD/.ab/p/packages}" \
    tpot_cells 95 24 lru lru-ab-34c3e22 1.2 --num-prompts 2
model_cells qwen1.5-moe 120 unlimited lru,specter queued-qwen-unlimited 1.7
