#!/usr/bin/env bash
# One device call (thirty-seventh session): Phi-3.5-MoE with a pruned draft, which no session
# had measured: 40 GB, specter with --draft-pruned 0 and with the default auto (with lru in
# that process), then 32 GB with auto and lru, 1 HumanEval prompt x 32 tokens, one process
# each.
#
#   SPECTER_GIT_COMMIT=<hash> bash scripts/gpu_phi_37.sh   (carry .whl)
# shellcheck source=scripts/gpu-call.sh
source "$(dirname "${BASH_SOURCE[0]}")/gpu-call.sh"
begin=$(date +%s)
phi() {
    model_cells phi-3.5-moe "$@" --num-prompts 1 --max-new-tokens 32
}
phi 175 40 specter pruned37-phi-0-40gb 2.6 --draft-pruned 0
echo "== Phi 40 GB pruned 0 at $(($(date +%s) - begin)) s"
phi 190 40 specter,lru pruned37-phi-auto-40gb 2.9
echo "== Phi 40 GB pruned auto at $(($(date +%s) - begin)) s"
phi 190 32 specter,lru pruned37-phi-auto-32gb 2.9
echo "== Phi 32 GB pruned auto at $(($(date +%s) - begin)) s"
hot_set_records "$out"/bench-*37*.jsonl
