#!/usr/bin/env python3
"""A worker that stalls (SIGSTOP, mid-push) past the heartbeat timeout is declared lost while its
process lives on; when it resumes (SIGCONT) it must rejoin, not exit.

With the shm transport the daemon closes a removed worker's gradient segment. The worker
used to read that as "the EPS stopped the job" and exit 0: a supervisor with
Restart=on-failure leaves an exit-0 worker stopped, and the job (on_worker_loss: pause)
waited for it forever. Now a closed segment with the job still running means "removed":
the worker re-registers, redoes the abandoned step, the job finishes, and the final
weights equal an uninterrupted run bit for bit.

Usage: stalled_worker_test.py BIN_DIR [--transport shm|grpc] [--keep]
"""
import argparse
import glob
import os
import re
import shutil
import signal
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import l2l_procs  # noqa: E402
from chaos_test import Cluster, Failure, finish, run_uninterrupted  # noqa: E402

STEPS = 12
LAYERS = 5  # the job of l2l_procs.write_job: embedding, 3 blocks, head
HEARTBEAT_TIMEOUT_MS = 1000


def wait_for(pred, timeout, what):
    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > deadline:
            raise Failure("timed out after %d s waiting for %s" % (timeout, what))
        time.sleep(0.02)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("bin_dir")
    ap.add_argument("--transport", default="shm", choices=["shm", "grpc"])
    ap.add_argument("--keep", action="store_true")
    a = ap.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))
    work = tempfile.mkdtemp(prefix="l2l-stalled-")
    procs = l2l_procs.Procs(a.bin_dir, work)
    tokens = os.path.join(work, "train.bin")
    l2l_procs.write_tokens(tokens, 20000, 96)
    job_yaml = os.path.join(work, "job.yaml")
    l2l_procs.write_job(job_yaml, tokens, STEPS)
    daemon_yaml = os.path.join(work, "eps.yaml")
    with open(daemon_yaml, "w") as f:
        f.write("heartbeat_timeout_ms: %d\non_worker_loss: pause\n" % HEARTBEAT_TIMEOUT_MS)
    ok = False
    c = None
    stopped_pid = None
    try:
        ref = run_uninterrupted(procs, work, job_yaml, a.transport, time.monotonic() + 300)
        ref_export, _ = finish(procs, ref, STEPS)

        c = Cluster(procs, work, job_yaml, a.transport, "stall")
        c.eps_args = ["--config", daemon_yaml]
        if not c.start_eps():
            raise Failure("l2l-eps did not start:\n" + c.eps.tail())
        c.start_worker(0)
        # w1 stops itself half-way through step 3's second gradient push (a slot claimed
        # and half written over shm; a chunk sent over gRPC) and stays stopped.
        c.start_worker(1, extra_env={"L2L_STOP_AT": "worker.push:%d" % (LAYERS * 3 + 2)})
        w1 = c.workers[1]
        stopped_pid = w1.pid
        wait_for(lambda: "L2L_STOP_AT: SIGSTOP at worker.push" in w1.log(), 120, "w1 to stop itself in step 3")
        # Its id: the daemon names it "worker N 'w1'" at registration.
        m = re.search(r"worker (\d+) 'w1' registered", c.eps.log())
        if not m:
            raise Failure("the daemon's log does not name w1's id:\n" + c.eps.tail())
        lost = "worker %s lost" % m.group(1)
        wait_for(lambda: lost in c.eps.log(), 30, "the daemon to declare the stalled w1 lost")
        time.sleep(0.3)
        os.kill(stopped_pid, signal.SIGCONT)
        stopped_pid = None
        deadline = time.monotonic() + 120
        while True:
            st = c.status()
            if st and st["step"] == STEPS and st["state"] == "finished":
                break
            if not w1.running() and w1.wait(0) == 0 and (st is None or st["step"] < STEPS):
                raise Failure("the resumed w1 exited 0 while the job waits for it at step %s:\n%s"
                              % (st and st["step"], w1.tail()))
            if time.monotonic() > deadline:
                raise Failure("the job did not finish in 120 s after w1 resumed: %s" % st)
            time.sleep(0.1)
        for i in range(2):
            code = c.workers[i].wait(60)
            if code != 0:
                raise Failure("w%d exited %s:\n%s" % (i, code, c.workers[i].tail()))
        if "rejoin" not in w1.log():
            raise Failure("w1 finished without rejoining after it was declared lost:\n" + w1.tail())
        got_export, _ = finish(procs, c, STEPS)
        diff = l2l_procs.compare_weights(got_export, ref_export)
        if diff:
            raise Failure("final weights differ from the uninterrupted run: " + diff)
        print("stalled_worker (%s): w1 stopped past the heartbeat timeout, declared lost; resumed, it rejoined and "
              "redid the step; both exited 0 and the final weights equal the uninterrupted run bit for bit"
              % a.transport)
        ok = True
    except Failure as e:
        print("stalled_worker: FAILED (%s): %s" % (a.transport, e))
        if c is not None:
            for p in [c.eps] + c.workers:
                if p is not None:
                    print("---- %s (tail)\n%s" % (p.name, p.tail(20)))
    finally:
        if stopped_pid is not None:
            try:
                os.kill(stopped_pid, signal.SIGCONT)
            except ProcessLookupError:
                pass
        alive = procs.close()
        if alive:
            print("stalled_worker: FAILED: processes outlived the test: %s" % alive)
            ok = False
        for seg in glob.glob("/dev/shm/l2l-*-%d-*" % os.getpid()):
            os.unlink(seg)
        if ok and not a.keep:
            shutil.rmtree(work, ignore_errors=True)
        else:
            print("stalled_worker: work dir kept: %s" % work)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
