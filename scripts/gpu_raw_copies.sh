#!/usr/bin/env bash
# One device call (twenty-seventh session): the copy engine's raw cudaMemcpyAsync issues
# against copy_ (both with the deferred counts), DeepSeek-V2-Lite at 24 GB with the
# twenty-sixth session's hot set: host_gaps_probe.py per arm (copy_, raw, copy_ again; one
# process each), then the CUDA tests of specter-cache and the streamed models tests.
#
# Ran at 3021dd3; the raw copies were removed after it (no gain beyond drift).
#
#   SPECTER_GIT_COMMIT=<hash> bash scripts/gpu_raw_copies.sh   (carry .whl)
# shellcheck source=scripts/gpu-call.sh
source "$(dirname "${BASH_SOURCE[0]}")/gpu-call.sh"
begin=$(date +%s)
mkdir -p /tmp/copy-calls
cat >/tmp/copy-calls/sitecustomize.py <<'PY'
from specter_cache import copy_engine

_engine = copy_engine.CudaCopyEngine.__init__
def _copy_calls(self, *args, **kwargs):
    kwargs["raw_copies"] = False
    _engine(self, *args, **kwargs)
copy_engine.CudaCopyEngine.__init__ = _copy_calls
print("copies through copy_", flush=True)
PY
depth=${RAW_DEPTH:-auto}
(export PYTHONPATH="/tmp/copy-calls:$PYTHONPATH" GAPS_DEPTHS=$depth GAPS_TAG=copy \
    && bash scripts/gpu_host_gaps.sh)
(export GAPS_DEPTHS=$depth GAPS_TAG=raw && bash scripts/gpu_host_gaps.sh)
(export PYTHONPATH="/tmp/copy-calls:$PYTHONPATH" GAPS_DEPTHS=$depth GAPS_TAG=copy-again \
    && bash scripts/gpu_host_gaps.sh)
echo "probes done at $(($(date +%s) - begin)) s"
cuda_tests_to gpu-tests.txt packages/specter-cache/tests/test_expert_cache_cuda.py
cuda_tests_to gpu-tests.txt packages/specter-models/tests/test_cuda.py -k "stream or budget"
echo "done at $(($(date +%s) - begin)) s"
