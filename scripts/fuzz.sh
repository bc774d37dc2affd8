#!/usr/bin/env bash
# Runs the libFuzzer targets of tests/fuzz (ASan+UBSan, build-asan from scripts/asan.sh).
# Usage: scripts/fuzz.sh TARGET SECONDS   fuzz one target (job_config, hf_config,
#                                         tokens_file, safetensors, gguf, tokenizer_json,
#                                         checkpoint_manifest, rpc) for SECONDS
#        scripts/fuzz.sh all SECONDS      every target, SECONDS split evenly among them
#                                         (CI: scripts/test.sh runs `all 30`)
#        scripts/fuzz.sh seeds            rewrite the seed corpora (tests/fuzz/corpus/*)
#                                         with l2l_fuzz_seeds (regression inputs stay)
# Each target starts from tests/fuzz/corpus/TARGET (seeds + regression inputs, in git)
# plus its work corpus outside git, where it adds what it finds:
# ${L2L_FUZZ_WORK:-$HOME/.cache/l2l-fuzz}/TARGET/corpus; a crash, leak, UB report or
# timeout is written to .../TARGET/crashes/ and fails the run. Prints the executions run.
# Memory: inputs are at most L2L_FUZZ_MAX_LEN bytes (default 16384, above every seed), and
# a parser may allocate at most 10x its input, with a floor libFuzzer can tell apart from
# its own and the sanitizers' memory: one allocation past max(64 MB, 10 x max_len)
# (-malloc_limit_mb; a table sized by a hostile id, a GGUF array count) or a resident set
# past 1024 MB (-rss_limit_mb; many small allocations) is a finding, like a crash.
# L2L_FUZZ_SEED=N fixes libFuzzer's seed (CI sets 1, so that a CI run is reproducible
# and a longer local run with the same seed covers what CI will try); unset, each run
# explores from a random seed.
# To keep a crashing input as a regression test: fix the code, then copy it into
# tests/fuzz/corpus/TARGET/ as regress-<what>.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
BUILD_DIR="${L2L_ASAN_BUILD_DIR:-build-asan}"
WORK="${L2L_FUZZ_WORK:-${XDG_CACHE_HOME:-$HOME/.cache}/l2l-fuzz}"
ALL=(job_config hf_config tokens_file safetensors gguf tokenizer_json checkpoint_manifest rpc)
usage() { sed -n '3,15p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2; }
[ $# -ge 1 ] || usage
what=$1
export CCACHE_BASEDIR="${CCACHE_BASEDIR:-$PWD}" CCACHE_NOHASHDIR="${CCACHE_NOHASHDIR:-1}"

if [ "$what" = seeds ]; then
  bash "$root/scripts/asan.sh" configure
  cmake --build "$BUILD_DIR" --target l2l_fuzz_seeds -j "${L2L_JOBS:-2}"
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' EXIT
  "$BUILD_DIR/fuzz/l2l_fuzz_seeds" "$tmp"
  cp configs/test-tiny.yaml configs/quickstart.yaml "$tmp/job_config/"
  for t in "${ALL[@]}"; do
    mkdir -p "tests/fuzz/corpus/$t"
    find "tests/fuzz/corpus/$t" -maxdepth 1 -type f ! -name 'regress-*' -delete
    cp "$tmp/$t"/* "tests/fuzz/corpus/$t/"
  done
  du -sh tests/fuzz/corpus
  exit 0
fi

[ $# -eq 2 ] && [[ $2 =~ ^[0-9]+$ ]] && [ "$2" -ge 1 ] || usage
if [ "$what" = all ]; then
  targets=("${ALL[@]}")
  secs=$(( $2 / ${#ALL[@]} ))
  [ "$secs" -ge 1 ] || secs=1
else
  [[ " ${ALL[*]} " == *" $what "* ]] || { echo "fuzz.sh: unknown target '$what' (${ALL[*]})" >&2; exit 2; }
  targets=("$what")
  secs=$2
fi
bins=()
for t in "${targets[@]}"; do bins+=("l2l_fuzz_$t"); done
bash "$root/scripts/asan.sh" configure
cmake --build "$BUILD_DIR" --target "${bins[@]}" -j "${L2L_JOBS:-2}"

export ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=1:strict_init_order=1}"
export UBSAN_OPTIONS="${UBSAN_OPTIONS:-halt_on_error=1:print_stacktrace=1:suppressions=$root/scripts/ubsan.supp}"
export LSAN_OPTIONS="${LSAN_OPTIONS:-suppressions=$root/scripts/lsan.supp}"
max_len="${L2L_FUZZ_MAX_LEN:-16384}"
malloc_mb=$(( (10 * max_len + (1 << 20) - 1) >> 20 ))
[ "$malloc_mb" -ge 64 ] || malloc_mb=64
rss_mb=1024
seed_arg=()
if [ -n "${L2L_FUZZ_SEED:-}" ]; then seed_arg=(-seed="$L2L_FUZZ_SEED"); fi
failed=()
total=0
for t in "${targets[@]}"; do
  # libFuzzer exits 1 before running anything when a corpus directory is missing.
  [ -d "tests/fuzz/corpus/$t" ] || { echo "fuzz.sh: seed corpus tests/fuzz/corpus/$t is missing (not in git?)" >&2; exit 1; }
  mkdir -p "$WORK/$t/corpus" "$WORK/$t/crashes"
  log="$WORK/$t/last.log"
  rc=0
  # -timeout: an input that takes 20 s is a hang (reported like a crash); the memory
  # limits: see the header.
  "$BUILD_DIR/fuzz/l2l_fuzz_$t" -max_total_time="$secs" -timeout=20 -max_len="$max_len" \
    -malloc_limit_mb="$malloc_mb" -rss_limit_mb="$rss_mb" \
    -print_final_stats=1 "${seed_arg[@]}" -artifact_prefix="$WORK/$t/crashes/" \
    "$WORK/$t/corpus" "tests/fuzz/corpus/$t" >"$log" 2>&1 || rc=$?
  execs=$(sed -n 's/^stat::number_of_executed_units: *\([0-9]*\).*/\1/p' "$log" | tail -1)
  execs=${execs:-0}
  total=$(( total + execs ))
  if [ "$rc" -ne 0 ]; then
    failed+=("$t")
    echo "fuzz.sh: $t FAILED (rc=$rc) after $execs executions in ${secs} s; log $log:" >&2
    { grep -E 'ERROR: |runtime error|SUMMARY|Test unit written|^==[0-9]+==' "$log" || tail -5 "$log"; } | head -20 >&2
  else
    echo "fuzz.sh: $t: $execs executions in ${secs} s, no crash ($(find "$WORK/$t/corpus" -type f | wc -l) inputs in the work corpus)"
  fi
done
echo "fuzz.sh: $total executions over ${#targets[@]} target(s) on $(date -u +%F)"
if [ ${#failed[@]} -gt 0 ]; then
  echo "fuzz.sh: crashes in: ${failed[*]} (inputs under $WORK/<target>/crashes/)" >&2
  exit 1
fi
