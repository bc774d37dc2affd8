// EpsClient: everything a worker needs from the eager param-server, independent of the
// transport. Two implementations (owned by the EPS protocol code): shared memory for a
// worker on the EPS's host (weights read straight out of the EPS's published segment,
// gradients written into this worker's own segment, futex wake-ups), and chunked gRPC
// streams for a worker on another host. Registration, heartbeats and control always go
// over gRPC. The relay (worker/relay.h) speaks only this interface. Two optional extras
// serve a GPU worker (the shm transport has them): the shared regions to page-lock
// (HostRegionObserver) and zero-copy gradient slots (ClaimGradientSlot/Publish).
//
// Versions: a layer's version is the number of optimizer steps applied to it. Step t
// (0-based) in synchronous mode uses every layer at exactly version t; the EPS publishes
// version t+1 of a layer once every registered worker pushed its step-t gradient for it.
//
// Ownership: a LayerWeights view points into transport-owned memory and stays valid and
// unchanged until ReleaseLayer(layer). At most kMaxAcquired layers are held at once.
// Thread-safety: AcquireLayer/ReleaseLayer/PushGradient/StepDone may be called from
// different threads (the relay prefetches and pushes in the background), but each layer
// is acquired by one thread at a time.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/adamw.h"
#include "common/config.h"
#include "common/shard_plan.h"
#include "common/status.h"

namespace l2l::worker {

inline constexpr int kMaxAcquired = 4;

struct WorkerRegistration {
  int32_t worker_id = -1;       // assigned by the EPS, 0-based, stable for the job
  int32_t num_workers = 1;      // workers the EPS waits for before each update
  JobConfig job;                // the job's full configuration
  int64_t start_step = 0;       // first step this worker runs (resume)
  int32_t data_rank = 0;        // this worker's data shard: rank of world
  int32_t data_world = 1;
  std::string data_position;    // opaque data-loader position to resume from ("" = start)
  Transport transport = Transport::kGrpc;  // kShm or kGrpc: how layers and gradients travel
  uint64_t registration_id = 0;  // the EPS's nonce for this registration (Deregister sends it)
  // The directories the job's data files may lie in (RegisterReply.data_roots): the
  // worker refuses data paths outside them before opening any (common/path_policy.h).
  std::vector<std::string> data_roots;
  // Sharded jobs (RegisterReply.shards; worker/eps_client_sharded.h): every l2l-eps
  // shard (from shard 0's reply; empty otherwise), and the first model layer of the
  // daemon this registration is with (its layers are local 0..).
  std::vector<ShardEndpoint> shards;
  int64_t first_layer = 0;
  int64_t recovery_epoch = 0;  // sharded jobs: the shard's recovery epoch (RegisterReply)
};

struct LayerWeights {
  const void* data = nullptr;   // numel elements of dtype: the layer's flat buffer, or
                                // (frozen != nullptr) its trainable span only
  DType dtype = DType::kF32;
  size_t numel = 0;
  int64_t version = -1;
  // A LoRA layer's frozen base (common/lora_frozen.h): its frozen record, frozen_bytes
  // long, encoded as the job's PlanFrozenBase says; null for every other layer.
  const void* frozen = nullptr;
  size_t frozen_bytes = 0;
};

struct StepReport {
  int64_t step = 0;
  double loss = 0;              // mean over this worker's micro-batches
  int64_t tokens = 0;           // tokens this worker processed in the step
  std::string data_position;    // loader position after the step (saved in checkpoints)
  // Seconds spent, for the per-step time breakdown.
  double forward_s = 0, backward_s = 0, recompute_s = 0, wait_layer_s = 0, wait_push_s = 0;
  // The step's timeline (proto/data.proto StepDoneRequest): compute (upload + forward +
  // head + recompute + backward), the first layer's wait, the relay step's wall time, and
  // the time between the previous relay step's end and this one's start.
  double compute_s = 0, wait_first_layer_s = 0, step_s = 0, between_s = 0;
  // In-job validation on this step (job `eval:`): mean loss over the eval targets this
  // worker scored, and their count (0: none this step).
  double eval_loss = 0;
  int64_t eval_tokens = 0;
};

// Host memory a transport shares with the EPS (the shm client's segments). A GPU worker
// page-locks it (kernels::Backend::PinHostRange) so copies run by DMA straight out of
// the weight segment and into the gradient segment, with no staging copy.
struct HostRegion {
  void* data = nullptr;
  size_t bytes = 0;
  bool read_only = false;  // mapped PROT_READ (the weight segment)
  std::string name;        // the segment's name, for messages
};

// Told when a transport maps or is about to unmap a shared region (at SetHostRegionObserver
// for those mapped already, and around Rejoin, which maps new segments). Called from the
// thread that calls SetHostRegionObserver / Rejoin / the client's destructor.
class HostRegionObserver {
 public:
  virtual ~HostRegionObserver() = default;
  virtual void Mapped(const HostRegion& region) = 0;     // right after mapping
  virtual void Unmapping(const HostRegion& region) = 0;  // right before unmapping
};

// A gradient slot claimed for a zero-copy push: `data` is host memory the EPS reads
// (capacity bytes), filled by the caller (e.g. a device-to-host DMA) before
// PublishGradientSlot.
struct GradientSlot {
  void* data = nullptr;
  size_t capacity = 0;
  int32_t index = -1;
};

// The worker's offer to run layer updates on its device (the interleaved optimizer,
// proto/data.proto OptimizerDevice), with the rates it measured at start.
struct OptimizerOffer {
  bool takes_updates = false;
  std::string device;              // the backend's name
  double update_params_per_s = 0;  // its AdamW rate
  double h2d_bytes_per_s = 0, d2h_bytes_per_s = 0;  // 0 = no link (CPU backend)
};

// One layer update the EPS handed to this worker (proto/data.proto TakeUpdateReply):
// p, m, v (updated in place) and the summed gradient lie at the given byte offsets in
// the shm segment `segment`, numel fp32 each.
struct UpdateAssignment {
  bool has_task = false;  // false: the wait ran out
  uint64_t task_id = 0;
  int64_t layer = 0, step = 0, numel = 0;
  std::string segment;
  uint64_t p_offset = 0, m_offset = 0, v_offset = 0, g_offset = 0;
  AdamWStepArgs adamw;  // weight_decay applies to the ranges with decay (WithDecay)
  struct Range {
    int64_t begin = 0, end = 0;
    bool decay = false;
  };
  std::vector<Range> ranges;
};

struct ClientOptions {
  Transport transport = Transport::kAuto;  // auto (shm when the EPS is on this host) | shm | grpc
  std::chrono::milliseconds connect_timeout{10000};  // bounded retry when the EPS is unreachable
  std::chrono::milliseconds heartbeat_interval{500};
  // gRPC PushGradient's deadline: push_deadline_floor + the bytes pushed at
  // push_min_bytes_per_s (PushGradientDeadline). A daemon that stops reading a gradient
  // stream while its connection stays up (hung, yet answering keepalive pings) then fails
  // the push with DEADLINE_EXCEEDED instead of hanging the worker. The defaults are
  // generous: 60 s + 1 s per 8 MiB, far below any link a worker trains over.
  std::chrono::milliseconds push_deadline_floor{60000};
  double push_min_bytes_per_s = 8.0 * 1024 * 1024;
  std::string worker_name;          // for status displays; default hostname:pid
  // Security (docs/operations.md "Security"): the EPS's shared token, sent as
  // "authorization: Bearer <token>" on every call ("" = none), and PEM CA certificate(s)
  // to verify a TLS EPS ("" = plaintext); tls_server_name: the name the EPS's certificate
  // must hold when it is not the address's host ("" = that host; proto/client_channel.h).
  std::string token;
  std::string tls_ca_pem;
  std::string tls_server_name;
  // This worker's PEM certificate chain and private key, presented to an EPS that requires
  // client certificates (l2l-eps --tls-client-ca; mutual TLS). "" = none; need tls_ca_pem.
  std::string tls_cert_pem;
  std::string tls_key_pem;
  // Sent at Register: this worker's device takes layer updates (worker/device_updater.h).
  OptimizerOffer optimizer;
  // Sharded jobs: the id shard 0 gave this worker, sent to the other shards (-1: none).
  int32_t shard_worker_id = -1;
  // Sharded jobs: how long a rejoin waits for a shard that is down (restarted, it rejoins
  // shard 0 and every shard rolls back) or for every shard to roll back, before the
  // worker gives up (non-zero exit). It logs what it waits for every 10 s.
  std::chrono::milliseconds shard_wait{600000};
};

class EpsClient {
 public:
  virtual ~EpsClient() = default;
  virtual const WorkerRegistration& registration() const = 0;

  // Blocks until `layer` has a published version >= min_version (and, in synchronous
  // mode, the caller passes the step number so this is exactly that version), then
  // returns a view of it. Fails with DEADLINE_EXCEEDED after `timeout`, or ABORTED when
  // the job is stopped.
  virtual Result<LayerWeights> AcquireLayer(int64_t layer, int64_t min_version,
                                            std::chrono::milliseconds timeout) = 0;
  virtual void ReleaseLayer(int64_t layer) = 0;

  // Sends this worker's gradient of `layer` for `step`: the SUM over its micro_batches of
  // each micro-batch's mean-loss gradient (fp32, numel = the layer's parameter count).
  // The EPS sums over workers and divides by the total micro-batch count. Returns once
  // the bytes are handed over (grad may be reused).
  virtual Status PushGradient(int64_t layer, int64_t step, int64_t micro_batches,
                              const float* grad, size_t numel) = 0;

  virtual Status StepDone(const StepReport& report) = 0;

  // Mixture-of-experts jobs: the experts (n_layer x num_experts, block-major, 1 = got a
  // token) this worker's forward of `step` routed tokens to. The relay calls it after the
  // forward and before it pushes any block gradient of the step; the EPS updates only the
  // experts some worker reported (proto/data.proto ReportExperts). Returns once the EPS
  // holds it. Default: UNIMPLEMENTED (a transport without it cannot train such a model).
  virtual Status ReportExperts(int64_t step, const std::vector<uint8_t>& touched) {
    return Unimplemented("this EPS transport cannot report the experts a step used (mixture-of-experts jobs)");
  }

  // ---- shared host memory (optional; the shm transport has it) -------------------------
  // Sets the observer (nullptr: none) and calls observer->Mapped for every region mapped
  // now. The caller keeps the observer alive until it sets another one; setting nullptr
  // does not call Unmapping (the observer lets go of what it holds by itself).
  virtual void SetHostRegionObserver(HostRegionObserver* observer) {}

  // Zero-copy gradient push: ClaimGradientSlot blocks until a slot for `numel` floats of
  // `layer` is free and returns it; the caller fills slot.data and then either publishes
  // it (the same meaning as PushGradient with those bytes) or abandons it (the slot is
  // freed unread). Every claimed slot must be published or abandoned. Transports without
  // slots return UNIMPLEMENTED (HasGradientSlots() false): use PushGradient.
  virtual bool HasGradientSlots() const { return false; }
  virtual Result<GradientSlot> ClaimGradientSlot(int64_t layer, size_t numel) {
    return Unimplemented("this EPS transport has no gradient slots; use PushGradient");
  }
  virtual Status PublishGradientSlot(const GradientSlot& slot, int64_t layer, int64_t step,
                                     int64_t micro_batches, size_t numel) {
    return Unimplemented("this EPS transport has no gradient slots; use PushGradient");
  }
  virtual void AbandonGradientSlot(const GradientSlot& slot) {}

  // Worker loss and rollback (see eps_server/eps_core.h): when the EPS abandons this
  // worker's step (a rollback after another worker was lost) or declared this worker
  // lost, data calls fail with FAILED_PRECONDITION that NeedsRejoin() recognises and
  // rejoin_requested() turns true. The worker then releases every layer, calls
  // Rejoin(), and restarts at registration().start_step from
  // registration().data_position (both updated by Rejoin).
  virtual Status Rejoin() { return Unimplemented("this EPS client cannot rejoin"); }
  virtual bool rejoin_requested() const { return false; }

  // The job's end: after layer 0 showed the last step committed, leaves the job once the
  // EPS has that step on disk (waits up to `wait`; DEADLINE_EXCEEDED: not yet, ask
  // again). An error means the EPS may have lost the step: the worker must not report
  // success. Clients without an EPS behind them have nothing to wait for.
  virtual Status LeaveAfterLastStep(std::chrono::milliseconds wait) { return Status::Ok(); }

  // ---- interleaved optimizer (the gRPC clients have it) ----------------------------------
  // TakeUpdate long-polls for a layer update (up to `wait`); UpdateDone answers it
  // (error non-empty: this worker could not run it). See proto/data.proto.
  virtual Result<UpdateAssignment> TakeUpdate(std::chrono::milliseconds wait) {
    return Unimplemented("this EPS client cannot take updates");
  }
  virtual Status UpdateDone(uint64_t task_id, int64_t layer, int64_t numel, const std::string& error) {
    return Unimplemented("this EPS client cannot take updates");
  }
};

// True for the errors after which the worker must Rejoin() (see above).
bool NeedsRejoin(const Status& s);

// How long a gRPC PushGradient of `bytes` may take: options.push_deadline_floor plus
// bytes / options.push_min_bytes_per_s (a rate <= 0 adds nothing), in whole milliseconds.
std::chrono::milliseconds PushGradientDeadline(const ClientOptions& options, size_t bytes);

// Registers with the EPS at `address` ("127.0.0.1:PORT") and returns a connected client.
// Retries until options.connect_timeout, then fails with UNAVAILABLE naming the address.
// A sharded job's shard 0 names the other shards: the client registers with each of them
// too and routes every layer to its owner (worker/eps_client_sharded.h).
Result<std::unique_ptr<EpsClient>> ConnectEps(const std::string& address,
                                              const ClientOptions& options);

}  // namespace l2l::worker
