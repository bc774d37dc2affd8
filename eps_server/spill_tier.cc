// SpillTier and TierPlan: which state pages live on SSD, and the lease/cache state
// machine over the staging pool that brings them into RAM. The design (placement, the
// layer states absent -> reading -> clean <-> leased -> writing -> clean, prefetch in
// update order, fault handling) is in spill_tier.h.
//
// Locking: one mutex (Impl::mu) guards every layer's state, the pool's free list as
// seen by this tier, health and the counters; one condition variable (Impl::cv) is
// notified on every state change. I/O is submitted and zero-fills run without the
// mutex; the engine's callbacks (reaper thread) take it briefly. Lock order: Impl::mu
// before the pool's own mutex; the engine never calls back while Submit holds anything
// of ours.
#include "eps_server/spill_tier.h"

#include <sys/file.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <condition_variable>
#include <cstring>
#include <mutex>

#include "common/logging.h"
#include "common/rng.h"
#include "common/thread_annotations.h"

namespace l2l::eps {
namespace {

constexpr size_t kHeaderBytes = 4096;
constexpr char kSpillMagic[8] = {'L', '2', 'L', 'S', 'P', 'I', 'L', 'L'};
constexpr uint32_t kSpillVersion = 1;

// The first kHeaderBytes of a spill file (the rest of the block is zero). The file is
// scratch: it is rewritten at every start and never read back across runs; the header
// says what the slots belong to, for a person looking at a stray file.
struct SpillHeader {
  char magic[8];
  uint32_t version;
  uint32_t header_bytes;
  uint64_t page_bytes;
  uint64_t slots;
  uint64_t num_layers;
  uint64_t fingerprint;  // FNV-1a of job id, page bytes and every layer's numel
  char job_id[128];      // NUL-terminated, truncated
};
static_assert(sizeof(SpillHeader) <= kHeaderBytes);


// Page counts of the layers, numbered across layers in layer order (the same numbering
// for each kind).
struct Geometry {
  std::vector<int64_t> pages;  // per layer
  std::vector<int64_t> first;  // first page number of each layer
  int64_t total = 0;           // pages per kind
  int64_t max_pages = 0;       // pages of the largest layer
};

Geometry MakeGeometry(const std::vector<LayerLayout>& layouts, size_t page_bytes) {
  const size_t page_floats = page_bytes / sizeof(float);
  Geometry g;
  for (const auto& l : layouts) {
    const auto n = static_cast<int64_t>((l.numel + page_floats - 1) / page_floats);
    g.first.push_back(g.total);
    g.pages.push_back(n);
    g.total += n;
    g.max_pages = std::max(g.max_pages, n);
  }
  return g;
}

// Spilled pages per kind (index = kind: 0 master, 1 m, 2 v) when s pages are spilled:
// all of v first, then m, then master.
std::array<int64_t, 3> KindCounts(int64_t s, int64_t total) {
  std::array<int64_t, 3> k{};
  k[2] = std::min(s, total);
  k[1] = std::min(s - k[2], total);
  k[0] = s - k[2] - k[1];
  return k;
}

// k of a kind's `total` pages are spilled: page i when floor((i+1)k/total) >
// floor(ik/total). The picks are evenly spaced, so pages [a, b) hold
// floor(bk/total) - floor(ak/total) of them: every layer gets its share to within one.
bool Picked(int64_t i, int64_t k, int64_t total) { return (i + 1) * k / total > i * k / total; }

int64_t PickedIn(int64_t a, int64_t b, int64_t k, int64_t total) { return b * k / total - a * k / total; }

int64_t MaxLayerSlots(const Geometry& g, const std::array<int64_t, 3>& k) {
  int64_t best = 0;
  for (size_t l = 0; l < g.pages.size(); ++l) {
    int64_t n = 0;
    for (int kind = 0; kind < 3; ++kind) n += PickedIn(g.first[l], g.first[l] + g.pages[l], k[kind], g.total);
    best = std::max(best, n);
  }
  return best;
}

std::string Num(int64_t v) { return std::to_string(v); }

}  // namespace

// ---------------------------------------------------------------------------------
// TierPlan

bool TierPlan::layer_spilled(int64_t layer) const {
  if (layer < 0 || layer >= static_cast<int64_t>(slot.size())) return false;
  for (const auto& s : slot[layer]) {
    if (s[0] >= 0 || s[1] >= 0 || s[2] >= 0) return true;
  }
  return false;
}

Result<TierPlan> TierPlan::Make(const std::vector<LayerLayout>& layouts, size_t page_bytes,
                                size_t host_bytes, size_t fixed_bytes, const SpillOptions& opts) {
  if (page_bytes == 0 || page_bytes % 4096 != 0) {
    return InvalidArgument("memory.page_bytes=" + std::to_string(page_bytes) + " must be a positive multiple of 4096");
  }
  if (opts.prefetch_layers < 0) {
    return InvalidArgument("spill.prefetch_layers=" + Num(opts.prefetch_layers) + " must be >= 0");
  }
  const Geometry g = MakeGeometry(layouts, page_bytes);
  const auto page = static_cast<int64_t>(page_bytes);
  const int64_t state_pages = 3 * g.total;
  TierPlan plan;
  plan.total = {g.total, g.total, g.total};
  plan.slot.resize(layouts.size());
  for (size_t l = 0; l < layouts.size(); ++l) plan.slot[l].assign(g.pages[l], {-1, -1, -1});
  plan.ram_pages = state_pages;
  if (host_bytes == 0 || static_cast<size_t>(state_pages) * page_bytes + fixed_bytes <= host_bytes) return plan;

  // The budget, in whole pages, for RAM state pages + staging buffers:
  //   (ram_pages + pool) * page + fixed <= host  <=>  ram_pages + pool <= avail.
  const int64_t avail = host_bytes >= fixed_bytes ? static_cast<int64_t>((host_bytes - fixed_bytes) / page_bytes) : -1;
  const int64_t min_pool = 3 * g.max_pages;  // every page spilled: the largest layer's master+m+v
  const bool pool_given = opts.pool_bytes > 0;
  auto pool_for = [&](int64_t mls) {
    return pool_given ? static_cast<int64_t>(opts.pool_bytes / page_bytes) : (opts.prefetch_layers + 1) * mls;
  };
  auto refuse = [&](const std::string& why) {
    return ResourceExhausted(
        "the model's state is " + Num(state_pages) + " pages of " + Num(page) + " bytes (" +
        Num(state_pages * page) + " bytes of fp32 master + AdamW m + v) and memory.host_bytes=" +
        std::to_string(host_bytes) + " must also hold the published copies (" + std::to_string(fixed_bytes) +
        " bytes); " + why + "; raise memory.host_bytes");
  };

  // The fewest spilled pages whose pool fits beside the pages left in RAM. The pool
  // depends on the spill (through max_layer_slots), so scan up from the bound a pool of
  // 0 gives; the scan ends within pool_for(min_pool) steps, where that pool fits.
  int64_t spill = -1;
  int64_t pool = 0;
  for (int64_t s = std::max<int64_t>(1, state_pages - avail); s <= state_pages; ++s) {
    const int64_t p = pool_for(MaxLayerSlots(g, KindCounts(s, g.total)));
    if ((state_pages - s) + p <= avail) {
      spill = s;
      pool = p;
      break;
    }
  }
  if (spill < 0) {
    // Even with every page on SSD the pool does not fit. A given pool is final;
    // otherwise shrink it (less prefetch) down to the largest layer's pages.
    if (pool_given) {
      return refuse("with every state page on SSD it would still need spill.pool_bytes=" +
                    std::to_string(opts.pool_bytes) + " (" + Num(pool_for(0)) + " staging pages) beside them, " +
                    Num(pool_for(0) * page + static_cast<int64_t>(fixed_bytes)) + " bytes in all");
    }
    if (avail < min_pool) {
      return refuse("with every state page on SSD it would still need a staging pool of at least " +
                    Num(min_pool) + " pages (" + Num(min_pool * page) +
                    " bytes: the largest layer's master + m + v), " +
                    Num(min_pool * page + static_cast<int64_t>(fixed_bytes)) + " bytes in all");
    }
    spill = state_pages;
    pool = avail;
  }

  const std::array<int64_t, 3> k = KindCounts(spill, g.total);
  plan.max_layer_slots = MaxLayerSlots(g, k);
  if (pool < plan.max_layer_slots) {
    return InvalidArgument("spill.pool_bytes=" + std::to_string(opts.pool_bytes) + " holds " + Num(pool) +
                           " staging pages of " + Num(page) + " bytes, but a layer has " +
                           Num(plan.max_layer_slots) + " spilled pages and takes them all at once; set "
                           "spill.pool_bytes to at least " + Num(plan.max_layer_slots * page) + " (or 0 = auto)");
  }
  // Slots in (layer, page, kind) order: a layer's pages are contiguous in the file.
  int64_t next = 0;
  for (size_t l = 0; l < layouts.size(); ++l) {
    for (int64_t p = 0; p < g.pages[l]; ++p) {
      for (int kind = 0; kind < 3; ++kind) {
        if (Picked(g.first[l] + p, k[kind], g.total)) {
          plan.slot[l][p][kind] = next++;
          ++plan.spilled[kind];
        }
      }
    }
  }
  L2L_CHECK(next == spill) << "placed " << next << " of " << spill << " spilled pages";
  plan.slots = spill;
  plan.ram_pages = state_pages - spill;
  plan.pool_buffers = pool;
  return plan;
}

// ---------------------------------------------------------------------------------
// SpillTier

struct SpillTier::Impl {
  enum class St { kAbsent, kReading, kClean, kLeased, kWriting };
  struct Array {
    int64_t page;
    int kind;
    uint64_t offset;  // in the spill file
  };
  struct Layer {
    std::vector<Array> arrays;  // the spilled arrays; staging buffer j holds arrays[j]
    St st = St::kAbsent;
    std::vector<void*> bufs;    // held unless kAbsent
    int pending = 0;            // transfers in flight
    Status io_error;            // first error among the transfers in flight
    Status read_error;          // a failed (pre)fetch not yet reported to a Lease
    bool on_disk = false;       // written back once: its slots hold its values (else zeros)
    bool write_failed = false;  // the buffers are the only good copy: never evicted
    int waiters = 0;            // Leases waiting for this layer: not evictable
    uint64_t last_use = 0;      // LRU tick
  };
  // What to do, outside the mutex, to fill a layer's buffers.
  struct Fill {
    int64_t layer = -1;
    bool zero = false;          // never written: zeros (no I/O)
    bool read = false;          // read every array from the file
  };

  size_t page_bytes = 0;
  int prefetch_layers = 0;
  FaultPlan faults;
  SpillFile file;
  std::unique_ptr<AlignedBufferPool> pool;
  std::unique_ptr<IoEngine> engine;  // declared last: destroyed first (callbacks use the rest)

  mutable std::mutex mu;
  std::condition_variable cv;
  // Not GUARDED_BY as a whole: its size and each Layer's `arrays` are fixed after Create
  // and read without mu; a Layer's other fields are written only under mu, and `bufs` is
  // read without it only by the thread that moved the layer to kReading, kLeased or
  // kWriting (that state hands it the buffers until it moves the layer on, under mu).
  std::vector<Layer> layers;
  Status health GUARDED_BY(mu);
  uint64_t tick GUARDED_BY(mu) = 0;
  int64_t hits GUARDED_BY(mu) = 0;
  int64_t misses GUARDED_BY(mu) = 0;
  double wait_s GUARDED_BY(mu) = 0;

  // Gives `layer` its buffers, evicting clean unleased layers in LRU order (never one in
  // `protect`, one waited for, or one whose write failed), all or nothing. False when not
  // enough can be freed now.
  bool TakeBuffers(int64_t layer, const std::vector<char>* protect) REQUIRES(mu) {
    Layer& ly = layers[layer];
    const size_t n = ly.arrays.size();
    size_t have = pool->free_count();
    if (have < n) {
      std::vector<int64_t> cand;
      for (int64_t i = 0; i < static_cast<int64_t>(layers.size()); ++i) {
        const Layer& c = layers[i];
        if (c.st == St::kClean && c.waiters == 0 && !c.write_failed && (protect == nullptr || !(*protect)[i])) {
          cand.push_back(i);
        }
      }
      std::sort(cand.begin(), cand.end(),
                [&](int64_t a, int64_t b) { return layers[a].last_use < layers[b].last_use; });
      size_t victims = 0;
      while (victims < cand.size() && have < n) have += layers[cand[victims++]].bufs.size();
      if (have < n) return false;
      for (size_t v = 0; v < victims; ++v) {
        Layer& c = layers[cand[v]];
        pool->Release(c.bufs);
        c.bufs.clear();
        c.st = St::kAbsent;
      }
    }
    ly.bufs = pool->TryAcquire(n);
    return ly.bufs.size() == n;
  }

  // REQUIRES: layer has its buffers. Moves the layer to kReading (or kClean when nothing
  // is to be read) and says what to do next.
  Fill BeginFill(int64_t layer, bool read) REQUIRES(mu) {
    Layer& ly = layers[layer];
    Fill f;
    f.layer = layer;
    if (!read) {
      ly.st = St::kClean;
      return f;
    }
    ly.st = St::kReading;
    if (!ly.on_disk) {
      f.zero = true;
    } else {
      f.read = true;
      ly.pending = static_cast<int>(ly.arrays.size());
      ly.io_error = Status::Ok();
    }
    return f;
  }

  void RunFill(const Fill& f) EXCLUDES(mu) {
    Layer& ly = layers[f.layer];  // arrays and bufs are stable while kReading
    if (f.zero) {
      for (void* b : ly.bufs) std::memset(b, 0, page_bytes);
      std::lock_guard<std::mutex> lock(mu);
      ly.st = St::kClean;
      cv.notify_all();
    } else if (f.read) {
      for (size_t j = 0; j < ly.arrays.size(); ++j) {
        engine->Submit(file, IoOp::kRead, ly.bufs[j], page_bytes, ly.arrays[j].offset,
                       [this, layer = f.layer](Status s) { OnDone(layer, std::move(s)); });
      }
    }
  }

  // Engine callback (reaper thread): one transfer of `layer` finished.
  void OnDone(int64_t layer, Status s) {
    std::lock_guard<std::mutex> lock(mu);
    Layer& ly = layers[layer];
    if (!s.ok() && ly.io_error.ok()) ly.io_error = std::move(s);
    if (--ly.pending > 0) return;
    if (ly.st == St::kReading) {
      if (!ly.io_error.ok()) {
        // Nothing half-read is handed out: the buffers go back, the next Lease reports it.
        pool->Release(ly.bufs);
        ly.bufs.clear();
        ly.st = St::kAbsent;
        ly.read_error = ly.io_error.WithContext("reading layer " + Num(layer) + " from the SSD tier");
      } else {
        ly.st = St::kClean;
      }
    } else {
      L2L_CHECK(ly.st == St::kWriting) << "transfer done for layer " << layer << " in state " << static_cast<int>(ly.st);
      if (!ly.io_error.ok()) {
        ly.write_failed = true;
        if (health.ok()) {
          health = ly.io_error.WithContext("writing layer " + Num(layer) +
                                           " back to the SSD tier (its state is kept in RAM, the tier is "
                                           "unhealthy; stop and resume from the last checkpoint)");
          L2L_LOG_ERROR("spill tier: {}", health.ToString());
        }
      } else {
        ly.on_disk = true;
      }
      ly.st = St::kClean;
    }
    ly.io_error = Status::Ok();
    cv.notify_all();
  }

  // Starts reads of the layers after `layer` in update order (layer-1, layer-2, ...,
  // wrapping) that are absent, without waiting and without evicting any of them.
  void Prefetch(int64_t layer) {
    if (prefetch_layers <= 0) return;
    const auto L = static_cast<int64_t>(layers.size());
    std::vector<int64_t> window;
    std::vector<char> protect(L, 0);
    protect[layer] = 1;
    for (int64_t d = 1; d < L && static_cast<int>(window.size()) < prefetch_layers; ++d) {
      const int64_t j = ((layer - d) % L + L) % L;
      if (layers[j].arrays.empty()) continue;
      window.push_back(j);
      protect[j] = 1;
    }
    std::vector<Fill> fills;
    {
      std::lock_guard<std::mutex> lock(mu);
      if (!health.ok()) return;
      for (int64_t j : window) {
        Layer& y = layers[j];
        if (y.st != St::kAbsent || !y.read_error.ok() || y.waiters > 0) continue;
        if (!TakeBuffers(j, &protect)) break;
        y.last_use = ++tick;
        fills.push_back(BeginFill(j, /*read=*/true));
      }
    }
    for (const Fill& f : fills) RunFill(f);
  }
};

SpillTier::SpillTier() = default;

Result<std::unique_ptr<SpillTier>> SpillTier::Create(const std::vector<LayerLayout>& layouts, size_t page_bytes,
                                                     TierPlan plan, const SpillOptions& opts) {
  if (opts.dir.empty()) return InvalidArgument("SpillTier needs spill.dir");
  if (!plan.any()) return InvalidArgument("SpillTier: the plan spills nothing");
  if (plan.slot.size() != layouts.size()) {
    return InvalidArgument("SpillTier: plan for " + Num(plan.slot.size()) + " layers, model has " + Num(layouts.size()));
  }
  if (page_bytes == 0 || page_bytes % 4096 != 0) {
    return InvalidArgument("memory.page_bytes=" + std::to_string(page_bytes) + " must be a positive multiple of 4096");
  }
  if (plan.pool_buffers < plan.max_layer_slots || plan.max_layer_slots <= 0) {
    return InvalidArgument("SpillTier: pool of " + Num(plan.pool_buffers) + " pages cannot hold a layer's " +
                           Num(plan.max_layer_slots) + " spilled pages");
  }
  if (opts.job_id.empty() || opts.job_id.find('/') != std::string::npos) {
    return InvalidArgument("job id '" + opts.job_id + "' cannot name a spill file (empty or has '/')");
  }
  std::unique_ptr<SpillTier> t(new SpillTier());
  t->plan_ = std::move(plan);
  t->impl_ = std::make_unique<Impl>();
  Impl& I = *t->impl_;
  I.page_bytes = page_bytes;
  I.prefetch_layers = opts.prefetch_layers;
  if (!opts.faults.empty()) {
    L2L_ASSIGN_OR_RETURN(I.faults, FaultPlan::Parse(opts.faults));
  }
  const TierPlan& p = t->plan_;
  const std::string path = opts.dir + "/l2l-" + opts.job_id + ".spill";
  SpillFileOptions fo;
  fo.direct = opts.direct;
  fo.must_exist = false;
  fo.resize_existing = false;
  const uint64_t bytes = kHeaderBytes + static_cast<uint64_t>(p.slots) * page_bytes;
  L2L_ASSIGN_OR_RETURN(I.file, SpillFile::Open(path, bytes, fo, &I.faults));
  if (page_bytes % I.file.align() != 0 || kHeaderBytes % I.file.align() != 0) {
    return InvalidArgument("memory.page_bytes=" + std::to_string(page_bytes) + " is not a multiple of " +
                           std::to_string(I.file.align()) + ", the I/O alignment of " + path);
  }
  if (flock(I.file.fd(), LOCK_EX | LOCK_NB) != 0) {
    if (errno == EWOULDBLOCK) {
      return FailedPrecondition("spill file " + path + " is in use by another store (flock); give each job its "
                                "own job id or spill.dir");
    }
    return ErrnoError("flock", path, errno);
  }
  IoEngineOptions eo;
  eo.queue_depth = opts.queue_depth;
  eo.block_bytes = opts.block_bytes;
  L2L_ASSIGN_OR_RETURN(I.engine, IoEngine::Create(eo, &I.faults));
  L2L_ASSIGN_OR_RETURN(I.pool, AlignedBufferPool::Create(page_bytes, static_cast<size_t>(p.pool_buffers)));

  I.layers.resize(layouts.size());
  uint64_t fp = Fnv1a64(opts.job_id.data(), opts.job_id.size());
  const uint64_t pb = page_bytes;
  fp = Fnv1a64(&pb, sizeof(pb), fp);
  for (size_t l = 0; l < layouts.size(); ++l) {
    const uint64_t numel = layouts[l].numel;
    fp = Fnv1a64(&numel, sizeof(numel), fp);
    for (size_t pg = 0; pg < p.slot[l].size(); ++pg) {
      for (int kind = 0; kind < 3; ++kind) {
        const int64_t s = p.slot[l][pg][kind];
        if (s < 0) continue;
        I.layers[l].arrays.push_back(
            {static_cast<int64_t>(pg), kind, kHeaderBytes + static_cast<uint64_t>(s) * page_bytes});
      }
    }
  }

  // The header: written directly (an aligned staging buffer, O_DIRECT-safe), not through
  // the engine, so FaultPlan's read/write counts are page transfers only.
  std::vector<void*> hb = I.pool->TryAcquire(1);
  L2L_CHECK(hb.size() == 1) << "fresh pool has no free buffer";
  std::memset(hb[0], 0, kHeaderBytes);
  SpillHeader h{};
  std::memcpy(h.magic, kSpillMagic, sizeof(h.magic));
  h.version = kSpillVersion;
  h.header_bytes = kHeaderBytes;
  h.page_bytes = page_bytes;
  h.slots = static_cast<uint64_t>(p.slots);
  h.num_layers = layouts.size();
  h.fingerprint = fp;
  std::strncpy(h.job_id, opts.job_id.c_str(), sizeof(h.job_id) - 1);
  std::memcpy(hb[0], &h, sizeof(h));
  size_t done = 0;
  int err = 0;
  while (done < kHeaderBytes) {
    const ssize_t w = pwrite(I.file.fd(), static_cast<char*>(hb[0]) + done, kHeaderBytes - done,
                             static_cast<off_t>(done));
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) {
      err = w < 0 ? errno : EIO;
      break;
    }
    done += static_cast<size_t>(w);
  }
  I.pool->Release(hb);
  if (err != 0) return ErrnoError("pwrite (spill file header, offset " + std::to_string(done) + ")", path, err);
  L2L_LOG_INFO("spill tier: {} ({} slots of {} bytes = {} bytes; {} of {} v, {} of {} m, {} of {} master pages "
               "spilled; {} state pages in RAM; pool of {} pages{}; {})",
               path, p.slots, page_bytes, bytes, p.spilled[2], p.total[2], p.spilled[1], p.total[1], p.spilled[0],
               p.total[0], p.ram_pages, p.pool_buffers, I.pool->pinned() ? ", pinned" : "",
               I.file.direct() ? "O_DIRECT" : "buffered");
  return t;
}

SpillTier::~SpillTier() {
  if (impl_ == nullptr) return;
  Impl& I = *impl_;
  if (I.engine != nullptr) {
    UniqueLock lock(I.mu);
    // Every write-behind and (pre)fetch still in flight lands before the buffers go.
    I.cv.wait(lock.native(), [&]() REQUIRES(I.mu) {
      for (const auto& ly : I.layers) {
        if (ly.st == Impl::St::kReading || ly.st == Impl::St::kWriting) return false;
      }
      return true;
    });
    for (size_t l = 0; l < I.layers.size(); ++l) {
      if (I.layers[l].st == Impl::St::kLeased) L2L_LOG_ERROR("spill tier destroyed while layer {} is leased", l);
    }
    if (!I.health.ok()) L2L_LOG_ERROR("spill tier closing unhealthy: {}", I.health.ToString());
  }
  I.engine.reset();
  if (I.pool != nullptr) {
    for (auto& ly : I.layers) {
      if (!ly.bufs.empty()) I.pool->Release(ly.bufs);
      ly.bufs.clear();
    }
  }
  impl_.reset();
}

const std::string& SpillTier::path() const { return impl_->file.path(); }

Status SpillTier::Lease(int64_t layer, const std::vector<StateSpan>& ram, bool read, std::vector<StateSpan>* out) {
  Impl& I = *impl_;
  if (layer < 0 || layer >= static_cast<int64_t>(I.layers.size())) {
    return NotFound("layer " + Num(layer) + " does not exist (model has " + Num(I.layers.size()) + " layers)");
  }
  if (ram.size() != plan_.slot[layer].size()) {
    return InvalidArgument("lease of layer " + Num(layer) + " with " + Num(ram.size()) + " spans, the plan has " +
                           Num(plan_.slot[layer].size()));
  }
  Impl::Layer& ly = I.layers[layer];
  if (ly.arrays.empty()) {
    *out = ram;
    return Status::Ok();
  }
  const auto t0 = std::chrono::steady_clock::now();
  bool started = false;  // this Lease took the buffers (a miss)
  bool warned = false;
  Status result;
  UniqueLock lock(I.mu);
  ++ly.waiters;
  for (;;) {
    if (!I.health.ok()) {
      result = I.health;
      break;
    }
    if (ly.st == Impl::St::kClean) break;
    if (ly.st != Impl::St::kAbsent) {  // being read, leased or written: wait for it
      I.cv.wait(lock.native());
      continue;
    }
    if (!ly.read_error.ok()) {
      Status e = std::move(ly.read_error);
      ly.read_error = Status::Ok();
      if (read) {
        result = std::move(e);
        break;
      }
    }
    if (!I.TakeBuffers(layer, nullptr)) {
      // Every buffer is leased or in flight. Leases end, so this waits; but a thread that
      // holds leases while asking for more than the pool can spare waits for ever: say so.
      if (I.cv.wait_for(lock.native(), std::chrono::seconds(10)) == std::cv_status::timeout && !warned) {
        warned = true;
        int64_t leased = 0;
        for (const auto& y : I.layers) leased += y.st == Impl::St::kLeased;
        L2L_LOG_WARN("spill tier: lease of layer {} has waited 10 s for {} staging pages ({} of {} free, {} layers "
                     "leased); holding more leases at once than the pool holds layers cannot progress",
                     layer, ly.arrays.size(), I.pool->free_count(), I.pool->capacity(), leased);
      }
      continue;
    }
    started = true;
    ly.last_use = ++I.tick;
    const Impl::Fill f = I.BeginFill(layer, read);
    if (!read) break;  // kClean and ours: nobody else may see unread buffers
    lock.unlock();
    I.RunFill(f);
    I.Prefetch(layer);
    lock.lock();
  }
  --ly.waiters;
  if (!result.ok()) {
    I.cv.notify_all();
    return result;
  }
  ly.st = Impl::St::kLeased;
  ly.last_use = ++I.tick;
  started ? ++I.misses : ++I.hits;
  I.wait_s += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  *out = ram;
  for (size_t j = 0; j < ly.arrays.size(); ++j) {
    StateSpan& s = (*out)[ly.arrays[j].page];
    float** dst[3] = {&s.master, &s.m, &s.v};
    *dst[ly.arrays[j].kind] = static_cast<float*>(ly.bufs[j]);
  }
  lock.unlock();
  if (!started || !read) I.Prefetch(layer);
  return Status::Ok();
}

void SpillTier::Unlease(int64_t layer, bool dirty) {
  Impl& I = *impl_;
  Impl::Layer& ly = I.layers[layer];
  if (ly.arrays.empty()) return;
  {
    std::lock_guard<std::mutex> lock(I.mu);
    L2L_CHECK(ly.st == Impl::St::kLeased) << "Unlease of layer " << layer << " that is not leased";
    ly.last_use = ++I.tick;
    if (!dirty) {
      ly.st = Impl::St::kClean;
      I.cv.notify_all();
      return;
    }
    ly.st = Impl::St::kWriting;
    ly.pending = static_cast<int>(ly.arrays.size());
    ly.io_error = Status::Ok();
  }
  // Write-behind: the buffers stay with the layer (kWriting) until every page landed.
  for (size_t j = 0; j < ly.arrays.size(); ++j) {
    I.engine->Submit(I.file, IoOp::kWrite, ly.bufs[j], I.page_bytes, ly.arrays[j].offset,
                     [&I, layer](Status s) { I.OnDone(layer, std::move(s)); });
  }
}

Status SpillTier::Flush() {
  Impl& I = *impl_;
  UniqueLock lock(I.mu);
  I.cv.wait(lock.native(), [&]() REQUIRES(I.mu) {
    for (const auto& ly : I.layers) {
      if (ly.st == Impl::St::kWriting || ly.st == Impl::St::kReading) return false;
    }
    return true;
  });
  return I.health;
}

Status SpillTier::health() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  return impl_->health;
}

TierStats SpillTier::stats() const {
  const Impl& I = *impl_;
  TierStats s;
  s.ram_state_bytes = plan_.ram_pages * static_cast<int64_t>(I.page_bytes);
  s.ssd_bytes = plan_.slots * static_cast<int64_t>(I.page_bytes);
  s.pool_bytes = plan_.pool_buffers * static_cast<int64_t>(I.page_bytes);
  s.io = I.engine->stats();
  std::lock_guard<std::mutex> lock(I.mu);
  s.lease_hits = I.hits;
  s.lease_misses = I.misses;
  s.lease_wait_s = I.wait_s;
  return s;
}

}  // namespace l2l::eps
