// DeviceUpdater: the worker's side of the interleaved optimizer. A background thread
// long-polls the EPS (EpsClient::TakeUpdate) for layer updates, runs each on this
// worker's device with kernels::Backend::AdamW (bitwise common/adamw.h AdamWStep: the
// daemon's result) and answers UpdateDone. p, m, v and the summed gradient lie in the
// worker's update-exchange segment (POSIX shm the EPS created; mapped here read-write):
// a CUDA device copies them in, updates and copies p, m, v back; the CPU backend updates
// them in place. Only the small control messages travel over gRPC.
//
// At start the updater measures its device's AdamW rate and host<->device bandwidth
// (MeasureDeviceRates); the worker sends them at Register (ClientOptions::optimizer) so
// the daemon's performance model (optim.gpu_fraction: auto) plans with real rates.
//
// Test hook (integration fault tests only): L2L_TEST_UPDATE_FAULT="hang:N" makes the
// thread stop answering after N updates (it holds the N+1-th forever: an unresponsive
// device), "bad-done:N" answers the N+1-th with a wrong numel.
//
// Ownership: owns its backend (a second instance on the relay's device, with its own
// stream, so updates never serialise behind the relay's kernels), its device buffers,
// the mapped segment and the thread. The EpsClient must outlive Stop().
// Thread-safety: Start/Stop from one thread; Run is used by the thread (or a test).
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>

#include "common/shm.h"
#include "common/status.h"
#include "kernels/backend.h"
#include "worker/eps_client.h"

namespace l2l::worker {

// AdamW parameters/s on `be` over n parameters (one untimed pass first), and the
// host->device / device->host copy rates of 12n bytes (0 for the CPU backend: no link).
Result<OptimizerOffer> MeasureDeviceRates(kernels::Backend* be, size_t n = size_t{1} << 18);

class DeviceUpdater {
 public:
  explicit DeviceUpdater(std::unique_ptr<kernels::Backend> backend);
  ~DeviceUpdater();  // Stop()

  kernels::Backend* backend() { return backend_.get(); }
  // Starts the TakeUpdate thread on `client`.
  void Start(EpsClient* client);
  void Stop();
  int64_t updates_done() const { return done_.load(); }

  // Runs one assignment on the mapped segment [base, base+bytes): checks the offsets and
  // ranges against it (INVALID_ARGUMENT naming the field), then updates p, m, v there.
  Status Run(const UpdateAssignment& a, char* base, size_t bytes);

 private:
  void Loop(EpsClient* client);
  Status RunOnSegment(const UpdateAssignment& a);

  std::unique_ptr<kernels::Backend> backend_;
  ShmSegment seg_;  // the exchange segment last named by the EPS
  float* dev_ = nullptr;  // device buffers: p, m, v, g (dev_numel_ each)
  size_t dev_numel_ = 0;
  std::atomic<bool> stop_{false};
  std::atomic<int64_t> done_{0};
  std::thread thread_;
  // L2L_TEST_UPDATE_FAULT
  enum class Fault { kNone, kHang, kBadDone } fault_ = Fault::kNone;
  int64_t fault_after_ = 0;
};

}  // namespace l2l::worker
