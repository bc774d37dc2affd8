#!/usr/bin/env python3
"""Chaos test: a seeded schedule of kill -9 of the daemon (l2l-eps) and of the two workers
(l2l-worker) while a synchronous job trains, with the restarts an operator's supervisor
makes (l2l-eps --resume from the latest checkpoint, workers restarted whenever they exit
non-zero). The final weights and optimizer state must equal an uninterrupted run of the
same job bit for bit, and no process started here may outlive the test.

Faults, in the order the seed draws them:
  * kill -9 from this script at a random moment of a step (mid-fetch, mid-push, mid-update
    or mid-checkpoint, wherever the moment falls): of the daemon or of one worker;
  * kill -9 at a named site, made by the process itself through L2L_FAULT_AT
    (common/fault_point.h) on a restarted process: the daemon with some layer files of a
    checkpoint written (eps.checkpoint) or with a layer updated and its step not
    committed (eps.update); a worker holding a fetched layer (worker.fetch) or with a
    gradient half written (worker.push).
A fault counts as survived when training goes past the step it hit (or the job ends).

Sharded jobs (--shards N, N >= 2; issue 31): N l2l-eps shards (--shard K/N, shard K > 0
joining shard 0 with --coordinator; each listening on a loopback port picked here, kept
across its restarts; one checkpoint root given by a daemon config file; a checkpoint
every 2 of 12 steps) and two workers (--eps <shard 0>, --transport as given; each fetched
layer held 20 ms, L2L_DELAY_AT, so a step lasts ~0.2 s). The uninterrupted reference is
one daemon with the same job. Faults the seed draws (6 by default), each once the job has
committed a step since the previous one:
  * kill -9 of shard k at a random moment of a step (any k; k >= 1 only with
    --kill-shard0 no), some of them with the restarted shard armed with a fault site
    (eps.checkpoint, eps.update, as above);
  * kill -9 of one worker at a random moment.
The supervisor here restarts a dead shard ALONE, with the same argv except --resume ROOT
for --job FILE, on its port; the other shards and the workers stay up (the shards roll
back to the last complete checkpoint, the workers wait for the shard and redo the steps
since). A dead worker is restarted with the same argv. Any other exit fails the test: a
shard exiting by itself, a worker exiting non-zero. The job ends when both workers exit
0; then every shard gets SIGTERM and must exit 0. Checked: the root's latest checkpoint
(the last step's) equals the reference's bit for bit (layer files and manifest,
l2l_procs.compare_checkpoints); the root holds no partial checkpoint; no shard removed a worker mid-job; no
process outlives the test; no shm segment is left.

Usage: chaos_test.py BIN_DIR [--transport shm|grpc] [--seed N] [--faults N] [--steps N]
                     [--shards N] [--kill-shard0 yes|no] [--shard-restart-delay-s S]
                     [--worker-exits fail|restart] [--check-losses yes|no] [--deadline-s S]
                     [--keep]
--check-losses yes (the default) also requires every step loss a daemon logs ("step N loss
X") to equal the reference's (either mode).
The seed defaults to $L2L_CHAOS_SEED, else 1; it is printed with the result line
  chaos: seed S (...): N faults injected, N survived ...
Defaults: one daemon, 100 steps, 16 faults; --shards N >= 2: 12 steps, 6 faults, shard 0
not killed. Exit 0 on success, 1 on any failure (with the logs' tails).
"""
import argparse
import glob
import os
import random
import re
import shutil
import signal
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import l2l_procs  # noqa: E402

SITES = {
    "eps": ["eps.checkpoint", "eps.update"],
    "worker": ["worker.fetch", "worker.push"],
}


Failure = l2l_procs.Failure


def site_fired(c, role, p, code):
    """Whether `role` (cluster c's process p, exit code) died at the fault site it was armed
    with; records it in c.site_fired and c.faults and disarms the role."""
    fired = c.env_now.get(role) and "L2L_FAULT_AT: injected SIGKILL at" in p.log()
    if not (fired and code == -signal.SIGKILL):
        return False
    site = c.env_now[role].split(":")[0]
    c.site_fired.append((role, site))
    c.faults.append((c.last_step, "%s at %s" % (role, site)))
    c.env_now[role] = None
    return True


class Cluster:
    """One daemon and two workers on loopback, restarted as a supervisor would."""

    def __init__(self, procs, work, job_yaml, transport, name):
        self.procs, self.work, self.job_yaml, self.transport = procs, work, job_yaml, transport
        self.name = name
        self.state = os.path.join(work, name + "-state")
        os.makedirs(self.state, exist_ok=True)
        self.job_id = "%s-%d" % (name, os.getpid())
        self.port = l2l_procs.free_port()
        self.addr = "127.0.0.1:%d" % self.port
        self.eps = None
        self.workers = [None, None]
        self.worker_done = [False, False]
        self.starts = {"eps": 0, "w0": 0, "w1": 0}
        self.worker_eps_gen = [0, 0]  # the daemon start each worker registered with
        self.env_next = {}  # role -> L2L_FAULT_AT for its next start
        self.env_now = {}   # role -> L2L_FAULT_AT its running process has
        self.site_fired = []  # (role, site) of the faults that fired
        self.faults = []  # (the job's step when it hit, what), every fault injected
        self.last_step = 0
        self.unexpected = []  # exits nobody asked for
        self.eps_args = []  # extra l2l-eps flags (e.g. --config)
        self.eps_env = {}  # extra l2l-eps environment (e.g. L2L_DELAY_AT)

    def ckpt_root(self):
        return os.path.join(self.state, "checkpoints")

    def start_eps(self):
        try:
            os.unlink(os.path.join(self.state, "eps.port"))
        except FileNotFoundError:
            pass
        argv = [self.procs.bin("l2l-eps"), "--state-dir", self.state, "--job-id", self.job_id, "--workers", "2",
                "--listen", self.addr]
        if os.path.exists(os.path.join(self.ckpt_root(), "latest")):
            argv += ["--resume", self.ckpt_root()]
        else:
            argv += ["--job", self.job_yaml]
        if self.transport == "grpc":
            argv += ["--transport", "grpc"]
        argv += self.eps_args
        env = dict(self.eps_env)
        fault = self.env_next.pop("eps", None)
        if fault:
            env["L2L_FAULT_AT"] = fault
        self.env_now["eps"] = fault
        self.starts["eps"] += 1
        self.eps = self.procs.spawn("%s-eps-%d" % (self.name, self.starts["eps"]), argv, env=env)
        if l2l_procs.wait_port(self.state, self.eps, 120) is None:
            if self.eps.running():
                raise Failure("l2l-eps did not write eps.port in 120 s:\n" + self.eps.tail())
            return False  # died while starting (a fault site, e.g. a checkpoint at once)
        return True

    def start_worker(self, i, extra_env=None):
        role = "w%d" % i
        argv = [self.procs.bin("l2l-worker"), "--eps", self.addr, "--threads", "1", "--name", role,
                "--connect-timeout-ms", "120000"]
        if self.transport == "grpc":
            argv += ["--transport", "grpc"]
        env = {}
        fault = self.env_next.pop(role, None)
        if fault:
            env["L2L_FAULT_AT"] = fault
        env.update(extra_env or {})
        self.env_now[role] = fault
        self.starts[role] += 1
        self.worker_eps_gen[i] = self.starts["eps"]
        self.workers[i] = self.procs.spawn("%s-%s-%d" % (self.name, role, self.starts[role]), argv, env=env)

    def proc(self, role):
        return self.eps if role == "eps" else self.workers[int(role[1])]

    def note_exit(self, role, p, code, killed_by_us):
        """Classifies an exit: a fault site firing, our kill, or something unexpected."""
        if site_fired(self, role, p, code):
            return "site"
        if killed_by_us:
            return "kill"
        if role != "eps" and code == 0:
            return "done"
        if role != "eps" and code != 0 and self.worker_eps_gen[int(role[1])] != self.starts["eps"]:
            return "daemon-gone"  # its daemon died under it: it exited with an error, as it must
        self.unexpected.append("%s (%s) exited %s:\n%s" % (role, p.name, code, p.tail(15)))
        return "unexpected"

    def supervise(self, killed_by_us=()):
        """One supervisor pass: restarts whatever died. Returns the roles that died."""
        died = []
        if self.eps is not None and not self.eps.running():
            code = self.eps.wait(0)
            kind = self.note_exit("eps", self.eps, code, "eps" in killed_by_us)
            died.append(("eps", kind))
            if kind == "unexpected":
                raise Failure("l2l-eps exited by itself (%s)" % code)
            self.start_eps()
            # A worker that exited 0 is not restarted (systemd's Restart=on-failure): it
            # left only once the last step's checkpoint was written, so a daemon that
            # dies after that resumes with the job finished and needs nobody.
        for i in range(2):
            role = "w%d" % i
            w = self.workers[i]
            if w is None or w.running() or self.worker_done[i]:
                continue
            code = w.wait(0)
            kind = self.note_exit(role, w, code, role in killed_by_us)
            died.append((role, kind))
            if kind == "done":
                self.worker_done[i] = True
                continue
            if kind == "unexpected":
                raise Failure("%s exited by itself (%s)" % (role, code))
            if self.eps.running():
                self.start_worker(i)
            else:
                self.workers[i] = w  # restarted on the next pass, once the daemon is back
        return died

    def current(self):
        """The processes now in the roles (the last start of each)."""
        return [self.eps] + self.workers

    def status(self):
        if self.eps is None or not self.eps.running():
            return None
        return self.procs.status(self.addr)


def run_uninterrupted(procs, work, job_yaml, transport, deadline, eps_env=None):
    c = Cluster(procs, work, job_yaml, transport, "ref")
    c.eps_env = eps_env or {}
    if not c.start_eps():
        raise Failure("reference l2l-eps did not start:\n" + c.eps.tail())
    for i in range(2):
        c.start_worker(i)
    for i in range(2):
        code = c.workers[i].wait(max(1, deadline - time.monotonic()))
        if code != 0:
            raise Failure("reference worker w%d: exit %s:\n%s" % (i, code, c.workers[i].tail()))
    return c


def finish(procs, c, steps):
    """Waits for the job's end, writes the weights (export) and the whole state (a
    checkpoint) into the state dir, stops the daemon cleanly: (export path, checkpoint dir)."""
    wait_finished(c, steps, 120, "%s: the job" % c.name)
    for args in (["export", "final.safetensors"], ["checkpoint", "--dir", "final-checkpoint"],
                 ["stop", "--skip-checkpoint"]):
        code, out, err = procs.ctl(c.addr, args)
        if code != 0:
            raise Failure("%s: l2lctl %s failed: %s %s" % (c.name, " ".join(args), out, err))
    rc = c.eps.wait(60)
    if rc != 0:
        raise Failure("%s: l2l-eps exited %s after stop:\n%s" % (c.name, rc, c.eps.tail()))
    return os.path.join(c.state, "final.safetensors"), os.path.join(c.state, "final-checkpoint")


def wait_finished(c, steps, timeout, what="the job", check=None):
    """Polls c's daemon until it reports `steps` steps done and the job finished; check()
    (optional) runs on every poll with the last status and may raise Failure."""
    deadline = time.monotonic() + timeout
    while True:
        st = c.status()
        if st and st["step"] == steps and st["state"] == "finished":
            return st
        if check is not None:
            check(st)
        if time.monotonic() > deadline:
            raise Failure("%s did not finish in %d s: %s" % (what, timeout, st))
        time.sleep(0.1)


def write_small_job(work, steps, checkpoint_every=0):
    """Token file and job YAML (l2l_procs.write_job) in `work`: the job YAML's path."""
    tokens = os.path.join(work, "train.bin")
    l2l_procs.write_tokens(tokens, 20000, 96)
    job_yaml = os.path.join(work, "job.yaml")
    l2l_procs.write_job(job_yaml, tokens, steps, checkpoint_every=checkpoint_every)
    return job_yaml


def wait_workers_exit_0(c, who="w"):
    """Both of c's workers exit with status 0 within 60 s each."""
    for i in range(2):
        code = c.workers[i].wait(60)
        if code != 0:
            raise Failure("%s%d exited %s:\n%s" % (who, i, code, c.workers[i].tail()))


def finish_and_compare(procs, c, steps, ref_export):
    """Both workers exit 0, then finish(); the final weights must equal ref_export's."""
    wait_workers_exit_0(c)
    got_export, _ = finish(procs, c, steps)
    diff = l2l_procs.compare_weights(got_export, ref_export)
    if diff:
        raise Failure("final weights differ from the uninterrupted run: " + diff)


def run_scenario(name, bin_dir, transport, keep, body):
    """The frame of the deterministic fault tests (last_step, final_step, stalled_worker):
    a fresh work dir and process set, then body(procs, work, shown), which returns the
    line to print on success, raises Failure otherwise and appends to `shown` the
    clusters whose logs a failure prints. Every process is gone and the job's shm
    segments removed afterwards; the work dir is kept on failure (or with keep)."""
    work = tempfile.mkdtemp(prefix="l2l-%s-" % name.replace("_", "-"))
    procs = l2l_procs.Procs(bin_dir, work)
    shown = []
    ok = False
    try:
        print("%s (%s): %s" % (name, transport, body(procs, work, shown)))
        ok = True
    except Failure as e:
        print("%s: FAILED (%s): %s" % (name, transport, e))
        for c in shown:
            for p in [c.eps] + c.workers:
                if p is not None:
                    print("---- %s (tail)\n%s" % (p.name, p.tail(20)))
    finally:
        alive = procs.close()
        if alive:
            print("%s: FAILED: processes outlived the test: %s" % (name, alive))
            ok = False
        l2l_procs.remove_segments(os.getpid())
        if ok and not keep:
            shutil.rmtree(work, ignore_errors=True)
        else:
            print("%s: work dir kept: %s" % (name, work))
    return 0 if ok else 1


def scenario_args():
    """BIN_DIR [--transport shm|grpc] [--keep] of the deterministic fault tests."""
    ap = argparse.ArgumentParser()
    ap.add_argument("bin_dir")
    ap.add_argument("--transport", default="grpc", choices=["shm", "grpc"])
    ap.add_argument("--keep", action="store_true")
    a = ap.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))
    return a


def make_schedule(rng, n_faults, steps):
    """[(trigger_step, role, delay_s, {role: L2L_FAULT_AT})]: at the trigger step, wait
    delay_s, kill -9 `role`; the roles in the dict start next with that fault site armed
    (the killed role itself, or for a killed daemon also the workers, which exit with it).
    Drawn again (deterministically) until every site is armed at least once."""
    all_sites = set(SITES["eps"] + SITES["worker"])
    while True:
        plan, armed = [], set()
        for t in sorted(rng.sample(range(2, steps - 3), n_faults)):
            role = rng.choice(["eps", "eps", "w0", "w1"])
            delay = rng.uniform(0.0, 0.08)
            arm = {}
            if rng.random() < 0.7:  # the restarted process dies again, at a named site
                target = role if role != "eps" or rng.random() < 0.5 else rng.choice(["w0", "w1"])
                site = rng.choice(SITES["eps" if target == "eps" else "worker"])
                # Counts that fire within a few steps of the restart: per step a worker
                # fetches each of the 5 layers twice and pushes 5 gradients; the daemon
                # updates 5 layers and writes a checkpoint of 5 layer files.
                arm[target] = "%s:%d" % (site, rng.randint(1, 12))
                armed.add(site)
            plan.append((t, role, delay, arm))
        if armed == all_sites:
            return plan


def check_no_worker_removed(procs, eps_marker):
    """Every worker here leaves only at the job's end: a removal mid-job ("left ...
    continuing with the other workers") in the log of a daemon (a process whose name holds
    eps_marker) means a Deregister nobody meant, e.g. a stale client of an earlier daemon
    (the job would go on with one data shard fewer)."""
    for p in procs.all:
        if eps_marker not in p.name:
            continue
        for line in p.log().splitlines():
            if " left at step " in line and "continuing with the other workers" in line:
                raise Failure("%s removed a worker mid-job: %s" % (p.name, line))


def check_losses(procs, ref_log):
    """--check-losses yes: every step a daemon of the chaos run logged as committed ("step
    N loss X", steps a rollback undid later included) was computed from the same weights
    and batches as the reference's step N, so X must equal the reference's loss to its 4
    printed decimals."""
    ref_loss = dict(re.findall(r"\] step (\d+) loss ([0-9.]+)", ref_log))
    wrong = []
    for p in procs.all:
        if p.name.startswith("chaos-eps"):
            wrong += ["%s: step %s loss %s (reference %s)" % (p.name, n, x, ref_loss.get(n))
                      for n, x in re.findall(r"\] step (\d+) loss ([0-9.]+)", p.log()) if ref_loss.get(n) != x]
    if wrong:
        raise Failure("the final state equals the reference's, but %d step losses logged by the daemons differ from "
                      "the uninterrupted run's: %s" % (len(wrong), "; ".join(wrong[:8])))


def count_sites(site_fired):
    """'site N, ...' of the (role, site) pairs of fault sites that fired, or 'none'."""
    sites = {}
    for _, site in site_fired:
        sites[site] = sites.get(site, 0) + 1
    return ", ".join("%s %d" % kv for kv in sorted(sites.items())) or "none"


def run_single(a, procs, work, rng, t_start, deadline, shown):
    """The chaos test of one daemon and two workers: the summary line, or Failure."""
    tokens = os.path.join(work, "train.bin")
    l2l_procs.write_tokens(tokens, 20000, 96)
    job_yaml = os.path.join(work, "job.yaml")
    l2l_procs.write_job(job_yaml, tokens, a.steps, checkpoint_every=1)
    plan = make_schedule(rng, a.faults, a.steps)
    print("chaos: seed %d, transport %s, %d steps, schedule:" % (a.seed, a.transport, a.steps))
    for t, role, delay, arm in plan:
        print("  at step %3d: kill -9 %s %+.0f ms into the step%s" % (
            t, role, delay * 1000, "".join("; then %s starts with L2L_FAULT_AT=%s" % kv for kv in arm.items())))
    sys.stdout.flush()
    # The uninterrupted run: the same job, the same checkpoints, no faults.
    ref = run_uninterrupted(procs, work, job_yaml, a.transport, deadline)
    ref_export, ref_ckpt = finish(procs, ref, a.steps)
    print("chaos: uninterrupted run done in %.1f s" % (time.monotonic() - t_start))

    c = Cluster(procs, work, job_yaml, a.transport, "chaos")
    shown.append(c)
    c.start_eps()
    for i in range(2):
        c.start_worker(i)
    kills = {"eps": 0, "w0": 0, "w1": 0}
    pending = list(plan)
    last_step, last_progress = 0, time.monotonic()
    while True:
        if time.monotonic() > deadline:
            raise Failure("no end in %.0f s (step %d)" % (a.deadline_s, last_step))
        if time.monotonic() - last_progress > 180:
            raise Failure("no progress for 180 s at step %d" % last_step)
        c.supervise()
        st = c.status()
        step = st["step"] if st else last_step
        if step > last_step:
            last_step, last_progress = step, time.monotonic()
            c.last_step = step
        if st and st["step"] == a.steps and st["state"] == "finished":
            break
        if pending and st and st["step"] >= pending[0][0] and c.eps.running():
            t, role, delay, arm = pending.pop(0)
            p = c.proc(role)
            if p is None or not p.running():
                pending.insert(0, (last_step + 1, role, delay, arm))  # not up yet: next step
            else:
                time.sleep(delay)
                c.env_next.update(arm)
                p.kill9()
                kills[role] += 1
                c.faults.append((step, "kill -9 " + role))
                c.supervise(killed_by_us=(role,))
                if role != "eps":
                    continue
        time.sleep(0.02)
    # The job is over: the workers exit 0 (started late ones find the job finished).
    for i in range(2):
        w = c.workers[i]
        code = w.wait(120)
        if code != 0:
            raise Failure("w%d ended with exit %s:\n%s" % (i, code, w.tail()))
    if c.env_now.get("eps"):
        # Its fault site was never reached; the export and checkpoint below would reach
        # it. A clean restart (from the final checkpoint) without it.
        not_reached_eps = c.env_now.pop("eps")
        code, out, err = procs.ctl(c.addr, ["stop", "--skip-checkpoint"])
        if code != 0 or c.eps.wait(60) != 0:
            raise Failure("stopping the daemon (armed with %s) failed: %s %s" % (not_reached_eps, out, err))
        c.start_eps()
        pending.append(not_reached_eps)
    got_export, got_ckpt = finish(procs, c, a.steps)
    injected = len(c.faults)
    # Every fault was followed by training up to the last step (the triggers end 4
    # steps before it) with the uninterrupted run's result: each one survived.
    survived = sum(1 for s, _ in c.faults if s < a.steps)
    check_no_worker_removed(procs, "-eps-")
    diff = l2l_procs.compare_weights(got_export, ref_export)
    if diff:
        raise Failure("final weights differ from the uninterrupted run: " + diff)
    if a.check_losses == "yes":
        check_losses(procs, ref.eps.log())
    # Masters and AdamW moments: the final checkpoints' layer files, byte for byte.
    ref_ck = sorted(glob.glob(os.path.join(ref_ckpt, "layer-*.bin")))
    got_ck = sorted(glob.glob(os.path.join(got_ckpt, "layer-*.bin")))
    if not ref_ck or [os.path.basename(x) for x in ref_ck] != [os.path.basename(x) for x in got_ck]:
        raise Failure("final checkpoints hold different layer files: %s vs %s" % (got_ck, ref_ck))
    for g, r in zip(got_ck, ref_ck):
        if l2l_procs.read_bytes(g) != l2l_procs.read_bytes(r):
            raise Failure("checkpoint %s differs from the uninterrupted run's" % os.path.basename(g))
    # Checkpoints cut short by a kill leave temporary directories; the next daemon start
    # removes them, so none may be left (each would hold up to a checkpoint's bytes).
    partial = [x for x in os.listdir(c.ckpt_root()) if ".tmp-" in x]
    if partial:
        raise Failure("partial checkpoints left in %s: %s" % (c.ckpt_root(), partial))
    cleaned = 0
    for p in procs.all:
        for line in p.log().splitlines():
            if "partial checkpoint(s) left in" in line:
                cleaned += int(line.split("removed ")[1].split()[0])
    n_bytes = sum(os.path.getsize(x) for x in got_ck)
    return ("chaos: seed %d (%s): %d faults injected, %d survived (kill -9 from the test: daemon %d, workers %d; "
            "at fault sites: %s); restarts: daemon %d, workers %d; final weights and optimizer state "
            "(%d bytes) equal the uninterrupted run bit for bit; %d partial checkpoints removed at restarts, "
            "none left; %d scheduled faults not reached; %.1f s" % (
                a.seed, a.transport, injected, survived, kills["eps"], kills["w0"] + kills["w1"],
                count_sites(c.site_fired), c.starts["eps"] - 1, c.starts["w0"] + c.starts["w1"] - 2, n_bytes, cleaned,
                len(pending) + len(c.env_next) + sum(1 for v in c.env_now.values() if v),
                time.monotonic() - t_start))


# ---- sharded jobs (--shards N >= 2) -----------------------------------------------------

SHARD_CHECKPOINT_EVERY = 2
# Each layer a worker fetches (10 a step: 5 layers, forward and backward) is held this
# long (L2L_DELAY_AT=worker.fetch), so a step lasts about FETCH_DELAY_MS * 10 and a kill
# drawn within STEP_S lands inside a step, not between two.
FETCH_DELAY_MS = 20
STEP_S = 0.2
NO_PROGRESS_S = 45  # a sharded run that commits no step for this long fails


def make_shard_schedule(rng, n_faults, steps, shards, kill_shard0):
    """[(trigger_step, role, delay_s, {role: L2L_FAULT_AT})] of a sharded job: at the
    trigger step (once the job has committed a step since the previous fault), wait
    delay_s, kill -9 `role`: sK (shard K; K >= 1 unless kill_shard0) or a worker wI. A
    killed shard may start next with a fault site armed (eps.checkpoint: some of its layer
    files of a checkpoint part written; eps.update: a layer updated, its step not
    committed). Triggers fall after the first checkpoint and before the last step; drawn
    with replacement (a rollback brings a step back). Drawn again (deterministically) until
    both sites are armed, when n_faults allows."""
    targets = ["s%d" % k for k in range(0 if kill_shard0 else 1, shards)]
    first = SHARD_CHECKPOINT_EVERY + 1
    while True:
        plan, armed = [], set()
        for t in sorted(rng.randrange(first, steps - 1) for _ in range(n_faults)):
            role = rng.choice(targets) if rng.random() < 0.6 else rng.choice(["w0", "w1"])
            delay = rng.uniform(0.0, STEP_S)
            arm = {}
            if role[0] == "s" and rng.random() < 0.6:
                # Counts that fire within a few steps of the restart: a shard of 1-3 of the
                # 5 layers updates each of them once a step and writes one file per layer
                # into each checkpoint part (every SHARD_CHECKPOINT_EVERY steps).
                site = rng.choice(SITES["eps"])
                arm[role] = "%s:%d" % (site, rng.randint(1, 4))
                armed.add(site)
            plan.append((t, role, delay, arm))
        if armed == set(SITES["eps"]) or n_faults < 4:
            return plan


class ShardedCluster(l2l_procs.ShardedJob):
    """N shards (l2l-eps --shard K/N, each on a loopback port picked here and kept across
    its restarts, one checkpoint root) and two workers (--eps <shard 0>), restarted as a
    supervisor would: a shard that dies is started again ALONE, same argv but --resume ROOT
    instead of --job FILE (the other shards and the workers stay: the shards roll back to
    the root's latest checkpoint, the workers rejoin and redo the steps since); a worker
    that dies is started again with the same argv. Roles: sK (shard K), wI (worker I)."""

    def __init__(self, procs, work, job, n, transport, worker_env, restart_failed_workers=False, restart_delay_s=0.0):
        ports = []
        while len(ports) < n:
            port = l2l_procs.free_port()
            if port not in ports:
                ports.append(port)
        super().__init__(procs, work, "chaos", job, n, ports=ports)
        self.transport, self.worker_env = transport, worker_env
        self.roles = ["s%d" % k for k in range(n)] + ["w0", "w1"]
        self.starts_of = {r: 0 for r in self.roles}
        self.worker_done = [False, False]
        self.env_next = {}  # role -> L2L_FAULT_AT for its next start
        self.env_now = {}  # role -> L2L_FAULT_AT its running process has
        self.site_fired = []  # (role, site) of the faults that fired
        self.faults = []  # (the job's step when it hit, what), every fault injected
        self.resumed_without_checkpoint = 0  # shard restarts before the root had a latest
        self.mark = -1  # commits seen at the last fault or restart (progress(): > mark = recovered)
        self.last_step = 0
        # --worker-exits restart: a worker exiting non-zero by itself is restarted and
        # listed here instead of failing the test (to see past a first such failure).
        self.restart_failed_workers = restart_failed_workers
        self.failed_workers = []
        self.restart_delay_s = restart_delay_s  # a dead shard stays down this long (--shard-restart-delay-s)

    def proc(self, role):
        return self.eps[int(role[1:])] if role[0] == "s" else self.workers[int(role[1:])]

    def start_role(self, role, first=False):
        """Starts role: at the job's start (first) from the job file; a shard again from
        the root's latest checkpoint (the job file while there is none yet)."""
        env = {}
        fault = self.env_next.pop(role, None)
        if fault:
            env["L2L_FAULT_AT"] = fault
        self.env_now[role] = fault
        self.starts_of[role] += 1
        if role[0] == "s":
            resume = not first and self.latest() is not None
            if not first and not resume:
                self.resumed_without_checkpoint += 1
            self.start_shard(int(role[1:]), resume=resume, env=env, wait=first,
                             args=["--transport", "grpc"] if self.transport == "grpc" else [])
        else:
            env.update(self.worker_env)
            self.start_worker(int(role[1:]), self.transport, env=env, connect_timeout_ms=120000)

    def note_exit(self, role, p, code, killed_by_us):
        """Classifies an exit: a fault site firing, our kill, a worker done, or unexpected
        (a shard exiting by itself, a worker exiting non-zero: both are failures)."""
        if site_fired(self, role, p, code):
            return "site"
        if killed_by_us:
            return "kill"
        if role[0] == "w" and code == 0:
            return "done"
        return "unexpected"

    def supervise(self, killed_by_us=()):
        """One supervisor pass: restarts whatever died (raises Failure on an exit nobody
        asked for)."""
        for role in self.roles:
            p = self.proc(role)
            if p is None or p.running() or (role[0] == "w" and self.worker_done[int(role[1:])]):
                continue
            code = p.wait(0)
            kind = self.note_exit(role, p, code, role in killed_by_us)
            if kind == "done":
                self.worker_done[int(role[1:])] = True
                continue
            if kind == "unexpected" and role[0] == "w" and self.restart_failed_workers:
                self.failed_workers.append("%s exited %s at step %d: %s" % (
                    p.name, code, self.last_step, (p.log().strip().splitlines() or [""])[-1]))
            elif kind == "unexpected":
                what = "shard %s" % role[1:] if role[0] == "s" else "worker " + role
                raise Failure("%s (%s) exited %s by itself at step %d (faults so far: %s)" % (
                    what, p.name, code, self.last_step, self.faults))
            if role[0] == "s" and self.restart_delay_s > 0:
                time.sleep(self.restart_delay_s)
            self.start_role(role)
            self.mark = self.progress()[1]

    def progress(self):
        """(steps done per the running shard 0's log, step commits logged by every shard 0
        so far): shard 0 logs 'step N loss' when step N (0-based) commits, and 'start step
        S' when it starts."""
        done, commits = 0, 0
        for p in self.procs.all:
            if p.name.startswith("%s-eps0-" % self.name):
                commits += len(re.findall(r"\] step \d+ loss", p.log()))
        log = self.eps[0].log() if self.eps[0] is not None else ""
        steps = re.findall(r"\] step (\d+) loss", log)
        start = re.findall(r"start step (\d+)", log)
        if steps:
            done = int(steps[-1]) + 1
        elif start:
            done = int(start[-1])
        return done, commits

    def all_running(self):
        return all(self.proc(r) is not None and (self.proc(r).running() or
                                                   (r[0] == "w" and self.worker_done[int(r[1:])]))
                   for r in self.roles)


def run_sharded(a, procs, work, rng, t_start, deadline, shown):
    """The chaos test of a job sharded over a.shards daemons: the summary line, or Failure."""
    job_yaml = write_small_job(work, a.steps, checkpoint_every=SHARD_CHECKPOINT_EVERY)
    plan = make_shard_schedule(rng, a.faults, a.steps, a.shards, a.kill_shard0 == "yes")
    print("chaos: seed %d, transport %s, %d shards, %d steps (a checkpoint every %d), shard 0 killed: %s, schedule:" % (
        a.seed, a.transport, a.shards, a.steps, SHARD_CHECKPOINT_EVERY, a.kill_shard0))
    for t, role, delay, arm in plan:
        print("  at step %3d: kill -9 %s %+.0f ms into the step%s" % (
            t, role, delay * 1000, "".join("; then %s starts with L2L_FAULT_AT=%s" % kv for kv in arm.items())))
    sys.stdout.flush()
    # The uninterrupted run: the same job on one daemon, no faults.
    ref = l2l_procs.ShardedJob(procs, work, "ref", job_yaml, 1)
    shown.append(ref)
    bad = ref.train(a.transport)
    if bad:
        raise Failure("the uninterrupted run did not stop cleanly: %s" % "; ".join(bad))
    ref_dir = ref.final_dir(a.steps)
    shown.remove(ref)
    print("chaos: uninterrupted single-daemon run done in %.1f s" % (time.monotonic() - t_start))
    sys.stdout.flush()

    c = ShardedCluster(procs, work, job_yaml, a.shards, a.transport,
                       {"L2L_DELAY_AT": "worker.fetch:%d" % FETCH_DELAY_MS}, a.worker_exits == "restart",
                       a.shard_restart_delay_s)
    shown.append(c)
    for k in range(a.shards):
        c.start_role("s%d" % k, first=True)
    for i in range(2):
        c.start_role("w%d" % i, first=True)
    kills = {r: 0 for r in c.roles}
    pending = list(plan)
    last_commits, last_progress = 0, time.monotonic()
    while True:
        now = time.monotonic()
        if now > deadline:
            raise Failure("no end in %.0f s (step %d)" % (a.deadline_s, c.last_step))
        if now - last_progress > NO_PROGRESS_S:
            raise Failure("no step committed for %d s at step %d (faults so far: %s)" % (
                NO_PROGRESS_S, c.last_step, c.faults))
        c.supervise()
        if all(c.worker_done):
            break
        done, commits = c.progress()
        c.last_step = done
        if commits > last_commits:
            last_commits, last_progress = commits, now
        if pending and done >= pending[0][0] and commits > c.mark and c.all_running():
            t, role, delay, arm = pending[0]
            if role[0] == "w" and c.worker_done[int(role[1:])]:
                pending.pop(0)  # that worker is done: the job is ending
                continue
            time.sleep(delay)
            p = c.proc(role)
            # Not once the last step's checkpoint is written (the workers are leaving: the
            # job is over, a kill now tests nothing; the fault stays "not reached").
            if p.running() and c.latest() != "step-%08d" % a.steps:
                pending.pop(0)
                c.env_next.update(arm)
                p.kill9()
                kills[role] += 1
                c.faults.append((c.progress()[0], "kill -9 " + role))
                c.supervise(killed_by_us=(role,))
            continue
        time.sleep(0.02)
    # The job is over: both workers exited 0. Every shard is up (a shard restarted just
    # now is given the time to listen, so that it handles SIGTERM) and stops cleanly.
    for k in range(a.shards):
        if l2l_procs.wait_port(c.state(k), c.eps[k], 60) is None:
            raise Failure("after the workers exited 0, shard %d (%s) is not listening (exit %s)" % (
                k, c.eps[k].name, c.eps[k].wait(0)))
    bad = c.stop()
    if bad:
        raise Failure("after the workers exited 0, not every shard stopped cleanly on SIGTERM: %s" % "; ".join(bad))
    check_no_worker_removed(procs, "chaos-eps")
    d = l2l_procs.compare_checkpoints(c.final_dir(a.steps), ref_dir)
    if d:
        raise Failure("the final checkpoint (%s) differs from the uninterrupted single daemon's: %s" % (
            c.final_dir(a.steps), d))
    if a.check_losses == "yes":
        check_losses(procs, ref.eps[0].log())
    # A checkpoint part or temporary dir cut short by a kill is removed by a later start or
    # rollback: the root holds complete step dirs and `latest` only.
    partial = sorted(x for x in os.listdir(c.root) if x != "latest" and not re.match(r"step-\d{8}$", x))
    if partial:
        raise Failure("partial checkpoints left in %s: %s" % (c.root, partial))
    logs = [p.log() for p in procs.all if p.name.startswith("chaos-eps")]
    if a.transport == "grpc" and any("(shm)" in log for log in logs):
        raise Failure("a worker registered over shm with a shard although --transport grpc")
    if a.transport == "shm" and sum(1 for log in logs if "registered (shm)" in log) < a.shards:
        raise Failure("the workers did not register over shm with every shard")
    waits = sum(len(re.findall(r"waiting [^\n]*?for (?:it to come back|shard)", p.log())) for p in procs.all
                if p.name.startswith("chaos-w"))
    n_bytes = sum(os.path.getsize(os.path.join(c.final_dir(a.steps), x))
                  for x in os.listdir(c.final_dir(a.steps)) if x.startswith("layer-"))
    shard_kills = [kills["s%d" % k] for k in range(a.shards)]
    # Every fault hit before the workers exited 0 (none once the last checkpoint is
    # written), and the job went on to finish bit-identical: each one survived.
    line = ("chaos: seed %d (%s, %d shards): %d faults injected, all survived (kill -9 from the test: shards %d "
            "(%s per shard), workers %d; at fault sites: %s); restarts: shards %d (%d before any checkpoint), "
            "workers %d; 'waiting for shard' logged %d times by the workers; the final checkpoint (%d layer bytes) "
            "equals the uninterrupted single daemon's bit for bit; no partial checkpoint left; %d scheduled faults "
            "not reached; %.1f s" % (
                a.seed, a.transport, a.shards, len(c.faults),
                sum(shard_kills), "/".join(str(x) for x in shard_kills), kills["w0"] + kills["w1"],
                count_sites(c.site_fired), sum(c.starts_of["s%d" % k] for k in range(a.shards)) - a.shards,
                c.resumed_without_checkpoint, c.starts_of["w0"] + c.starts_of["w1"] - 2, waits, n_bytes,
                len(pending) + len(c.env_next) + sum(1 for v in c.env_now.values() if v), time.monotonic() - t_start))
    if c.failed_workers:
        raise Failure("%s; BUT %d worker exit(s) nobody asked for (restarted: --worker-exits restart): %s" % (
            line, len(c.failed_workers), "; ".join(c.failed_workers)))
    return line


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("bin_dir")
    ap.add_argument("--transport", default="shm", choices=["shm", "grpc"])
    ap.add_argument("--seed", type=int, default=int(os.environ.get("L2L_CHAOS_SEED", "1")))
    ap.add_argument("--shards", type=int, default=1, help="1: one daemon; N >= 2: a job sharded over N daemons")
    ap.add_argument("--kill-shard0", default="yes", choices=["yes", "no"],
                    help="with --shards N: whether shard 0 is among the shards killed (default yes)")
    ap.add_argument("--worker-exits", default="fail", choices=["fail", "restart"],
                    help="with --shards N: a worker exiting non-zero by itself fails the test (default), or is "
                         "restarted and listed (to see past a first such failure; the test then still fails)")
    ap.add_argument("--shard-restart-delay-s", type=float, default=0.0,
                    help="with --shards N: how long a dead shard stays down before its restart (default 0: at once, "
                         "as Restart=always does)")
    ap.add_argument("--check-losses", default="yes", choices=["yes", "no"],
                    help="also require every step loss the daemons log to equal the uninterrupted run's (default "
                         "yes; before 2026-11-28 a step redone while a worker was still rejoining was logged with "
                         "fewer reports)")
    ap.add_argument("--faults", type=int, help="default 16 (one daemon), 6 (sharded)")
    ap.add_argument("--steps", type=int, help="default 100 (one daemon), 12 (sharded)")
    ap.add_argument("--deadline-s", type=float, help="default 600 (one daemon), 240 (sharded)")
    ap.add_argument("--keep", action="store_true", help="keep the work dir")
    a = ap.parse_args()
    if a.shards < 1:
        ap.error("--shards must be >= 1")
    sharded = a.shards >= 2
    if a.faults is None:
        a.faults = 6 if sharded else 16
    if a.steps is None:
        a.steps = 12 if sharded else 100
    if a.deadline_s is None:
        a.deadline_s = 240 if sharded else 600
    if a.steps < (SHARD_CHECKPOINT_EVERY + 3 if sharded else a.faults + 5):
        ap.error("--steps %d: too few for the schedule" % a.steps)
    # ctest's timeout sends SIGTERM: run the cleanup below (kill and reap), then exit.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))
    t_start = time.monotonic()
    deadline = t_start + a.deadline_s
    rng = random.Random(a.seed)
    work = tempfile.mkdtemp(prefix="l2l-chaos-%s%s-" % (a.transport, "-shards%d" % a.shards if sharded else ""))
    procs = l2l_procs.Procs(a.bin_dir, work)
    what = "%s, %d shards" % (a.transport, a.shards) if sharded else a.transport
    ok = False
    shown = []  # the clusters whose processes' logs a failure prints
    try:
        print((run_sharded if sharded else run_single)(a, procs, work, rng, t_start, deadline, shown))
        ok = True
    except Exception as e:  # noqa: BLE001 (a bug in this script fails the test the same way)
        print("chaos: FAILED (seed %d, %s): %s: %s" % (a.seed, what, type(e).__name__, e))
        for c in shown:
            now = [p for p in c.current() if p is not None]
            # Earlier starts of its processes (killed, or died at a fault site) first, shorter.
            for p in procs.all:
                if p not in now and p.name.startswith(c.name + "-"):
                    print("---- %s (exit %s, earlier start, tail)\n%s" % (p.name, p.wait(0), p.tail(8)))
            for p in now:
                print("---- %s (exit %s, tail)\n%s" % (p.name, p.wait(0), p.tail(25)))
    finally:
        alive = procs.close()
        stale = []
        for p in procs.all:
            if os.path.exists("/proc/%d" % p.pid):
                stale.append(p.pid)
        leftover = [s for s in glob.glob("/dev/shm/l2l-*%d*" % os.getpid())]
        if alive or stale:
            print("chaos: FAILED: processes outlived the test: %s" % sorted(set(alive + stale)))
            ok = False
        else:
            print("chaos: all %d processes started here are gone" % len(procs.spawned_pids))
        if leftover and ok:
            print("chaos: FAILED: shared-memory segments left behind: %s" % leftover)
            ok = False
        for seg in leftover:  # a failed run's daemon was killed: its segments are ours to remove
            try:
                os.unlink(seg)
            except OSError:
                pass
        if ok and not a.keep:
            shutil.rmtree(work, ignore_errors=True)
        else:
            print("chaos: work dir kept: %s" % work)
    return 0 if ok else 1

if __name__ == "__main__":
    sys.exit(main())
