#!/usr/bin/env bash
# One device call: DeepSeek-V2-Lite's resident steps profiled kernel by kernel
# (scripts/profile_steps.py), the current defaults.
source "$(dirname "$0")/gpu-call.sh"
timeout 400 python3 scripts/profile_steps.py --tag profile --out "$out/profile-steps.jsonl" \
    >"$out/log-profile.txt" 2>&1
grep -v -i warn "$out/log-profile.txt" | cut -c1-150
