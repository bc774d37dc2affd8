#!/usr/bin/env bash
# l2l-launch.sh: one task of an l2l job under Slurm (docs/operations.md "Running on a
# cluster"). `srun` runs it once per task (scripts/slurm/l2l.sbatch); from SLURM_PROCID it
# decides what this task is:
#
#   tasks 0..K-1   l2l-eps shards (K = --shards, default 1); shard 0 is the coordinator,
#                  the address every worker is given. K = 1 starts today's single daemon
#                  (no --shard flag); K > 1 passes --shard K/N, and to shards K > 0
#                  --coordinator (shard 0's address) and --advertise.
#   tasks K..N-1   l2l-worker, one per task: --device cuda:<i> where a GPU is visible
#                  (CUDA_VISIBLE_DEVICES / SLURM_STEP_GPUS), i = the task's index among
#                  the workers of its node; else --device cpu.
#
# The job directory (--job-dir, default $SLURM_SUBMIT_DIR/l2l-<SLURM_JOB_ID>; on a shared
# filesystem, mode 0700) is made once by task 0; a requeued job keeps its SLURM_JOB_ID and
# so its directory:
#
#   secrets/           mode 0700: token (made once), tls.crt + tls.key (self-signed,
#                      its names every node of the allocation: made once, and again
#                      when a requeued run lands on other nodes), tls.names; files mode
#                      0600, made with openssl by task 0, never printed
#   eps.yaml           the daemon config (--eps-config's text + checkpoint.dir)
#   checkpoints/       the checkpoint root every shard shares; when it has a `latest`,
#                      every shard starts with --resume <root> instead of --job
#   state/shard-K/     shard K's --state-dir (eps.port, run.jsonl); its --job-id (the
#                      names of its shared memory) is l2l-<cluster>-<job id>-s<K>
#   run-R/ready        this run's set-up is done (R = SLURM_RESTART_COUNT)
#   run-R/shard-K      shard K's published HOST:PORT, written atomically once it listens
#   run-R/shard-0.exit shard 0's daemon's exit status, once it has exited
#
# Other tasks wait for the files they need for at most --timeout seconds, then fail
# naming the file. Shard 0 watches its daemon (l2lctl watch: one progress line per step)
# until the job is finished and its workers have left, then stops it (final checkpoint),
# writes run-R/shard-0.exit and exits with the daemon's status; shards K > 0 are stopped
# once that file appears (or end when their daemon does). A worker task is the worker's
# process (exec): its exit status is the task's. srun --kill-on-bad-exit=1 (l2l.sbatch)
# turns a failed task into a failed step.
#
# Options (each also an environment variable; the flag wins):
#   --job FILE            L2L_JOB          the job YAML (required; read by the shards)
#   --shards K            L2L_SHARDS       shard tasks (1)
#   --job-dir DIR         L2L_JOB_DIR      ($SLURM_SUBMIT_DIR/l2l-$SLURM_JOB_ID)
#   --bin-dir DIR         L2L_BIN_DIR      where l2l-eps, l2l-worker, l2lctl are (PATH,
#                                          else this script's ../../build/bin)
#   --eps-config FILE     L2L_EPS_CONFIG   base daemon config (configs/eps.yaml's keys;
#                                          it must not have a checkpoint: section)
#   --checkpoint-every N  L2L_CHECKPOINT_EVERY  checkpoint.every (0: the job's)
#   --port P              L2L_PORT         shard K listens on P+K (0: any free port)
#   --listen-host H       L2L_LISTEN_HOST  the shards' listen host (the node's name)
#   --tls-san NAMES       L2L_TLS_SANS     extra certificate names, comma-separated
#   --timeout S           L2L_LAUNCH_TIMEOUT  wait for peers' files, workers' connect (900)
#   --watch-interval S    L2L_WATCH_INTERVAL  seconds between progress polls (10)
#   --device D            L2L_WORKER_DEVICE   auto (default) | cpu | cuda:N
#   --threads N           L2L_WORKER_THREADS  CPU workers' --threads (0: all cores)
#   --eps-args "..."      L2L_EPS_ARGS     more l2l-eps flags (word-split)
#   --worker-args "..."   L2L_WORKER_ARGS  more l2l-worker flags (word-split)
set -euo pipefail

me="l2l-launch[${SLURM_PROCID:-?}]"
die() { echo "$me: error: $*" >&2; exit 2; }
log() { echo "$me: $*" >&2; }

JOB=${L2L_JOB:-}
SHARDS=${L2L_SHARDS:-1}
JOB_DIR=${L2L_JOB_DIR:-}
BIN_DIR=${L2L_BIN_DIR:-}
EPS_CONFIG=${L2L_EPS_CONFIG:-}
CHECKPOINT_EVERY=${L2L_CHECKPOINT_EVERY:-0}
PORT=${L2L_PORT:-0}
LISTEN_HOST=${L2L_LISTEN_HOST:-}
TLS_SANS=${L2L_TLS_SANS:-}
TIMEOUT=${L2L_LAUNCH_TIMEOUT:-900}
WATCH_INTERVAL=${L2L_WATCH_INTERVAL:-10}
DEVICE=${L2L_WORKER_DEVICE:-auto}
THREADS=${L2L_WORKER_THREADS:-}
EPS_ARGS=${L2L_EPS_ARGS:-}
WORKER_ARGS=${L2L_WORKER_ARGS:-}

while [ $# -gt 0 ]; do
  [ $# -ge 2 ] || die "option $1 needs a value"
  case "$1" in
    --job) JOB=$2 ;;
    --shards) SHARDS=$2 ;;
    --job-dir) JOB_DIR=$2 ;;
    --bin-dir) BIN_DIR=$2 ;;
    --eps-config) EPS_CONFIG=$2 ;;
    --checkpoint-every) CHECKPOINT_EVERY=$2 ;;
    --port) PORT=$2 ;;
    --listen-host) LISTEN_HOST=$2 ;;
    --tls-san) TLS_SANS=$2 ;;
    --timeout) TIMEOUT=$2 ;;
    --watch-interval) WATCH_INTERVAL=$2 ;;
    --device) DEVICE=$2 ;;
    --threads) THREADS=$2 ;;
    --eps-args) EPS_ARGS=$2 ;;
    --worker-args) WORKER_ARGS=$2 ;;
    *) die "unknown option '$1' (see the comment at the top of $0)" ;;
  esac
  shift 2
done

# ---- input checks: every task refuses the same bad input, naming it ------------------
uint() {  # uint NAME VALUE: a non-negative decimal integer
  [[ $2 =~ ^[0-9]+$ ]] && [ ${#2} -le 9 ] || die "$1 must be a non-negative integer, got '$2'"
}
for v in SLURM_PROCID SLURM_NTASKS SLURM_JOB_ID SLURM_NODEID SLURM_LOCALID; do
  [ -n "${!v:-}" ] || die "$v is not set: run this script with srun inside a Slurm job (scripts/slurm/l2l.sbatch)"
  uint "$v" "${!v}"
done
uint "SLURM_RESTART_COUNT" "${SLURM_RESTART_COUNT:-0}"
uint "--shards (L2L_SHARDS)" "$SHARDS"
uint "--port (L2L_PORT)" "$PORT"
uint "--timeout (L2L_LAUNCH_TIMEOUT)" "$TIMEOUT"
uint "--watch-interval (L2L_WATCH_INTERVAL)" "$WATCH_INTERVAL"
uint "--checkpoint-every (L2L_CHECKPOINT_EVERY)" "$CHECKPOINT_EVERY"
[ -z "$THREADS" ] || uint "--threads (L2L_WORKER_THREADS)" "$THREADS"
PROCID=$SLURM_PROCID NTASKS=$SLURM_NTASKS RESTART=${SLURM_RESTART_COUNT:-0}
[ "$SHARDS" -ge 1 ] || die "--shards (L2L_SHARDS) must be at least 1, got $SHARDS"
[ "$SHARDS" -lt "$NTASKS" ] ||
  die "--shards $SHARDS needs more tasks than that: SLURM_NTASKS=$NTASKS leaves no task for a worker"
[ "$PROCID" -lt "$NTASKS" ] || die "SLURM_PROCID=$PROCID is not below SLURM_NTASKS=$NTASKS"
[ "$TIMEOUT" -ge 1 ] || die "--timeout (L2L_LAUNCH_TIMEOUT) must be at least 1 s"
[ "$WATCH_INTERVAL" -ge 1 ] || die "--watch-interval (L2L_WATCH_INTERVAL) must be at least 1 s"
[ "$PORT" -eq 0 ] || [ $((PORT + SHARDS - 1)) -le 65535 ] || die "--port $PORT + $SHARDS shards exceeds 65535"
[ -n "$JOB" ] || die "no job file: pass --job FILE (or L2L_JOB) to $0"
[ -f "$JOB" ] && [ -r "$JOB" ] || die "job file '$JOB' (--job / L2L_JOB) does not exist or is not readable"
JOB=$(cd "$(dirname "$JOB")" && pwd)/$(basename "$JOB")
if [ -n "$EPS_CONFIG" ]; then
  [ -f "$EPS_CONFIG" ] && [ -r "$EPS_CONFIG" ] ||
    die "daemon config '$EPS_CONFIG' (--eps-config / L2L_EPS_CONFIG) does not exist or is not readable"
  ! grep -qE '^checkpoint[[:space:]]*:' "$EPS_CONFIG" ||
    die "daemon config '$EPS_CONFIG' has a checkpoint: section; remove it: the launcher sets checkpoint.dir" \
        "to the job directory's checkpoints/ (use --checkpoint-every for checkpoint.every)"
fi
case "$DEVICE" in auto | cpu | cuda:[0-9]*) ;; *) die "--device (L2L_WORKER_DEVICE) must be auto, cpu or cuda:N, got '$DEVICE'" ;; esac
if [ -z "$BIN_DIR" ]; then
  if command -v l2l-eps >/dev/null 2>&1; then BIN_DIR=$(dirname "$(command -v l2l-eps)")
  else BIN_DIR=$(cd "$(dirname "$0")/../.." && pwd)/build/bin; fi
fi
for b in l2l-eps l2l-worker l2lctl; do
  [ -x "$BIN_DIR/$b" ] || die "$BIN_DIR/$b is not an executable (set --bin-dir / L2L_BIN_DIR)"
done
command -v openssl >/dev/null || [ "$PROCID" -ne 0 ] || die "openssl is not installed (task 0 makes the TLS certificate)"

SUBMIT_DIR=${SLURM_SUBMIT_DIR:-$PWD}
JOB_DIR=${JOB_DIR:-$SUBMIT_DIR/l2l-$SLURM_JOB_ID}
case "$JOB_DIR" in /*) ;; *) JOB_DIR=$SUBMIT_DIR/$JOB_DIR ;; esac
NODE=${SLURMD_NODENAME:-$(hostname -s)}
LISTEN_HOST=${LISTEN_HOST:-$NODE}
RUN_DIR=$JOB_DIR/run-$RESTART
SECRETS=$JOB_DIR/secrets
CKPT=$JOB_DIR/checkpoints
umask 077

# wait_file PATH WHAT: waits until PATH exists and is not empty, at most $TIMEOUT s.
wait_file() {
  local deadline=$((SECONDS + TIMEOUT))
  while [ ! -s "$1" ]; do
    [ $SECONDS -lt $deadline ] || die "timed out after ${TIMEOUT} s waiting for $1 ($2); see that task's output"
    sleep 0.5
  done
}

# The job's node names (for the certificate): scontrol expands SLURM_JOB_NODELIST; a
# list without ranges ("a,b") is split here when scontrol cannot (no slurm.conf).
node_names() {
  local list=${SLURM_JOB_NODELIST:-}
  [ -n "$list" ] || { echo "$me: error: SLURM_JOB_NODELIST is not set" >&2; return 1; }
  if command -v scontrol >/dev/null 2>&1 && scontrol show hostnames "$list" 2>/dev/null; then
    return 0
  fi
  if [[ $list =~ [][] ]]; then
    echo "$me: error: cannot expand SLURM_JOB_NODELIST='$list': \`scontrol show hostnames\` failed" >&2
    return 1
  fi
  tr ',' '\n' <<<"$list"
}

# Task 0: the job directory, once per job (the secrets) and once per run (run-R/).
setup_job_dir() {
  mkdir -p "$JOB_DIR" && chmod 0700 "$JOB_DIR"
  mkdir -p "$CKPT" "$JOB_DIR/state" "$RUN_DIR"
  mkdir -p "$SECRETS" && chmod 0700 "$SECRETS"
  rm -f "$SECRETS"/.*.tmp-*  # left by a task 0 killed while writing (only task 0 writes here)
  # The token: made once per job directory.
  if [ ! -s "$SECRETS/token" ]; then
    openssl rand -hex 32 >"$SECRETS/.token.tmp-$$" 2>/dev/null || die "openssl rand failed (making the job's token)"
    chmod 0600 "$SECRETS/.token.tmp-$$" && mv -f "$SECRETS/.token.tmp-$$" "$SECRETS/token"
    log "made the job's token in $SECRETS/token"
  fi
  # The certificate: its names are this allocation's nodes (+ --listen-host, --tls-san);
  # made once, and again only when a requeued run lands on nodes it does not name.
  local names n
  names=$(node_names) || exit 2
  names=$({ echo "$names"; [ "$LISTEN_HOST" = "$NODE" ] || echo "$LISTEN_HOST"; tr ',' '\n' <<<"$TLS_SANS"; } |
          grep -v '^$' | sort -u)
  if [ ! -s "$SECRETS/tls.crt" ] || [ ! -s "$SECRETS/tls.key" ] || [ "$(cat "$SECRETS/tls.names" 2>/dev/null)" != "$names" ]; then
    local san="DNS:localhost,IP:127.0.0.1" tmp=$SECRETS/.tls.tmp-$$
    while read -r n; do
      if [[ $n =~ ^[0-9.]+$ ]]; then san="$san,IP:$n"; else san="$san,DNS:$n"; fi
    done <<<"$names"
    if ! openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 3650 \
         -subj "/CN=l2l-$SLURM_JOB_ID" -addext "subjectAltName=$san" \
         -keyout "$tmp.key" -out "$tmp.crt" >"$tmp.log" 2>&1; then
      cat "$tmp.log" >&2
      die "openssl could not make the job's TLS certificate"
    fi
    rm -f "$tmp.log"
    chmod 0600 "$tmp.key" "$tmp.crt"
    echo "$names" >"$tmp.names"
    mv -f "$tmp.key" "$SECRETS/tls.key" && mv -f "$tmp.crt" "$SECRETS/tls.crt" && mv -f "$tmp.names" "$SECRETS/tls.names"
    log "made the job's TLS certificate in $SECRETS (names: $san)"
  fi
  local cfg=$JOB_DIR/.eps.yaml.tmp-$$
  {
    echo "# made by scripts/slurm/l2l-launch.sh for Slurm job $SLURM_JOB_ID"
    [ -z "$EPS_CONFIG" ] || cat "$EPS_CONFIG"
    echo
    echo "checkpoint:"
    echo "  dir: $CKPT"
    echo "  every: $CHECKPOINT_EVERY"
  } >"$cfg"
  mv -f "$cfg" "$JOB_DIR/eps.yaml"
  echo "$SLURM_JOB_ID $RESTART" >"$RUN_DIR/.ready.tmp-$$"
  mv -f "$RUN_DIR/.ready.tmp-$$" "$RUN_DIR/ready"
}

if [ "$PROCID" -eq 0 ]; then
  setup_job_dir
else
  wait_file "$RUN_DIR/ready" "the job directory, made by task 0"
fi
for f in token tls.crt tls.key; do [ -s "$SECRETS/$f" ] || die "$SECRETS/$f is missing"; done
CTL=("$BIN_DIR/l2lctl" --tls-ca "$SECRETS/tls.crt" --token-file "$SECRETS/token")

# ---- a shard --------------------------------------------------------------------------
run_shard() {
  local k=$PROCID state=$JOB_DIR/state/shard-$PROCID port=0 args
  [ "$PORT" -eq 0 ] || port=$((PORT + k))
  mkdir -p "$state"
  rm -f "$state/eps.port"  # a stale one (a requeued run) would be read as this run's
  # (l2l-eps appends -s<K> to a shard's --job-id itself.)
  args=(--config "$JOB_DIR/eps.yaml" --state-dir "$state" --job-id "l2l-${SLURM_CLUSTER_NAME:+$SLURM_CLUSTER_NAME-}$SLURM_JOB_ID"
        --workers $((NTASKS - SHARDS)) --listen "$LISTEN_HOST:$port"
        --tls-cert "$SECRETS/tls.crt" --tls-key "$SECRETS/tls.key" --token-file "$SECRETS/token")
  if [ -f "$CKPT/latest" ]; then
    log "shard $k/$SHARDS: resuming from $CKPT ($(cat "$CKPT/latest")), restart $RESTART"
    args+=(--resume "$CKPT")
  else
    log "shard $k/$SHARDS: starting job $JOB"
    args+=(--job "$JOB")
  fi
  if [ "$SHARDS" -gt 1 ]; then
    args+=(--shard "$k/$SHARDS")
    if [ "$k" -gt 0 ]; then
      wait_file "$RUN_DIR/shard-0" "shard 0's address, published by task 0"
      args+=(--coordinator "$(cat "$RUN_DIR/shard-0")" --coordinator-ca "$SECRETS/tls.crt")
      [ "$port" -eq 0 ] || args+=(--advertise "$LISTEN_HOST:$port")
    fi
  fi
  # shellcheck disable=SC2206
  args+=($EPS_ARGS)
  "$BIN_DIR/l2l-eps" "${args[@]}" &
  local pid=$!
  # Slurm's SIGTERM (scancel, requeue, time limit) reaches the daemon too; pass it on in
  # case it was sent to this script only: the daemon writes its final checkpoint.
  trap 'kill -TERM $pid 2>/dev/null || true' TERM INT
  local deadline=$((SECONDS + TIMEOUT))
  while [ ! -s "$state/eps.port" ]; do
    if ! kill -0 $pid 2>/dev/null; then
      local rc=0; wait $pid || rc=$?
      log "shard $k: l2l-eps exited $rc before it listened"
      exit $((rc == 0 ? 1 : rc))
    fi
    [ $SECONDS -lt $deadline ] || { kill -TERM $pid; wait $pid || true; die "shard $k: l2l-eps did not listen within ${TIMEOUT} s"; }
    sleep 0.2
  done
  local addr
  addr=$LISTEN_HOST:$(cat "$state/eps.port")
  echo "$addr" >"$RUN_DIR/.shard-$k.tmp-$$" && mv -f "$RUN_DIR/.shard-$k.tmp-$$" "$RUN_DIR/shard-$k"
  log "shard $k/$SHARDS: l2l-eps (pid $pid) listens on $addr, published in $RUN_DIR/shard-$k"
  if [ "$k" -eq 0 ]; then watch_coordinator "$addr" $pid; else follow_coordinator "$addr" $pid; fi
  local rc=0
  wait $pid || rc=$?
  # A wait cut short by a trapped signal: the daemon is still writing its checkpoint.
  while kill -0 $pid 2>/dev/null; do rc=0; wait $pid || rc=$?; done
  log "shard $k: l2l-eps exited $rc"
  [ "$k" -ne 0 ] || { echo "$rc" >"$RUN_DIR/.shard-0.exit.tmp-$$" && mv -f "$RUN_DIR/.shard-0.exit.tmp-$$" "$RUN_DIR/shard-0.exit"; }
  exit $rc
}

# Shard 0 (the coordinator): progress until the job is finished
# (l2lctl watch exits 0), then until its workers have left (they deregister after the
# last step's checkpoint), then stop it (final checkpoint).
watch_coordinator() {
  local addr=$1 pid=$2 i st
  while kill -0 "$pid" 2>/dev/null; do
    if "${CTL[@]}" --eps "$addr" --connect-timeout-ms 10000 watch --interval "$WATCH_INTERVAL" </dev/null; then
      for ((i = 0; i < 600; ++i)); do
        st=$("${CTL[@]}" --eps "$addr" --json status 2>/dev/null || true)
        # The workers' states; the job's own is "finished" here.
        grep -qE '"state":"(active|rejoin)"' <<<"$st" || break
        sleep 0.2
      done
      [ "$i" -lt 600 ] || log "shard 0: workers still registered 120 s after the end; stopping anyway"
      log "shard 0: job finished; stopping l2l-eps (final checkpoint)"
      "${CTL[@]}" --eps "$addr" stop --wait 600 || log "shard 0: l2lctl stop failed (exit $?)"
      return
    fi
    sleep 1
  done
}

# Shards K > 0 end after the coordinator: when its daemon has exited (run-R/shard-0.exit,
# written by task 0), this one is stopped too, unless it has exited by itself.
follow_coordinator() {
  local addr=$1 pid=$2
  while kill -0 "$pid" 2>/dev/null; do
    if [ -s "$RUN_DIR/shard-0.exit" ]; then
      log "shard $PROCID: shard 0 exited $(cat "$RUN_DIR/shard-0.exit"); stopping l2l-eps"
      "${CTL[@]}" --eps "$addr" stop --wait 600 || log "shard $PROCID: l2lctl stop failed (exit $?)"
      return
    fi
    sleep 1
  done
}

# ---- a worker -------------------------------------------------------------------------
# The GPU of this worker: with one visible device, that one; with several, the task's
# index among this node's workers (tasks are placed in blocks: this node's tasks are
# PROCID-LOCALID .. and the shards among them come first).
worker_device() {
  [ "$DEVICE" = auto ] || { echo "$DEVICE"; return; }
  local vis=${CUDA_VISIBLE_DEVICES:-${SLURM_STEP_GPUS:-${SLURM_JOB_GPUS:-}}}
  if [ -z "$vis" ] || [ "$vis" = NoDevFiles ]; then echo cpu; return; fi
  local n first shards_here idx
  n=$(tr ',' '\n' <<<"$vis" | grep -c .)
  first=$((PROCID - SLURM_LOCALID))
  shards_here=$((SHARDS > first ? SHARDS - first : 0))
  idx=$((SLURM_LOCALID - shards_here))
  if [ "$n" -eq 1 ]; then echo cuda:0; return; fi
  [ "$idx" -lt "$n" ] || die "worker task $PROCID is worker $idx of node $NODE but only $n GPUs are visible ($vis): \
fewer tasks per node, or --gpus-per-task=1"
  echo "cuda:$idx"
}

run_worker() {
  local dev eps w=$((PROCID - SHARDS)) args
  dev=$(worker_device)
  wait_file "$RUN_DIR/shard-0" "shard 0's address, published by task 0"
  eps=$(cat "$RUN_DIR/shard-0")
  args=(--eps "$eps" --device "$dev" --name "$NODE-w$w" --connect-timeout-ms $((TIMEOUT * 1000))
        --tls-ca "$SECRETS/tls.crt" --token-file "$SECRETS/token")
  [ -z "$THREADS" ] || [ "$dev" != cpu ] || args+=(--threads "$THREADS")
  # shellcheck disable=SC2206
  args+=($WORKER_ARGS)
  log "worker $w: l2l-worker --device $dev --eps $eps (restart $RESTART)"
  exec "$BIN_DIR/l2l-worker" "${args[@]}"
}

if [ "$PROCID" -lt "$SHARDS" ]; then run_shard; else run_worker; fi
