# shellcheck shell=bash
# Shared shell functions for gpu_check.sh and bench_gpu.sh (sourced, not run; bundle.sh
# packs it with the rest of scripts/ into the bundle's src/scripts/). Defines functions
# only: sourcing it changes no variable or option of the caller. Needs $PYTHON set
# (the interpreter whose site-packages may hold PyTorch's nvidia wheels).
#
#   find_cublaslt        prints the folder holding libcublasLt.so.13 (which the bundle
#                        leaves out) and returns 0, or prints nothing and returns 1.
#                        Looks in $L2L_CUBLAS_DIR, the CUDA 13 toolkit folders,
#                        /usr/lib/x86_64-linux-gnu, then PyTorch's wheels in every
#                        site-packages folder and the user site: nvidia/cublas/lib,
#                        nvidia/cu13/lib, nvidia/*/lib, torch/lib.
#   find_cuda_lib LIB    the same search for another library the bundle leaves out
#                        (libnccl.so.2: 200+ MB, found beside the toolkit or in PyTorch's
#                        nvidia/nccl wheel).
#   find_cublaslt_where  one line naming the places find_cublaslt looks (for messages).
#   ldd_unresolved F...  runs ldd on each executable F and prints one line per file that
#                        has unresolved libraries ("name: libA.so.1 libB.so.2"); returns
#                        1 if there was any, 0 if all resolve (or there is no ldd: then
#                        it says so on stderr and returns 0).

find_cuda_lib() {  # find_cuda_lib LIBNAME: the folder holding it (see find_cublaslt)
  local d lib=$1
  for d in ${L2L_CUBLAS_DIR:-} /usr/local/cuda/lib64 /usr/local/cuda/lib /usr/local/cuda/targets/x86_64-linux/lib \
           /usr/local/cuda-13*/lib64 /usr/lib/x86_64-linux-gnu; do
    [[ -n "$d" && -e "$d/$lib" ]] && { echo "$d"; return 0; }
  done
  # PyTorch's pip wheels: site-packages/nvidia/{cublas,nccl,cu13}/lib, torch/lib
  "${PYTHON:-python3}" - "$lib" <<'PY' 2>/dev/null
import glob, os, site, sys
roots = site.getsitepackages() + [site.getusersitepackages()]
for r in roots:
    for pat in ("nvidia/cublas/lib", "nvidia/nccl/lib", "nvidia/cu13/lib", "nvidia/*/lib", "torch/lib"):
        for d in glob.glob(os.path.join(r, pat)):
            if os.path.exists(os.path.join(d, sys.argv[1])):
                print(d); sys.exit(0)
sys.exit(1)
PY
}

find_cublaslt() { find_cuda_lib libcublasLt.so.13; }

find_cublaslt_where() {
  echo "\$L2L_CUBLAS_DIR (${L2L_CUBLAS_DIR:-unset}), /usr/local/cuda{,-13*}/lib64, /usr/lib/x86_64-linux-gnu," \
       "and nvidia/{cublas,cu13,*}/lib, torch/lib under ${PYTHON:-python3}'s site-packages and user site"
}

ldd_unresolved() {
  if ! command -v ldd >/dev/null; then
    echo "ldd_unresolved: no ldd on PATH: library check SKIPPED" >&2
    return 0
  fi
  local f nf any=0
  for f in "$@"; do
    [[ -f "$f" && -x "$f" ]] || continue
    # "\tlibfoo.so.1 => not found"
    nf=$(ldd "$f" 2>/dev/null | awk '$2 == "=>" && $3 == "not" { printf "%s ", $1 }' || true)
    [[ -z "$nf" ]] || { echo "$(basename "$f"): ${nf% }"; any=1; }
  done
  return "$any"
}
