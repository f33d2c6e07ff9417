#!/usr/bin/env bash
# Train the three topology proxies (dsv2-proxy, qwen-proxy, phi-proxy) and measure them,
# in one command of at most 9 minutes on one GPU (see docs/training.md).
#
#   source scripts/gpu-env.sh && bash scripts/gpu_proxies.sh          # the H200 run
#   PYTHON=.venv/bin/python bash scripts/gpu_proxies.sh --smoke       # CPU check, ~3 min
#
# For each proxy: scripts/train_moe.py trains it into $PROXY_WORK/<arch> (300 to 360 MB:
# too large to come back from the GPU machine, so it is measured there), then
# `specter bench --experiment routing` teacher-forces 3 HumanEval prompts x 128 greedy
# tokens through the FP16 target and the INT4 draft (every expert resident): greedy
# agreement, sampled acceptance (T = 1 and 0.7), routing agreement per layer, distinct
# experts per layer against K, and cache hit rates per policy at a quarter and half of the
# experts. Each proxy's bench runs in the background while the next one trains.
#
# Files left under $OUT (7, each far below 16 MiB), written as each step finishes so that
# a run cut short still returns what finished:
#   bench-<arch>-proxies-<date>.jsonl    each proxy's bench records (3 files)
#   training-proxies-<date>.jsonl        the three training logs, one after another
#   proxies-<date>.log                   the console output of every step
#   proxies-<date>.md, working_set_proxies.png   the report (scripts/proxy_report.py)
#
# Every step has its own `timeout`, none reaching past PROXY_HARD_S, and the training time
# shrinks when earlier steps ran long, so a slow step costs its own results only.
# Settings (environment): PROXY_ARCHS (the three), PROXY_TRAIN_MINUTES (1.8 a proxy),
# PROXY_TOTAL_S (520: the plan), PROXY_HARD_S (560: no step runs past it), PROXY_BENCH_S
# (150 a bench), PROXY_PROMPTS (3), PROXY_NEW_TOKENS (128), PROXY_WORK (/tmp/proxy),
# PYTHON (python3).
set -uo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT" || exit 2
SMOKE=0
case "${1:-}" in
    --smoke) SMOKE=1 ;;
    "") ;;
    *) echo "usage: bash scripts/gpu_proxies.sh [--smoke]" >&2; exit 2 ;;
esac
if [ -z "${SPECTER_ROOT:-}" ] && [ "$SMOKE" = 0 ]; then
    # shellcheck source=/dev/null
    source scripts/gpu-env.sh
fi
export PYTHONUNBUFFERED=1
PY="${PYTHON:-python3}"
DATE="${PROXY_DATE:-$(date -u +%F)}"
OUT="${OUT:-/tmp/proxy-out}"
WORK="${PROXY_WORK:-/tmp/proxy}"
ARCHS="${PROXY_ARCHS:-dsv2-proxy qwen-proxy phi-proxy}"
TOK=packages/specter-models/src/specter_models/data/specter-code-tiny
TOTAL_S="${PROXY_TOTAL_S:-520}"
HARD_S="${PROXY_HARD_S:-560}"
BENCH_S="${PROXY_BENCH_S:-150}"
TRAIN_MINUTES="${PROXY_TRAIN_MINUTES:-1.8}"
PROMPTS="${PROXY_PROMPTS:-3}"
NEW_TOKENS="${PROXY_NEW_TOKENS:-128}"
DEPTHS=1,2,4,8,16,32
# Prompts are cut to 384 tokens so that prompt + 128 new tokens stay within the 512
# positions the proxies were trained on.
PROMPT_TOKENS=384
# 8 held-out evaluations instead of 16: keep-best still sees the curve, and more of the
# short budget goes to training steps; 32-token generation checks end the run sooner.
TRAIN_EXTRA=(--evals 8 --max-new-tokens 32)
# Seconds past --max-minutes before a trainer is killed (its finalize reserve is 45 s).
TRAIN_SLACK=90
if [ "$SMOKE" = 1 ]; then
    # Tiny everything: only checks that every step runs and writes what the report reads.
    TRAIN_MINUTES="${PROXY_TRAIN_MINUTES:-1.5}"
    TOTAL_S="${PROXY_TOTAL_S:-1200}"
    HARD_S="${PROXY_HARD_S:-1500}"
    BENCH_S="${PROXY_BENCH_S:-240}"
    PROMPTS="${PROXY_PROMPTS:-2}"
    NEW_TOKENS="${PROXY_NEW_TOKENS:-8}"
    DEPTHS=1,2,4,8
    TRAIN_EXTRA=(--smoke --steps 3 --batch-size 2 --seq-len 64 --evals 1 --eval-windows 2
        --max-new-tokens 4)
    TRAIN_SLACK=300  # a shared two-core machine can be slow to build and save 170 M params
fi
mkdir -p "$OUT" "$WORK" || exit 2
LOG="$OUT/proxies-$DATE.log"
TRAINING="$OUT/training-proxies-$DATE.jsonl"
: > "$TRAINING"
START=0  # bash counts SECONDS from the script's start, gpu-env.sh included
say() { echo "[gpu_proxies +$((SECONDS - START))s] $*" | tee -a "$LOG"; }
# A step's timeout: what it plans, but never past HARD_S (prints 0 when under 30 s remain).
capped() {
    local left=$((HARD_S - (SECONDS - START) - 5))
    if [ "$left" -lt 30 ]; then echo 0; elif [ "$1" -lt "$left" ]; then echo "$1"; else echo "$left"; fi
}

{
    echo "== specter gpu_proxies: $ARCHS, $(date -u +%FT%TZ), commit $(git rev-parse --short HEAD 2>/dev/null || echo unknown), smoke=$SMOKE"
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null || echo "no nvidia-smi"
    "$PY" -c "import sys, torch, transformers; print('python', sys.version.split()[0], 'torch', torch.__version__, 'transformers', transformers.__version__, 'cuda', torch.cuda.is_available())"
} 2>&1 | tee -a "$LOG"

# Seconds kept at the end for the last proxy's bench and the report.
FINAL_RESERVE=$((BENCH_S + 20))
set -- $ARCHS
COUNT=$#
INDEX=0
BENCH_PIDS=()
for ARCH in $ARCHS; do
    INDEX=$((INDEX + 1))
    LEFT=$((TOTAL_S - (SECONDS - START) - FINAL_RESERVE))
    REMAINING=$((COUNT - INDEX + 1))
    # Each proxy gets its share of what is left (less ~15 s of start-up outside the
    # trainer's own clock), never more than TRAIN_MINUTES.
    MINUTES=$(awk -v left="$LEFT" -v n="$REMAINING" -v cap="$TRAIN_MINUTES" \
        'BEGIN { m = (left / n - 15) / 60; if (m > cap) m = cap; printf "%.2f", m }')
    if awk -v m="$MINUTES" 'BEGIN { exit !(m < 0.75) }'; then
        say "SKIP $ARCH: only ${LEFT}s left for $REMAINING proxies"
        continue
    fi
    CKPT="$WORK/$ARCH"
    rm -rf "$CKPT"
    # The trainer stops itself at --max-minutes; the timeout only catches a hang.
    TRAIN_TIMEOUT=$(capped "$(awk -v m="$MINUTES" -v s="$TRAIN_SLACK" 'BEGIN { printf "%d", m * 60 + s }')")
    if [ "$TRAIN_TIMEOUT" = 0 ]; then
        say "SKIP $ARCH: past the hard limit of ${HARD_S}s"
        continue
    fi
    say "train $ARCH: --max-minutes $MINUTES (timeout ${TRAIN_TIMEOUT}s)"
    timeout -k 10 "$TRAIN_TIMEOUT" "$PY" scripts/train_moe.py --arch "$ARCH" --tokenizer "$TOK" \
        --max-minutes "$MINUTES" --out "$CKPT" "${TRAIN_EXTRA[@]}" 2>&1 | tee -a "$LOG"
    STATUS=${PIPESTATUS[0]}
    say "train $ARCH: exit $STATUS (1 = a self-check failed, 124 = timed out)"
    if [ -f "$CKPT/training_log.jsonl" ]; then
        cat "$CKPT/training_log.jsonl" >> "$TRAINING"
    fi
    if [ ! -f "$CKPT/config.json" ] || ! ls "$CKPT"/*.safetensors >/dev/null 2>&1; then
        say "SKIP bench $ARCH: no checkpoint was saved"
        continue
    fi
    BENCH_TIMEOUT=$(capped "$BENCH_S")
    if [ "$BENCH_TIMEOUT" = 0 ]; then
        say "SKIP bench $ARCH: past the hard limit of ${HARD_S}s"
        continue
    fi
    # --max-minutes stops starting new work 40 s before the kill, so records get written.
    BENCH_MINUTES=$(awk -v s="$BENCH_TIMEOUT" 'BEGIN { m = (s - 40) / 60; if (m < 0.2) m = 0.2; printf "%.2f", m }')
    say "bench $ARCH in the background (timeout ${BENCH_TIMEOUT}s, --max-minutes $BENCH_MINUTES)"
    (
        # The records go straight to $OUT (appended as the bench finishes each part).
        timeout -k 10 "$BENCH_TIMEOUT" "$PY" -m specter_bench bench --model "$CKPT" \
            --experiment routing --prompts humaneval --num-prompts "$PROMPTS" \
            --max-new-tokens "$NEW_TOKENS" --max-prompt-tokens "$PROMPT_TOKENS" \
            --depths "$DEPTHS" --out "$OUT" --tag "proxies-$DATE" \
            --max-minutes "$BENCH_MINUTES" > "$WORK/bench-$ARCH.log" 2>&1
        echo "bench $ARCH: exit $? (124 = timed out)" >> "$WORK/bench-$ARCH.log"
    ) &
    BENCH_PIDS+=($!)
    if [ "$SMOKE" = 1 ]; then
        # Two CPU cores cannot train one proxy while measuring another: one at a time.
        wait "$!"
    fi
done

say "waiting for ${#BENCH_PIDS[@]} bench(es)"
for PID in "${BENCH_PIDS[@]}"; do
    wait "$PID"
done
for ARCH in $ARCHS; do
    if [ -f "$WORK/bench-$ARCH.log" ]; then
        echo "---- bench $ARCH" >> "$LOG"
        # Progress bars redraw with carriage returns; keep their last state only.
        tr '\r' '\n' < "$WORK/bench-$ARCH.log" | grep -v 'run/s' >> "$LOG"
    fi
done
shopt -s nullglob  # no bench file: an empty list, not the pattern
BENCH_FILES=("$OUT"/bench-*-"proxies-$DATE".jsonl)
shopt -u nullglob
say "bench records: $(cat "${BENCH_FILES[@]}" 2>/dev/null | wc -l) in ${BENCH_FILES[*]}"

REPORT_TIMEOUT=$(capped 60)
[ "$REPORT_TIMEOUT" = 0 ] && REPORT_TIMEOUT=10
timeout -k 5 "$REPORT_TIMEOUT" "$PY" scripts/proxy_report.py "${BENCH_FILES[@]}" \
    "$TRAINING" --markdown "$OUT/proxies-$DATE.md" \
    --plot "$OUT/working_set_proxies.png" --date "$DATE" 2>&1 | tee -a "$LOG"
say "done; files in $OUT:"
ls -l "$OUT" | tee -a "$LOG"
