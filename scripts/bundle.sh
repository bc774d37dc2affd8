#!/usr/bin/env bash
# Packs a CUDA build of l2l for a GPU machine that has no package registry (it has the
# NVIDIA driver, CUDA 13 and PyTorch, but none of our Debian -dev packages):
#   bin/      build/bin/* (l2l-eps, l2l-worker, ...), debug info stripped
#   tests/    the Catch2 test binaries (l2l_*_tests, l2l_gpu_tests among them)
#   lib/      every non-system shared library they load (found with ldd): gRPC, protobuf,
#             abseil, oneDNN, oneTBB, yaml-cpp, spdlog, fmt, libgomp, libcudart, ...
#   src/      scripts/, configs/, tests/**/*.py, docs/gpu.md, so gpu_check.sh and
#             bench_gpu.sh run from the unpacked tree; peers/megatrain (MegaTrain's
#             Python code for bench_large.sh) when $MEGATRAIN_DIR or
#             ../shared/peers/megatrain holds a checkout
# Left out: glibc and the GCC base runtime (libc, libm, libpthread, libdl, librt,
# ld-linux, libstdc++, libgcc_s: the target's own must be used), the driver (libcuda,
# libnvidia-*), and cuBLAS/cuBLASLt (541 MB uncompressed; the GPU machine's CUDA 13
# toolkit or PyTorch's nvidia-cublas wheel provides libcublasLt.so.13 and gpu_check.sh
# finds it there).
#
# Usage: scripts/bundle.sh [BUILD_DIR] [OUT.tar.gz]
#   BUILD_DIR defaults to $L2L_BUILD_DIR or build; OUT to bundle/l2l-gpu-bundle.tar.gz.
# Fails when the build has no CUDA test binary, when a library cannot be resolved, or
# when the archive exceeds 60 MB. Prints the archive's size.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
BUILD_DIR=${1:-${L2L_BUILD_DIR:-build}}
OUT=${2:-bundle/l2l-gpu-bundle.tar.gz}
LIMIT_BYTES=$((60 * 1000 * 1000))

die() { echo "bundle.sh: $*" >&2; exit 1; }
[[ -d "$BUILD_DIR" ]] || die "no build directory $BUILD_DIR (build first: L2L_BUILD_DIR=$BUILD_DIR bash scripts/build.sh)"
[[ -x "$BUILD_DIR/tests/l2l_gpu_tests" ]] || \
  die "$BUILD_DIR/tests/l2l_gpu_tests is missing: this is not a CUDA build (configure with -DL2L_CUDA=ON and build)"

STAGE=$(mktemp -d /tmp/l2l-bundle.XXXXXX)
trap 'rm -rf "$STAGE"' EXIT
PKG="$STAGE/l2l"
mkdir -p "$PKG/bin" "$PKG/tests" "$PKG/lib" "$PKG/src"

# ---- binaries ------------------------------------------------------------------------
bins=()
if [[ -d "$BUILD_DIR/bin" ]]; then
  for f in "$BUILD_DIR"/bin/*; do
    [[ -f "$f" && -x "$f" ]] || continue
    cp "$f" "$PKG/bin/" && bins+=("$PKG/bin/$(basename "$f")")
  done
fi
for f in "$BUILD_DIR"/tests/l2l_*_tests; do
  [[ -f "$f" && -x "$f" ]] || continue
  cp "$f" "$PKG/tests/" && bins+=("$PKG/tests/$(basename "$f")")
done
for f in "${bins[@]}"; do strip --strip-debug "$f"; done
echo "bundle.sh: ${#bins[@]} binaries from $BUILD_DIR"

# ---- shared libraries (ldd, transitively: ldd already lists indirect dependencies) ----
is_excluded() {
  case "$(basename "$1")" in
    libc.so*|libm.so*|libpthread.so*|libdl.so*|librt.so*|ld-linux*|libresolv.so*|libutil.so*) return 0 ;;
    libstdc++.so*|libgcc_s.so*) return 0 ;;
    libcuda.so*|libnvidia-*|libcublas.so*|libcublasLt.so*|libnccl.so*) return 0 ;;
    linux-vdso.so*) return 0 ;;
  esac
  return 1
}
declare -A seen=()
missing=()
for f in "${bins[@]}"; do
  while read -r line; do
    # "libfoo.so.1 => /path/libfoo.so.1 (0x...)" | "libfoo.so.1 => not found"
    name=$(awk '{print $1}' <<<"$line")
    path=$(awk '$2 == "=>" {print $3}' <<<"$line")
    [[ -n "$path" ]] || continue
    if [[ "$path" == "not" ]]; then
      is_excluded "$name" || missing+=("$name (needed by $(basename "$f"))")
      continue
    fi
    is_excluded "$path" && continue
    [[ -n "${seen[$name]:-}" ]] && continue
    seen[$name]=1
    cp -L "$path" "$PKG/lib/$name"
    strip --strip-debug "$PKG/lib/$name" 2>/dev/null || true
  done < <(ldd "$f")
done
((${#missing[@]} == 0)) || die "unresolved libraries: ${missing[*]}"
echo "bundle.sh: ${#seen[@]} shared libraries: $(ls "$PKG/lib" | tr '\n' ' ')"

# ---- scripts, configs, python test helpers, docs --------------------------------------
cp -r scripts configs "$PKG/src/"
mkdir -p "$PKG/src/docs" && cp docs/gpu.md "$PKG/src/docs/" 2>/dev/null || true
while IFS= read -r -d '' py; do
  mkdir -p "$PKG/src/$(dirname "$py")" && cp "$py" "$PKG/src/$py"
done < <(find tests -name '*.py' -print0)
# MegaTrain's code (~0.7 MB of Python), for bench_large.sh's side-by-side run, when a
# checkout is at $MEGATRAIN_DIR or ../shared/peers/megatrain beside the source tree.
mt=${MEGATRAIN_DIR:-$ROOT/../shared/peers/megatrain}
if [[ -f "$mt/examples/sft/train.py" ]]; then
  mkdir -p "$PKG/src/peers" && cp -r "$mt" "$PKG/src/peers/megatrain" && rm -rf "$PKG/src/peers/megatrain/.git"
  echo "bundle.sh: MegaTrain from $mt in src/peers/megatrain"
fi
git -C "$ROOT" rev-parse HEAD > "$PKG/COMMIT" 2>/dev/null || echo unknown > "$PKG/COMMIT"
# The newest glibc symbol version the binaries need: the target's glibc must be at least this.
glibc_need=$(for f in "${bins[@]}" "$PKG"/lib/*; do objdump -T "$f" 2>/dev/null; done |
             grep -o 'GLIBC_[0-9.]*' | sort -t. -k1,1 -k2,2n -k3,3n -V | tail -1)
echo "${glibc_need:-unknown}" > "$PKG/GLIBC_REQUIRED"
cp scripts/gpu_check.sh "$PKG/gpu_check.sh"

mkdir -p "$(dirname "$OUT")"
tar -C "$STAGE" -czf "$OUT" l2l
size=$(stat -c %s "$OUT")
echo "bundle.sh: wrote $OUT: $size bytes ($((size / 1000000)) MB; limit 60 MB); needs ${glibc_need:-?} on the target"
((size <= LIMIT_BYTES)) || die "$OUT is $size bytes, over the 60 MB limit"
