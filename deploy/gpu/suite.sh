#!/usr/bin/env bash
# The GPU checks of Kernel Foundry, in stages that each fit one device call (< 10 minutes).
#   deploy/gpu/suite.sh probe|tests|runner-bench|template-bench|run|kbench|kbench-dev|all|py [extra args]
#   all      probe, a real kfoundry run and a short kfoundry bench, with a table (deploy/gpu/session.sh)
#   kbench-dev  every level's development subset, every GPU busy (KB_LEVELS, KB_DEADLINE; below)
#   kbench   kfoundry bench's own arguments, e.g.  kbench --level 1 --problems dev --seconds 90
#            (the KernelBench folder defaults to $KB, else .kb/, else ~/kb/KernelBench); it resumes
#            from /tmp/kf-kbench on a warm machine, or from a carried .kb-state/bench.json;
#            KF_MEMWATCH=1 samples every process's device memory into gpu_mem.csv
# Expects the wheels of deploy/gpu/fetch_wheels.sh in .whl/ (installed into python3's own
# site-packages, the checkout on a .pth file there) and writes logs under $OUT (or ./gpu-out).
set -uo pipefail
cd "$(dirname "$0")/../.."
out=${OUT:-gpu-out}
mkdir -p "$out"
stage=${1:-probe}
shift || true
if [ "$stage" = all ]; then
  exec deploy/gpu/session.sh "$@"
fi
# shellcheck source=deploy/gpu/setup_env.sh
source deploy/gpu/setup_env.sh
kf_setup || exit 1
kb_dir() {
  for d in "${KB:-}" .kb "$HOME/kb/KernelBench"; do
    [ -n "$d" ] && [ -d "$d" ] && { echo "$d"; return 0; }
  done
  echo "no KernelBench folder: set KB, or carry one as .kb/" >&2
  return 1
}
case "$stage" in
  probe)
    nvidia-smi --query-gpu=name,memory.total,memory.used,driver_version,clocks.sm,clocks.max.sm --format=csv
    python3 -c "import sys, torch, triton; print(sys.version.split()[0], torch.__version__, triton.__version__, torch.cuda.get_device_name(0), torch.cuda.get_device_properties(0))"
    unshare -n true && echo "unshare -n: ok"
    command -v nats-server && nats-server --version
    free -g
    ;;
  tests)
    [ $# -gt 0 ] || set -- tests/gpu_runner tests/diagnosis tests/experts/test_template_gpu.py
    timeout -k 20 560 python3 -m pytest -m gpu -W default -q -p no:cacheprovider -o addopts="" \
      --junitxml "$out/gpu_tests.xml" "$@" 2>&1 \
      | tee "$out/gpu_tests.log" | tail -40
    ;;
  runner-bench)
    timeout -k 20 570 python3 bench/gpu_runner_bench.py "$@" 2>&1 | tee "$out/gpu_runner_bench.log" | tail -40
    ;;
  template-bench)
    timeout -k 20 570 python3 -m bench.template_bench --device cuda --out "$out/template" "$@" 2>&1 \
      | tee "$out/template_bench.log" | tail -45
    ;;
  run)
    task=${1:-examples/tasks/layer_norm_gelu.py}
    shift || true
    timeout -k 30 570 python3 -m actors.cli run "$task" --device cuda --run-dir "$out/run" --log-level info "$@" 2>&1 \
      | tee "$out/run.log" | tail -25
    ;;
  kbench)
    # The bench writes many files: its folder stays outside $OUT; bench.json, bench.md and a
    # tarball of the runs' logs come back.
    # To resume on a fresh machine, carry the bench.json of an earlier call as .kb-state/bench.json.
    work=${KF_BENCH_DIR:-/tmp/kf-kbench}
    mkdir -p "$work"
    if [ ! -f "$work/bench.json" ] && [ -f "${KB_RESUME:-.kb-state/bench.json}" ]; then
      cp "${KB_RESUME:-.kb-state/bench.json}" "$work/bench.json"
    fi
    if [ $# -eq 0 ] || [ "${1#-}" != "$1" ]; then
      kb=$(kb_dir) || exit 1
      set -- "$kb" "$@"
    fi
    # KF_MEMWATCH=1: every second, each process's device memory (nvidia-smi) with its command
    # line, into $out/gpu_mem.csv (which role of the evaluator holds what when a GPU fills).
    watcher=
    if [ "${KF_MEMWATCH:-0}" = 1 ]; then
      ( while sleep 1; do
          t=$(date +%s)
          nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader,nounits 2>/dev/null \
            | while IFS=', ' read -r pid mib; do
                echo "$t,$pid,$mib,$(tr '\0' ' ' < "/proc/$pid/cmdline" 2>/dev/null | cut -c1-160)"
              done
        done ) > "$out/gpu_mem.csv" &
      watcher=$!
    fi
    timeout -s TERM -k 60 "${KB_TIMEOUT:-560}" python3 -m actors.cli bench "$@" --device "${KF_DEVICE:-cuda}" --out "$work" 2>&1 \
      | tee "$out/kbench.log" | tail -40
    rc=${PIPESTATUS[0]}
    [ -n "$watcher" ] && kill "$watcher" 2>/dev/null
    cp "$work/bench.json" "$work/bench.md" "$out/" 2>/dev/null
    [ -d "$work/runs" ] && tar -czf "$out/kbench-runs.tar.gz" -C "$work" --exclude='*.png' runs
    [ -f "$work/bench.md" ] && cat "$work/bench.md"
    exit "$rc"
    ;;
  kbench-dev)
    # The development subsets of KB_LEVELS (default "3 2 1"), one level after another inside one
    # call's KB_DEADLINE seconds (default 560), every visible GPU running problems side by side
    # (--parallel, one GPU each); resumable across calls on a warm machine (/tmp/kf-kbench-lN),
    # or on a fresh one from the bench-lN.json of an earlier call carried as .kb-state/bench-lN.json.
    # Extra arguments go to every kfoundry bench, e.g. kbench-dev --seconds 45
    kb=$(kb_dir) || exit 1
    end=$(( $(date +%s) + ${KB_DEADLINE:-560} ))
    ngpu=$(nvidia-smi -L | grep -c '^GPU')
    rc=0
    for level in ${KB_LEVELS:-3 2 1}; do
      left=$(( end - $(date +%s) ))
      [ "$left" -gt 90 ] || { echo "level $level: no time left in this call"; rc=75; break; }
      work=/tmp/kf-kbench-l$level
      mkdir -p "$work"
      if [ ! -f "$work/bench.json" ] && [ -f ".kb-state/bench-l$level.json" ]; then
        cp ".kb-state/bench-l$level.json" "$work/bench.json"  # an earlier call's results, carried
      fi
      # no problem starts later than a 60 s run (and its drain) could still end inside the call
      timeout -s TERM -k 60 "$left" python3 -m actors.cli bench "$kb" --level "$level" --problems dev \
        --device cuda --parallel "${KB_PARALLEL:-$ngpu}" --start-until $(( left > 150 ? left - 150 : 0 )) \
        --out "$work" "$@" 2>&1 | tee -a "$out/kbench-dev.log" | grep -v '^\s*$' | tail -8
      lrc=${PIPESTATUS[0]}
      [ "$lrc" -eq 0 ] || rc=$lrc
      cp "$work/bench.json" "$out/bench-l$level.json" 2>/dev/null
      cp "$work/bench.md" "$out/bench-l$level.md" 2>/dev/null
      [ "$lrc" -eq 0 ] || break
    done
    # what the runs left that a reader needs (reports, logs, best kernels), not their bulk
    (cd /tmp && find kf-kbench-l? -type f -size -4M \( -name '*.json' -o -name '*.log' -o -name '*.md' \
      -o -name 'best_model.py' \) -print0 2>/dev/null | tar -czf "$out/kbench-dev-runs.tar.gz" --null -T -)
    for f in "$out"/bench-l*.md; do [ -f "$f" ] && tail -12 "$f"; done
    exit "$rc"
    ;;
  py)
    timeout -k 20 570 python3 "$@" 2>&1 | tee "$out/py.log" | tail -80
    ;;
  *) echo "unknown stage $stage"; exit 2 ;;
esac
