// ParamStore: the EPS's model state. Per layer: fp32 master weights and AdamW moments
// m and v, each split into fixed-size pages from a PageAllocator (so any page can
// move between RAM and SSD), and a published copy (bf16 or fp32) that workers read, double-buffered with a
// version number per slot.
//
// The published copies live in a weight segment laid out as common/shm.h describes:
// a POSIX shared-memory segment when a shm name is given (same-host workers map it
// read-only), otherwise anonymous memory with the same layout.
//
// Publishing protocol (no torn reads):
//   writer (Publish*): takes the slot that is not `current`; bumps its seq to odd
//     (seq_cst); waits until no reader pins that slot (in-process readers: a count per
//     slot; workers: their pins array in their gradient segment); writes the bytes;
//     stores the version; bumps seq to even (release); makes it `current`; bumps
//     wake_seq and futex-wakes waiters.
//   reader (ReadPin / the shm client): reads current slot s and its seq (even); pins
//     (s, version) (seq_cst); re-reads seq: unchanged -> the slot is stable until unpin;
//     changed -> unpin and retry. With seq_cst on both sides at least one of them sees
//     the other (Dekker), so the writer never writes a slot a reader uses.
// In synchronous mode readers hold version t while the writer fills t+1 into the other
// slot, so nobody ever waits; a reader that still holds version t when t+2 is due
// delays only that layer's publish.
//
// A LoRA job (ParamStoreOptions::lora, common/lora.h): the state is each layer's
// TRAINABLE VECTOR only (adapters, modules_to_save; layout(l) is its TrainableLayout), so
// masters, moments, gradients, checkpoints and the update pipeline see nothing else; the
// frozen base lives once, encoded in base_dtype (common/lora_frozen.h), in a frozen
// record per layer in the weight segment, written by WriteInitialLayer before the first
// publish and never changed. Published slots hold the trainable span; readers get the
// record beside it (ReadPin::frozen_data). Host bytes per frozen parameter: 4 (fp32),
// 2 (bf16), 0.5625 (q4) or 1.0625 (q8) for block linears, 2 for the rest.
//
// Ownership: the store owns its pages and the weight segment (unlinked on destruction).
// Thread-safety: different layers may be updated concurrently from different threads;
// one writer per layer at a time (the update pipeline guarantees it); readers on any
// thread. Master/moment accessors (spans, Read/Write*) need the caller to exclude the
// layer's writer (the pipeline owns a layer while it updates it).
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "common/dtype.h"
#include "common/lora.h"
#include "common/lora_frozen.h"
#include "common/model_spec.h"
#include "common/shard_plan.h"
#include "common/shm.h"
#include "common/status.h"
#include "common/thread_annotations.h"
#include "eps_server/page_allocator.h"
#include "eps_server/spill_tier.h"
#include "eps_server/state_span.h"

namespace l2l::eps {

struct ParamStoreOptions {
  size_t page_bytes = kDefaultPageBytes;  // multiple of 4096
  size_t host_bytes = 0;                  // budget for pages + published copies; 0 = unlimited
  DType publish_dtype = DType::kBF16;     // kF32 or kBF16
  std::string shm_name;                   // weight segment name ("/l2l-<job>-w"); "" = private
  // SSD tier: with spill.dir set, state pages that do not fit host_bytes live on SSD
  // (eps_server/spill_tier.h) instead of Create refusing.
  SpillOptions spill;
  // A LoRA job: the state is the adapters (and modules_to_save); the base is frozen
  // (see the file comment). Not enabled: every parameter trains.
  LoraConfig lora;
  // A shard of a sharded job (common/shard_plan.h): the store holds layers
  // [layers.first, layers.end()) of the model only, as its LOCAL layers 0..count-1
  // (layout(0) is the model's layer `first`). count < 0: the whole model. Everything
  // indexed by layer in this class is local; model_layer() maps back (seeded init,
  // model files and checkpoint files are indexed by model layer).
  LayerRange layers{0, -1};
};

// How a lease will use the layer's state.
enum class LeaseMode {
  kRead,       // read only (checkpoint, export): nothing is written back
  kUpdate,     // read and modify (AdamW): spilled pages are written back when it ends
  kOverwrite,  // every element will be written (init, resume): no reads, written back
};


class ParamStore {
 public:
  // Host bytes the store needs for `spec` (pages for master/m/v plus both published
  // slots and the segment header), so callers can refuse to start with the numbers.
  static size_t RequiredHostBytes(const ModelSpec& spec, const ParamStoreOptions& opts);

  // Allocates the state (zeros; call InitFromSeed or WriteMasterZeroMoments next) and the weight
  // segment. RESOURCE_EXHAUSTED when RequiredHostBytes exceeds opts.host_bytes.
  static Result<std::unique_ptr<ParamStore>> Create(const ModelSpec& spec,
                                                    const ParamStoreOptions& opts);
  ~ParamStore();

  const ModelSpec& spec() const { return spec_; }
  // Layers this store holds (a shard's: its range; see ParamStoreOptions::layers).
  int64_t num_layers() const { return static_cast<int64_t>(layouts_.size()); }
  // The model's layer of local layer `layer`, and the model's layer count.
  int64_t model_layer(int64_t layer) const { return first_layer_ + layer; }
  int64_t first_layer() const { return first_layer_; }
  int64_t model_num_layers() const { return model_num_layers_; }
  // The layout of what the store keeps state for: the whole layer, or a LoRA job's
  // trainable vector (TrainableLayout of full_layout).
  const LayerLayout& layout(int64_t layer) const { return layouts_[layer]; }
  // The layer as workers compute with it (BuildLoraLayout; == layout without LoRA).
  const LayerLayout& full_layout(int64_t layer) const { return full_layouts_[layer]; }
  const FrozenPlan& frozen_plan(int64_t layer) const { return frozen_plans_[layer]; }
  bool lora() const { return opts_.lora.enabled; }
  // Floats of BuildLayout(spec)[layer], what a model file or seed gives for the layer.
  size_t base_numel(int64_t layer) const { return base_numel_[layer]; }
  size_t max_layer_numel() const;
  DType publish_dtype() const { return opts_.publish_dtype; }
  const std::string& shm_name() const { return opts_.shm_name; }
  size_t weight_segment_bytes() const { return weights_size_; }
  size_t state_bytes() const;  // state pages in RAM (pages in use * page size)
  size_t ssd_bytes() const;    // state pages on SSD (0 without a tier)

  // Page geometry of a layer's state (in element order). The master/m/v pointers are
  // null for arrays that live on SSD: use Lease() to touch the values.
  const std::vector<StateSpan>& spans(int64_t layer) const { return spans_[layer]; }

  // Access to a layer's state values. While held, spans() has every array valid (RAM
  // pages, or staging buffers of the SSD tier). Ending a kUpdate/kOverwrite lease writes
  // spilled pages back behind. One lease per layer at a time (a second one waits). For
  // layers wholly in RAM a lease costs nothing. Errors: spill I/O faults (the message
  // names the file, the operation and the offset); the caller must not use the state.
  class StateLease {
   public:
    StateLease() = default;
    StateLease(StateLease&& o) noexcept { *this = std::move(o); }
    StateLease& operator=(StateLease&& o) noexcept;
    ~StateLease() { Release(); }
    const std::vector<StateSpan>& spans() const { return spans_; }
    void Release();

   private:
    friend class ParamStore;
    SpillTier* tier_ = nullptr;  // null: RAM-only layer (nothing to give back)
    int64_t layer_ = -1;
    bool dirty_ = false;
    std::vector<StateSpan> spans_;
  };
  Result<StateLease> Lease(int64_t layer, LeaseMode mode) const;

  // Copies between the state and contiguous (numel) buffers, through leases. which:
  // 0 master, 1 m, 2 v.
  Status ReadState(int64_t layer, int which, float* out) const;
  Status WriteState(int64_t layer, int which, const float* in);
  // Writes all three arrays of a layer at once (one lease): a state with its moments; a
  // null m or v writes zeros.
  Status WriteLayer(int64_t layer, const float* master, const float* m, const float* v);
  // A fresh optimizer state for a layer: its master from `master` (numel floats), AdamW m
  // and v zero. Every initial state but a checkpoint's is written this way
  // (eps_server/job_start.h, InitFromSeed).
  Status WriteMasterZeroMoments(int64_t layer, const float* master);
  // A fresh start of a layer from the base model's values (base_numel floats, as
  // BuildLayout lays the layer out). Without LoRA: WriteMasterZeroMoments. A LoRA job:
  // the adapters are initialised (InitLoraAdapters), the frozen tensors encoded into the
  // layer's frozen record -- the first time only: the base never changes for the store's
  // life, a rollback's reload keeps the record (and its hash) -- and the trainable
  // vector written with zero moments.
  Status WriteInitialLayer(int64_t layer, const float* base);
  // The whole layer as workers compute with it (full_layout numel floats): the frozen
  // record decoded, the master in its trainable span. For export; needs the caller to
  // exclude the layer's writer, as ReadState.
  Status ReadFullLayer(int64_t layer, float* out) const;
  // A LoRA job's frozen base identity: FNV-1a 64 over every layer's record bytes (the
  // encoded base, so a changed base file or base_dtype changes it), as 16 hex digits;
  // "" without LoRA. REQUIRES: every layer's record written.
  std::string BaseHash() const;
  // Fills every layer's master with InitLayerParams(seed), zero moments. Layers run in
  // parallel, each through a layer-sized buffer: as many as scratch_bytes holds (at
  // least one); the values do not depend on it.
  Status InitFromSeed(uint64_t seed, size_t scratch_bytes = 0);

  // The SSD tier, or null when nothing is spilled.
  SpillTier* tier() const { return tier_.get(); }
  // OK, or the SSD tier's first write fault (the state on SSD is then not trustworthy).
  Status health() const;

  // Publishes the layer's current master as `version` (casts into the free slot).
  // Errors: the SSD tier could not read the layer (nothing is published then).
  Status PublishMaster(int64_t layer, int64_t version);
  // Two-phase publish for the update pipeline, which writes the copy during AdamW:
  // BeginPublish returns the free slot's memory (numel elements of publish_dtype) after
  // waiting for readers to leave it; EndPublish makes it current as `version`.
  void* BeginPublish(int64_t layer);
  void EndPublish(int64_t layer, int64_t version);

  // Newest published version of `layer` (-1 before the first publish).
  int64_t published_version(int64_t layer) const;

  // In-process reader: pins the newest copy (waiting until its version >= min_version).
  class ReadPin {
   public:
    ReadPin() = default;
    ReadPin(ReadPin&& o) noexcept { *this = std::move(o); }
    ReadPin& operator=(ReadPin&& o) noexcept;
    ~ReadPin() { Release(); }
    const void* data() const { return data_; }
    int64_t version() const { return version_; }
    size_t bytes() const { return bytes_; }
    // The layer's frozen record (LoRA; never rewritten, needs no pin); null otherwise.
    const void* frozen_data() const { return frozen_; }
    size_t frozen_bytes() const { return frozen_bytes_; }
    void Release();

   private:
    friend class ParamStore;
    std::atomic<int32_t>* count_ = nullptr;
    std::atomic<uint32_t>* unpin_seq_ = nullptr;
    const void* data_ = nullptr;
    int64_t version_ = -1;
    size_t bytes_ = 0;
    const void* frozen_ = nullptr;
    size_t frozen_bytes_ = 0;
  };
  // DEADLINE_EXCEEDED after timeout; ABORTED once Stop() was called; NOT_FOUND for a
  // bad layer; FAILED_PRECONDITION when epoch >= 0 and the store's epoch differs (a
  // rollback happened: the caller's step was abandoned).
  Result<ReadPin> Acquire(int64_t layer, int64_t min_version, std::chrono::milliseconds timeout,
                          int64_t epoch = -1);

  // Rollback epoch (common/shm.h WeightSegmentHeader::epoch). BumpEpoch wakes waiters.
  uint32_t epoch() const;
  void BumpEpoch();

  // Worker pins (from a gradient segment, see common/shm.h GradPins): the writer honours
  // them until RemovePinSource. pin_seq is the futex word the worker bumps on unpin.
  void AddPinSource(int32_t worker_id, const std::atomic<int64_t>* pins,
                    const std::atomic<uint32_t>* pin_seq);
  void RemovePinSource(int32_t worker_id);

  // Marks the job stopped: readers waiting in Acquire (and shm clients) return ABORTED.
  // failed: the job failed instead (a fatal error; common/shm.h kStoppedFailed): they get
  // FAILED_PRECONDITION, so a worker does not take it for an operator's stop and exit 0.
  void Stop(bool failed = false);
  bool stopped() const;

  // The weight segment's base (layout in common/shm.h), for tests and the transport.
  void* weight_base() const { return weights_base_; }

 private:
  ParamStore(const ModelSpec& spec, const ParamStoreOptions& opts);
  Status Allocate();
  bool SlotPinned(int64_t layer, uint32_t slot) const;
  void* SlotData(int64_t layer, uint32_t slot) const;

  struct PinSource {
    int32_t worker_id;
    const std::atomic<int64_t>* pins;
    const std::atomic<uint32_t>* pin_seq;
  };

  const ModelSpec spec_;
  const ParamStoreOptions opts_;
  int64_t first_layer_ = 0;       // model layer of local layer 0
  int64_t model_num_layers_ = 0;  // layers of the whole model
  std::vector<LayerLayout> full_layouts_;  // BuildLoraLayout
  std::vector<LayerLayout> layouts_;       // the state's (TrainableLayout)
  std::vector<FrozenPlan> frozen_plans_;
  std::vector<size_t> base_numel_;
  std::vector<uint8_t> frozen_written_;    // per layer; each written by one thread
  PageAllocator pages_;
  std::vector<std::vector<StateSpan>> spans_;  // [layer][page]; null arrays: on SSD
  std::unique_ptr<SpillTier> tier_;            // null when nothing is spilled
  ShmSegment shm_;                             // when opts_.shm_name is set
  void* anon_ = nullptr;                       // otherwise: mmap'd private memory
  void* weights_base_ = nullptr;
  size_t weights_size_ = 0;
  // In-process reader counts, [layer*2 + slot].
  std::unique_ptr<std::atomic<int32_t>[]> readers_;
  std::atomic<uint32_t> unpin_seq_{0};         // futex word: bumped on every in-process unpin
  mutable std::mutex pin_mu_;
  std::vector<PinSource> pin_sources_ GUARDED_BY(pin_mu_);
};

}  // namespace l2l::eps
