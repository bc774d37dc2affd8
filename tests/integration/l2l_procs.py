# Helpers for the python integration tests that drive real l2l processes (chaos_test.py,
# shards_test.py, netns_test.py, ...): a small job and its tokens file, l2l-eps /
# l2l-worker / l2lctl started the way an operator starts them (ShardedJob: one job on one
# daemon or N shards sharing a checkpoint root), checkpoints compared byte for byte, and a
# process table that kills and reaps everything it started on every exit path.
#
# Ownership: a Procs object owns every process it spawned; close() sends SIGKILL to the
# ones still running, reaps them all and says whether any spawned pid is still alive.
# Each child also gets PR_SET_PDEATHSIG(SIGKILL), so it dies with the test even when the
# test itself is killed. Thread-safety: one thread.
import ctypes
import glob
import json
import os
import re
import signal
import socket
import struct
import subprocess
import time

_libc = ctypes.CDLL(None, use_errno=True)
_PR_SET_PDEATHSIG = 1


def _die_with_parent():
    _libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


class Failure(Exception):
    """A check of an integration test failed (the tests catch it, print it and exit 1)."""


def sh(argv, check=True):
    """Runs argv (text output captured); with check, a non-zero exit raises Failure naming
    the command and its error output."""
    r = subprocess.run(argv, capture_output=True, text=True)
    if check and r.returncode != 0:
        raise Failure("%s: exit %d: %s" % (" ".join(argv), r.returncode, (r.stderr or r.stdout).strip()))
    return r


def remove_segments(tag):
    """Unlinks the /dev/shm segments of the daemons a test started with job ids holding
    `tag` (l2l-*-<tag>-*: a killed daemon leaves its segments behind)."""
    for seg in glob.glob("/dev/shm/l2l-*-%s-*" % tag):
        try:
            os.unlink(seg)
        except OSError:
            pass


def free_port():
    """A TCP port on 127.0.0.1 that was free a moment ago (for a --listen that must stay
    the same across restarts; port 0 everywhere else)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def write_tokens(path, n, vocab):
    """An llm.c tokens file (version 1, uint16) holding a noisy walk over the vocabulary."""
    toks, x, cur = [], 12345, 0
    for _ in range(n):
        x = (x * 6364136223846793005 + 1442695040888963407) % (1 << 64)
        r = (x >> 33) % 8
        cur = (cur + 1) % vocab if r < 7 else (x >> 20) % vocab
        toks.append(cur)
    header = [20240520, 1, n] + [0] * 253
    with open(path, "wb") as f:
        f.write(struct.pack("<256i", *header))
        f.write(struct.pack("<%dH" % n, *toks))


JOB_LAYERS = 5  # write_job's model: embedding, 3 blocks, head


def write_job(path, tokens_path, steps, checkpoint_every=0, extra=""):
    """A job small enough for seconds per run on one core, big enough to have 3+ layers."""
    with open(path, "w") as f:
        f.write(f"""model:
  vocab_size: 96
  seq_len: 16
  d_model: 32
  n_layer: 3
  n_head: 4
  d_ff: 128
optim:
  lr: 3.0e-3
  warmup_steps: 2
  eps: 1.0e-6
train:
  steps: {steps}
  micro_batch_size: 2
  micro_batches: 3
  seed: 77
  log_every: 1
  mode: sync
  checkpoint_every: {checkpoint_every}
data:
  train_path: {tokens_path}
publish_dtype: f32
{extra}""")


class Proc:
    def __init__(self, name, popen, log_path):
        self.name, self.popen, self.log_path = name, popen, log_path

    @property
    def pid(self):
        return self.popen.pid

    def running(self):
        return self.popen.poll() is None

    def kill9(self):
        if self.running():
            os.kill(self.popen.pid, signal.SIGKILL)
        return self.wait(30)

    def wait(self, timeout):
        """Exit code (negative: killed by that signal), or None when still running."""
        try:
            return self.popen.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            return None

    def log(self):
        try:
            with open(self.log_path, errors="replace") as f:
                return f.read()
        except OSError:
            return ""

    def tail(self, n=30):
        return "\n".join(self.log().splitlines()[-n:])


class Procs:
    def __init__(self, bin_dir, work_dir):
        self.bin_dir, self.work_dir = os.path.abspath(bin_dir), work_dir
        self.all = []
        self.spawned_pids = []

    def spawn(self, name, argv, prefix=(), env=None):
        log_path = os.path.join(self.work_dir, name + ".log")
        logf = open(log_path, "ab")
        full_env = dict(os.environ)
        full_env.update(env or {})
        p = subprocess.Popen(list(prefix) + argv, stdout=logf, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                             preexec_fn=_die_with_parent, env=full_env, cwd=self.work_dir)
        logf.close()
        proc = Proc(name, p, log_path)
        self.all.append(proc)
        self.spawned_pids.append(p.pid)
        return proc

    def bin(self, name):
        return os.path.join(self.bin_dir, name)

    def ctl(self, addr, args, prefix=(), ctl_flags=(), timeout=120):
        """l2lctl --eps ADDR ... ARGS: (exit code, stdout, stderr)."""
        r = subprocess.run(list(prefix) + [self.bin("l2lctl"), "--eps", addr] + list(ctl_flags) + list(args),
                           capture_output=True, text=True, timeout=timeout, preexec_fn=_die_with_parent)
        return r.returncode, r.stdout, r.stderr

    def status(self, addr, prefix=(), ctl_flags=()):
        """The daemon's status as a dict, or None when it does not answer."""
        try:
            code, out, _ = self.ctl(addr, ["--json", "--connect-timeout-ms", "3000", "status"], prefix, ctl_flags,
                                    timeout=60)
        except subprocess.TimeoutExpired:
            return None
        if code != 0:
            return None
        try:
            return json.loads(out)
        except ValueError:
            return None

    def close(self):
        """Kills and reaps every spawned process; returns the pids still alive afterwards."""
        for p in self.all:
            if p.running():
                try:
                    os.kill(p.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        for p in self.all:
            p.wait(30)
        alive = []
        for p in self.all:
            if p.popen.returncode is None:  # not reaped: still ours and alive
                alive.append(p.pid)
        return alive


def wait_port(state_dir, proc, timeout):
    """Waits for <state_dir>/eps.port written by a daemon that is `proc`; the port or None."""
    path = os.path.join(state_dir, "eps.port")
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not proc.running():
            return None
        try:
            with open(path) as f:
                s = f.read().strip()
            if s:
                return int(s)
        except (OSError, ValueError):
            pass
        time.sleep(0.05)
    return None


def read_bytes(path):
    with open(path, "rb") as f:
        return f.read()


def safetensors_tensors(path):
    """{name: raw bytes} of a safetensors file (the header's JSON and the data it points to)."""
    data = read_bytes(path)
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    base = 8 + n
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        b, e = info["data_offsets"]
        out[name] = (info["dtype"], tuple(info["shape"]), data[base + b:base + e])
    return out


def compare_weights(got_path, ref_path):
    """Empty string when both safetensors files hold the same tensors bit for bit, else
    a description of the first differences."""
    got, ref = safetensors_tensors(got_path), safetensors_tensors(ref_path)
    if set(got) != set(ref):
        return "tensor names differ: only in result %s, only in reference %s" % (
            sorted(set(got) - set(ref)), sorted(set(ref) - set(got)))
    bad = []
    for name in sorted(ref):
        if got[name][:2] != ref[name][:2]:
            bad.append("%s: dtype/shape %s vs %s" % (name, got[name][:2], ref[name][:2]))
        elif got[name][2] != ref[name][2]:
            g, r = got[name][2], ref[name][2]
            first = next(i for i in range(len(r)) if g[i] != r[i]) // 4
            bad.append("%s: bytes differ from float %d on" % (name, first))
    return "; ".join(bad[:5]) + (" (and %d more)" % (len(bad) - 5) if len(bad) > 5 else "")


def manifest_for_compare(d):
    """Checkpoint dir d's manifest.json less what differs between equal runs: its
    "created_unix" and the workers' "name" fields."""
    with open(os.path.join(d, "manifest.json")) as f:
        m = json.load(f)
    m.pop("created_unix", None)
    for w in m.get("workers", []):
        w.pop("name", None)
    return m


def compare_checkpoints(got, ref, layers=JOB_LAYERS):
    """'' when checkpoint dirs `got` and `ref` hold the same `layers` layer files byte for
    byte (fp32 master, AdamW m and v) and the same manifest (manifest_for_compare); else
    the differences."""
    names = sorted(x for x in os.listdir(ref) if x.startswith("layer-"))
    got_names = sorted(x for x in os.listdir(got) if x.startswith("layer-"))
    if names != got_names or len(names) != layers:
        return "layer files %s vs the reference's %s" % (got_names, names)
    diff = [n for n in names if read_bytes(os.path.join(got, n)) != read_bytes(os.path.join(ref, n))]
    gm, rm = manifest_for_compare(got), manifest_for_compare(ref)
    if gm != rm:
        keys = sorted(k for k in set(gm) | set(rm) if gm.get(k) != rm.get(k))
        diff.append("manifest.json fields %s (%s vs %s)" % (keys, {k: gm.get(k) for k in keys},
                                                           {k: rm.get(k) for k in keys}))
    return ", ".join(diff)


class ShardedJob:
    """One job on n l2l-eps daemons and its workers, started the way an operator starts
    them: n == 1 is a single daemon; n > 1 runs l2l-eps --shard K/N, shard K > 0 joining
    shard 0 with --coordinator, the workers given shard 0 (--eps). Every daemon reads one
    daemon config file naming one checkpoint root (checkpoint.dir: each shard writes its
    part there, shard 0 assembles), and has a job id holding this process's pid (for
    remove_segments). With `ports` (one per shard) shard K listens on 127.0.0.1:ports[K],
    so a restarted shard is found where it was; without, on port 0 (read from eps.port).
    Owns nothing itself: its processes are `procs`'."""

    def __init__(self, procs, work, name, job, n, workers=2, ports=None, shard_args=None, shard_env=None,
                 shard_config=None):
        self.procs, self.name, self.job, self.n, self.n_workers = procs, name, job, n, workers
        self.dir = os.path.join(work, name)
        os.makedirs(self.dir)
        self.root = os.path.join(self.dir, "ckpt")
        self.config = os.path.join(self.dir, "eps.yaml")
        with open(self.config, "w") as f:
            f.write("checkpoint:\n  dir: %s\n" % self.root)
        # Extra flags / environment / config file per shard index.
        self.shard_args = shard_args or {}
        self.shard_env = shard_env or {}
        self.shard_config = shard_config or {}
        self.job_id = "%s-%d" % (name, os.getpid())  # remove_segments' glob needs "-<pid>-"
        self.ports = ports
        self.eps = [None] * n
        self.addr = ["127.0.0.1:%d" % p for p in ports] if ports else [None] * n
        self.workers = []  # worker i's Proc at index i (tests may also append their own)
        self.starts = 0

    def state(self, k):
        return os.path.join(self.dir, "s%d" % k)

    def current(self):
        """The processes now in its roles (shards, then workers; None where not started)."""
        return self.eps + self.workers

    def start_shard(self, k, resume=False, args=None, env=None, wait=True):
        """Starts shard k (the only daemon when n == 1), from the job file or (resume) the
        root's latest checkpoint; its Proc (wait: once it listens, else at once)."""
        try:
            os.unlink(os.path.join(self.state(k), "eps.port"))
        except FileNotFoundError:
            pass
        argv = [self.procs.bin("l2l-eps"), "--state-dir", self.state(k), "--workers", str(self.n_workers),
                "--job-id", self.job_id, "--config", self.shard_config.get(k, self.config)]
        argv += ["--resume", self.root] if resume else ["--job", self.job]
        if self.ports:
            argv += ["--listen", self.addr[k]]
        if self.n > 1:
            argv += ["--shard", "%d/%d" % (k, self.n)]
            if k > 0:
                argv += ["--coordinator", self.addr[0]]
        argv += self.shard_args.get(k, []) + list(args or [])
        e = dict(self.shard_env.get(k, {}))
        e.update(env or {})
        self.starts += 1
        p = self.procs.spawn("%s-eps%d-%d" % (self.name, k, self.starts), argv, env=e)
        self.eps[k] = p
        if wait:
            port = wait_port(self.state(k), p, 120)
            if port is None:
                raise Failure("%s: shard %d did not start (exit %s):\n%s" % (self.name, k, p.wait(0), p.tail()))
            self.addr[k] = "127.0.0.1:%d" % port
        return p

    def start_daemons(self, resume=False):
        for k in range(self.n):
            self.start_shard(k, resume=resume)

    def start_worker(self, i, transport="auto", env=None, args=(), connect_timeout_ms=60000):
        """Starts worker i (named wI) against shard 0; its Proc."""
        argv = [self.procs.bin("l2l-worker"), "--eps", self.addr[0], "--device", "cpu", "--threads", "1",
                "--transport", transport, "--name", "w%d" % i, "--connect-timeout-ms",
                str(connect_timeout_ms)] + list(args)
        self.starts += 1
        p = self.procs.spawn("%s-w%d-%d" % (self.name, i, self.starts), argv, env=env)
        self.workers += [None] * (i + 1 - len(self.workers))
        self.workers[i] = p
        return p

    def start_workers(self, transport="auto", env=None, args=()):
        self.workers = []
        for i in range(self.n_workers):
            self.start_worker(i, transport, env, args)

    def wait_workers_ok(self, timeout=180):
        deadline = time.monotonic() + timeout
        for w in self.workers:
            code = w.wait(max(1, deadline - time.monotonic()))
            if code != 0:
                raise Failure("%s: worker %s exited %s:\n%s" % (self.name, w.name, code, w.tail()))

    def stop(self):
        """SIGTERM to every running daemon; each must exit 0 after 'signal 15: shutting
        down'. Returns the ones that did not, described (empty: all stopped cleanly)."""
        for p in self.eps:
            if p is not None and p.running():
                os.kill(p.pid, signal.SIGTERM)
        bad = []
        for k, p in enumerate(self.eps):
            if p is None:
                continue
            code = p.wait(60)
            if code != 0 or "signal 15: shutting down" not in p.log():
                bad.append("shard %d (%s) exited %s after SIGTERM%s" % (
                    k, p.name, code, "" if "signal 15: shutting down" in p.log()
                    else ", without logging 'signal 15: shutting down' (killed by the signal's default action?)"))
        return bad

    def train(self, transport="auto", worker_env=None):
        """The whole job: daemons, workers to the end (exit 0), daemons stopped. Returns
        stop()'s list."""
        self.start_daemons()
        self.start_workers(transport, worker_env)
        self.wait_workers_ok()
        return self.stop()

    def shard_layers(self, k, layers=JOB_LAYERS):
        """(first, last) model layer of shard k, from its log line 'shard K of N: model
        layers A..B of L'."""
        m = re.search(r"shard %d of %d: model layers (\d+)\.\.(\d+) of %d" % (k, self.n, layers), self.eps[k].log())
        if not m:
            raise Failure("%s: shard %d's log names no layer range:\n%s" % (self.name, k, self.eps[k].tail()))
        return int(m.group(1)), int(m.group(2))

    def latest(self):
        """The root's `latest` (a step-* dir name), or None."""
        try:
            with open(os.path.join(self.root, "latest")) as f:
                return f.read().strip()
        except OSError:
            return None

    def final_dir(self, steps):
        """The root's latest checkpoint dir, which must be step `steps`'s."""
        name = self.latest()
        if name != "step-%08d" % steps:
            raise Failure("%s: the root's latest is %r, not step %d's checkpoint (root: %s)" % (
                self.name, name, steps, sorted(os.listdir(self.root)) if os.path.isdir(self.root) else "missing"))
        return os.path.join(self.root, name)
