// CtlClient: a small C++ client of the daemon's Control service
// (proto/control.proto, l2l.control.v1.Control), used by l2lctl and by tests. Protobuf
// types stop in ctl_client.cc; callers get the plain structs below.
//
// Every call has a deadline (CtlClientOptions::rpc_timeout, longer for checkpoint and
// export, which write files). An unreachable daemon fails Connect within
// connect_timeout with UNAVAILABLE naming the address (also what a plaintext client of
// a TLS daemon, or a client whose CA does not verify it, sees). A daemon that wants a
// token and got none or a wrong one: PERMISSION_DENIED saying to pass --token-file.
//
// Ownership: owns its channel and stub. Thread-safety: calls may run concurrently
// (gRPC stubs are thread-safe).
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/shard_plan.h"
#include "common/status.h"

namespace l2l::eps {

struct CtlClientOptions {
  std::chrono::milliseconds connect_timeout{3000};  // Connect() gives up after this
  std::chrono::milliseconds rpc_timeout{10000};     // status, pause, resume, stop
  std::chrono::milliseconds write_timeout{600000};  // checkpoint, export (files)
  // Security (docs/operations.md "Security"): sent as "authorization: Bearer <token>" on
  // every call when not empty (common/auth_token.h ReadTokenFile reads it).
  std::string token;
  // PEM CA certificate(s): when not empty the channel uses TLS and verifies the daemon's
  // certificate against them (its name must match the address's host, or
  // tls_server_name when that is set: proto/client_channel.h).
  std::string tls_ca_pem;
  std::string tls_server_name;
  // This client's PEM certificate chain and private key, for a daemon that requires
  // client certificates (l2l-eps --tls-client-ca; mutual TLS). "" = none. Need tls_ca_pem.
  std::string tls_cert_pem;
  std::string tls_key_pem;
};

struct CtlMemoryTier {
  std::string tier;           // ram | shm | ssd
  int64_t used_bytes = 0;
  int64_t budget_bytes = 0;   // 0 = unlimited / not configured
};

struct CtlWorker {
  int32_t id = -1;
  std::string name, transport, state;  // state: active | lost | left
  int64_t step = 0;
  int64_t last_heartbeat_ms_ago = 0;
  double last_loss = 0;
};

struct CtlStatus {
  std::string state;          // starting | idle | waiting_workers | running | paused | stopping | finished
  std::string job_id;
  int64_t step = 0, total_steps = 0, num_params = 0;
  std::vector<int64_t> layer_version;  // per layer, model order
  double last_loss = 0, tokens_per_s = 0, step_time_s = 0;
  double val_loss = 0;   // last in-job validation loss (job eval:)
  int64_t val_step = 0;  // its step; 0 = none yet
  double update_busy_s = 0, update_exposed_s = 0;
  std::vector<CtlMemoryTier> memory;
  std::vector<CtlWorker> workers;
  std::string last_checkpoint;
  std::string error;                   // state failed: what failed
  // SSD tier (has_spill false when nothing is spilled); see proto SpillStatus.
  bool has_spill = false;
  int64_t spill_bytes_read = 0, spill_bytes_written = 0, lease_hits = 0, lease_misses = 0;
  double lease_wait_s = 0;
  int64_t staleness_bound = 0, max_version_lag = 0;  // lock-free mode
  int64_t skipped_steps = 0, consecutive_skips = 0;  // non-finite gradient or loss
  std::string last_skip_reason, pause_reason;
  // Sharded jobs: this daemon is shard `shard` of `shards` (1: not sharded) from model
  // layer first_layer; shard 0 lists every shard.
  int32_t shard = 0, shards = 1;
  int64_t first_layer = 0;
  std::vector<ShardEndpoint> shard_map;
};

struct CtlHealth {
  std::string state;
  int64_t uptime_ms = 0;
};

struct CtlWritten {
  std::string path;           // checkpoint directory or export file
  int64_t step = 0;           // checkpoints only
  int64_t bytes = 0;
};

class CtlClient {
 public:
  // Connects to host:port and waits (up to connect_timeout) until the channel is ready.
  static Result<std::unique_ptr<CtlClient>> Connect(const std::string& address,
                                                    const CtlClientOptions& options = {});
  ~CtlClient();

  const std::string& address() const { return address_; }

  Result<CtlHealth> Health();
  Result<CtlStatus> GetStatus();
  Status Pause();
  Status Resume();
  Result<CtlWritten> Checkpoint(const std::string& dir);  // "" = the daemon's default
  Result<CtlWritten> Export(const std::string& path);
  // format: "safetensors" | "hf" | "gguf" | "peft" | "gguf-lora"; dtype "" = f32
  // (ExportRequest in control.proto). max_shard_bytes: hf only, the largest safetensors
  // shard (0 = the daemon's default, 5 GB). merge: a LoRA job's merged model.
  Result<CtlWritten> Export(const std::string& path, const std::string& format, const std::string& dtype,
                            int64_t max_shard_bytes = 0, bool merge = false);
  Status Shutdown(bool abort_step, bool skip_checkpoint);

 private:
  struct Impl;
  CtlClient(std::string address, CtlClientOptions options, std::unique_ptr<Impl> impl);
  const std::string address_;
  const CtlClientOptions opts_;
  std::unique_ptr<Impl> impl_;
};

}  // namespace l2l::eps
