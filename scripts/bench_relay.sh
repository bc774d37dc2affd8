#!/usr/bin/env bash
# Relay benchmark: tokens/s of the layer-to-layer relay (one l2l-worker relay against the
# in-process FakeEps) vs the reference trainer on the same CPU threads, same model and
# data, measured in the same run, with the ratio and the relay's per-step breakdown
# (forward, head, recompute, backward, waiting for layers, waiting on the EPS, optimizer).
# Not a test: prints only. Results go to docs/performance.md, section "Relay".
#
# Environment: L2L_BUILD_DIR (default build), THREADS (2), STEPS (5), CONFIG
# (configs/quickstart.yaml: the `small` model, B=8 T=128 M=2), STASH (the config's).
# Extra arguments go to l2l-bench-relay (e.g. --set model.n_layer=8).
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR="${L2L_BUILD_DIR:-build}"
THREADS="${THREADS:-2}" STEPS="${STEPS:-5}" CONFIG="${CONFIG:-configs/quickstart.yaml}"
if [[ ! -x "$BUILD_DIR/bin/l2l-bench-relay" ]]; then
  cmake --build "$BUILD_DIR" --target l2l-bench-relay -j 2
fi
export OMP_WAIT_POLICY="${OMP_WAIT_POLICY:-PASSIVE}"
echo "machine: $(lscpu | sed -n 's/^Model name: *//p') ($(nproc) cores), load: $(cut -d' ' -f1-3 /proc/loadavg)"
args=(--config "$CONFIG" --threads "$THREADS" --steps "$STEPS")
[[ -n "${STASH:-}" ]] && args+=(--stash "$STASH")
"$BUILD_DIR/bin/l2l-bench-relay" "${args[@]}" "$@"
