// StepRunner: what runs one training step of this worker on its device(s), as l2l-worker's
// step loop sees it. Two implementations: Relay (worker/relay.h: one backend) and
// DeviceGroup (worker/device_group.h: several GPUs of the host as one EPS worker, a Relay
// per device). CreateStepRunner (device_group.h) picks one by the number of backends, so
// worker_main.cc holds one StepRunner pointer and never asks which it has.
//
// Why an interface both implement rather than a device group of one: a group adds, on
// every layer fetch and gradient push, a shared acquisition table, a rank client, one
// thread per device and NCCL communicators (none of which exist for one device, and
// CPU-only builds have no NCCL); a Relay behind this interface runs exactly the code it
// runs without it. The cost is one virtual call per step (and per statistic read), not
// per layer: inside a DeviceGroup the relays are called as Relay (final), not through
// this interface.
//
// RunStep's `eval` has no default here: the step loop always passes it. Relay and
// DeviceGroup keep `eval = {}` for their direct callers (tests, benchmarks); a call
// through StepRunner cannot omit it, so no default is ever taken from the static type.
//
// Thread-safety: RunStep from one thread; the readers from that thread between steps.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <vector>

#include "common/status.h"
#include "worker/data_loader.h"  // MicroBatch
#include "worker/eps_client.h"   // StepReport

namespace l2l::worker {

// Layer versions the relay computed with (the lock-free bound's evidence).
struct VersionStats {
  int64_t acquires = 0;
  int64_t max_lag = 0;                 // max over acquires of (step - version)
  int64_t min_lag = 0;                 // min over acquires of (step - version)
  std::map<int64_t, int64_t> lag_counts;  // lag -> acquires
};

// Seconds of one step, measured on the compute thread (the backend synchronised at each
// boundary). BlockBackward recomputes and differentiates in one call, so `recompute` is
// the forward time of the same step's recomputed blocks (identical work; blocks that kept
// their intermediates count 0) and `backward` is the rest.
struct RelayTimes {
  double upload = 0;      // tokens to the device
  double forward = 0;     // embedding + blocks forward (incl. stash offload)
  double head = 0;        // head forward + backward, all micro-batches
  double recompute = 0;   // see above
  double backward = 0;    // blocks (minus recompute) + embedding backward
  double wait_layer = 0;  // blocked waiting for a layer to be resident
  double wait_first_layer = 0;  // the part of wait_layer spent on the step's first layer
  double wait_push = 0;   // blocked waiting for a gradient push to finish
  double total = 0;
};

class StepRunner {
 public:
  virtual ~StepRunner() = default;

  // Runs step `step` over exactly job.train.micro_batches micro-batches and pushes every
  // layer's gradient to the EPS (Relay::RunStep and DeviceGroup::RunStep say how);
  // `eval`: forward-only in-job validation micro-batches (empty: none). Returns the
  // report with data_position left empty for the caller.
  virtual Result<StepReport> RunStep(int64_t step, const std::vector<MicroBatch>& micro_batches,
                                     const std::vector<MicroBatch>& eval) = 0;

  // The last step's times (a group: device 0's; every device computes the same layers).
  virtual const RelayTimes& last_times() const = 0;
  // The layer versions computed with so far (a group: shared by its devices).
  virtual const VersionStats& versions() const = 0;
  // Backend bytes held, and host bytes of the stash (a group: summed over its devices).
  virtual size_t device_bytes() const = 0;
  virtual size_t stash_host_bytes() const = 0;
};

}  // namespace l2l::worker
