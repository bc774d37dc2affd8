#!/usr/bin/env python3
"""scripts/slurm/l2l.sbatch and l2l-launch.sh under a real Slurm (Debian's slurm-wlm and
munge), made here for the test: in a temporary directory, as root, a munge daemon with
its own key and socket, and a one-node cluster (slurmctld + slurmd in the foreground,
this host's short name, CPUs max(nproc, tasks) with SlurmdParameters=config_overrides,
proctrack/linuxproc, task/none, no accounting, JobRequeue=1, ReturnToService=2, its own
ports, state, spool and logs; SLURM_CONF points every client at it).

  0. The launcher refuses bad input (no job file, --shards >= SLURM_NTASKS, a
     non-numeric value), exit 2 naming it, before starting anything.
     And the l2l-eps command lines it builds, with a stub l2l-eps that records them: one
     shard (no --shard flag), shard 1 of 2 (--shard 1/2, --coordinator <shard 0's
     published address>, --advertise), and with a checkpoint root that has `latest`
     (--resume instead of --job).
  1. A reference: the test's job (a 3-layer GPT from a seed on a token walk, 60 steps,
     a checkpoint every 5) run by one l2l-eps and two l2l-workers outside Slurm; its
     final checkpoint's layer files (fp32 master, AdamW m and v) are the oracle.
  2. `sbatch l2l.sbatch` with SHARDS shards + 2 worker tasks on the one node: the job
     must end COMPLETED with exit 0:0, its job directory must hold the secrets with
     modes 0700/0600 (and the token must not appear in the output), and its final
     checkpoint's layer files must equal the reference's bit for bit.
  3. Requeue: the same job submitted again (each layer update slowed by L2L_DELAY_AT so
     it runs a few seconds), `scontrol requeue` once a checkpoint exists (Slurm holds a
     requeued job for 2 minutes: the test moves its StartTime to now), the second run
     must resume from the job directory's checkpoint (the launcher and l2l-eps say so,
     at a step past 0 and before the last), end COMPLETED with one restart, and equal
     the reference bit for bit.

--shards N (default 1) sets the shard count (l2l-launch.sh passes --shard K/N to
l2l-eps when N > 1). Needs root and slurmctld, slurmd, munged, sbatch, scontrol, squeue
(scripts/setup.sh installs slurm-wlm and munge); where it cannot run it prints a loud
SKIPPED banner and exits 77 (ctest: skipped); with CI=true it FAILS instead. Every job is
cancelled, every daemon stopped and the temporary directory removed on every exit path
(--keep keeps the directory). Usage: slurm_test.py BIN_DIR [--shards N] [--keep]
"""
import argparse
import glob
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import l2l_procs  # noqa: E402

SKIP = 77
STEPS = 60
CHECKPOINT_EVERY = 5
WORKERS = 2
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SBATCH = os.path.join(REPO, "scripts", "slurm", "l2l.sbatch")
LAUNCHER = os.path.join(REPO, "scripts", "slurm", "l2l-launch.sh")
TOOLS = ("munged", "slurmctld", "slurmd", "sbatch", "scontrol", "squeue", "scancel", "sinfo", "openssl")


class Failure(Exception):
    pass


def skip(why):
    bar = "!" * 78
    in_ci = os.environ.get("CI") == "true"
    print("%s\nslurm: %s: %s\n  This test needs root, Slurm (slurm-wlm) and munge; the Slurm launcher\n"
          "  (scripts/slurm/l2l.sbatch, l2l-launch.sh) is NOT tested here.\n%s%s"
          % (bar, "FAILED" if in_ci else "SKIPPED", why,
             "  CI=true: a skip is a failure here (scripts/setup.sh installs slurm-wlm and munge).\n"
             if in_ci else "", bar))
    sys.exit(1 if in_ci else SKIP)


free_port = l2l_procs.free_port


class Cluster:
    """munged + slurmctld + slurmd for one node, all under `root`; stop() undoes it."""

    def __init__(self, procs, root, cpus):
        self.procs, self.root = procs, root
        self.node = socket.gethostname().split(".")[0]
        self.conf = os.path.join(root, "slurm.conf")
        self.env = dict(os.environ, SLURM_CONF=self.conf)
        self.daemons = []
        m = os.path.join(root, "munge")
        os.makedirs(m, mode=0o700)
        for d in ("state", "spool", "log"):
            os.makedirs(os.path.join(root, d), mode=0o755)
        key = os.path.join(m, "munge.key")
        with open(key, "wb") as f:
            f.write(os.urandom(1024))
        os.chmod(key, 0o600)
        self.socket = os.path.join(m, "munge.socket")
        self.munge_argv = ["munged", "--foreground", "--force", "--socket=" + self.socket, "--key-file=" + key,
                           "--pid-file=" + os.path.join(m, "munged.pid"), "--log-file=" + os.path.join(m, "munged.log"),
                           "--seed-file=" + os.path.join(m, "munged.seed")]
        with open(self.conf, "w") as f:
            f.write("""# made by tests/integration/slurm_test.py
ClusterName=l2l{pid}
SlurmctldHost={node}(127.0.0.1)
SlurmctldPort={ctld_port}
SlurmdPort={d_port}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={sock}
StateSaveLocation={root}/state
SlurmdSpoolDir={root}/spool
SlurmctldPidFile={root}/slurmctld.pid
SlurmdPidFile={root}/slurmd.pid
SlurmctldLogFile={root}/log/slurmctld.log
SlurmdLogFile={root}/log/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
MpiDefault=none
SwitchType=switch/none
SlurmdParameters=config_overrides
MailProg=/bin/true
ReturnToService=2
JobRequeue=1
KillWait=10
MinJobAge=600
NodeName={node} NodeAddr=127.0.0.1 CPUs={cpus} RealMemory=1000 State=UNKNOWN
PartitionName=l2ltest Nodes={node} Default=YES MaxTime=INFINITE State=UP
""".format(pid=os.getpid(), node=self.node, ctld_port=free_port(), d_port=free_port(), sock=self.socket, root=root, cpus=cpus))

    def run(self, argv, check=True, timeout=60):
        r = subprocess.run(argv, capture_output=True, text=True, env=self.env, timeout=timeout, cwd=self.root)
        if check and r.returncode != 0:
            raise Failure("%s: exit %d: %s" % (" ".join(argv), r.returncode, (r.stderr or r.stdout).strip()))
        return r

    def start(self):
        self.daemons.append(self.procs.spawn("munged", self.munge_argv, env=self.env))
        deadline = time.monotonic() + 30
        while not os.path.exists(self.socket):
            if not self.daemons[0].running() or time.monotonic() > deadline:
                raise Failure("munged did not start:\n" + self.daemons[0].tail())
            time.sleep(0.1)
        self.daemons.append(self.procs.spawn("slurmctld", ["slurmctld", "-D", "-f", self.conf], env=self.env))
        self.daemons.append(self.procs.spawn("slurmd", ["slurmd", "-D", "-f", self.conf], env=self.env))
        deadline = time.monotonic() + 90
        state = ""
        while time.monotonic() < deadline:
            for d in self.daemons:
                if not d.running():
                    raise Failure("%s exited %s:\n%s" % (d.name, d.wait(0), d.tail()))
            r = self.run(["sinfo", "-h", "-N", "-o", "%T"], check=False)
            state = r.stdout.strip()
            if r.returncode == 0 and state == "idle":
                return
            time.sleep(0.5)
        raise Failure("the node did not become idle in 90 s (sinfo: %r)" % state)

    def job(self, job_id):
        """scontrol show job as a dict (one line, key=value), or {} when unknown."""
        r = self.run(["scontrol", "-o", "show", "job", str(job_id)], check=False)
        if r.returncode != 0:
            return {}
        return dict(re.findall(r"(\w+)=(\S*)", r.stdout))

    def wait_state(self, job_id, states, timeout):
        deadline = time.monotonic() + timeout
        info = {}
        while time.monotonic() < deadline:
            info = self.job(job_id)
            if info.get("JobState") in states:
                return info
            time.sleep(0.2)
        raise Failure("job %s did not reach %s in %d s: %s" % (job_id, "/".join(states), timeout,
                                                              {k: info.get(k) for k in ("JobState", "Reason",
                                                                                         "ExitCode", "Restarts")}))

    def stop(self):
        """Cancels every job, waits for the queue to drain, stops the daemons."""
        if not self.daemons:
            return
        try:
            if len(self.daemons) == 3 and self.daemons[1].running():
                self.run(["scancel", "--full", "--user=root"], check=False)
                deadline = time.monotonic() + 60
                while time.monotonic() < deadline:
                    r = self.run(["squeue", "-h", "-o", "%i"], check=False)
                    if r.returncode != 0 or not r.stdout.strip():
                        break
                    time.sleep(0.5)
        except subprocess.TimeoutExpired:
            pass
        for d in reversed(self.daemons):  # slurmd, slurmctld, munged
            if d.running():
                d.popen.send_signal(signal.SIGTERM)
                if d.wait(30) is None:
                    d.kill9()
        self.daemons = []


def tagged_pids(tag):
    """Pids of processes whose environment carries L2L_SLURM_TEST=tag (this test's)."""
    pids = []
    for p in os.listdir("/proc"):
        if not p.isdigit() or int(p) == os.getpid():
            continue
        try:
            with open("/proc/%s/environ" % p, "rb") as f:
                env = f.read().split(b"\0")
        except OSError:
            continue
        if ("L2L_SLURM_TEST=" + tag).encode() in env:
            pids.append(int(p))
    return pids


def final_layers(ckpt_root):
    """{relative path: bytes} of the layer files of the checkpoint `latest` names."""
    with open(os.path.join(ckpt_root, "latest")) as f:
        step_dir = os.path.join(ckpt_root, f.read().strip())
    files = sorted(glob.glob(os.path.join(step_dir, "**", "layer-*.bin"), recursive=True))
    if not files:
        raise Failure("no layer files in %s" % step_dir)
    return os.path.basename(step_dir), {os.path.relpath(p, step_dir): l2l_procs.read_bytes(p) for p in files}


def compare_final(got_root, ref_root, what):
    got_step, got = final_layers(got_root)
    ref_step, ref = final_layers(ref_root)
    if got_step != ref_step:
        raise Failure("%s: final checkpoint %s, the reference's is %s" % (what, got_step, ref_step))
    if sorted(got) != sorted(ref):
        raise Failure("%s: layer files %s, the reference has %s" % (what, sorted(got), sorted(ref)))
    bad = [name for name in sorted(ref) if got[name] != ref[name]]
    if bad:
        raise Failure("%s: layer files differ from the reference run's: %s" % (what, bad))
    return got_step, len(ref), sum(len(b) for b in ref.values())


def reference_run(procs, work, job_yaml):
    """One l2l-eps + WORKERS workers outside Slurm; returns its checkpoint root."""
    state = os.path.join(work, "ref-state")
    eps = procs.spawn("ref-eps", [procs.bin("l2l-eps"), "--job", job_yaml, "--state-dir", state,
                                  "--job-id", "l2l-slurm-ref-%d" % os.getpid(), "--workers", str(WORKERS)])
    port = l2l_procs.wait_port(state, eps, 120)
    if port is None:
        raise Failure("reference l2l-eps did not start:\n" + eps.tail())
    addr = "127.0.0.1:%d" % port
    workers = [procs.spawn("ref-w%d" % i, [procs.bin("l2l-worker"), "--eps", addr, "--threads", "1",
                                           "--device", "cpu", "--connect-timeout-ms", "60000"])
               for i in range(WORKERS)]
    for w in workers:
        code = w.wait(300)
        if code != 0:
            raise Failure("reference worker exited %s:\n%s" % (code, w.tail()))
    st = procs.status(addr)
    if not st or st["step"] != STEPS or st["state"] != "finished":
        raise Failure("reference run did not finish: %s" % st)
    code, out, err = procs.ctl(addr, ["stop"])
    if code != 0 or eps.wait(60) != 0:
        raise Failure("reference l2l-eps did not stop cleanly: %s %s\n%s" % (out, err, eps.tail()))
    return os.path.join(state, "checkpoints")


def launcher_refusals(work, job_yaml, bin_dir):
    """Step 0: the launcher run by hand with a task's Slurm variables."""
    base = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "L2L_"))}
    base.update(SLURM_PROCID="0", SLURM_NTASKS="3", SLURM_JOB_ID="999", SLURM_NODEID="0", SLURM_LOCALID="0",
                SLURM_JOB_NODELIST="localhost", SLURM_SUBMIT_DIR=work, L2L_BIN_DIR=bin_dir)
    cases = (("a missing job file", ["--job", os.path.join(work, "no-such-job.yaml")], {}, "no-such-job.yaml"),
             ("--shards >= SLURM_NTASKS", ["--job", job_yaml, "--shards", "3"], {}, "SLURM_NTASKS=3"),
             ("a non-numeric L2L_SHARDS", ["--job", job_yaml], {"L2L_SHARDS": "two"}, "L2L_SHARDS"),
             ("a non-numeric SLURM_PROCID", ["--job", job_yaml], {"SLURM_PROCID": "x1"}, "SLURM_PROCID"))
    lines = []
    for what, argv, env, word in cases:
        r = subprocess.run([LAUNCHER] + argv, capture_output=True, text=True, env=dict(base, **env), timeout=60)
        if r.returncode != 2 or word not in r.stderr:
            raise Failure("l2l-launch.sh with %s: exit %d, expected 2 naming %s: %s%s" % (what, r.returncode, word,
                                                                                      r.stdout, r.stderr))
        lines.append("%s: %s" % (what, r.stderr.strip()))
    if os.path.exists(os.path.join(work, "l2l-999")):
        raise Failure("l2l-launch.sh refused its input but made a job directory")
    return lines


def shard_command_lines(work, job_yaml):
    """Step 0b: the l2l-eps command lines the launcher builds, with a stub l2l-eps that
    records its arguments and exits 3 (no Slurm needed): one shard (task 0: no --shard;
    it also makes the job directory), shard 1 of 2 (--shard, --coordinator, --advertise)
    and shard 1 of 2 with a checkpoint (--resume). Returns the lines."""
    stub = os.path.join(work, "stub-bin")
    os.makedirs(stub)
    out = os.path.join(work, "stub-args")
    for name, body in (("l2l-eps", 'printf "%%s\\n" "$*" > "%s"; exit 3' % out), ("l2l-worker", "exit 0"),
                       ("l2lctl", "exit 0")):
        with open(os.path.join(stub, name), "w") as f:
            f.write("#!/bin/sh\n%s\n" % body)
        os.chmod(os.path.join(stub, name), 0o755)
    base = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "L2L_"))}
    base.update(SLURM_NTASKS="4", SLURM_JOB_ID="5", SLURM_NODEID="0", SLURMD_NODENAME="node0",
                SLURM_JOB_NODELIST="node0", SLURM_SUBMIT_DIR=work, L2L_BIN_DIR=stub, L2L_LAUNCH_TIMEOUT="5")
    job_dir = os.path.join(work, "l2l-5")
    lines = []

    def run(what, env, want, unwanted):
        if os.path.exists(out):
            os.remove(out)
        r = subprocess.run([LAUNCHER, "--job", job_yaml], capture_output=True, text=True, env=dict(base, **env),
                           timeout=60)
        args = open(out).read().strip() if os.path.exists(out) else ""
        if r.returncode != 3 or not args:
            raise Failure("launcher (%s) with a stub l2l-eps: exit %d (expected the stub's 3): %s" % (
                what, r.returncode, r.stderr))
        for w in want:
            if w not in " %s " % args:
                raise Failure("launcher (%s): l2l-eps got `%s`, without `%s`" % (what, args, w.strip()))
        for u in unwanted:
            if u in " %s " % args:
                raise Failure("launcher (%s): l2l-eps got `%s`, with `%s`" % (what, args, u.strip()))
        lines.append("%s: l2l-eps %s" % (what, args))

    run("1 shard, task 0", {"SLURM_PROCID": "0", "SLURM_LOCALID": "0", "SLURM_NTASKS": "3"},
        [" --job %s " % job_yaml, " --workers 2 ", " --listen node0:0 ", " --token-file %s/secrets/token " % job_dir],
        [" --shard", " --coordinator", " --advertise", " --resume"])
    with open(os.path.join(job_dir, "run-0", "shard-0"), "w") as f:
        f.write("node0:7000\n")
    two = {"SLURM_PROCID": "1", "SLURM_LOCALID": "1", "L2L_SHARDS": "2", "L2L_PORT": "7000"}
    run("shard 1 of 2", two, [" --shard 1/2 ", " --coordinator node0:7000 ", " --advertise node0:7001 ",
                              " --listen node0:7001 ", " --workers 2 ", " --job %s " % job_yaml], [" --resume"])
    os.makedirs(os.path.join(job_dir, "checkpoints", "step-00000002"), exist_ok=True)
    with open(os.path.join(job_dir, "checkpoints", "latest"), "w") as f:
        f.write("step-00000002\n")
    run("shard 1 of 2, a checkpoint", two, [" --shard 1/2 ", " --resume %s/checkpoints " % job_dir], [" --job "])
    shutil.rmtree(job_dir)
    return lines


def submit(cluster, work, job_yaml, shards, extra_env=None):
    env = dict(cluster.env, L2L_JOB=job_yaml, L2L_SHARDS=str(shards), L2L_BIN_DIR=cluster.procs.bin_dir,
               L2L_LAUNCHER=LAUNCHER, L2L_WATCH_INTERVAL="1", L2L_WORKER_THREADS="1", L2L_LAUNCH_TIMEOUT="120",
               L2L_WORKER_DEVICE="cpu")
    env.update(extra_env or {})
    n = shards + WORKERS
    r = subprocess.run(["sbatch", "--parsable", "--nodes=1", "--ntasks=%d" % n, "--ntasks-per-node=%d" % n,
                        "--cpus-per-task=1", "--time=10", SBATCH], capture_output=True, text=True, env=env,
                       cwd=work, timeout=60)
    if r.returncode != 0:
        raise Failure("sbatch failed (exit %d): %s" % (r.returncode, r.stderr.strip()))
    return int(r.stdout.strip().split(";")[0])


def job_output(work, job_id):
    try:
        with open(os.path.join(work, "l2l-%d.out" % job_id), errors="replace") as f:
            return f.read()
    except OSError:
        return ""


def check_completed(cluster, work, job_id, timeout):
    info = cluster.wait_state(job_id, ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY"),
                              timeout)
    if info.get("JobState") != "COMPLETED" or info.get("ExitCode") != "0:0":
        raise Failure("job %d ended %s, exit %s:\n%s" % (job_id, info.get("JobState"), info.get("ExitCode"),
                                                          "\n".join(job_output(work, job_id).splitlines()[-40:])))
    return info


def check_secrets(job_dir, output):
    mode = lambda p: os.stat(p).st_mode & 0o777  # noqa: E731
    if mode(job_dir) != 0o700 or mode(os.path.join(job_dir, "secrets")) != 0o700:
        raise Failure("job directory modes %o / secrets %o, expected 700" % (mode(job_dir),
                                                                            mode(os.path.join(job_dir, "secrets"))))
    for f in ("token", "tls.key", "tls.crt"):
        if mode(os.path.join(job_dir, "secrets", f)) != 0o600:
            raise Failure("secrets/%s has mode %o, expected 600" % (f, mode(os.path.join(job_dir, "secrets", f))))
    with open(os.path.join(job_dir, "secrets", "token")) as f:
        token = f.read().strip()
    if len(token) < 32 or token in output:
        raise Failure("the job's token is too short or appears in the job's output")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("bin_dir")
    ap.add_argument("--shards", type=int, default=1)
    ap.add_argument("--keep", action="store_true")
    a = ap.parse_args()
    if a.shards < 1:
        print("slurm: --shards must be at least 1")
        return 2
    if os.geteuid() != 0:
        skip("not root (uid %d)" % os.geteuid())
    for tool in TOOLS:
        if not shutil.which(tool):
            skip("`%s` is not installed (scripts/setup.sh installs slurm-wlm, munge, openssl)" % tool)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))  # ctest's timeout: clean up, then exit

    t0 = time.monotonic()
    work = tempfile.mkdtemp(prefix="l2l-slurm-")
    os.chmod(work, 0o755)
    tag = os.path.basename(work)
    os.environ["L2L_SLURM_TEST"] = tag  # inherited by every daemon, job and task: found again at the end
    procs = l2l_procs.Procs(a.bin_dir, work)
    cluster = None
    ok = False
    try:
        tokens = os.path.join(work, "train.bin")
        l2l_procs.write_tokens(tokens, 20000, 96)
        job_yaml = os.path.join(work, "job.yaml")
        l2l_procs.write_job(job_yaml, tokens, STEPS, checkpoint_every=CHECKPOINT_EVERY)

        for line in launcher_refusals(work, job_yaml, procs.bin_dir):
            print("slurm: refused: " + line)
        for line in shard_command_lines(work, job_yaml):
            print("slurm: command line: " + line)

        ref_root = reference_run(procs, work, job_yaml)
        print("slurm: reference run outside Slurm (1 l2l-eps, %d workers, %d steps) done" % (WORKERS, STEPS))

        n = a.shards + WORKERS
        cluster = Cluster(procs, os.path.join(work, "slurm"), max(os.cpu_count() or 1, n))
        cluster.start()
        print("slurm: cluster up: node %s, slurm.conf %s" % (cluster.node, cluster.conf))
        if cluster.run(["getent", "hosts", cluster.node], check=False).returncode != 0:
            raise Failure("this host's name %s does not resolve (the shards listen on their node's name)"
                          % cluster.node)

        # 2. A plain run.
        t = time.monotonic()
        job1 = submit(cluster, work, job_yaml, a.shards)
        check_completed(cluster, work, job1, 240)
        out1 = job_output(work, job1)
        job_dir = os.path.join(work, "l2l-%d" % job1)
        check_secrets(job_dir, out1)
        for k in range(1, a.shards):  # the shards really split the model (and shard k joined shard 0)
            if ("shard %d of %d: model layers" % (k, a.shards)) not in out1 or \
                    ("shard %d of %d joined shard 0" % (k, a.shards)) not in out1:
                raise Failure("job %d: shard %d of %d did not start with its layers and join shard 0" %
                              (job1, k, a.shards))
        step, nfiles, nbytes = compare_final(os.path.join(job_dir, "checkpoints"), ref_root, "job %d" % job1)
        print("slurm: job %d (%d shard(s) + %d workers) COMPLETED in %.1f s; final checkpoint %s: %d layer files, "
              "%d bytes, equal to the reference bit for bit" % (job1, a.shards, WORKERS, time.monotonic() - t, step,
                                                                nfiles, nbytes))

        # 3. Requeue mid-run.
        t = time.monotonic()
        job2 = submit(cluster, work, job_yaml, a.shards, {"L2L_DELAY_AT": "eps.update:20"})
        job_dir2 = os.path.join(work, "l2l-%d" % job2)
        latest = os.path.join(job_dir2, "checkpoints", "latest")
        deadline = time.monotonic() + 120
        while not os.path.exists(latest):
            st = cluster.job(job2).get("JobState")
            if st not in ("PENDING", "RUNNING", "CONFIGURING") or time.monotonic() > deadline:
                raise Failure("job %d wrote no checkpoint (state %s):\n%s" % (job2, st, job_output(work, job2)[-3000:]))
            time.sleep(0.1)
        cluster.run(["scontrol", "requeue", str(job2)])
        with open(latest) as f:
            at = f.read().strip()
        deadline = time.monotonic() + 60
        while True:  # requeued: Restarts=1, no longer COMPLETING
            info = cluster.job(job2)
            if info.get("Restarts") == "1" and info.get("JobState") not in ("COMPLETING", None):
                break
            if time.monotonic() > deadline:
                raise Failure("job %d after scontrol requeue: %s" % (job2, info))
            time.sleep(0.2)
        if info.get("JobState") == "PENDING":  # held until BeginTime (2 minutes on 22.05): release it now
            cluster.run(["scontrol", "update", "jobid=%d" % job2, "StartTime=now"], check=False)
        info = check_completed(cluster, work, job2, 240)
        out2 = job_output(work, job2)
        if info.get("Restarts") != "1":
            raise Failure("job %d: Restarts=%s, expected 1" % (job2, info.get("Restarts")))
        if "CANCELLED" not in out2 or "DUE TO JOB REQUEUE" not in out2:
            raise Failure("job %d's output does not show the requeue:\n%s" % (job2, out2[-3000:]))
        resumed = re.findall(r"0: l2l-launch\[0\]: shard 0/%d: resuming from (\S+) \((step-\d+)\), restart 1"
                             % a.shards, out2)
        starts = [int(s) for s in re.findall(r"start step (\d+) from checkpoint", out2)]
        if not resumed or resumed[0][0] != os.path.join(job_dir2, "checkpoints") or not starts:
            raise Failure("job %d's second run did not resume from its checkpoint root:\n%s" % (job2, out2[-4000:]))
        if not 0 < starts[-1] < STEPS:
            raise Failure("job %d resumed at step %d, expected one in 1..%d" % (job2, starts[-1], STEPS - 1))
        step, nfiles, nbytes = compare_final(os.path.join(job_dir2, "checkpoints"), ref_root, "job %d" % job2)
        print("slurm: job %d requeued with a checkpoint at %s; the second run resumed from %s at step %d and "
              "COMPLETED in %.1f s in all; final checkpoint %s equal to the reference bit for bit"
              % (job2, at, resumed[0][1], starts[-1], time.monotonic() - t, step))
        print("slurm: passed in %.1f s" % (time.monotonic() - t0))
        ok = True
    except (Failure, subprocess.TimeoutExpired) as e:
        print("slurm: FAILED: %s" % e)
        for p in procs.all:
            print("---- %s (tail)\n%s" % (p.name, p.tail(15)))
    finally:
        if cluster is not None:
            cluster.stop()
        alive = procs.close()
        left = tagged_pids(tag)
        deadline = time.monotonic() + 15  # slurmstepd ends a moment after its job
        while left and time.monotonic() < deadline:
            time.sleep(0.5)
            left = tagged_pids(tag)
        for pid in left:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        if alive or left:
            print("slurm: FAILED: processes outlived the test: %s" % sorted(set(alive + left)))
            ok = False
        if ok and not a.keep:
            shutil.rmtree(work, ignore_errors=True)
        else:
            print("slurm: work dir kept: %s" % work)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
