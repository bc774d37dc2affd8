# Helpers for the python integration tests that drive real l2l processes (chaos_test.py,
# netns_test.py): a small job and its tokens file, l2l-eps / l2l-worker / l2lctl started
# the way an operator starts them, and a process table that kills and reaps everything it
# started on every exit path.
#
# Ownership: a Procs object owns every process it spawned; close() sends SIGKILL to the
# ones still running, reaps them all and says whether any spawned pid is still alive.
# Each child also gets PR_SET_PDEATHSIG(SIGKILL), so it dies with the test even when the
# test itself is killed. Thread-safety: one thread.
import ctypes
import glob
import json
import os
import signal
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
