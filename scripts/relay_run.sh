#!/usr/bin/env bash
# Sourced by the quickstarts: runs one job through the real system, the l2l-eps daemon and
# one l2l-worker on the CPU, watched with l2lctl, and leaves the daemon up (paused at the
# end of the job) so the caller can export before stopping it.
#
#   relay_start BIN_DIR JOB_YAML OUT_DIR [worker args...]   # sets RELAY_CTL (array), RELAY_STATE,
#                                                           # RELAY_EPS_PID, RELAY_WORKER_PID
#   relay_wait                                              # watches, waits for the worker, prints
#                                                           # peak RSS of daemon and worker
#   relay_stop                                              # stops the daemon (no checkpoint: the
#                                                           # caller checkpoints or exports first)
# Logs: OUT_DIR/eps.log, OUT_DIR/worker.log; state: OUT_DIR/eps-state.
# RELAY_EPS_ARGS (an array, optional): extra l2l-eps flags, e.g. (--allow-data DIR
# --allow-models DIR) for a job naming files outside its own directory (the daemon reads
# only files under the job file's directory, its state dir and those it is given:
# docs/operations.md "Files a job may name").
relay_start() {
  local bin=$1 job=$2 out=$3
  shift 3
  RELAY_OUT=$out
  case $out in
    /*) RELAY_STATE="$out/eps-state" ;;
    *) RELAY_STATE="$PWD/$out/eps-state" ;;
  esac
  rm -rf "$RELAY_STATE"
  mkdir -p "$RELAY_STATE"
  "$bin/l2l-eps" --job "$job" --state-dir "$RELAY_STATE" --job-id "quickstart-$$" --workers 1 \
    ${RELAY_EPS_ARGS[@]+"${RELAY_EPS_ARGS[@]}"} > "$out/eps.log" 2>&1 &
  RELAY_EPS_PID=$!
  RELAY_WORKER_PID=""
  trap 'kill ${RELAY_WORKER_PID:-} ${RELAY_EPS_PID:-} 2>/dev/null || true' EXIT
  for _ in $(seq 3000); do
    [ -s "$RELAY_STATE/eps.port" ] && break
    kill -0 "$RELAY_EPS_PID" 2>/dev/null || break
    sleep 0.1
  done
  if [ ! -s "$RELAY_STATE/eps.port" ]; then
    echo "relay: l2l-eps did not start; its log ($out/eps.log):" >&2
    tail -20 "$out/eps.log" >&2
    return 1
  fi
  local addr="127.0.0.1:$(cat "$RELAY_STATE/eps.port")"
  echo "relay: l2l-eps listening on $addr (log $out/eps.log)"
  "$bin/l2l-worker" --eps "$addr" --name quickstart-worker "$@" > "$out/worker.log" 2>&1 &
  RELAY_WORKER_PID=$!
  echo "relay: l2l-worker started (log $out/worker.log)"
  RELAY_CTL=("$bin/l2lctl" --eps "$addr")
}

relay_peak_rss_mib() {  # PID -> peak resident set (VmHWM) in MiB, or "?"
  awk '/^VmHWM:/ {printf "%.0f", $2 / 1024; found = 1} END {if (!found) printf "?"}' "/proc/$1/status" 2>/dev/null || printf "?"
}

relay_wait() {
  "${RELAY_CTL[@]}" watch "$@" || true
  if ! wait "$RELAY_WORKER_PID"; then
    echo "relay: l2l-worker failed; its log:" >&2
    tail -20 "$RELAY_OUT/worker.log" >&2
    return 1
  fi
  RELAY_WORKER_PID=""
  local done_line
  done_line=$(grep -o 'done steps=.*' "$RELAY_OUT/worker.log" | tail -1 || true)
  local worker_kb
  worker_kb=$(sed -n 's/.*peak_rss_kb=\([0-9]*\).*/\1/p' <<<"$done_line")
  echo "relay: peak RSS: l2l-eps $(relay_peak_rss_mib "$RELAY_EPS_PID") MiB, l2l-worker $(( ${worker_kb:-0} / 1024 )) MiB"
}

relay_stop() {
  "${RELAY_CTL[@]}" stop --skip-checkpoint >/dev/null
  wait "$RELAY_EPS_PID" || true
  RELAY_EPS_PID=""
  trap - EXIT
}
