#!/usr/bin/env bash
# One device call (thirty-eighth session): `specter generate --depth auto` with every expert
# resident, without the adaptive depth's warm-up (--depth-warmup 0) and with it (the default,
# 32 tokens), arms alternated, one process each, on HumanEval/1: DeepSeek-V2-Lite 64 and 128
# tokens, Qwen1.5-MoE 64 tokens. Then the CLI tests of generate on the GPU.
#
#   SPECTER_GIT_COMMIT=<hash> bash scripts/gpu_depth_warmup_38.sh   (carry .whl)
# shellcheck source=scripts/gpu-call.sh
source "$(dirname "${BASH_SOURCE[0]}")/gpu-call.sh"
begin=$(date +%s)
python3 -c "from specter_bench.prompt_sources import load_humaneval; \
print(load_humaneval(2)[1].text, end='')" >"$out/prompt.txt"
for arm in off on off2 on2; do
    case $arm in off*) warm=(--depth-warmup 0) ;; *) warm=() ;; esac
    generate_record "dsv2-unlimited-64-$arm" 120 "${warm[@]}"
    echo "  at $(($(date +%s) - begin)) s"
done
for arm in off on; do
    case $arm in off*) warm=(--depth-warmup 0) ;; *) warm=() ;; esac
    generate_record "dsv2-unlimited-128-$arm" 120 --max-new-tokens 128 "${warm[@]}"
    generate_record "qwen-unlimited-64-$arm" 120 --model qwen1.5-moe "${warm[@]}"
    echo "  at $(($(date +%s) - begin)) s"
done
generate_lines depth_warmup_s
