#!/usr/bin/env bash
# l2l-tokenize on hostile tokenizer.json files: a vocab id of 2^31-2 in a 60-byte file,
# float, negative and huge ids (model.vocab, added_tokens, post-processor) for the BPE and
# the WordPiece loaders, and a 2 GiB (sparse) tokenizer.json. Each must exit 1 with a
# message naming the file and the entry (a bounded parser), not die of SIGABRT/bad_alloc.
# The tool runs under a memory limit so a loader that allocates what the file asks fails
# fast here instead of swapping: ulimit -v 2 GiB, or in sanitizer builds (whose shadow
# memory needs a large address space) the sanitizer's max_allocation_size_mb=1024.
# A valid tokenizer under the same limit exits 0 (the limit is not what refuses).
# Usage: bounded_ids_test.sh L2L_TOKENIZE SANITIZERS   (SANITIZERS: "" or CMake's L2L_SANITIZE)
set -uo pipefail
unset L2L_MAX_FILE_BYTES
tool=$1
sanitize=${2:-}
work=$(mktemp -d "${TMPDIR:-/tmp}/l2l-bounded-ids-XXXXXX")
trap 'rm -rf "$work"' EXIT
printf 'hello world\n' >"$work/in.txt"
failures=0

# run NAME EXPECTED_RC JSON_TEXT_OR_EMPTY NEEDLE... : writes $work/NAME.json (unless it
# exists), runs the tool on it under the limit, checks the exit status and the needles.
run() {
  local name=$1 want=$2 text=$3
  shift 3
  local file="$work/$name.json"
  [ -e "$file" ] || printf '%s' "$text" >"$file"
  (
    if [ -z "$sanitize" ]; then
      ulimit -v 2097152
    else
      export ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}max_allocation_size_mb=1024:allocator_may_return_null=0"
      export TSAN_OPTIONS="${TSAN_OPTIONS:+$TSAN_OPTIONS:}max_allocation_size_mb=1024:allocator_may_return_null=0"
    fi
    exec "$tool" "$work/in.txt" "$work/$name.bin" --tokenizer "$file"
  ) >"$work/$name.out" 2>"$work/$name.err"
  local rc=$?
  local ok=1
  [ "$rc" -eq "$want" ] || ok=0
  for needle in "$@"; do grep -qF -- "$needle" "$work/$name.err" || ok=0; done
  if [ "$ok" -eq 1 ]; then
    echo "ok: $name (rc $rc)"
  else
    echo "FAIL: $name: rc $rc (want $want), stderr:" >&2
    head -c 2000 "$work/$name.err" >&2
    echo " -- wanted: $*" >&2
    failures=$((failures + 1))
  fi
}

bpe() { printf '{"model": {"type": "BPE", "vocab": %s, "merges": []}%s, "pre_tokenizer": {"type": "ByteLevel"}}' "$1" "${2:-}"; }
wp() { printf '{"model": {"type": "WordPiece", "vocab": %s}%s, "pre_tokenizer": {"type": "BertPreTokenizer"}}' "$1" "${2:-}"; }

# The valid controls: they load and encode under the same limit.
run bpe-ok 0 "$(bpe '{"h": 0, "e": 1, "l": 2, "o": 3, "Ġ": 4, "w": 5, "r": 6, "d": 7, "Ċ": 8}')"
run wp-ok 0 "$(wp '{"[UNK]": 0, "[CLS]": 1, "[SEP]": 2, "hello": 3, "world": 4}')"

# BPE (tokenizer/tokenizer_json.cc).
run bpe-huge-id 1 "$(bpe '{"a": 2147483646}')" "bpe-huge-id.json" 'model.vocab["a"] = 2147483646' "out of range"
run bpe-float-id 1 "$(bpe '{"a": 5.5e108}')" 'model.vocab["a"] = 5.5e+108' "not an integer"
run bpe-frac-id 1 "$(bpe '{"a": 0.5}')" 'model.vocab["a"] = 0.5' "not an integer"
run bpe-negative-id 1 "$(bpe '{"a": -1}')" 'model.vocab["a"] = -1' "out of range"
run bpe-huge-added 1 "$(bpe '{"a": 0}' ', "added_tokens": [{"id": 2147483646, "content": "<x>"}]')" \
  "added_tokens[0].id = 2147483646" "out of range"
run bpe-float-post 1 \
  "$(bpe '{"a": 0}' ', "post_processor": {"type": "BertProcessing", "cls": ["a", 1e300], "sep": ["a", 0]}')" \
  "post_processor.cls[1]" "not an integer"

# WordPiece (tokenizer/wordpiece.cc).
run wp-huge-id 1 "$(wp '{"[UNK]": 0, "a": 2147483646}')" "wp-huge-id.json" 'model.vocab["a"] = 2147483646' "out of range"
run wp-float-id 1 "$(wp '{"[UNK]": 0, "a": 1.5}')" 'model.vocab["a"] = 1.5' "not an integer"
run wp-huge-added 1 "$(wp '{"[UNK]": 0}' ', "added_tokens": [{"id": 2147483646, "content": "<x>"}]')" \
  "added_tokens[0].id = 2147483646" "out of range"

# A 2 GiB tokenizer.json (sparse): refused by its size before it is read.
printf '{' >"$work/oversize.json"
truncate -s 2G "$work/oversize.json"
run oversize 1 "" "oversize.json: 2147483648 bytes" "L2L_MAX_FILE_BYTES"

if [ "$failures" -ne 0 ]; then
  echo "bounded_ids_test: $failures case(s) failed" >&2
  exit 1
fi
echo "bounded_ids_test: all cases passed"
