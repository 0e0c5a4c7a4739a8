#!/usr/bin/env bash
# Issue-12 checks of the evaluator on a GPU machine, in one device call (< 10 minutes):
#   cold `kfoundry eval` with --timeout 20 (honest Triton correct, an infinite loop timed out),
#   the size sweep of bench/scale_bench.py, and that nothing is left behind afterwards.
# Expects the wheels of deploy/gpu/fetch_wheels.sh in .whl/; logs under $OUT (or ./gpu-out).
#   deploy/gpu/scale_check.sh [eval|sweep|all] [scale_bench args...]
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
stage=${1:-all}
shift || true
leftovers() {
  echo "--- left behind: /dev/shm kf-* folders, kf-runner folders, worker processes"
  ls -d /dev/shm/kf-* /tmp/kf-runner-* 2>/dev/null || echo "(no folders)"
  pgrep -af "gpu_runner" || echo "(no gpu_runner processes)"
  free -g | head -2
  nvidia-smi --query-gpu=memory.used --format=csv,noheader
}
if [ "$stage" = eval ] || [ "$stage" = all ]; then
  nvidia-smi --query-gpu=name,memory.total,memory.used --format=csv,noheader
  for cand in honest_add_relu infinite_loop; do
    start=$(date +%s.%N)
    timeout 200 python3 -m gpu_runner tests/gpu_runner/references/add_relu.py "tests/gpu_runner/candidates/$cand.py" \
      --device cuda --timeout 20 --json > "$out/eval_$cand.json" 2> "$out/eval_$cand.err"
    rc=$?
    end=$(date +%s.%N)
    python3 - "$out/eval_$cand.json" "$cand" "$rc" "$start" "$end" <<'PY'
import json, sys
path, cand, rc, start, end = sys.argv[1:]
try:
    r = json.load(open(path))
    print(f"eval {cand}: rc={rc} status={r['status']} candidate_total_s={r['stages'].get('total_s'):.1f} "
          f"wall_s={float(end) - float(start):.1f} summary={r['summary'][:120]}")
except Exception as exc:
    print(f"eval {cand}: rc={rc} no result ({exc})")
PY
  done
  leftovers
fi
if [ "$stage" = sweep ] || [ "$stage" = all ]; then
  timeout 480 python3 bench/scale_bench.py "$@" 2>&1 | tee "$out/scale_bench.log" | grep -v '^\s*$' | grep -v '\[debug' | tail -40
  leftovers
fi
