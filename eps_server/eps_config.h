// EpsConfig: the daemon's own settings (not the job's): where it listens, its state
// directory, memory budget, workers to wait for, transport policy. Loaded from YAML
// (configs/eps.yaml) through common/yaml_util.h, as the job config is, so errors name
// file:line and the key path; unknown keys are errors; l2l-eps's CLI flags
// override fields after loading (in main only).
//
// Thread-safety: a value.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "common/dtype.h"
#include "common/modes.h"
#include "common/path_policy.h"
#include "common/status.h"

namespace l2l::eps {

struct EpsConfig {
  std::string listen = "127.0.0.1:0";   // host:port; port 0 picks a free port
  bool allow_remote = false;            // deprecated, no effect (was: needed for non-loopback);
                                        // see the security fields below
  std::string state_dir = "/tmp/l2l-eps";  // eps.port is written here
  std::string job_id = "default";       // names shm segments /l2l-<job_id>-*
  int64_t host_bytes = 0;               // memory.host_bytes: budget, 0 = unlimited
  int64_t guard_bytes = 0;              // memory.guard_bytes: the non-finite guard's undo
                                        // copies, taken out of host_bytes; 0 = unbounded
                                        // (12 B/param beside host_bytes); >= 4 B/param
  int64_t page_bytes = 4 << 20;         // memory.page_bytes: state page size
  std::optional<DType> publish_dtype;   // none = the job's; f32 | bf16 overrides
  int32_t expected_workers = 1;         // workers every update waits for
  int64_t heartbeat_timeout_ms = 10000; // a silent worker counts as lost after this
  int64_t update_deadline_ms = 30000;   // a layer update handed to a worker's device and not
                                        // answered this long is run by the daemon instead
  OnWorkerLoss on_worker_loss = OnWorkerLoss::kPause;  // pause | continue
  Transport transport = Transport::kAuto;  // auto (shm for same-host workers) | grpc
  std::string checkpoint_dir;           // "" = <state_dir>/checkpoints
  int64_t checkpoint_every = 0;         // steps; 0 = the job's training.checkpoint_every
                                        // (0 there too: only on request and at exit)
  // Export/Checkpoint rpc paths may be absolute paths outside state_dir.
  bool allow_absolute_paths = false;
  // paths.models, paths.data, paths.presets: the directories a job may name files in
  // (common/path_policy.h). The state dir is always allowed, and for a job from a local
  // file (--job) that file's directory; nothing else unless listed here. Relative entries
  // in a config file are resolved against its directory; l2l-eps --allow-models DIR,
  // --allow-data DIR, --allow-presets DIR add entries.
  PathRoots paths;

  // Security (both gRPC services). Binding beyond loopback needs client authentication:
  // a shared token, or mutual TLS (cert + key + client_ca); TLS alone authenticates no
  // client and is refused there. Without either the daemon refuses to start unless
  // `insecure` is set (eps_server/server_security.h).
  std::string tls_cert;                 // tls.cert: PEM server certificate chain file
  std::string tls_key;                  // tls.key: PEM private key file (mode 0600)
  std::string tls_client_ca;            // tls.client_ca: PEM CA(s); clients must present a
                                        // certificate signed by one (mutual TLS; needs tls.cert)
  std::string auth_token_file;          // auth.token_file: file holding the shared token;
                                        // clients send it as "authorization: Bearer <t>"
  bool insecure = false;                // permit non-loopback binding without client auth

  // SSD tier (spill.*): pages of master/m/v beyond memory.host_bytes live in files in
  // spill.dir (eps_server/spill_tier.h). Empty dir = no spilling (the daemon refuses to
  // start when the state does not fit memory.host_bytes).
  std::string spill_dir;                // spill.dir
  int64_t spill_queue_depth = 32;       // spill.queue_depth: io_uring requests in flight
  int64_t spill_block_bytes = 1 << 20;  // spill.block_bytes: bytes per request (mult. of 4096)
  int64_t spill_prefetch_layers = 2;    // spill.prefetch_layers: layers read ahead in update order
  int64_t spill_pool_bytes = 0;         // spill.pool_bytes: staging buffer pool; 0 = auto
                                        // ((prefetch_layers + 1) x the largest spilled layer)
  bool spill_direct = true;             // spill.direct: O_DIRECT (falls back with a warning
                                        // where the filesystem refuses it, e.g. tmpfs)

  Status Validate() const;
};

// Loads YAML; a missing key keeps its default. Errors: "<path>:<line>: <message>".
Result<EpsConfig> LoadEpsConfig(const std::string& path);
Result<EpsConfig> ParseEpsConfig(const std::string& yaml_text, const std::string& origin);

}  // namespace l2l::eps
