#!/usr/bin/env python3
"""A worker that stalls (SIGSTOP, mid-push) past the heartbeat timeout is declared lost while its
process lives on; when it resumes (SIGCONT) it must rejoin, not exit.

With the shm transport the daemon closes a removed worker's gradient segment. The worker
used to read that as "the EPS stopped the job" and exit 0: a supervisor with
Restart=on-failure leaves an exit-0 worker stopped, and the job (on_worker_loss: pause)
waited for it forever. Now a closed segment with the job still running means "removed":
the worker re-registers, redoes the abandoned step, the job finishes, and the final
weights equal an uninterrupted run bit for bit.

Usage: stalled_worker_test.py BIN_DIR [--transport grpc|shm] [--keep]
"""
import os
import re
import signal
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from chaos_test import (Cluster, Failure, finish, finish_and_compare, run_scenario,  # noqa: E402
                        run_uninterrupted, scenario_args, wait_finished, write_small_job)

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
    a = scenario_args()

    def scenario(procs, work, shown):
        job_yaml = write_small_job(work, STEPS)
        daemon_yaml = os.path.join(work, "eps.yaml")
        with open(daemon_yaml, "w") as f:
            f.write("heartbeat_timeout_ms: %d\non_worker_loss: pause\n" % HEARTBEAT_TIMEOUT_MS)
        ref = run_uninterrupted(procs, work, job_yaml, a.transport, time.monotonic() + 300)
        ref_export, _ = finish(procs, ref, STEPS)

        c = Cluster(procs, work, job_yaml, a.transport, "stall")
        shown.append(c)
        c.eps_args = ["--config", daemon_yaml]
        if not c.start_eps():
            raise Failure("l2l-eps did not start:\n" + c.eps.tail())
        c.start_worker(0)
        # w1 stops itself half-way through step 3's second gradient push (a slot claimed
        # and half written over shm; a chunk sent over gRPC) and stays stopped.
        c.start_worker(1, extra_env={"L2L_STOP_AT": "worker.push:%d" % (LAYERS * 3 + 2)})
        w1 = c.workers[1]
        try:
            wait_for(lambda: "L2L_STOP_AT: SIGSTOP at worker.push" in w1.log(), 120, "w1 to stop itself in step 3")
            # Its id: the daemon names it "worker N 'w1'" at registration.
            m = re.search(r"worker (\d+) 'w1' registered", c.eps.log())
            if not m:
                raise Failure("the daemon's log does not name w1's id:\n" + c.eps.tail())
            lost = "worker %s lost" % m.group(1)
            wait_for(lambda: lost in c.eps.log(), 30, "the daemon to declare the stalled w1 lost")
            time.sleep(0.3)
        finally:
            if w1.running():
                os.kill(w1.pid, signal.SIGCONT)

        def w1_exit_0(st):
            if not w1.running() and w1.wait(0) == 0:
                raise Failure("the resumed w1 exited 0 while the job waits for it at step %s:\n%s"
                              % (st and st["step"], w1.tail()))
        wait_finished(c, STEPS, 120, "the job after w1 resumed", check=w1_exit_0)
        if "rejoin" not in w1.log():
            raise Failure("w1 finished without rejoining after it was declared lost:\n" + w1.tail())
        finish_and_compare(procs, c, STEPS, ref_export)
        return ("w1 stopped past the heartbeat timeout mid-push, declared lost; resumed, it rejoined and redid the "
                "step; both exited 0 and the final weights equal the uninterrupted run bit for bit")

    return run_scenario("stalled_worker", a.bin_dir, a.transport, a.keep, scenario)


if __name__ == "__main__":
    sys.exit(main())
