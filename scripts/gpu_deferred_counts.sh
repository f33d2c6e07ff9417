#!/usr/bin/env bash
# One device call (twenty-seventh session): the deferred counts (a streamed verification's
# record and the prefetcher's closing run once the next draft is queued) against counting at
# once, DeepSeek-V2-Lite at 24 GB with the twenty-sixth session's hot set: host_gaps_probe.py
# per arm (off, on, off again; one process each), then specter and lru in one bench process.
#
#   SPECTER_GIT_COMMIT=<hash> bash scripts/gpu_deferred_counts.sh   (carry .whl)
# shellcheck source=scripts/gpu-call.sh
source "$(dirname "${BASH_SOURCE[0]}")/gpu-call.sh"
begin=$(date +%s)
mkdir -p /tmp/counts-at-once
cat >/tmp/counts-at-once/sitecustomize.py <<'PY'
from specter_cache import speculative_prefetcher as sp
from specter_models import streamed_misses as sm

_record, _prefetcher = sm.StreamRecord.__init__, sp.SpeculativePrefetcher.__init__
def _record_now(self, *args, **kwargs):
    kwargs["deferred"] = False
    _record(self, *args, **kwargs)
def _close_now(self, *args, **kwargs):
    kwargs["deferred_close"] = False
    _prefetcher(self, *args, **kwargs)
sm.StreamRecord.__init__, sp.SpeculativePrefetcher.__init__ = _record_now, _close_now
print("counts made at once", flush=True)
PY
depth=${COUNTS_DEPTH:-auto}
(export PYTHONPATH="/tmp/counts-at-once:$PYTHONPATH" GAPS_DEPTHS=$depth GAPS_TAG=off \
    && bash scripts/gpu_host_gaps.sh)
(export GAPS_DEPTHS=$depth GAPS_TAG=on && bash scripts/gpu_host_gaps.sh)
(export PYTHONPATH="/tmp/counts-at-once:$PYTHONPATH" GAPS_DEPTHS=$depth GAPS_TAG=off-again \
    && bash scripts/gpu_host_gaps.sh)
echo "probes done at $(($(date +%s) - begin)) s"
if [ "${COUNTS_BENCH:-1}" = 1 ]; then
    tpot_cells 170 24 specter,lru deferred-counts-24gb 2.4
fi
echo "done at $(($(date +%s) - begin)) s"
