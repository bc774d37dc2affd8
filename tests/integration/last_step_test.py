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
import os
import signal
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from chaos_test import (Cluster, Failure, finish, finish_and_compare, run_scenario,  # noqa: E402
                        run_uninterrupted, scenario_args, wait_finished, write_small_job)

STEPS = 4
LAYERS = 5  # the job of l2l_procs.write_job: embedding, 3 blocks, head


def main():
    a = scenario_args()

    def scenario(procs, work, shown):
        job_yaml = write_small_job(work, STEPS, checkpoint_every=1)
        ref = run_uninterrupted(procs, work, job_yaml, a.transport, time.monotonic() + 300)
        ref_export, _ = finish(procs, ref, STEPS)

        c = Cluster(procs, work, job_yaml, a.transport, "chaos")
        shown.append(c)
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
        wait_finished(c, STEPS, 120, "the job (w1 %s)" % (
            "had exited %s before the last step committed" % w1_exited_early if w1_exited_early is not None
            else "waited"))
        finish_and_compare(procs, c, STEPS, ref_export)
        return ("w0 killed mid-push in the last step after w1 reported it; w1 %s; the replacement took w0's id; "
                "the job finished, final weights equal the uninterrupted run bit for bit" % (
                    "waited for the commit and redid the step" if "rejoin" in w1.log() else "waited"))

    return run_scenario("last_step", a.bin_dir, a.transport, a.keep, scenario)


if __name__ == "__main__":
    sys.exit(main())
