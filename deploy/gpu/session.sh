#!/usr/bin/env bash
# One device call (< 10 minutes) that checks the GPU path as shipped, end to end:
#   1. setup: the wheels into python3's site-packages, the checkout on a .pth file (setup_env.sh)
#   2. probe: GPU, torch/Triton, unshare, nats-server
#   3. a real `kfoundry run` of one small task with the template expert
#   4. `kfoundry bench` on a few development-subset problems of KernelBench level 1
#   5. a short table: each step's outcome and time, the run's summary, the bench's table
# Usage (repo root): deploy/gpu/session.sh      (or deploy/gpu/suite.sh all)
# Carry .whl (deploy/gpu/fetch_wheels.sh) and a KernelBench folder as .kb (e.g.
# `mkdir -p .kb && cp -r ~/kb/KernelBench/level1 .kb/`), or set KB. Knobs (environment):
#   RUN_TASK (examples/tasks/layer_norm_gelu.py), RUN_SECONDS (60),
#   KB_PROBLEMS (10,21,95: dev-subset problems of level 1), KB_SECONDS (45), KB_TIMEOUT (270),
#   KF_DEVICE (cuda; cpu for a dry run of this script on a machine without a GPU).
# Everything is logged under $OUT (or ./gpu-out): session.log, run-report.json, bench.json,
# bench.md, logs.tar.gz (the runs' logs, no plots).
set -u -o pipefail
cd "$(dirname "$0")/../.."
out=${OUT:-gpu-out}
mkdir -p "$out"
work=${KF_SESSION_DIR:-/tmp/kf-session}
rm -rf "$work"
mkdir -p "$work"
exec > >(tee "$out/session.log") 2>&1
started=$SECONDS
steps=()
dev=${KF_DEVICE:-cuda}

step() { # step NAME TIMEOUT_S COMMAND...: run it with a timeout (SIGTERM, then SIGKILL 60 s later)
  local name=$1 limit=$2 t0=$SECONDS rc
  shift 2
  echo "=== [$((SECONDS - started))s] $name (limit ${limit}s)"
  timeout -s TERM -k 60 "$limit" "$@"
  rc=$?
  [ "$rc" -eq 124 ] && echo "=== $name: timed out after ${limit}s"
  steps+=("$name|$rc|$((SECONDS - t0))")
  return "$rc"
}

# shellcheck source=deploy/gpu/setup_env.sh
source deploy/gpu/setup_env.sh
echo "=== [0s] setup"
kf_setup
rc=$?
steps+=("setup|$rc|$((SECONDS - started))")
[ "$rc" -eq 0 ] || { echo "setup failed: stopping"; exit 1; }

step probe 90 bash -c '
  nvidia-smi --query-gpu=name,memory.total,memory.used,driver_version --format=csv
  python3 -c "import sys, torch, triton; print(sys.version.split()[0], torch.__version__, triton.__version__, torch.cuda.get_device_name(0))"
  unshare -n true && echo "unshare -n: ok"
  free -g'

task=${RUN_TASK:-examples/tasks/layer_norm_gelu.py}
# A run id the embedded server (state in $KFOUNDRY_HOME, kept between sessions) has not seen: it refuses a used one.
run_id=gpusession-$(date +%s)
step run $((${RUN_SECONDS:-60} + 120)) python3 -m actors.cli run "$task" --device "$dev" --experts template \
  --islands 1 --seconds "${RUN_SECONDS:-60}" --run-dir "$work/run" --run-id "$run_id"
cp "$work/run/report.json" "$out/run-report.json" 2>/dev/null

kb=""
for d in "${KB:-}" .kb "$HOME/kb/KernelBench"; do
  if [ -n "$d" ] && [ -d "$d" ]; then kb=$d; break; fi
done
if [ -n "$kb" ]; then
  # SIGTERM from the step's timeout stops the bench cleanly: finished problems stay in bench.json.
  step bench "${KB_TIMEOUT:-270}" python3 -m actors.cli bench "$kb" --level 1 --problems "${KB_PROBLEMS:-10,21,95}" \
    --seconds "${KB_SECONDS:-45}" --device "$dev" --out "$work/bench" --run-args "--islands 1"
  cp "$work/bench/bench.json" "$work/bench/bench.md" "$out/" 2>/dev/null
else
  echo "no KernelBench folder (set KB, or carry one as .kb/): bench skipped"
  steps+=("bench|skipped|0")
fi

tar -czf "$out/logs.tar.gz" -C "$work" --exclude='*.png' --exclude='*.pt' . 2>/dev/null
leftover=$(ps -eo pid=,args= | grep -E "actors[.]cli|gpu_runner|nats-server" | grep -v grep)

echo
echo "=== summary ($((SECONDS - started)) s)"
printf '| %-8s | %-7s | %8s |\n' step "exit" seconds
printf '|----------|---------|----------|\n'
for s in "${steps[@]}"; do
  IFS='|' read -r name rc secs <<<"$s"
  printf '| %-8s | %-7s | %8s |\n' "$name" "$rc" "$secs"
done
echo "processes of the project still alive: $(printf '%s' "$leftover" | grep -c .)"
[ -n "$leftover" ] && printf '%s\n' "$leftover" | head -10
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=memory.used --format=csv,noheader
free -g | sed -n 1,2p
grep -h "^run $run_id ended" "$out/session.log" 2>/dev/null | head -1
[ -f "$work/bench/bench.md" ] && cat "$work/bench/bench.md"
exit 0
