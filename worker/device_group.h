// DeviceGroup: one worker process driving several GPUs of its host as ONE worker of the
// EPS (l2l-worker --devices cuda:0,cuda:1,...), data parallel across the devices with
// bandwidth-centric fetch (ZeRO-Infinity; the L2L paper's L2L-p sketch):
//
//   fetch 1/n      each device copies only its shard (1/n of the layer's published bytes)
//                  from the EPS's page-locked memory over its own PCIe link;
//   all-gather     NCCL fills in the other shards over the device links, in place;
//   compute        each device runs its share of the step's micro-batches through the
//                  layer (forward, stash, recompute, backward: the ordinary relay);
//   reduce-scatter NCCL sums the devices' layer gradients so device r holds shard r of
//                  the sum;
//   push 1/n       each device copies its shard to the host; the group hands the EPS the
//                  whole layer gradient ONCE (as one worker, micro_batches = the step's
//                  total), so the EPS, its reduction across workers and hosts, its
//                  versions, stash/activation handling, checkpoints and rejoin are
//                  unchanged.
//
// Why one process with n devices rather than one worker per device joined by the EPS:
// the shard assembly, the shared acquisition of a layer (every device must gather the
// SAME version) and the NCCL communicators (ncclCommInitAll, no unique-id exchange) all
// stay inside one process; the EPS and its protocol do not change; a device failure
// fails the one worker (its step returns the error), which the job handles as any
// worker's failure; and device memory of one process is simplest to reason about.
//
// Each device has its own Relay (worker/relay.h) on its own Backend, with a RankClient
// (the EpsClient it sees) that shares acquisitions with the other ranks and collects
// gradient shards, two communicators (the prefetcher's all-gathers and the pusher's
// reduce-scatters run on different threads and copy streams, so each has its own
// ordered channel), and one HostRegionPinner shared by all ranks (the EPS's segments
// are page-locked once, portable to every device). Micro-batches: device r runs
// micro-batches [start_r, start_r + m_r) of the step, m_r = M/n (the first M%n devices
// one more); eval micro-batches all go to device 0.
//
// The group is a StepRunner (worker/step_runner.h), as a Relay is; CreateStepRunner
// below builds a Relay for one backend and a DeviceGroup for several.
//
// Ownership: borrows the EpsClient and the Backends (they outlive the group); owns the
// relays, rank clients, communicators and the pinner.
// Thread-safety: RunStep from one thread; it runs one thread per device for the step.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "common/config.h"
#include "common/status.h"
#include "kernels/backend.h"
#include "worker/data_loader.h"
#include "worker/eps_client.h"
#include "worker/host_pinner.h"
#include "worker/relay.h"
#include "worker/step_runner.h"

namespace l2l::worker {

class DeviceGroup final : public StepRunner {
 public:
  // backends: one per device, at least 2, CUDA on distinct devices (the collectives need
  // NCCL: UNIMPLEMENTED without it). job.train.micro_batches >= backends.size().
  static Result<std::unique_ptr<DeviceGroup>> Create(EpsClient* client,
                                                     std::vector<kernels::Backend*> backends,
                                                     const JobConfig& job, const RelayOptions& options);
  ~DeviceGroup() override;
  DeviceGroup(const DeviceGroup&) = delete;
  DeviceGroup& operator=(const DeviceGroup&) = delete;

  // As Relay::RunStep, for the whole group: exactly job.train.micro_batches micro-batches.
  // The report's loss is the mean over all micro-batches of their mean losses. After a
  // failure the EPS caused (a refused acquisition or push) the group's shared state is
  // reset (held layers released), so the step can be redone after a rejoin. A device
  // that fails on its own (bad input, a device error) aborts the communicators, so no
  // peer waits forever in a collective; the group then fails every later step
  // (FAILED_PRECONDITION) and the worker exits with the error.
  Result<StepReport> RunStep(int64_t step, const std::vector<MicroBatch>& micro_batches,
                             const std::vector<MicroBatch>& eval = {}) override;

  int size() const { return static_cast<int>(relays_.size()); }
  int64_t micro_batches(int rank) const { return counts_[static_cast<size_t>(rank)]; }
  const Relay& relay(int rank) const { return *relays_[static_cast<size_t>(rank)]; }
  // Device 0's times (every device computes the same layers; device 0 also runs eval).
  const RelayTimes& last_times() const override { return relays_[0]->last_times(); }
  // Versions device 0 computed with (every device uses the same: acquisitions are shared).
  const VersionStats& versions() const override { return relays_[0]->versions(); }
  size_t device_bytes() const override;       // summed over the devices
  size_t stash_host_bytes() const override;   // summed over the devices
  const HostRegionPinner& pinner() const { return *pinner_; }
  // Layer fetches that acquired from the EPS (one per layer use, shared by the devices)
  // and gradient pushes handed to it (one per layer and step).
  int64_t eps_acquires() const;
  int64_t eps_pushes() const;

  class Shared;  // acquisitions and gradient assembly shared by the rank clients

 private:
  DeviceGroup() = default;

  EpsClient* client_ = nullptr;
  std::vector<kernels::Backend*> backends_;
  std::vector<int64_t> counts_, starts_;  // per rank: micro-batches and the first one
  Status aborted_;  // set when a device failed on its own mid-step: later steps fail with it
  std::unique_ptr<HostRegionPinner> pinner_;
  std::unique_ptr<Shared> shared_;
  std::vector<std::unique_ptr<EpsClient>> rank_clients_;
  std::vector<std::unique_ptr<kernels::DeviceCollective>> gather_, scatter_;
  // Declared last: destroyed first (their threads use everything above).
  std::vector<std::unique_ptr<Relay>> relays_;
};

// The StepRunner for `backends`: a Relay on backends[0] when there is one, a DeviceGroup
// over all of them when there are several (its requirements above). REQUIRES: at least
// one backend.
Result<std::unique_ptr<StepRunner>> CreateStepRunner(EpsClient* client, std::vector<kernels::Backend*> backends,
                                                     const JobConfig& job, const RelayOptions& options);

}  // namespace l2l::worker
