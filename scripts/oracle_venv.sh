#!/usr/bin/env bash
# The Python environment of the oracle tests: a venv over Debian's python3 (with its
# python3-torch 1.13 and numpy, --system-site-packages) plus the pinned PyPI packages that
# are the oracles themselves: Hugging Face transformers 4.46.3 (the model classes users
# compare us with), tokenizers, safetensors, gguf, jinja2 (transformers' chat templates: an
# optional dependency it does not install), and PEFT 0.13.2 (LoRA adapters:
# PeftModel.from_pretrained / merge_and_unload are the oracle of our adapter files).
# PEFT is installed with --no-deps: it asks for torch>=1.13.0, which Debian's 1.13.0a0 (a
# pre-release by version order) does not satisfy, so pip would pull a torch 2.x; its other
# requirements (accelerate 0.34.2: torch>=1.10) are in PINS. Test oracles only: nothing in l2l
# imports them, and no test loads weights from a hub (HF_HUB_OFFLINE=1 in the tests).
#
# Usage: scripts/oracle_venv.sh        # creates/updates the venv, prints its python
#        PY=$(scripts/oracle_venv.sh)  # as the tests use it
# Location: $L2L_ORACLE_VENV, default ${XDG_CACHE_HOME:-$HOME/.cache}/l2l/oracle-venv
# (outside git, reused across builds). Idempotent: a stamp holding the pin list skips
# pip when nothing changed. Fails (non-zero, one line on stderr) when the venv cannot be
# made or a package cannot be installed: the tests that need it then fail, never skip.
set -euo pipefail
PINS="transformers==4.46.3 tokenizers==0.20.3 safetensors==0.4.5 gguf==0.10.0 sentencepiece==0.2.0 accelerate==0.34.2 jinja2==3.1.4"
NODEPS_PINS="peft==0.13.2"
VENV=${L2L_ORACLE_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/l2l/oracle-venv}
PY="$VENV/bin/python3"
STAMP="$VENV/.l2l-pins"
if [[ -x "$PY" && -f "$STAMP" && "$(cat "$STAMP")" == "$PINS $NODEPS_PINS" ]]; then
  echo "$PY"; exit 0
fi
mkdir -p "$(dirname "$VENV")"
# A lock: ctest runs oracle tests in parallel, and several may ask for the venv at once.
exec 9>"$VENV.lock"
flock 9
if [[ -x "$PY" && -f "$STAMP" && "$(cat "$STAMP")" == "$PINS $NODEPS_PINS" ]]; then
  echo "$PY"; exit 0
fi
{
  [[ -x "$PY" ]] || /usr/bin/python3 -m venv --system-site-packages "$VENV"
  # shellcheck disable=SC2086
  "$PY" -m pip install -q --disable-pip-version-check $PINS
  # shellcheck disable=SC2086
  "$PY" -m pip install -q --disable-pip-version-check --no-deps $NODEPS_PINS
  "$PY" -c 'import torch, transformers, tokenizers, safetensors, gguf, numpy, peft, jinja2'
} >&2 || { echo "oracle_venv.sh: could not make the oracle venv at $VENV (pins: $PINS $NODEPS_PINS)" >&2; exit 1; }
echo "$PINS $NODEPS_PINS" > "$STAMP"
echo "$PY"
