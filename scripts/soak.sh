#!/usr/bin/env bash
# Soak test (not in CI: run it nightly, or before a release, by hand or from a timer): long
# chaos runs (tests/integration/chaos_test.py) of a synchronous job, one daemon and two
# workers, under a seeded random schedule of faults from every fault site:
#   * kill -9 from outside at a random moment of a step, of the daemon or of a worker;
#   * kill -9 by the process itself at a named site (L2L_FAULT_AT, common/fault_point.h):
#     eps.checkpoint, eps.update, worker.fetch, worker.push; every run arms each of the
#     four at least once;
# with the restarts a supervisor makes (l2l-eps --resume, workers restarted on failure).
# A run passes when the job completes and its final weights, masters and AdamW moments
# equal an uninterrupted run of the same job bit for bit, no process outlives it and no
# shared-memory segment or partial checkpoint is left. Not covered here: SSD-tier I/O
# faults (L2L_SPILL_FAULTS) and device-update faults (L2L_TEST_UPDATE_FAULT), which need
# a spill config or a GPU; their own tests inject them deterministically.
#
# Usage: scripts/soak.sh [--steps N] [--faults N] [--seeds "S ..."] [--transports "shm grpc"]
#                        [--bin DIR] [--deadline-s S]
#   defaults: 400 steps, 80 faults per run, one seed drawn from the clock (printed, so a
#   failure can be replayed with --seeds S), both transports, build/bin, 3600 s a run.
# Needs the built binaries (scripts/build.sh, or cmake --build build --target l2l-eps
# l2l-worker l2lctl) and /usr/bin/python3. Prints every run's result line, then one
# summary line "soak: PASSED|FAILED: ..."; exits 1 when any run failed.
# docs/operations.md "Soak test" records the last result.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
steps=400
faults=80
seeds=""
transports="shm grpc"
bin="$root/build/bin"
deadline=3600
while [ $# -gt 0 ]; do
  case "$1" in
    --steps) steps=$2; shift 2 ;;
    --faults) faults=$2; shift 2 ;;
    --seeds) seeds=$2; shift 2 ;;
    --transports) transports=$2; shift 2 ;;
    --bin) bin=$2; shift 2 ;;
    --deadline-s) deadline=$2; shift 2 ;;
    *) echo "soak.sh: unknown argument $1 (see the header of scripts/soak.sh)" >&2; exit 2 ;;
  esac
done
if [ -z "$seeds" ]; then seeds=$(( $(date +%s) % 1000000 )); fi
for b in l2l-eps l2l-worker l2lctl; do
  [ -x "$bin/$b" ] || { echo "soak.sh: $bin/$b missing: build first (scripts/build.sh)" >&2; exit 2; }
done
# chaos_test.py draws its fault steps from [2, steps - 3) without repetition.
if [ "$faults" -gt $((steps - 5)) ]; then
  echo "soak.sh: --faults $faults needs --steps >= $((faults + 5))" >&2
  exit 2
fi

start=$(date +%s)
cpu=$(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -n1)
echo "soak: $(date -u '+%Y-%m-%d %H:%M UTC'), $(uname -n), ${cpu:-unknown cpu}, $(nproc) cores"
echo "soak: $steps steps, $faults scheduled faults per run; seeds: $seeds; transports: $transports"
runs=0
failed=0
injected=0
survived=0
results=()
for seed in $seeds; do
  for t in $transports; do
    runs=$((runs + 1))
    log=$(mktemp "/tmp/l2l-soak-$t-$seed-XXXXXX.log")
    t0=$(date +%s)
    rc=0
    /usr/bin/python3 "$root/tests/integration/chaos_test.py" "$bin" --transport "$t" --seed "$seed" \
      --steps "$steps" --faults "$faults" --deadline-s "$deadline" > "$log" 2>&1 || rc=$?
    line=$(grep -E "^chaos: (seed [0-9]+ \(|FAILED)" "$log" | tail -n1 || true)
    echo "soak: run $runs ($t, seed $seed, $(( $(date +%s) - t0 )) s, exit $rc): ${line:-no result line}"
    if [ "$rc" -eq 0 ]; then
      n=$(sed -n 's/^chaos: seed [0-9]* ([a-z]*): \([0-9]*\) faults injected, \([0-9]*\) survived.*/\1 \2/p' "$log")
      injected=$((injected + ${n% *}))
      survived=$((survived + ${n#* }))
      rm -f "$log"
    else
      failed=$((failed + 1))
      echo "soak: run $runs failed; its log: $log (last lines below)"
      tail -n 40 "$log" | sed 's/^/  | /'
    fi
    results+=("$t/$seed:$([ "$rc" -eq 0 ] && echo ok || echo FAILED)")
  done
done
verdict=PASSED
[ "$failed" -eq 0 ] || verdict=FAILED
echo "soak: $verdict: $runs runs (${results[*]}), $((runs * steps)) steps, $injected faults injected," \
  "$survived survived (passed runs), $failed runs failed; $(( $(date +%s) - start )) s"
[ "$failed" -eq 0 ]
