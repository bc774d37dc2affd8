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

Usage: chaos_test.py BIN_DIR [--transport shm|grpc] [--seed N] [--faults N] [--steps N]
The seed defaults to $L2L_CHAOS_SEED, else 1; it is printed with the result line
  chaos: seed S: N faults injected, N survived ...
Exit 0 on success, 1 on any failure (with the logs' tails).
"""
import argparse
import glob
import os
import random
import shutil
import signal
import socket
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import l2l_procs  # noqa: E402

SITES = {
    "eps": ["eps.checkpoint", "eps.update"],
    "worker": ["worker.fetch", "worker.push"],
}


class Failure(Exception):
    pass


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Cluster:
    """One daemon and two workers on loopback, restarted as a supervisor would."""

    def __init__(self, procs, work, job_yaml, transport, name):
        self.procs, self.work, self.job_yaml, self.transport = procs, work, job_yaml, transport
        self.name = name
        self.state = os.path.join(work, name + "-state")
        os.makedirs(self.state, exist_ok=True)
        self.job_id = "%s-%d" % (name, os.getpid())
        self.port = free_port()
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
        fired = self.env_now.get(role) and "L2L_FAULT_AT: injected SIGKILL at" in p.log()
        if fired and code == -signal.SIGKILL:
            site = self.env_now[role].split(":")[0]
            self.site_fired.append((role, site))
            self.faults.append((self.last_step, "%s at %s" % (role, site)))
            self.env_now[role] = None
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


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("bin_dir")
    ap.add_argument("--transport", default="shm", choices=["shm", "grpc"])
    ap.add_argument("--seed", type=int, default=int(os.environ.get("L2L_CHAOS_SEED", "1")))
    ap.add_argument("--faults", type=int, default=16)
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--deadline-s", type=float, default=600)
    ap.add_argument("--keep", action="store_true", help="keep the work dir")
    a = ap.parse_args()
    # ctest's timeout sends SIGTERM: run the cleanup below (kill and reap), then exit.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))
    t_start = time.monotonic()
    deadline = t_start + a.deadline_s
    rng = random.Random(a.seed)
    work = tempfile.mkdtemp(prefix="l2l-chaos-%s-" % a.transport)
    procs = l2l_procs.Procs(a.bin_dir, work)
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
    ok = False
    c = None
    try:
        # The uninterrupted run: the same job, the same checkpoints, no faults.
        ref = run_uninterrupted(procs, work, job_yaml, a.transport, deadline)
        ref_export, ref_ckpt = finish(procs, ref, a.steps)
        print("chaos: uninterrupted run done in %.1f s" % (time.monotonic() - t_start))

        c = Cluster(procs, work, job_yaml, a.transport, "chaos")
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
        # Every worker here leaves only at the job's end: a removal mid-job ("left ...
        # continuing with the other workers") means a Deregister nobody meant, e.g. a
        # stale client of an earlier daemon (the job would go on with one shard fewer).
        for p in procs.all:
            if "-eps-" not in p.name:
                continue
            for line in p.log().splitlines():
                if " left at step " in line and "continuing with the other workers" in line:
                    raise Failure("%s removed a worker mid-job: %s" % (p.name, line))
        diff = l2l_procs.compare_weights(got_export, ref_export)
        if diff:
            raise Failure("final weights differ from the uninterrupted run: " + diff)
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
        sites = {}
        for role, site in c.site_fired:
            sites[site] = sites.get(site, 0) + 1
        print("chaos: seed %d (%s): %d faults injected, %d survived (kill -9 from the test: daemon %d, workers %d; "
              "at fault sites: %s); restarts: daemon %d, workers %d; final weights and optimizer state "
              "(%d bytes) equal the uninterrupted run bit for bit; %d partial checkpoints removed at restarts, none left; "
              "%d scheduled faults not reached; %.1f s" % (
                  a.seed, a.transport, injected, survived, kills["eps"], kills["w0"] + kills["w1"],
                  ", ".join("%s %d" % kv for kv in sorted(sites.items())) or "none",
                  c.starts["eps"] - 1, c.starts["w0"] + c.starts["w1"] - 2, n_bytes, cleaned,
                  len(pending) + len(c.env_next) + sum(1 for v in c.env_now.values() if v),
                  time.monotonic() - t_start))
        ok = True
    except Exception as e:  # noqa: BLE001 (a bug in this script fails the test the same way)
        print("chaos: FAILED (seed %d, %s): %s: %s" % (a.seed, a.transport, type(e).__name__, e))
        if c is not None:
            for p in [c.eps] + c.workers:
                if p is not None:
                    print("---- %s (tail)\n%s" % (p.name, p.tail(25)))
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
