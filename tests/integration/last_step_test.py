#!/usr/bin/env python3
"""A worker killed in the job's last step while the other worker has already reported it
(the chaos test's rare case, made deterministic with L2L_FAULT_AT):

  w0 dies half-way through pushing a gradient of the last step (worker.push); w1 pushes
  all of its gradients of that step and reports it (gRPC: nothing waits for w0 there);
  then the supervisor starts a replacement for w0.

The job must still finish with every step done by both data shards: w1 may not exit (and
leave the daemon) before the last step commits, since w0's loss abandons that step and
every worker must redo it; the replacement must take the dead worker's id (its shard and
unfinished step), not the id of a worker that left. The final state must equal an
uninterrupted run bit for bit, and every worker exits 0.

Usage: last_step_test.py BIN_DIR [--transport grpc|shm] [--keep]
"""
import argparse
import glob
import os
import shutil
import signal
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import l2l_procs  # noqa: E402
from chaos_test import Cluster, Failure, finish, run_uninterrupted  # noqa: E402

STEPS = 4
LAYERS = 5  # the job of l2l_procs.write_job: embedding, 3 blocks, head


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("bin_dir")
    ap.add_argument("--transport", default="grpc", choices=["shm", "grpc"])
    ap.add_argument("--keep", action="store_true")
    a = ap.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))
    work = tempfile.mkdtemp(prefix="l2l-last-step-")
    procs = l2l_procs.Procs(a.bin_dir, work)
    tokens = os.path.join(work, "train.bin")
    l2l_procs.write_tokens(tokens, 20000, 96)
    job_yaml = os.path.join(work, "job.yaml")
    l2l_procs.write_job(job_yaml, tokens, STEPS, checkpoint_every=1)
    ok = False
    c = None
    try:
        ref = run_uninterrupted(procs, work, job_yaml, a.transport, time.monotonic() + 300)
        ref_export, _ = finish(procs, ref, STEPS)

        c = Cluster(procs, work, job_yaml, a.transport, "chaos")
        c.start_eps()
        # The second push of the last step: the head's gradient is in, layer 3's half written.
        c.env_next["w0"] = "worker.push:%d" % (LAYERS * (STEPS - 1) + 2)
        c.start_worker(0)
        c.start_worker(1)
        w0, w1 = c.workers
        code = w0.wait(120)
        if code != -signal.SIGKILL or "injected SIGKILL at worker.push" not in w0.log():
            raise Failure("w0 was to die at its fault site; exit %s:\n%s" % (code, w0.tail()))
        # w1 reports the last step (over shm its pushes wait for w0's gradient instead).
        deadline = time.monotonic() + 60
        while "step %d/%d" % (STEPS, STEPS) not in w1.log() and a.transport == "grpc":
            if time.monotonic() > deadline:
                raise Failure("w1 did not report the last step:\n" + w1.tail())
            time.sleep(0.05)
        time.sleep(0.5)  # time to exit, where it would
        w1_exited_early = w1.wait(0)
        c.start_worker(0)  # the supervisor's replacement
        deadline = time.monotonic() + 120
        while True:
            st = c.status()
            if st and st["step"] == STEPS and st["state"] == "finished":
                break
            if time.monotonic() > deadline:
                raise Failure("the job did not finish in 120 s after the replacement started (w1 %s): %s" % (
                    "had exited %s before the last step committed" % w1_exited_early if w1_exited_early is not None
                    else "waited", st))
            time.sleep(0.1)
        for i in range(2):
            code = c.workers[i].wait(60)
            if code != 0:
                raise Failure("w%d exited %s:\n%s" % (i, code, c.workers[i].tail()))
        got_export, _ = finish(procs, c, STEPS)
        diff = l2l_procs.compare_weights(got_export, ref_export)
        if diff:
            raise Failure("final weights differ from the uninterrupted run: " + diff)
        print("last_step (%s): w0 killed mid-push in the last step after w1 reported it; w1 %s; the replacement "
              "took w0's id; the job finished, final weights equal the uninterrupted run bit for bit" % (
                  a.transport, "waited for the commit and redid the step" if "rejoin" in w1.log() else "waited"))
        ok = True
    except Failure as e:
        print("last_step: FAILED (%s): %s" % (a.transport, e))
        if c is not None:
            for p in [c.eps] + c.workers:
                if p is not None:
                    print("---- %s (tail)\n%s" % (p.name, p.tail(20)))
    finally:
        alive = procs.close()
        if alive:
            print("last_step: FAILED: processes outlived the test: %s" % alive)
            ok = False
        for seg in glob.glob("/dev/shm/l2l-*-%d-*" % os.getpid()):
            os.unlink(seg)
        if ok and not a.keep:
            shutil.rmtree(work, ignore_errors=True)
        else:
            print("last_step: work dir kept: %s" % work)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
