#!/usr/bin/env python3
"""Sharded state (issue 31) end to end: N l2l-eps daemons, each owning a contiguous range
of the model's layers (l2l-eps --shard K/N; common/shard_plan.h), against one daemon.

Every training case runs the tiny job of l2l_procs.write_job (5 layers: embedding, 3
blocks, head; 8 steps, a checkpoint every 4) with two CPU workers, and compares the final
checkpoint with a single-daemon reference run of the same job and the same workers: every
layer-*.bin file byte for byte (master, AdamW m and v) and manifest.json equal except its
"created_unix" and the workers' "name" fields. Every shard is given one checkpoint root
(a daemon config file, --config); each writes its part there and shard 0 assembles the
checkpoint. Daemons keep running after the job; they are stopped with SIGTERM and must
exit 0 ("signal 15: shutting down").

  1. 2 shards (workers' transport auto: shm) and 3 shards (workers --transport grpc):
     bit-identical to the reference; the root holds step-* dirs and `latest` only (no
     .step-N.part-K left).
  2. The SSD tier on shard 1 (--spill-dir, and a --host-bytes that cannot hold its state
     beside its published copies): its status shows state bytes in the "ssd" tier;
     still bit-identical.
  3. Global clipping active (optim.grad_clip 1e-3; this job's global gradient norm is
     between 1 and 3 on its largest step: grad_clip 1 changes its result, 3 does not, so
     a step's norm would have to fall a thousandfold for the clip not to act; the test
     checks that the result differs from train.clip none) and the non-finite guard
     firing on a layer of shard 1 only (L2L_TEST_NAN_GRADIENT on both workers): both shards log the skipped
     step; bit-identical to a single daemon with the same variable, and different from a
     run without it.
  4. Resume: a sharded run (its workers slowed with L2L_DELAY_AT so the kill lands
     between the checkpoints) SIGKILLed, every process, once step 4's checkpoint is
     `latest`; every shard restarted with --resume ROOT and the workers again: the final
     checkpoint equals the uninterrupted reference.
  5. Checkpoint atomicity: shard 1 kills itself (L2L_FAULT_AT=eps.checkpoint) half-way
     through writing its part of step 8: `latest` still names step 4 (equal to the
     reference's step 4), step 8 is never assembled, shard 0 does not exit (it waits for
     the part), no worker exits 0. Then shard 1 alone is restarted with --resume ROOT on
     its port: every shard rolls back to step 4, the workers (never restarted) rejoin, and
     the final checkpoint equals the reference; the root is clean.
  7. In-place recovery: shard 1 (workers' transport auto: shm; then grpc) and shard 0
     (shm) SIGKILLed mid-step after step 4's checkpoint (a step past it committed): the
     workers keep running (they wait for it), the shard alone restarted with --resume ROOT
     on its port resumes at step 4, the other rolls back to step 4, and the final
     checkpoint equals the reference.
  8. A worker SIGKILLed mid-step (shm), a replacement started as a supervisor would: both
     shards roll back to step 4 and the final checkpoint equals the reference.
  9. on_worker_loss: continue: a worker SIGKILLed mid-step and not replaced: both shards
     roll back to step 4 and go on without it; the final checkpoint equals one daemon's
     whose second worker left after step 4 (l2l-worker --steps 4).
 11. The job's end: shard 1 SIGKILLed after shard 0 let both workers go (the final checkpoint
     assembled) but before they left shard 1 (L2L_DELAY_AT=worker.leave holds them there),
     then restarted with --resume: the workers exit 0 without waiting for it (the end is
     durable; a chaos run once hung here), the restarted shard starts at the last step, both
     shards stop cleanly, and the final checkpoint equals the reference.
 12. Both shards SIGKILLed, shard 1 first (the workers are rejoining it) then shard 0 while
     the workers' heartbeats are held off (l2l-worker --heartbeat-ms 120000, a daemon
     heartbeat timeout to match): both restarted with --resume at step 4. A worker that
     rejoins shard 1 has not noticed shard 0 restarted (a restarted shard 0 counts its
     recovery epochs from 0 again): it must register with shard 0 again (it logs "it
     restarted") instead of exiting on "the shards' states differ" (a chaos run once did);
     the final checkpoint and every logged step loss equal the reference's.
 10. Shard 0 SIGKILLed and never restarted: shard 1 exits 1 after --coordinator-timeout-ms
     naming the coordinator, the workers exit non-zero after --shard-wait-ms naming shard 0.
  6. Bad shard configurations, each refused (non-zero exit, a message naming the
     problem): a shard count other than shard 0's, another --shard-layers, another job,
     --shard 2/2, --shard x, --coordinator without --shard; and a worker that cannot
     reach shard 1 (started with --advertise 127.0.0.1:1) exits non-zero naming shard 1.

About a minute on an idle 2-core machine. Every process started here is killed and reaped,
and the jobs' shared-memory segments removed, on every exit path; the work dir is removed
unless the test fails or --keep is given.

Usage: shards_test.py BIN_DIR [--cases 1,2,...] [--keep]
Exit 0 on success, 1 on any failure (with the logs' tails).
"""
import argparse
import os
import re
import shutil
import signal
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import l2l_procs  # noqa: E402

STEPS = 8
EVERY = 4
LAYERS = l2l_procs.JOB_LAYERS  # write_job's model: embedding, 3 blocks, head
WORKERS = 2
NAN_STEP = 5
SMALL_CLIP = "0.001"
# Shard 1 of 2 holds 3 layers (25472 parameters): 331776 state bytes at 4 KiB pages, and
# with its published copies and the smallest staging pool it needs 385024 bytes of
# memory.host_bytes. 520000 puts its state pages on the SSD tier (case 2 checks that).
SPILL_HOST_BYTES = 520000


Failure = l2l_procs.Failure


class Ctx:
    """What every case shares: the process table, the work dir, the job files."""

    def __init__(self, procs, work):
        self.procs, self.work = procs, work
        self.shown = []  # the runs whose logs a failure prints
        self.stop_failures = []  # daemons that did not stop cleanly on SIGTERM
        self.tokens = os.path.join(work, "train.bin")
        l2l_procs.write_tokens(self.tokens, 20000, 96)
        self.job = self.write_job("job.yaml")
        self.ref = None  # the single-daemon reference of self.job (case 1 makes it)

    def write_job(self, name, seed=None, grad_clip=None, clip=None, checkpoint_every=EVERY):
        path = os.path.join(self.work, name)
        l2l_procs.write_job(path, self.tokens, STEPS, checkpoint_every=checkpoint_every)
        with open(path) as f:
            text = f.read()
        edits = []
        if seed is not None:
            edits.append(("  seed: 77\n", "  seed: %d\n" % seed))
        if grad_clip is not None:
            edits.append(("  eps: 1.0e-6\n", "  eps: 1.0e-6\n  grad_clip: %s\n" % grad_clip))
        if clip is not None:
            edits.append(("  mode: sync\n", "  mode: sync\n  clip: %s\n" % clip))
        for old, new in edits:
            if text.count(old) != 1:
                raise Failure("write_job's YAML changed: %r not found once in %s" % (old, path))
            text = text.replace(old, new)
        with open(path, "w") as f:
            f.write(text)
        return path

    def reference(self):
        if self.ref is None:
            self.ref = Run(self, "ref", self.job, 1)
            self.ref.train()
        return self.ref


class Run(l2l_procs.ShardedJob):
    """One job: a single daemon (n == 1) or n shards, their workers, one checkpoint root;
    registered with ctx (its logs shown on a failure, its stop's failures reported)."""

    def __init__(self, ctx, name, job, n, shard_args=None, shard_env=None, shard_config=None):
        super().__init__(ctx.procs, ctx.work, name, job, n, workers=WORKERS, shard_args=shard_args,
                         shard_env=shard_env, shard_config=shard_config)
        self.ctx = ctx
        ctx.shown.append(self)

    def stop(self):
        """ShardedJob.stop(); a failure is recorded in ctx.stop_failures (the case fails
        when it ends, after its checkpoints were compared)."""
        bad = super().stop()
        self.ctx.stop_failures += ["%s: %s" % (self.name, b) for b in bad]
        return bad

    def final_dir(self, steps=STEPS):
        return super().final_dir(steps)

    def check_root_clean(self):
        want = ["latest"] + ["step-%08d" % s for s in range(EVERY, STEPS + 1, EVERY)]
        got = sorted(os.listdir(self.root))
        if got != sorted(want):
            raise Failure("%s: the checkpoint root holds %s, want %s (no part or temporary dirs)" % (
                self.name, got, sorted(want)))


compare_checkpoints = l2l_procs.compare_checkpoints


def expect_same(run, ref, what):
    d = compare_checkpoints(run.final_dir(), ref.final_dir())
    if d:
        raise Failure("%s: the final checkpoint differs from the single daemon's: %s" % (what, d))


def expect_same_losses(run, ref, what):
    """Every step loss a shard of `run` logged ("step N loss X"; a step redone after a
    rollback logs again) equals the reference's: in pause mode every logged step ran from
    the same weights and batches with every worker's report (a summary made while a
    worker was still rejoining would average fewer reports)."""
    want = dict(re.findall(r"\] step (\d+) loss ([0-9.]+)", ref.eps[0].log()))
    wrong = ["%s: step %s loss %s (reference %s)" % (p.name, n, x, want.get(n))
             for p in run.eps if p is not None
             for n, x in re.findall(r"\] step (\d+) loss ([0-9.]+)", p.log()) if want.get(n) != x]
    if wrong:
        raise Failure("%s: %d logged step losses differ from the single daemon's: %s" % (what, len(wrong),
                                                                                       "; ".join(wrong[:6])))


# ---- the cases ------------------------------------------------------------------------

def case_bit_identical(ctx):
    ref = ctx.reference()
    ref.check_root_clean()
    out = []
    for n, transport in ((2, "auto"), (3, "grpc")):
        r = Run(ctx, "sh%d-%s" % (n, transport), ctx.job, n)
        r.train(transport)
        ranges = [r.shard_layers(k) for k in range(n)]
        if ranges[0][0] != 0 or ranges[-1][1] != LAYERS - 1 or any(
                ranges[k][1] + 1 != ranges[k + 1][0] for k in range(n - 1)):
            raise Failure("%s: the shards' ranges %s do not tile layers 0..%d" % (r.name, ranges, LAYERS - 1))
        if transport == "auto" and "registered (shm)" not in r.eps[1].log():
            raise Failure("%s: the workers did not use shm with shard 1:\n%s" % (r.name, r.eps[1].tail()))
        if transport == "grpc" and ("registered (grpc)" not in r.eps[2].log() or "(shm)" in r.eps[2].log()):
            raise Failure("%s: the workers did not use gRPC with shard 2:\n%s" % (r.name, r.eps[2].tail()))
        expect_same(r, ref, r.name)
        r.check_root_clean()
        out.append("%d shards (%s, layers %s)" % (n, "shm" if transport == "auto" else transport,
                                                    ", ".join("%d..%d" % x for x in ranges)))
    return "%s: final checkpoints equal the single daemon's bit for bit; roots hold step dirs and latest only" % (
        " and ".join(out))


def case_spill(ctx):
    ref = ctx.reference()
    spill = os.path.join(ctx.work, "spill1")
    os.makedirs(spill)
    # 4 KiB state pages on shard 1 (the default 4 MiB would make the tiny model's state
    # one page per array); the same checkpoint root.
    r = Run(ctx, "sh2-spill", ctx.job, 2,
            shard_args={1: ["--spill-dir", spill, "--host-bytes", str(SPILL_HOST_BYTES)]})
    cfg1 = os.path.join(r.dir, "eps-s1.yaml")
    with open(cfg1, "w") as f:
        f.write("checkpoint:\n  dir: %s\nmemory:\n  page_bytes: 4096\nspill:\n  block_bytes: 4096\n" % r.root)
    r.shard_config[1] = cfg1
    r.start_daemons()
    st = ctx.procs.status(r.addr[1])
    if st is None:
        raise Failure("%s: l2lctl status of shard 1 got no answer:\n%s" % (r.name, r.eps[1].tail()))
    tiers = {m["tier"]: m["used_bytes"] for m in st.get("memory", [])}
    if tiers.get("ssd", 0) <= 0:
        raise Failure("%s: shard 1 (--host-bytes %d) holds no state on SSD: memory %s" % (
            r.name, SPILL_HOST_BYTES, st.get("memory")))
    m = re.search(r"spill tier: .*?(\d+ of \d+ master pages spilled)", r.eps[1].log())
    if not m:
        raise Failure("%s: shard 1 did not log its spill tier:\n%s" % (r.name, r.eps[1].tail()))
    if "ssd" in {mm["tier"] for mm in (ctx.procs.status(r.addr[0]) or {}).get("memory", [])}:
        raise Failure("%s: shard 0 (no --spill-dir) reports an SSD tier" % r.name)
    r.start_workers()
    r.wait_workers_ok()
    r.stop()
    expect_same(r, ref, r.name)
    r.check_root_clean()
    return "shard 1 with %d state bytes on SSD (%s, host_bytes %d): final checkpoint equals the single daemon's" % (
        tiers["ssd"], m.group(1), SPILL_HOST_BYTES)


def case_clip_nonfinite(ctx):
    job = ctx.write_job("job-clip.yaml", grad_clip=SMALL_CLIP)
    # The 2-shard run first: shard 1's first layer is where the NaN goes.
    r = Run(ctx, "sh2-nan", job, 2)
    r.start_daemons()
    first1, last1 = r.shard_layers(1)
    first0, last0 = r.shard_layers(0)
    layer = first1
    nan_env = {"L2L_TEST_NAN_GRADIENT": "%d:%d" % (layer, NAN_STEP)}
    r.start_workers(env=nan_env)
    r.wait_workers_ok()
    r.stop()
    skip = "step %d skipped, state unchanged: non-finite gradient in layer %d" % (NAN_STEP, layer)
    for k in range(2):
        log = r.eps[k].log()
        if skip not in log:
            raise Failure("%s: shard %d (layers %d..%d) did not log %r:\n%s" % (
                r.name, k, *r.shard_layers(k), skip, r.eps[k].tail()))
        if log.count("skipped, state unchanged") != 1:
            raise Failure("%s: shard %d skipped %d steps, want 1" % (r.name, k, log.count("skipped, state unchanged")))
    for w in r.workers:
        if "L2L_TEST_NAN_GRADIENT: a NaN in the gradient of layer %d" % layer not in w.log():
            raise Failure("%s: %s did not inject its NaN:\n%s" % (r.name, w.name, w.tail()))
    ref_nan = Run(ctx, "ref-nan", job, 1)
    ref_nan.train(worker_env=nan_env)
    if skip not in ref_nan.eps[0].log():
        raise Failure("ref-nan: the single daemon did not log %r" % skip)
    expect_same(r, ref_nan, r.name)
    r.check_root_clean()
    # The test's own controls: without the NaN the result differs (so a guard that did
    # not fire would be noticed), and without clipping (train.clip none) too (so the clip
    # acts: its coefficient is below 1 on some step; at 1e-3, on every step). Per-layer
    # clipping also differs from global in every layer file at this grad_clip, so shards
    # that clipped with their own layers' norm would not equal the single daemon.
    ref_clip = Run(ctx, "ref-clip", job, 1)
    ref_clip.train()
    if "skipped" in ref_clip.eps[0].log():
        raise Failure("ref-clip: a step was skipped without the NaN:\n%s" % ref_clip.eps[0].tail())
    if not compare_checkpoints(ref_nan.final_dir(), ref_clip.final_dir()):
        raise Failure("the run with a NaN at step %d equals the run without it: the skip changed nothing" % NAN_STEP)
    ref_none = Run(ctx, "ref-noclip", ctx.write_job("job-noclip.yaml", grad_clip=SMALL_CLIP, clip="none"), 1)
    ref_none.train()
    if not compare_checkpoints(ref_clip.final_dir(), ref_none.final_dir()):
        raise Failure("grad_clip %s (global) gives the same checkpoint as train.clip none: the clip never acted"
                      % SMALL_CLIP)
    return ("grad_clip %s (global; the result differs from clip none), a NaN in layer %d's gradient at step %d (shard 1 owns %d..%d, "
            "shard 0 %d..%d): both shards logged the skipped step; the final checkpoint equals the single daemon's with "
            "the same NaN, and differs from the run without it" % (SMALL_CLIP, layer, NAN_STEP, first1, last1, first0,
                                                                   last0))


def case_resume(ctx):
    ref = ctx.reference()
    r = Run(ctx, "sh2-resume", ctx.job, 2)
    r.start_daemons()
    # Each layer fetch sleeps: tens of ms per step, so the kill lands between step 4's
    # checkpoint and the end of the job.
    r.start_workers(env={"L2L_DELAY_AT": "worker.fetch:40"})
    deadline = time.monotonic() + 120
    want = "step-%08d" % EVERY
    while r.latest() != want:
        if time.monotonic() > deadline or not all(p.running() for p in r.eps + r.workers):
            raise Failure("%s: step %d's checkpoint did not become latest (latest %r; exits %s)" % (
                r.name, EVERY, r.latest(), [p.wait(0) for p in r.eps + r.workers]))
        time.sleep(0.01)
    for p in r.workers + r.eps:
        code = p.kill9()
        if code != -signal.SIGKILL:
            raise Failure("%s: %s exited %s before the SIGKILL (the job ran past the kill?):\n%s" % (
                r.name, p.name, code, p.tail()))
    if r.latest() != want or os.path.exists(os.path.join(r.root, "step-%08d" % STEPS)):
        raise Failure("%s: after the kill latest is %r (root %s): the job got to step %d before it" % (
            r.name, r.latest(), sorted(os.listdir(r.root)), STEPS))
    steps_done = max([int(x) for x in re.findall(r"\] step (\d+) loss", r.eps[0].log())] or [-1]) + 1
    r.start_daemons(resume=True)
    for k in range(2):
        if "start step %d" % EVERY not in r.eps[k].log():
            raise Failure("%s: resumed shard %d does not start at step %d:\n%s" % (r.name, k, EVERY, r.eps[k].tail()))
    r.start_workers()
    r.wait_workers_ok()
    r.stop()
    expect_same(r, ref, r.name)
    return ("2 shards SIGKILLed (daemons and workers) with step %d's checkpoint latest and %d steps done, every shard "
            "resumed with --resume ROOT: the final checkpoint equals the uninterrupted single daemon's; root %s" % (
                EVERY, steps_done, sorted(os.listdir(r.root))))


def case_atomic(ctx):
    ref = ctx.reference()
    r = Run(ctx, "sh2-atomic", ctx.job, 2)
    r.start_shard(0)
    # Shard 1 (of 2) owns the layers after shard 0's. Its part of a checkpoint is one
    # eps.checkpoint visit per layer file: those of step 4 come first; die after two of
    # step 8's.
    first0, last0 = r.shard_layers(0)
    n1 = LAYERS - (last0 + 1)
    if n1 < 2:
        raise Failure("%s: shard 1 owns %d layer(s): no kill half-way through its part" % (r.name, n1))
    fault = "eps.checkpoint:%d" % (n1 + 2)
    r.start_shard(1, env={"L2L_FAULT_AT": fault})
    r.start_workers()
    code = r.eps[1].wait(120)
    if code != -signal.SIGKILL or "injected SIGKILL at eps.checkpoint" not in r.eps[1].log():
        raise Failure("%s: shard 1 (%s) was to die writing step %d's part; exit %s:\n%s" % (
            r.name, fault, STEPS, code, r.eps[1].tail()))
    if "checkpoint part of step %d written" % EVERY not in r.eps[1].log():
        raise Failure("%s: shard 1 died, but not after writing step %d's part:\n%s" % (r.name, EVERY, r.eps[1].tail()))
    # Shard 0 waits for the missing part; the workers must not be told the job is done
    # (they wait for shard 1).
    time.sleep(3)
    final = os.path.join(r.root, "step-%08d" % STEPS)
    if r.latest() != "step-%08d" % EVERY or os.path.exists(final):
        raise Failure("%s: shard 1 died in step %d's part, yet latest is %r and the root holds %s" % (
            r.name, STEPS, r.latest(), sorted(os.listdir(r.root))))
    d = compare_checkpoints(os.path.join(r.root, "step-%08d" % EVERY), os.path.join(ref.root, "step-%08d" % EVERY))
    if d:
        raise Failure("%s: step %d's checkpoint differs from the single daemon's: %s" % (r.name, EVERY, d))
    code0 = r.eps[0].wait(0)
    codes = [w.wait(0) for w in r.workers]
    if code0 is not None:
        raise Failure("%s: shard 0 exited %s after shard 1 died (it should wait for the part):\n%s" % (
            r.name, code0, r.eps[0].tail()))
    if 0 in codes:
        raise Failure("%s: a worker exited 0 although step %d's checkpoint was never assembled (exits %s):\n%s" % (
            r.name, STEPS, codes, "\n".join(w.tail(10) for w in r.workers)))
    leftover = sorted(x for x in os.listdir(r.root) if x.startswith(".step-%08d" % STEPS))
    # Restarted alone from the last complete checkpoint, shard 1 rejoins: every shard rolls
    # back to step 4, the waiting workers rejoin, and the job ends as if never interrupted.
    r.start_shard(1, resume=True, args=["--listen", r.addr[1]])
    r.wait_workers_ok()
    r.stop()
    expect_same(r, ctx.reference(), r.name)
    r.check_root_clean()
    return ("shard 1 SIGKILLed half-way through step %d's part (%s, %d layers): latest stayed step %d (equal to the "
            "single daemon's), step %d never assembled, shard 0 kept waiting, workers' exits %s (none 0); left in the "
            "root: %s; then shard 1 restarted alone with --resume: the job finished, equal to the single daemon's, "
            "the root clean" % (STEPS, fault, n1, EVERY, STEPS, ["running" if c is None else c for c in codes],
                                leftover or "nothing of step %d" % STEPS))


def expect_rolled_back(r, shards):
    for k in shards:
        if "rolled back to step %d" % EVERY not in r.eps[k].log():
            raise Failure("%s: shard %d did not roll back to step %d:\n%s" % (r.name, k, EVERY, r.eps[k].tail()))


def case_restart_in_place(ctx):
    ref = ctx.reference()
    out = []
    for victim, transport in ((1, "auto"), (1, "grpc"), (0, "auto")):
        r = Run(ctx, "sh2-inplace-%d-%s" % (victim, transport), ctx.job, 2)
        r.start_daemons()
        r.start_workers(transport=transport, env={"L2L_DELAY_AT": "worker.fetch:40"})
        # Into the second period, a step past the checkpoint committed: the shards roll back.
        wait_log(r.eps[0], "] step %d loss" % (EVERY + 1), "%s: shard 0" % r.name, 120)
        code = r.eps[victim].kill9()
        if code != -signal.SIGKILL:
            raise Failure("%s: shard %d exited %s before the SIGKILL:\n%s" % (r.name, victim, code,
                                                                            r.eps[victim].tail()))
        done_before = max(int(x) for x in re.findall(r"\] step (\d+) loss", r.eps[0].log())) + 1
        # The workers wait for it (they must not exit) while it is down.
        time.sleep(2)
        for w in r.workers:
            if not w.running():
                raise Failure("%s: worker %s exited %s while shard %d was down:\n%s" % (
                    r.name, w.name, w.wait(0), victim, w.tail()))
        r.start_shard(victim, resume=True, args=["--listen", r.addr[victim]])
        r.wait_workers_ok()
        expect_rolled_back(r, [1 - victim])
        if "start step %d" % EVERY not in r.eps[victim].log():
            raise Failure("%s: the restarted shard %d does not start at step %d:\n%s" % (r.name, victim, EVERY,
                                                                                        r.eps[victim].tail()))
        waited = [w.name for w in r.workers if "shard %d at" % victim in w.log()]
        r.stop()
        expect_same(r, ref, r.name)
        expect_same_losses(r, ref, r.name)
        out.append("shard %d (workers %s) SIGKILLed after %d steps (latest step %d), restarted alone with --resume: "
                   "workers waited (%s), the other shard rolled back to step %d" % (
                       victim, transport, done_before, EVERY, ", ".join(waited) or "none logged", EVERY))
    return "; ".join(out) + "; the final checkpoints equal the uninterrupted single daemon's"


def case_worker_loss(ctx):
    ref = ctx.reference()
    # Shard 1 learns of the rollback 1.5 s late (eps.epoch): the replacement registers
    # with it while it still holds worker 1 as active, and must wait for the rollback
    # there (a race the chaos test once lost) instead of giving up.
    r = Run(ctx, "sh2-wloss", ctx.job, 2, shard_env={1: {"L2L_DELAY_AT": "eps.epoch:1500"}})
    r.start_daemons()
    r.start_workers(env={"L2L_DELAY_AT": "worker.fetch:40"})
    wait_log(r.eps[0], "] step %d loss" % (EVERY + 1), "%s: shard 0" % r.name, 120)
    victim = r.workers[1]
    if victim.kill9() != -signal.SIGKILL:
        raise Failure("%s: worker 1 exited before the SIGKILL:\n%s" % (r.name, victim.tail()))
    # Its replacement (as a supervisor starts it) takes its place once a shard declares it lost.
    argv = [r.procs.bin("l2l-worker"), "--eps", r.addr[0], "--device", "cpu", "--threads", "1", "--name", "w1",
            "--connect-timeout-ms", "60000"]
    r.starts += 1
    r.workers[1] = r.procs.spawn("%s-w1-%d" % (r.name, r.starts), argv)
    r.wait_workers_ok()
    expect_rolled_back(r, range(2))
    if "registers again while still active on this shard" not in r.eps[1].log():
        raise Failure("%s: the replacement never met shard 1 before its rollback (the race this case makes):\n%s" % (
            r.name, r.eps[1].tail()))
    r.stop()
    expect_same(r, ref, r.name)
    expect_same_losses(r, ref, r.name)
    return ("worker 1 SIGKILLed mid-job after step %d's checkpoint, a replacement started, shard 1 told of the "
            "rollback 1.5 s late (the replacement waited for it): both shards rolled back to step %d, the final "
            "checkpoint and every logged step loss equal the uninterrupted single daemon's" % (EVERY, EVERY))


def case_lost_at_end(ctx):
    ref = ctx.reference()
    r = Run(ctx, "sh2-end", ctx.job, 2)
    r.start_daemons()
    # Each worker sleeps 4 s between leaving shard 0 and leaving shard 1.
    r.start_workers(env={"L2L_DELAY_AT": "worker.leave:4000"})
    for i in range(WORKERS):
        wait_log(r.eps[0], "worker %d left at step %d" % (i, STEPS), "%s: shard 0" % r.name, 120)
    if r.eps[1].kill9() != -signal.SIGKILL:
        raise Failure("%s: shard 1 exited before the SIGKILL:\n%s" % (r.name, r.eps[1].tail()))
    t0 = time.monotonic()
    r.start_shard(1, resume=True, args=["--listen", r.addr[1]])
    r.wait_workers_ok(timeout=60)
    took = time.monotonic() - t0
    for w in r.workers:
        if "shard 1 at" not in w.log() or "not left" not in w.log():
            raise Failure("%s: worker %s exited 0 without saying it did not leave shard 1:\n%s" % (
                r.name, w.name, w.tail()))
    if "start step %d" % STEPS not in r.eps[1].log():
        raise Failure("%s: the restarted shard 1 does not start at step %d:\n%s" % (r.name, STEPS, r.eps[1].tail()))
    r.stop()
    expect_same(r, ref, r.name)
    r.check_root_clean()
    return ("shard 1 SIGKILLed after shard 0 let both workers go (final checkpoint assembled), before they left "
            "shard 1, restarted with --resume at step %d: the workers exited 0 %.1f s later without it, both "
            "shards stopped cleanly, the final checkpoint equals the single daemon's" % (STEPS, took))


def case_both_restarted(ctx):
    ref = ctx.reference()
    r = Run(ctx, "sh2-both", ctx.job, 2)
    with open(r.config, "a") as f:
        f.write("heartbeat_timeout_ms: 240000\n")  # the workers beat only every 120 s here
    r.start_daemons()
    # No heartbeat in the first 120 s of a worker's life (the case ends well before): a
    # call's error alone tells it of a shard's loss, as when a loss falls between two
    # heartbeats.
    r.start_workers(env={"L2L_DELAY_AT": "worker.fetch:40"}, args=["--heartbeat-ms", "120000"])
    wait_log(r.eps[0], "] step %d loss" % (EVERY + 1), "%s: shard 0" % r.name, 120)
    if r.eps[1].kill9() != -signal.SIGKILL:
        raise Failure("%s: shard 1 exited before the SIGKILL:\n%s" % (r.name, r.eps[1].tail()))
    for w in r.workers:
        wait_log(w, "rejoining the EPS", "%s: worker %s" % (r.name, w.name), 30)
    if r.eps[0].kill9() != -signal.SIGKILL:
        raise Failure("%s: shard 0 exited before the SIGKILL:\n%s" % (r.name, r.eps[0].tail()))
    t0 = time.monotonic()
    r.start_shard(0, resume=True, args=["--listen", r.addr[0]])
    r.start_shard(1, resume=True, args=["--listen", r.addr[1]])
    r.wait_workers_ok()
    took = time.monotonic() - t0
    for k in range(2):
        if "start step %d" % EVERY not in r.eps[k].log():
            raise Failure("%s: the restarted shard %d does not start at step %d:\n%s" % (r.name, k, EVERY,
                                                                                        r.eps[k].tail()))
    for w in r.workers:
        if "still has this worker at step 0" not in w.log() or "(it restarted)" not in w.log():
            raise Failure("%s: worker %s never registered with the restarted shard 0 again (the race this case "
                          "makes):\n%s" % (r.name, w.name, w.tail()))
    r.stop()
    expect_same(r, ref, r.name)
    expect_same_losses(r, ref, r.name)
    return ("both shards SIGKILLed after step %d's checkpoint (shard 1, then shard 0 while the workers rejoined it, "
            "their heartbeats held off), restarted with --resume: both workers registered with the restarted shard 0 "
            "again and finished %.1f s after the restarts; the final checkpoint and every logged step loss equal the "
            "single daemon's" % (EVERY, took))


def case_continue(ctx):
    # The reference: one daemon, on_worker_loss: continue, worker 1 leaving after step
    # EVERY (--steps): the steps from EVERY on are worker 0's alone.
    ref = Run(ctx, "ref-continue", ctx.job, 1)
    r = Run(ctx, "sh2-continue", ctx.job, 2)
    for run in (ref, r):
        with open(run.config, "a") as f:
            f.write("on_worker_loss: continue\n")

    def worker(run, i, args=(), env=None):
        argv = [run.procs.bin("l2l-worker"), "--eps", run.addr[0], "--device", "cpu", "--threads", "1", "--name",
                "w%d" % i, "--connect-timeout-ms", "60000"] + list(args)
        run.starts += 1
        return run.procs.spawn("%s-w%d-%d" % (run.name, i, run.starts), argv, env=env)

    ref.start_daemons()
    ref.workers = [worker(ref, 0)]
    wait_log(ref.workers[0], "registered as worker 0", "%s: w0" % ref.name)  # ids in start order here
    ref.workers.append(worker(ref, 1, ["--steps", str(EVERY)]))
    ref.wait_workers_ok()
    ref.stop()
    # Sharded: worker 1 SIGKILLed a step past step EVERY's checkpoint, never replaced:
    # every shard rolls back to step EVERY and goes on with worker 0 alone.
    r.start_daemons()
    delay = {"L2L_DELAY_AT": "worker.fetch:40"}
    r.workers = [worker(r, 0, env=delay), worker(r, 1, env=delay)]
    wait_log(r.eps[0], "] step %d loss" % (EVERY + 1), "%s: shard 0" % r.name, 120)
    # The process that holds id 1 (the ids follow the order of registration).
    one = [w for w in r.workers if "registered as worker 1 " in w.log()]
    if len(one) != 1:
        raise Failure("%s: not one worker registered as worker 1: %s" % (r.name, [w.tail(5) for w in r.workers]))
    if one[0].kill9() != -signal.SIGKILL:
        raise Failure("%s: worker 1 exited before the SIGKILL:\n%s" % (r.name, one[0].tail()))
    r.workers = [w for w in r.workers if w is not one[0]]
    r.wait_workers_ok()
    expect_rolled_back(r, range(2))
    r.stop()
    expect_same(r, ref, r.name)
    return ("on_worker_loss: continue: worker 1 SIGKILLed after step %d's checkpoint and not replaced: both shards "
            "rolled back to step %d and went on with worker 0; the final checkpoint equals one daemon's whose worker 1 "
            "left after step %d" % (EVERY, EVERY, EVERY))


def case_coordinator_gone(ctx):
    # Shard 0 SIGKILLed and never restarted: every other process gives up within its
    # deadline, with a message naming what it waited for; none exits 0, none hangs.
    r = Run(ctx, "sh2-gone", ctx.job, 2, shard_args={1: ["--coordinator-timeout-ms", "3000"]})
    r.start_daemons()
    for i in range(WORKERS):
        r.starts += 1
        r.workers.append(r.procs.spawn("%s-w%d-%d" % (r.name, i, r.starts), [
            r.procs.bin("l2l-worker"), "--eps", r.addr[0], "--device", "cpu", "--threads", "1", "--name", "w%d" % i,
            "--connect-timeout-ms", "2000", "--shard-wait-ms", "5000"], env={"L2L_DELAY_AT": "worker.fetch:40"}))
    wait_log(r.eps[0], "] step 2 loss", "%s: shard 0" % r.name, 120)
    if r.eps[0].kill9() != -signal.SIGKILL:
        raise Failure("%s: shard 0 exited before the SIGKILL:\n%s" % (r.name, r.eps[0].tail()))
    t0 = time.monotonic()
    code1 = r.eps[1].wait(30)
    t1 = time.monotonic() - t0
    if code1 != 1 or "the job's coordinator (shard 0) is gone" not in r.eps[1].log():
        raise Failure("%s: shard 1 exited %s after shard 0 was gone (want 1, naming the coordinator):\n%s" % (
            r.name, code1, r.eps[1].tail()))
    codes, lines = [], []
    for w in r.workers:
        codes.append(w.wait(60))
        waited = [x for x in w.log().splitlines() if "still waiting for shard(s) 0" in x]
        if codes[-1] in (None, 0) or not waited:
            raise Failure("%s: worker %s exited %s (want non-zero, naming shard 0 it waited for):\n%s" % (
                r.name, w.name, codes[-1], w.tail()))
        lines.append(waited[-1].split("error: ", 1)[-1][:100])
    return ("shard 0 SIGKILLed, not restarted: shard 1 stopped after %.1f s (exit 1, --coordinator-timeout-ms 3000); "
            "the workers exited %s after --shard-wait-ms 5000: %s" % (t1, codes, lines[0]))


def wait_log(proc, text, what, timeout=60):
    deadline = time.monotonic() + timeout
    while text not in proc.log():
        if time.monotonic() > deadline or not proc.running():
            raise Failure("%s: no %r in its log (exit %s):\n%s" % (what, text, proc.wait(0), proc.tail()))
        time.sleep(0.05)


def expect_refused(proc, fragment, what, timeout=60):
    code = proc.wait(timeout)
    if code is None:
        raise Failure("%s: still running after %d s (should be refused with %r):\n%s" % (
            what, timeout, fragment, proc.tail()))
    if code == 0 or code < 0:
        raise Failure("%s: exit %s (want a non-zero exit with a message):\n%s" % (what, code, proc.tail()))
    if fragment not in proc.log():
        raise Failure("%s: exit %d without %r in its message:\n%s" % (what, code, fragment, proc.tail()))


def case_bad_configs(ctx):
    r = Run(ctx, "bad", ctx.job, 2)
    other_job = ctx.write_job("job-seed78.yaml", seed=78)
    r.start_shard(0)
    checks = 0
    joins = [
        ("shard 1 started as 1/3 (shard 0 is 0/2)", ["--shard", "1/3"], None,
         "give every shard the same --shard K/N"),
        ("shard 1 with --shard-layers 3 (shard 0 balanced)", ["--shard-layers", "3"], None,
         "give every shard the same --shard-layers"),
        ("shard 1 with another job (seed 78)", [], other_job, "runs another job"),
    ]
    for i, (what, args, job, fragment) in enumerate(joins):
        argv = [ctx.procs.bin("l2l-eps"), "--state-dir", os.path.join(r.dir, "bad%d" % i), "--workers", "2",
                "--job-id", r.job_id + "-b%d" % i, "--config", r.config, "--job", job or ctx.job,
                "--coordinator", r.addr[0]]
        argv += args if args and args[0] == "--shard" else ["--shard", "1/2"] + args
        expect_refused(ctx.procs.spawn("bad-join%d" % i, argv), fragment, what)
        checks += 1
    if not r.eps[0].running():
        raise Failure("shard 0 died after refusing bad shards:\n%s" % r.eps[0].tail())
    flags = [
        ("--shard 2/2", ["--shard", "2/2"], "--shard '2/2': need 0 <= K < N"),
        ("--shard x", ["--shard", "x"], "--shard 'x': expected K/N"),
        ("--coordinator without --shard", ["--coordinator", r.addr[0]], "need --shard K/N with N > 1"),
    ]
    for i, (what, args, fragment) in enumerate(flags):
        argv = [ctx.procs.bin("l2l-eps"), "--state-dir", os.path.join(r.dir, "flag%d" % i), "--workers", "2",
                "--job", ctx.job, "--job-id", r.job_id + "-f%d" % i] + args
        p = ctx.procs.spawn("bad-flag%d" % i, argv)
        expect_refused(p, fragment, what)
        if os.path.exists(os.path.join(r.dir, "flag%d" % i, "eps.port")):
            raise Failure("%s: refused, yet it listened (eps.port written)" % what)
        checks += 1
    # A shard whose advertised address nobody can dial: it joins shard 0 (which does not
    # dial it), the workers cannot reach it.
    r.start_shard(1, args=["--advertise", "127.0.0.1:1"])
    wait_log(r.eps[1], "joined shard 0 at %s as 127.0.0.1:1" % r.addr[0], "shard 1 --advertise 127.0.0.1:1")
    w = ctx.procs.spawn("bad-worker", [ctx.procs.bin("l2l-worker"), "--eps", r.addr[0], "--device", "cpu",
                                       "--threads", "1", "--connect-timeout-ms", "2000"])
    expect_refused(w, "shard 1 of 2 at 127.0.0.1:1", "a worker that cannot reach shard 1")
    checks += 1
    for p in r.eps:
        p.kill9()
    return "%d bad configurations refused with a message naming the problem (non-zero exit)" % checks


CASES = {
    1: ("bit_identical", case_bit_identical),
    2: ("spill", case_spill),
    3: ("clip_nonfinite", case_clip_nonfinite),
    4: ("resume", case_resume),
    5: ("atomic_checkpoint", case_atomic),
    6: ("bad_configs", case_bad_configs),
    7: ("restart_in_place", case_restart_in_place),
    8: ("worker_loss", case_worker_loss),
    9: ("continue", case_continue),
    10: ("coordinator_gone", case_coordinator_gone),
    11: ("lost_at_end", case_lost_at_end),
    12: ("both_restarted", case_both_restarted),
}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("bin_dir")
    ap.add_argument("--cases", default=",".join(str(c) for c in CASES), help="comma-separated case numbers")
    ap.add_argument("--keep", action="store_true", help="keep the work dir")
    a = ap.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))
    cases = [int(c) for c in a.cases.split(",") if c]
    work = tempfile.mkdtemp(prefix="l2l-shards-")
    procs = l2l_procs.Procs(a.bin_dir, work)
    ok = True
    t0 = time.monotonic()
    try:
        ctx = Ctx(procs, work)
        for c in cases:
            name, fn = CASES[c]
            start = time.monotonic()
            ctx.shown, ctx.stop_failures = [], []
            try:
                line = fn(ctx)
                if ctx.stop_failures:
                    raise Failure("the checks above passed (%s), but not every daemon stopped cleanly on SIGTERM: %s"
                                  % (line, "; ".join(ctx.stop_failures)))
                print("shards %d %s (%.1f s): %s" % (c, name, time.monotonic() - start, line), flush=True)
            except Failure as e:
                ok = False
                print("shards %d %s: FAILED: %s" % (c, name, e), flush=True)
                for run in ctx.shown:
                    for p in run.eps + run.workers:
                        if p is not None:
                            print("---- %s (exit %s, tail)\n%s" % (p.name, p.wait(0), p.tail(15)))
            finally:
                # A failed case's processes must not disturb the next one.
                for run in ctx.shown:
                    for p in run.eps + run.workers:
                        if p is not None and p.running():
                            p.kill9()
    finally:
        alive = procs.close()
        if alive:
            print("shards: FAILED: processes outlived the test: %s" % alive)
            ok = False
        l2l_procs.remove_segments(os.getpid())
        if ok and not a.keep:
            shutil.rmtree(work, ignore_errors=True)
        else:
            print("shards: work dir kept: %s" % work)
    print("shards: %s (%d cases, %.1f s)" % ("ok" if ok else "FAILED", len(cases), time.monotonic() - t0))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
