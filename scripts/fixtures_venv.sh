#!/usr/bin/env bash
# The Python environment that MAKES committed reference fixtures for model families whose
# Hugging Face classes need a newer transformers than the oracle venv's 4.46.3 (which runs on
# Debian's torch 1.13): Gemma3, Qwen3, Qwen3-MoE, Mixtral and Mistral with a sliding window
# (and gguf 0.17: the peers venv's gguf 0.10 cannot map a gemma3 GGUF for transformers).
# It is the benchmark peers venv (scripts/bench_peers_venv.sh: PyTorch 2.x) with a newer
# transformers layered over it (a .pth file puts the peers venv's site-packages after this
# venv's own). Never used by CI or by ctest: the fixtures it makes are committed with the
# versions that made them (tests/fixtures/), and CI compares against those files.
#
# Usage: PY=$(scripts/fixtures_venv.sh)   # creates/updates the venv, prints its python
# Location: $L2L_FIXTURES_VENV, default ${XDG_CACHE_HOME:-$HOME/.cache}/l2l/fixtures-venv.
# Idempotent (a stamp holding the pins). Fails (non-zero, one line on stderr) when it cannot.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
PINS="transformers==4.57.1 peft==0.17.1 gguf==0.17.1"
VENV=${L2L_FIXTURES_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/l2l/fixtures-venv}
PY="$VENV/bin/python3"
STAMP="$VENV/.l2l-pins"
if [[ -x "$PY" && -f "$STAMP" && "$(cat "$STAMP")" == "$PINS" ]]; then
  echo "$PY"; exit 0
fi
PEERS_PY=$(bash "$ROOT/scripts/bench_peers_venv.sh") \
  || { echo "fixtures_venv.sh: the peers venv (PyTorch 2.x) could not be made" >&2; exit 1; }
PEERS_SITE=$("$PEERS_PY" -c 'import site; print(site.getsitepackages()[0])')
mkdir -p "$(dirname "$VENV")"
{
  [[ -x "$PY" ]] || /usr/bin/python3 -m venv "$VENV"
  SITE=$("$PY" -c 'import site; print(site.getsitepackages()[0])')
  echo "$PEERS_SITE" > "$SITE/l2l-peers.pth"
  # shellcheck disable=SC2086
  "$PY" -m pip install -q --disable-pip-version-check $PINS
  "$PY" -c 'import torch, transformers, peft; from transformers import Gemma3ForCausalLM, Qwen3ForCausalLM, Qwen3MoeForCausalLM, MixtralForCausalLM'
} >&2 || { echo "fixtures_venv.sh: could not make the fixtures venv at $VENV (pins: $PINS)" >&2; exit 1; }
echo "$PINS" > "$STAMP"
echo "$PY"
