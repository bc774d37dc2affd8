#!/usr/bin/env bash
# The Python environment of the peer benchmarks (scripts/bench_peers.sh): a venv with
# PyTorch 2.x and DeepSpeed from PyPI (and transformers + gguf for the sampling peer,
# scripts/bench_sample.sh, and PEFT for the LoRA peer), used on the CPU only. PyPI's x86_64
# torch wheel is the CUDA build (a ~5 GB venv), so the venv lives in a cache outside the
# repository and is reused across runs. Bench only: no test and no CI job uses it.
#
# Usage: PY=$(scripts/bench_peers_venv.sh)   # creates the venv if needed, prints its python
# Location: $L2L_PEERS_VENV, default ${XDG_CACHE_HOME:-$HOME/.cache}/l2l/peers-venv.
# Interpreter: $L2L_PEERS_PYTHON, default /usr/bin/python3 (DeepSpeedCPUAdam compiles its
# op with ninja at first use and needs the interpreter's C headers: Python.h must exist).
set -euo pipefail
PINS="torch==2.9.1 deepspeed==0.18.2 ninja numpy<2 transformers==4.46.3 gguf==0.10.0 sentencepiece==0.2.0 (+ cpu_adam op)"
# PEFT and its accelerate with --no-deps, the versions the oracle venv pins (their other
# requirements -- torch, numpy, psutil, pyyaml, safetensors, huggingface_hub -- come with
# the packages above).
NODEPS_PINS="peft==0.13.2 accelerate==0.34.2"
VENV=${L2L_PEERS_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/l2l/peers-venv}
BASE=${L2L_PEERS_PYTHON:-/usr/bin/python3}
PY="$VENV/bin/python3"
STAMP="$VENV/.l2l-pins"
if [[ -x "$PY" && -f "$STAMP" && "$(cat "$STAMP")" == "$PINS $NODEPS_PINS" ]]; then
  echo "$PY"; exit 0
fi
inc=$("$BASE" -c 'import sysconfig; print(sysconfig.get_paths()["include"])')
[[ -f "$inc/Python.h" ]] || {
  echo "bench_peers_venv.sh: $BASE has no C headers ($inc/Python.h missing; DeepSpeedCPUAdam needs them): install python3-dev or set L2L_PEERS_PYTHON to an interpreter that has them" >&2
  exit 1; }
mkdir -p "$(dirname "$VENV")"
exec 9>"$VENV.lock"
flock 9
{
  [[ -x "$PY" ]] || "$BASE" -m venv "$VENV"
  "$PY" -m pip install -q --disable-pip-version-check --upgrade pip setuptools wheel
  # shellcheck disable=SC2086
  "$PY" -m pip install -q --disable-pip-version-check ${PINS%% (*}
  # shellcheck disable=SC2086
  "$PY" -m pip install -q --disable-pip-version-check --no-deps $NODEPS_PINS
  "$PY" -c 'import torch, deepspeed, ninja, numpy, transformers, gguf, peft'
  # Build DeepSpeedCPUAdam's op now (minutes), not inside the first timed run. A build
  # killed half-way leaves torch's lock file behind and the next load waits on it forever:
  # remove ~/.cache/torch_extensions/*/cpu_adam to start over.
  DS_ACCELERATOR=cpu "$PY" -c 'from deepspeed.ops.op_builder.cpu import CPUAdamBuilder; CPUAdamBuilder().load(verbose=False)'
} >&2 || { echo "bench_peers_venv.sh: could not make the peers venv at $VENV (pins: $PINS $NODEPS_PINS)" >&2; exit 1; }
echo "$PINS $NODEPS_PINS" > "$STAMP"
echo "$PY"
