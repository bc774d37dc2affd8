#!/usr/bin/env python3
"""A worker exits 0 only once the job's last step is on disk (the chaos test's stop-22 CI
failure, made deterministic with L2L_FAULT_AT).

The job has 5 steps and checkpoint_every 2, so the periodic checkpoints are steps 2 and 4;
the daemon must still write one of step 5 when the job ends, and workers leave only after
it (Deregister waits for it). Two runs:

  1. uninterrupted, with the daemon's checkpoint thread slowed (L2L_DELAY_AT=
     eps.checkpoint_loop): when both workers have exited 0, checkpoints/step-00000005
     exists (before anyone asks the daemon to stop or checkpoint), and 2 and 4 too (none
     skipped because the job ran past a boundary before the thread set its hold);
  2. the daemon is killed (SIGKILL at the fault site eps.checkpoint) half-way through
     writing that last checkpoint, after the last step committed. No worker may exit 0
     then: a supervisor with Restart=on-failure (this test) would not restart it, and the
     daemon, resumed from step 4, would wait for it forever. The workers exit non-zero,
     are restarted with the daemon (--resume), redo step 5 and exit 0; the final weights
     equal the uninterrupted run's bit for bit.

Usage: final_step_test.py BIN_DIR [--transport grpc|shm] [--keep]
"""
import os
import signal
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from chaos_test import (Cluster, Failure, finish, finish_and_compare, run_scenario,  # noqa: E402
                        run_uninterrupted, scenario_args, wait_finished, wait_workers_exit_0,
                        write_small_job)

STEPS = 5
EVERY = 2
LAYERS = 5  # the job of l2l_procs.write_job: embedding, 3 blocks, head


def last_checkpoint(c):
    return os.path.join(c.ckpt_root(), "step-%08d" % STEPS, "manifest.json")


def main():
    a = scenario_args()

    def scenario(procs, work, shown):
        job_yaml = write_small_job(work, STEPS, checkpoint_every=EVERY)
        # The reference daemon's checkpoint thread sleeps 300 ms after each checkpoint,
        # long enough for the job to run past the next boundary (a step takes a few ms):
        # it must still write every one of them, the last step's included.
        ref = run_uninterrupted(procs, work, job_yaml, a.transport, time.monotonic() + 300,
                                eps_env={"L2L_DELAY_AT": "eps.checkpoint_loop:300"})
        if not os.path.exists(last_checkpoint(ref)):
            raise Failure("both workers exited 0 but the last step's checkpoint %s is not written (checkpoints: %s)"
                          % (last_checkpoint(ref), sorted(os.listdir(ref.ckpt_root()))))
        written = sorted(x for x in os.listdir(ref.ckpt_root()) if x.startswith("step-"))
        if written != ["step-%08d" % s for s in (2, 4, 5)]:
            raise Failure("with a slow checkpoint thread the checkpoints are %s, not steps 2, 4 and 5" % written)
        ref_export, _ = finish(procs, ref, STEPS)

        c = Cluster(procs, work, job_yaml, a.transport, "chaos")
        shown.append(c)
        # Layer files 1-5: step 2, 6-10: step 4, 11-15: step 5; die after two of step 5's.
        c.env_next["eps"] = "eps.checkpoint:%d" % (2 * LAYERS + 2)
        if not c.start_eps():
            raise Failure("l2l-eps did not start:\n" + c.eps.tail())
        c.start_worker(0)
        c.start_worker(1)
        code = c.eps.wait(120)
        if code != -signal.SIGKILL or "injected SIGKILL at eps.checkpoint" not in c.eps.log():
            raise Failure("l2l-eps was to die writing the last checkpoint; exit %s:\n%s" % (code, c.eps.tail()))
        if os.path.exists(last_checkpoint(c)):
            raise Failure("the killed daemon's last checkpoint is complete; the fault fired elsewhere")
        for i in range(2):
            code = c.workers[i].wait(60)
            if code is None:
                raise Failure("w%d still runs 60 s after its daemon died:\n%s" % (i, c.workers[i].tail()))
            if code == 0:
                raise Failure("w%d exited 0 although the last step was not on disk (its daemon died writing it):\n%s"
                              % (i, c.workers[i].tail()))
        # The supervisor: the daemon resumes from step 4, the failed workers come back.
        died = c.supervise()
        if {r for r, _ in died} != {"eps", "w0", "w1"} or c.unexpected:
            raise Failure("supervisor pass saw %s, unexpected %s" % (died, c.unexpected))
        wait_finished(c, STEPS, 120, "the resumed job")
        # "finished" is the last step committed; the workers exit 0 only once it is on disk.
        wait_workers_exit_0(c, who="restarted w")
        if not os.path.exists(last_checkpoint(c)):
            raise Failure("the restarted workers exited 0 but the last step's checkpoint is not written")
        finish_and_compare(procs, c, STEPS, ref_export)
        return ("the last step's checkpoint exists when the workers exit 0; a daemon killed while writing it left "
                "both workers failing (not exit 0); restarted, they redid step %d and the final weights equal the "
                "uninterrupted run bit for bit" % STEPS)

    return run_scenario("final_step", a.bin_dir, a.transport, a.keep, scenario)


if __name__ == "__main__":
    sys.exit(main())
