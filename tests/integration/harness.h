// Integration harness: runs the real l2l binaries (build/bin/l2l-eps, l2l-worker) as
// child processes on loopback, the way operators run them, and cleans up after them
// even when a test fails or aborts:
//  * TempDir and Process from the shared test library (tests/testing/temp_dir.h,
//    process.h): a temp dir removed on destruction; a child that dies with the test.
//  * EpsDaemon: writes the job and daemon YAML into a TempDir, starts l2l-eps on
//    127.0.0.1:0 with a unique job id, reads the chosen port from <state_dir>/eps.port,
//    and talks to its Control service (status, export, shutdown). The destructor shuts
//    it down and removes any /dev/shm/l2l-<job_id>-* segment left behind.
//  * Log parsers for the worker's progress and summary lines (worker/worker_main.cc).
// Tests of other features (CUDA, SSD tier) use it with extra daemon/worker flags.
//
// Ownership: each object owns its process / directory. Thread-safety: one test thread.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "common/config.h"
#include "common/status.h"
#include "tests/testing/process.h"
#include "tests/testing/temp_dir.h"

namespace l2l::itest {

// Path of a built binary, e.g. BinaryPath("l2l-eps") -> <build>/bin/l2l-eps.
std::string BinaryPath(const std::string& name);

// The shared test library's temp dir and child process (tests/testing/).
using testing::Process;
using testing::TempDir;

struct DaemonOptions {
  int workers = 1;                      // expected_workers
  Transport transport = Transport::kAuto;  // auto (shm for local workers) | grpc
  OnWorkerLoss on_worker_loss = OnWorkerLoss::kPause;
  int64_t heartbeat_timeout_ms = 10000;
  std::vector<std::string> extra_args;  // appended to l2l-eps's command line
  std::string extra_yaml;               // appended to the daemon config file
  std::string job_id;                   // "" = a fresh one; the same id = the same state
                                        // dir and spill file (a restart)
  std::string resume;                   // --resume DIR instead of --job
  bool wait_ready = true;               // false: Start returns once spawned (the daemon
                                        // may refuse to start; use process().Wait)
};

// What the Control service reports (the subset the tests use).
struct DaemonStatus {
  std::string state;
  int64_t step = 0, total_steps = 0;
  std::vector<int64_t> layer_version;
  double last_loss = 0;
  struct Worker {
    int32_t id;
    std::string name, state;
    int64_t step;
  };
  std::vector<Worker> workers;
  std::string error;                    // state "failed": what failed
  // SSD tier (zeros without one) and lock-free staleness.
  int64_t ssd_bytes = 0, pool_bytes = 0, bytes_read = 0, bytes_written = 0;
  int64_t lease_hits = 0, lease_misses = 0;
  int64_t staleness_bound = 0, max_version_lag = 0;
};

class EpsDaemon {
 public:
  static Result<std::unique_ptr<EpsDaemon>> Start(const JobConfig& job, const DaemonOptions& options,
                                                  const TempDir& dir);
  ~EpsDaemon();

  const std::string& address() const { return address_; }  // "127.0.0.1:PORT"
  const std::string& job_id() const { return job_id_; }
  // The daemon's state dir (eps.port, checkpoints; Export paths must lie inside it).
  const std::string& state_dir() const { return state_dir_; }
  Process& process() { return *proc_; }

  Result<DaemonStatus> GetStatus();
  // Writes the fp32 master weights as safetensors at `path` (Export rpc).
  Status Export(const std::string& path);
  // Checkpoint rpc ("" = the default root, updating `latest`); returns the directory.
  Result<std::string> Checkpoint(const std::string& dir = "");
  // Shutdown rpc (no checkpoint), then waits for the process to exit 0.
  Status Shutdown();
  // Names of /dev/shm entries that belong to this daemon's job.
  std::vector<std::string> ShmSegments() const;

 private:
  struct Stub;
  EpsDaemon();
  std::unique_ptr<Process> proc_;
  std::unique_ptr<Stub> stub_;
  std::string address_, job_id_, state_dir_;
};

// l2l-worker --eps ADDRESS --threads 1 --name NAME <extra...>, logging to log_path.
Result<std::unique_ptr<Process>> StartWorker(const std::string& address, const std::string& name,
                                             const std::string& log_path,
                                             const std::vector<std::string>& extra = {});

// Parsed from a worker's log.
struct WorkerProgress {
  int64_t step = 0;  // 1-based steps completed
  double loss = 0;
  int64_t lag = 0;
};
std::vector<WorkerProgress> ParseProgress(const std::string& log);
// The "l2l-worker: done k=v ..." line as a map; empty when absent.
std::map<std::string, int64_t> ParseSummary(const std::string& log);

// GET http://127.0.0.1:PORT/PATH (Connection: close): the whole response, status line and
// headers included. An error names the step that failed (socket, connect, write).
Result<std::string> HttpGet(int port, const std::string& path);

// Writes `tokens` as an llm.c tokens file.
Status WriteTokens(const std::string& path, const std::vector<int32_t>& tokens);

// The small job the ops tests run through real processes: GPT-2 family, V=64 T=8 C=16,
// 2 blocks of 2 heads, F=32, 2 micro-batches of 2, 5 steps, on 4096 tokens of a
// learnable sequence written to dir/train.bin. An error names the file.
Result<JobConfig> SmallOpsJob(const TempDir& dir);

}  // namespace l2l::itest
