// Test-only fault injection at named sites, for the chaos tests (tests/integration/
// chaos_test.py, docs/operations.md "Failure modes").
//
//   L2L_FAULT_AT=<site>:<n>[,<site>:<n>...]
//
// makes the process kill itself with SIGKILL (as `kill -9` would: no handlers, no
// cleanup, exit status 137) the n-th time (1-based) it reaches FaultPoint("<site>").
// Sites: eps.checkpoint (a checkpoint with some layer files written, no manifest yet),
// eps.update (a layer's AdamW applied, the step not committed), worker.fetch (a layer
// acquired, not yet copied out or released), worker.push (a gradient half written to its
// shm slot / its first gRPC chunk sent). Without the variable a site costs a check of an
// empty list. A malformed value is reported on stderr once and ignored.
//
//   L2L_DELAY_AT=<site>:<ms>[,<site>:<ms>...]
//
// makes every visit of the site sleep <ms> milliseconds instead (a slow fetch, a slow
// update: the per-step timeline tests use it to see a wait land in the right field;
// eps.checkpoint_loop: the daemon's checkpoint thread between two checkpoints; eps.epoch:
// a shard other than 0 told of a new recovery epoch, before it rolls back; worker.leave: a
// worker of a sharded job let go by shard 0 after the last step, before it leaves the others).
//
//   L2L_STOP_AT=<site>:<n>[,<site>:<n>...]
//
// makes the process stop itself (SIGSTOP: every thread stalls, heartbeats too) the n-th
// time it reaches the site, until someone sends SIGCONT: a worker stalled past the
// heartbeat timeout mid-push (tests/integration/stalled_worker_test.py).
//
// Thread-safety: FaultPoint may be called from any thread; the counts are atomic.
#pragma once

namespace l2l {

void FaultPoint(const char* site);

}  // namespace l2l
