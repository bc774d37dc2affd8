// ParamStore: paged fp32 state and the double-buffered published copies. See
// param_store.h for the publishing protocol. With spill.dir set and a state that does
// not fit memory.host_bytes, TierPlan::Make picks the pages that live on SSD: their
// spans_ arrays stay null and every access goes through Lease() to the SpillTier
// (eps_server/spill_tier.h); layers wholly in RAM never touch the tier.
#include "eps_server/param_store.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <utility>
#include <thread>

#include <oneapi/tbb/task_arena.h>

#include "common/logging.h"
#include "common/parallel_for.h"
#include "common/rng.h"

namespace l2l::eps {
namespace {

size_t SlotBytes(size_t numel, DType dt) { return RoundUpTo(std::max<size_t>(numel, 1) * DTypeSize(dt), kShmAlign); }

// layouts: the state's (trainable) layouts; plans: each layer's frozen record.
size_t WeightSegmentBytes(const std::vector<LayerLayout>& layouts, const std::vector<FrozenPlan>& plans, DType dt) {
  size_t bytes = WeightHeaderBytes(layouts.size());
  for (size_t l = 0; l < layouts.size(); ++l) {
    bytes += 2 * SlotBytes(layouts[l].numel, dt) + RoundUpTo(plans[l].bytes, kShmAlign);
  }
  return bytes;
}

// The store's three views of a job's layers (see param_store.h).
struct StoreLayouts {
  std::vector<LayerLayout> full, state;
  std::vector<FrozenPlan> plans;
  std::vector<size_t> base_numel;
};
// A shard's store keeps the layers of `range` only (count < 0: all).
StoreLayouts MakeStoreLayouts(const ModelSpec& spec, const LoraConfig& lora, LayerRange range) {
  StoreLayouts v;
  std::vector<LayerLayout> full = BuildLoraLayout(spec, lora);
  std::vector<LayerLayout> base = BuildLayout(spec);
  const int64_t L = static_cast<int64_t>(full.size());
  const int64_t first = std::clamp<int64_t>(range.first, 0, L);
  const int64_t end = range.count < 0 ? L : std::clamp<int64_t>(range.end(), first, L);
  for (int64_t l = first; l < end; ++l) {
    v.full.push_back(full[static_cast<size_t>(l)]);
    v.state.push_back(lora.enabled ? TrainableLayout(v.full.back()) : v.full.back());
    v.plans.push_back(PlanFrozenBase(v.full.back(), lora));
    v.base_numel.push_back(base[static_cast<size_t>(l)].numel);
  }
  return v;
}

size_t PagesFor(size_t numel, size_t page_floats) { return (numel + page_floats - 1) / page_floats; }

}  // namespace

size_t ParamStore::RequiredHostBytes(const ModelSpec& spec, const ParamStoreOptions& opts) {
  const StoreLayouts v = MakeStoreLayouts(spec, opts.lora, opts.layers);
  const size_t page_floats = opts.page_bytes / sizeof(float);
  size_t pages = 0;
  for (const auto& l : v.state) pages += 3 * PagesFor(l.numel, page_floats);
  return pages * opts.page_bytes + WeightSegmentBytes(v.state, v.plans, opts.publish_dtype);
}

ParamStore::ParamStore(const ModelSpec& spec, const ParamStoreOptions& opts)
    : spec_(spec), opts_(opts), pages_(opts.page_bytes, 0) {
  StoreLayouts v = MakeStoreLayouts(spec, opts.lora, opts.layers);
  first_layer_ = opts.layers.count < 0 ? 0 : opts.layers.first;
  model_num_layers_ = static_cast<int64_t>(BuildLayout(spec).size());
  full_layouts_ = std::move(v.full);
  layouts_ = std::move(v.state);
  frozen_plans_ = std::move(v.plans);
  base_numel_ = std::move(v.base_numel);
  frozen_written_.assign(layouts_.size(), 0);
}

Result<std::unique_ptr<ParamStore>> ParamStore::Create(const ModelSpec& spec,
                                                       const ParamStoreOptions& opts) {
  L2L_RETURN_IF_ERROR(spec.Validate());
  L2L_RETURN_IF_ERROR(ValidateLora(spec, opts.lora));
  if (opts.layers.count >= 0) {
    const int64_t L = static_cast<int64_t>(BuildLayout(spec).size());
    if (opts.layers.first < 0 || opts.layers.count < 1 || opts.layers.end() > L) {
      return InvalidArgument("shard layers " + std::to_string(opts.layers.first) + ".." +
                             std::to_string(opts.layers.end() - 1) + " are not within the model's " +
                             std::to_string(L) + " layers");
    }
    if (opts.lora.enabled) {
      return Unimplemented("a LoRA job cannot be sharded: its state is the adapters only (run one l2l-eps)");
    }
  }
  if (opts.page_bytes == 0 || opts.page_bytes % kShmAlign != 0) {
    return InvalidArgument("memory.page_bytes=" + std::to_string(opts.page_bytes) +
                           " must be a positive multiple of 4096");
  }
  if (opts.publish_dtype != DType::kF32 && opts.publish_dtype != DType::kBF16) {
    return InvalidArgument(std::string("publish dtype ") + DTypeName(opts.publish_dtype) +
                           " is not supported (f32 or bf16)");
  }
  const size_t need = RequiredHostBytes(spec, opts);
  if (opts.host_bytes > 0 && need > opts.host_bytes && opts.spill.dir.empty()) {
    return ResourceExhausted(
        "model of " + std::to_string(spec.NumParams()) + " parameters needs " +
        std::to_string(need) + " host bytes (fp32 master + AdamW m + v in " +
        std::to_string(opts.page_bytes) + "-byte pages, plus two published " +
        DTypeName(opts.publish_dtype) + " copies) but memory.host_bytes is " +
        std::to_string(opts.host_bytes) +
        "; raise memory.host_bytes, set spill.dir to keep part of the state on SSD, or use a smaller model");
  }
  std::unique_ptr<ParamStore> store(new ParamStore(spec, opts));
  L2L_RETURN_IF_ERROR(store->Allocate());
  return store;
}

Status ParamStore::Allocate() {
  const size_t page_floats = opts_.page_bytes / sizeof(float);
  if (!opts_.spill.dir.empty()) {
    // Placement first (the SSD tier is the likelier failure: a bad dir, a full disk).
    L2L_ASSIGN_OR_RETURN(TierPlan plan,
                         TierPlan::Make(layouts_, opts_.page_bytes, opts_.host_bytes,
                                        WeightSegmentBytes(layouts_, frozen_plans_, opts_.publish_dtype), opts_.spill));
    if (plan.any()) {
      L2L_ASSIGN_OR_RETURN(tier_, SpillTier::Create(layouts_, opts_.page_bytes, std::move(plan), opts_.spill));
    }
  }
  spans_.resize(layouts_.size());
  for (size_t l = 0; l < layouts_.size(); ++l) {
    const size_t numel = layouts_[l].numel;
    for (size_t p = 0; p < PagesFor(numel, page_floats); ++p) {
      StateSpan s{};
      s.begin = p * page_floats;
      s.n = std::min(page_floats, numel - s.begin);
      float** targets[3] = {&s.master, &s.m, &s.v};
      for (int kind = 0; kind < 3; ++kind) {
        if (tier_ != nullptr && tier_->plan().slot[l][p][kind] >= 0) continue;  // on SSD: null
        L2L_ASSIGN_OR_RETURN(void* page, pages_.Allocate());
        *targets[kind] = static_cast<float*>(page);
      }
      spans_[l].push_back(s);
    }
  }
  weights_size_ = WeightSegmentBytes(layouts_, frozen_plans_, opts_.publish_dtype);
  if (!opts_.shm_name.empty()) {
    L2L_ASSIGN_OR_RETURN(shm_, ShmSegment::Create(opts_.shm_name, weights_size_));
    weights_base_ = shm_.data();
  } else {
    anon_ = mmap(nullptr, weights_size_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (anon_ == MAP_FAILED) {
      anon_ = nullptr;
      return ErrnoError("mmap", "published copies (" + std::to_string(weights_size_) + " bytes)", errno);
    }
    weights_base_ = anon_;
  }
  auto* hdr = new (weights_base_) WeightSegmentHeader();
  hdr->magic = kWeightMagic;
  hdr->layout_version = kShmLayoutVersion;
  hdr->num_layers = static_cast<uint32_t>(layouts_.size());
  hdr->dtype = static_cast<uint32_t>(opts_.publish_dtype);
  hdr->total_bytes = weights_size_;
  hdr->owner_pid = static_cast<int32_t>(getpid());
  size_t off = WeightHeaderBytes(layouts_.size());
  WeightLayerEntry* entries = WeightLayers(weights_base_);
  for (size_t l = 0; l < layouts_.size(); ++l) {
    auto* e = new (&entries[l]) WeightLayerEntry();
    e->frozen_offset = off;
    e->frozen_bytes = frozen_plans_[l].bytes;
    off += RoundUpTo(frozen_plans_[l].bytes, kShmAlign);
    e->numel = layouts_[l].numel;
    e->slot_bytes = SlotBytes(layouts_[l].numel, opts_.publish_dtype);
    for (int s = 0; s < 2; ++s) {
      e->slot_offset[s] = off;
      off += e->slot_bytes;
      e->version[s].store(-1);
    }
  }
  readers_ = std::make_unique<std::atomic<int32_t>[]>(layouts_.size() * 2);
  for (size_t i = 0; i < layouts_.size() * 2; ++i) readers_[i].store(0);
  return Status::Ok();
}

ParamStore::~ParamStore() {
  Stop();
  tier_.reset();  // flushes write-behind; its staging buffers are not pages_
  for (auto& layer : spans_) {
    for (auto& s : layer) {
      pages_.Free(s.master);
      pages_.Free(s.m);
      pages_.Free(s.v);
    }
  }
  if (anon_ != nullptr) munmap(anon_, weights_size_);
}

size_t ParamStore::max_layer_numel() const {
  size_t m = 0;
  for (const auto& l : layouts_) m = std::max(m, l.numel);
  return m;
}

size_t ParamStore::state_bytes() const { return pages_.pages_in_use() * pages_.page_bytes(); }

size_t ParamStore::ssd_bytes() const {
  return tier_ == nullptr ? 0 : static_cast<size_t>(tier_->plan().slots) * opts_.page_bytes;
}

Status ParamStore::health() const { return tier_ == nullptr ? Status::Ok() : tier_->health(); }

ParamStore::StateLease& ParamStore::StateLease::operator=(StateLease&& o) noexcept {
  if (this != &o) {
    Release();
    tier_ = o.tier_;
    layer_ = o.layer_;
    dirty_ = o.dirty_;
    spans_ = std::move(o.spans_);
    o.tier_ = nullptr;
    o.layer_ = -1;
    o.spans_.clear();
  }
  return *this;
}

void ParamStore::StateLease::Release() {
  if (tier_ != nullptr) tier_->Unlease(layer_, dirty_);
  tier_ = nullptr;
  layer_ = -1;
  spans_.clear();
}

Result<ParamStore::StateLease> ParamStore::Lease(int64_t layer, LeaseMode mode) const {
  if (layer < 0 || layer >= num_layers()) {
    return NotFound("layer " + std::to_string(layer) + " does not exist (model has " +
                    std::to_string(num_layers()) + " layers)");
  }
  StateLease lease;
  lease.layer_ = layer;
  if (tier_ == nullptr || !tier_->plan().layer_spilled(layer)) {
    lease.spans_ = spans_[layer];  // wholly in RAM: nothing to bring in or give back
    return lease;
  }
  L2L_RETURN_IF_ERROR(tier_->Lease(layer, spans_[layer], mode != LeaseMode::kOverwrite, &lease.spans_));
  lease.tier_ = tier_.get();
  lease.dirty_ = mode != LeaseMode::kRead;
  return lease;
}

namespace {
float* KindOf(const StateSpan& s, int which) { return which == 0 ? s.master : which == 1 ? s.m : s.v; }
}  // namespace

Status ParamStore::ReadState(int64_t layer, int which, float* out) const {
  L2L_ASSIGN_OR_RETURN(StateLease lease, Lease(layer, LeaseMode::kRead));
  for (const StateSpan& s : lease.spans()) std::memcpy(out + s.begin, KindOf(s, which), s.n * sizeof(float));
  return Status::Ok();
}

Status ParamStore::WriteState(int64_t layer, int which, const float* in) {
  // kUpdate, not kOverwrite: the other two arrays keep their values.
  L2L_ASSIGN_OR_RETURN(StateLease lease, Lease(layer, LeaseMode::kUpdate));
  for (const StateSpan& s : lease.spans()) std::memcpy(KindOf(s, which), in + s.begin, s.n * sizeof(float));
  return Status::Ok();
}

Status ParamStore::WriteLayer(int64_t layer, const float* master, const float* m, const float* v) {
  L2L_ASSIGN_OR_RETURN(StateLease lease, Lease(layer, LeaseMode::kOverwrite));
  for (const StateSpan& s : lease.spans()) {
    std::memcpy(s.master, master + s.begin, s.n * sizeof(float));
    // A null moment is zero (all-zero bytes are 0.0f): a fresh start needs no zeros buffer.
    for (auto [dst, src] : {std::pair{s.m, m}, std::pair{s.v, v}}) {
      if (src != nullptr) {
        std::memcpy(dst, src + s.begin, s.n * sizeof(float));
      } else {
        std::memset(dst, 0, s.n * sizeof(float));
      }
    }
  }
  return Status::Ok();
}

Status ParamStore::WriteMasterZeroMoments(int64_t layer, const float* master) {
  return WriteLayer(layer, master, nullptr, nullptr);
}

Status ParamStore::WriteInitialLayer(int64_t layer, const float* base) {
  if (!lora()) return WriteMasterZeroMoments(layer, base);
  const LayerLayout& full = full_layouts_[layer];
  std::vector<float> values(full.numel, 0.0f);  // base tensors are a prefix of the LoRA layout
  std::copy(base, base + base_numel_[layer], values.begin());
  InitLoraAdapters(opts_.lora, full, values.data());
  if (!frozen_written_[layer]) {
    const FrozenPlan& plan = frozen_plans_[layer];
    // The base has no master for CreateJob's finiteness check to see: checked here.
    for (const FrozenPiece& p : plan.pieces) {
      for (size_t i = p.offset; i < p.offset + p.numel; ++i) {
        if (!std::isfinite(values[i])) {
          return InvalidArgument("layer " + std::to_string(layer) + "'s frozen base is not finite (element " +
                                 std::to_string(i) + " of the layer)");
        }
      }
    }
    const WeightLayerEntry& e = WeightLayers(weights_base_)[layer];
    L2L_RETURN_IF_ERROR(EncodeFrozen(plan, values.data(), static_cast<uint8_t*>(weights_base_) + e.frozen_offset)
                            .WithContext("layer " + std::to_string(layer) + "'s frozen base"));
    frozen_written_[layer] = 1;
  }
  std::vector<float> packed(layouts_[layer].numel);
  PackTrainable(full, values.data(), packed.data());
  return WriteMasterZeroMoments(layer, packed.data());
}

Status ParamStore::ReadFullLayer(int64_t layer, float* out) const {
  if (!lora()) return ReadState(layer, 0, out);
  const FrozenPlan& plan = frozen_plans_[layer];
  const WeightLayerEntry& e = WeightLayers(weights_base_)[layer];
  DecodeFrozen(plan, static_cast<const uint8_t*>(weights_base_) + e.frozen_offset, out);
  return ReadState(layer, 0, out + plan.trainable.offset);
}

std::string ParamStore::BaseHash() const {
  if (!lora()) return "";
  uint64_t h = kFnv1a64Basis;
  for (size_t l = 0; l < layouts_.size(); ++l) {
    const WeightLayerEntry& e = WeightLayers(weights_base_)[l];
    h = Fnv1a64(static_cast<const uint8_t*>(weights_base_) + e.frozen_offset, e.frozen_bytes, h);
  }
  char text[17];
  std::snprintf(text, sizeof(text), "%016llx", static_cast<unsigned long long>(h));
  return text;
}

Status ParamStore::InitFromSeed(uint64_t seed, size_t scratch_bytes) {
  // Every layer has its own counter-based stream (InitLayerParams), so layers are
  // initialised in parallel with the values of a serial pass: as many at a time as
  // scratch_bytes holds layer buffers (at least one, at most the TBB threads). At 7B the
  // serial pass was the bulk of start-up (one core drawing 7.6 G normals).
  const std::vector<LayerLayout> base_layouts = BuildLayout(spec_);  // what the seed fills
  const size_t max_base_numel = *std::max_element(base_numel_.begin(), base_numel_.end());
  const size_t layer_bytes = std::max<size_t>(1, max_base_numel * sizeof(float));
  const int k = static_cast<int>(std::clamp<size_t>(scratch_bytes / layer_bytes, 1,
                                                    static_cast<size_t>(tbb::this_task_arena::max_concurrency())));
  std::vector<std::vector<float>> bufs(static_cast<size_t>(k));
  std::vector<int> free_bufs;
  for (int i = 0; i < k; ++i) free_bufs.push_back(i);
  std::mutex mu;
  Status first;
  tbb::task_arena arena(k);  // at most k layers in flight: the free list never runs dry
  arena.execute([&] {
    ParallelForIndex(int64_t{0}, num_layers(), [&](int64_t l) {
      int b;
      {
        std::lock_guard<std::mutex> lock(mu);
        if (!first.ok()) return;
        b = free_bufs.back();
        free_bufs.pop_back();
      }
      std::vector<float>& master = bufs[static_cast<size_t>(b)];
      master.resize(max_base_numel);
      InitLayerParams(spec_, base_layouts[static_cast<size_t>(model_layer(l))], seed, master.data());
      Status st = WriteInitialLayer(l, master.data());
      std::lock_guard<std::mutex> lock(mu);
      if (!st.ok() && first.ok()) first = st;
      free_bufs.push_back(b);
    });
  });
  return first;
}

void* ParamStore::SlotData(int64_t layer, uint32_t slot) const {
  return static_cast<char*>(weights_base_) + WeightLayers(weights_base_)[layer].slot_offset[slot];
}

bool ParamStore::SlotPinned(int64_t layer, uint32_t slot) const {
  if (readers_[layer * 2 + slot].load(std::memory_order_seq_cst) != 0) return true;
  std::lock_guard<std::mutex> lock(pin_mu_);
  for (const PinSource& src : pin_sources_) {
    const int64_t pin = src.pins[layer].load(std::memory_order_seq_cst);
    if (pin >= 0 && static_cast<uint32_t>(pin & 1) == slot) return true;
  }
  return false;
}

void* ParamStore::BeginPublish(int64_t layer) {
  WeightLayerEntry& e = WeightLayers(weights_base_)[layer];
  const uint32_t cur = e.current.load(std::memory_order_relaxed);
  // The very first publish fills slot 0 (current starts at 0 with version -1).
  const uint32_t slot = e.version[cur].load(std::memory_order_relaxed) < 0 ? cur : 1 - cur;
  e.seq[slot].fetch_add(1, std::memory_order_seq_cst);  // odd: being written
  while (SlotPinned(layer, slot)) {
    // Rare (a reader still holds the version before last): wait for an unpin. Several
    // futex words can signal it, so wait on ours with a short timeout.
    const uint32_t seen = unpin_seq_.load();
    if (!SlotPinned(layer, slot)) break;
    FutexWait(&unpin_seq_, seen, std::chrono::milliseconds(2));
  }
  return SlotData(layer, slot);
}

void ParamStore::EndPublish(int64_t layer, int64_t version) {
  auto* hdr = static_cast<WeightSegmentHeader*>(weights_base_);
  WeightLayerEntry& e = WeightLayers(weights_base_)[layer];
  const uint32_t cur = e.current.load(std::memory_order_relaxed);
  const uint32_t slot = (e.seq[cur].load(std::memory_order_relaxed) & 1) ? cur : 1 - cur;
  L2L_CHECK(e.seq[slot].load() & 1) << "EndPublish(layer " << layer << ") without BeginPublish";
  e.version[slot].store(version, std::memory_order_relaxed);
  e.seq[slot].fetch_add(1, std::memory_order_release);  // even: stable
  e.current.store(slot, std::memory_order_release);
  hdr->wake_seq.fetch_add(1, std::memory_order_release);
  FutexWake(&hdr->wake_seq);
}

Status ParamStore::PublishMaster(int64_t layer, int64_t version) {
  // Spilled master pages are read through a lease (REQUIRES: the caller holds no lease
  // of this layer). On a spill read fault nothing is published: readers keep the old
  // version, and the caller gets the error.
  auto lease = Lease(layer, LeaseMode::kRead);
  if (!lease.ok()) {
    return lease.status().WithContext("publishing layer " + std::to_string(layer) + " version " +
                                      std::to_string(version));
  }
  void* dst = BeginPublish(layer);
  for (const StateSpan& s : lease->spans()) {
    if (opts_.publish_dtype == DType::kBF16) {
      FloatToBf16(s.master, static_cast<uint16_t*>(dst) + s.begin, s.n);
    } else {
      std::memcpy(static_cast<float*>(dst) + s.begin, s.master, s.n * sizeof(float));
    }
  }
  EndPublish(layer, version);
  return Status::Ok();
}

int64_t ParamStore::published_version(int64_t layer) const {
  const WeightLayerEntry& e = WeightLayers(weights_base_)[layer];
  return e.version[e.current.load(std::memory_order_acquire)].load(std::memory_order_acquire);
}

ParamStore::ReadPin& ParamStore::ReadPin::operator=(ReadPin&& o) noexcept {
  if (this != &o) {
    Release();
    count_ = o.count_;
    unpin_seq_ = o.unpin_seq_;
    data_ = o.data_;
    version_ = o.version_;
    bytes_ = o.bytes_;
    frozen_ = o.frozen_;
    frozen_bytes_ = o.frozen_bytes_;
    o.count_ = nullptr;
    o.data_ = nullptr;
  }
  return *this;
}

void ParamStore::ReadPin::Release() {
  if (count_ == nullptr) return;
  count_->fetch_sub(1, std::memory_order_release);
  unpin_seq_->fetch_add(1, std::memory_order_release);
  FutexWake(unpin_seq_);
  count_ = nullptr;
  data_ = nullptr;
}

uint32_t ParamStore::epoch() const {
  return static_cast<const WeightSegmentHeader*>(weights_base_)->epoch.load(std::memory_order_acquire);
}

void ParamStore::BumpEpoch() {
  auto* hdr = static_cast<WeightSegmentHeader*>(weights_base_);
  hdr->epoch.fetch_add(1, std::memory_order_acq_rel);
  hdr->wake_seq.fetch_add(1, std::memory_order_release);
  FutexWake(&hdr->wake_seq);
}

Result<ParamStore::ReadPin> ParamStore::Acquire(int64_t layer, int64_t min_version,
                                               std::chrono::milliseconds timeout, int64_t epoch) {
  if (layer < 0 || layer >= num_layers()) {
    return NotFound("layer " + std::to_string(layer) + " does not exist (model has " +
                    std::to_string(num_layers()) + " layers)");
  }
  auto* hdr = static_cast<WeightSegmentHeader*>(weights_base_);
  WeightLayerEntry& e = WeightLayers(weights_base_)[layer];
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    const uint32_t wake = hdr->wake_seq.load(std::memory_order_acquire);
    if (const uint32_t st = hdr->stopped.load(std::memory_order_acquire); st != 0) return StoppedStatus(st);
    if (epoch >= 0 && hdr->epoch.load(std::memory_order_acquire) != static_cast<uint32_t>(epoch)) {
      return RejoinRequired(RejoinReason::kRolledBack, "the EPS rolled the state back while waiting for layer " + std::to_string(layer) +
                                " version " + std::to_string(min_version) + "; re-register to redo the step");
    }
    const uint32_t s = e.current.load(std::memory_order_acquire);
    const uint32_t q = e.seq[s].load(std::memory_order_acquire);
    const int64_t v = e.version[s].load(std::memory_order_acquire);
    if ((q & 1) == 0 && v >= min_version) {
      std::atomic<int32_t>& count = readers_[layer * 2 + s];
      count.fetch_add(1, std::memory_order_seq_cst);
      if (e.seq[s].load(std::memory_order_seq_cst) == q) {
        ReadPin pin;
        pin.count_ = &count;
        pin.unpin_seq_ = &unpin_seq_;
        pin.data_ = SlotData(layer, s);
        pin.version_ = v;
        pin.bytes_ = layouts_[layer].numel * DTypeSize(opts_.publish_dtype);
        if (e.frozen_bytes > 0) {
          pin.frozen_ = static_cast<const char*>(weights_base_) + e.frozen_offset;
          pin.frozen_bytes_ = e.frozen_bytes;
        }
        return pin;
      }
      count.fetch_sub(1, std::memory_order_release);
      unpin_seq_.fetch_add(1, std::memory_order_release);
      FutexWake(&unpin_seq_);
      continue;
    }
    const auto now = std::chrono::steady_clock::now();
    if (now >= deadline) {
      return Status(StatusCode::kDeadlineExceeded,
                    "layer " + std::to_string(layer) + " version " + std::to_string(min_version) +
                        " not published within " + std::to_string(timeout.count()) +
                        " ms (newest is " + std::to_string(published_version(layer)) + ")");
    }
    if ((q & 1) != 0 || v < min_version) {
      FutexWait(&hdr->wake_seq, wake, std::min<std::chrono::nanoseconds>(deadline - now, std::chrono::milliseconds(100)));
    }
  }
}

void ParamStore::AddPinSource(int32_t worker_id, const std::atomic<int64_t>* pins,
                              const std::atomic<uint32_t>* pin_seq) {
  std::lock_guard<std::mutex> lock(pin_mu_);
  pin_sources_.push_back({worker_id, pins, pin_seq});
}

void ParamStore::RemovePinSource(int32_t worker_id) {
  {
    std::lock_guard<std::mutex> lock(pin_mu_);
    pin_sources_.erase(std::remove_if(pin_sources_.begin(), pin_sources_.end(),
                                      [&](const PinSource& p) { return p.worker_id == worker_id; }),
                       pin_sources_.end());
  }
  unpin_seq_.fetch_add(1);
  FutexWake(&unpin_seq_);
}

void ParamStore::Stop(bool failed) {
  if (weights_base_ == nullptr) return;
  auto* hdr = static_cast<WeightSegmentHeader*>(weights_base_);
  uint32_t expected = 0;  // a failure after a plain stop still says failed; never the other way
  if (!hdr->stopped.compare_exchange_strong(expected, failed ? kStoppedFailed : 1, std::memory_order_acq_rel) &&
      failed) {
    hdr->stopped.store(kStoppedFailed, std::memory_order_release);
  }
  hdr->wake_seq.fetch_add(1, std::memory_order_release);
  FutexWake(&hdr->wake_seq);
}

bool ParamStore::stopped() const {
  return static_cast<const WeightSegmentHeader*>(weights_base_)->stopped.load(std::memory_order_acquire);
}

}  // namespace l2l::eps
