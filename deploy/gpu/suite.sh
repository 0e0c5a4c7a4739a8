#!/usr/bin/env bash
# The GPU checks of Kernel Foundry, in stages that each fit one device call (< 10 minutes).
#   deploy/gpu/suite.sh probe|tests|runner-bench|template-bench|run [extra args]
# Expects the wheels of deploy/gpu/fetch_wheels.sh in .whl/ and writes logs under $OUT (or ./gpu-out).
set -uo pipefail
cd "$(dirname "$0")/../.."
out=${OUT:-gpu-out}
mkdir -p "$out"
if [ -d .whl ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    || { echo "wheel install failed"; exit 1; }
  export PYTHONPATH=/tmp/site:$PWD PATH=/tmp/site/bin:$PATH
else
  export PYTHONPATH=$PWD
fi
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 KFOUNDRY_HOME=/tmp/kfhome
stage=${1:-probe}
shift || true
case "$stage" in
  probe)
    nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.max.sm --format=csv
    python3 -c "import sys, torch, triton; print(sys.version.split()[0], torch.__version__, triton.__version__, torch.cuda.get_device_name(0), torch.cuda.get_device_properties(0))"
    unshare -n true && echo "unshare -n: ok"
    which nats-server && nats-server --version
    python3 -c "import schemas, actors.bus, gpu_runner.service, experience; print('imports ok')"
    ;;
  tests)
    [ $# -gt 0 ] || set -- tests/gpu_runner tests/diagnosis tests/experts/test_template_gpu.py
    timeout 560 python3 -m pytest -m gpu -W default -q -p no:cacheprovider -o addopts="" \
      --junitxml "$out/gpu_tests.xml" "$@" 2>&1 \
      | tee "$out/gpu_tests.log" | tail -40
    ;;
  runner-bench)
    timeout 570 python3 bench/gpu_runner_bench.py "$@" 2>&1 | tee "$out/gpu_runner_bench.log" | tail -40
    ;;
  template-bench)
    timeout 570 python3 -m bench.template_bench --device cuda --out "$out/template" "$@" 2>&1 \
      | tee "$out/template_bench.log" | tail -45
    ;;
  run)
    task=${1:-examples/tasks/layer_norm_gelu.py}
    shift || true
    timeout 570 python3 -m actors.cli run "$task" --device cuda --run-dir "$out/run" --log-level info "$@" 2>&1 \
      | tee "$out/run.log" | tail -25
    ;;
  py)
    timeout 570 python3 "$@" 2>&1 | tee "$out/py.log" | tail -80
    ;;
  *) echo "unknown stage $stage"; exit 2 ;;
esac
