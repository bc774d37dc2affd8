// SpillTier: the SSD tier of the ParamStore: optimizer state beyond the RAM budget lives
// in a file, read ahead in update order and written behind, so RAM need not hold it all.
//
// Placement (TierPlan::Make): given memory.host_bytes, the published copies (always in
// RAM, they are the shm weight segment) and the staging pool, as many state pages as fit
// stay in RAM; the rest live in one preallocated file, <spill.dir>/l2l-<job_id>.spill,
// a 4096-byte header then one page-sized slot per spilled page. Moments go first (all
// of v, then all of m), then master; inside a kind the spilled pages are spread evenly
// over the layers so every layer's update moves about the same bytes.
//
// Leases: the update pipeline, checkpoints and state copies reach a layer's state only
// through ParamStore::Lease (param_store.h), which for a layer with spilled pages asks
// the tier. The tier keeps a small cache of layers in staging buffers from a bounded
// AlignedBufferPool (pool_bytes; a layer takes all its buffers at once):
//     absent -> reading -> clean <-> leased -> writing -> clean -> (evicted) absent
// Lease(l) waits for l's reads (or starts them), then hands out spans whose spilled
// arrays point into staging buffers; when the lease ends after an update its spilled
// pages are written back behind (write-behind), and the buffers stay cached (clean)
// until another layer needs them. Each Lease(l) also starts reads of the next layers in
// update order (l-1, l-2, ... wrapping to the last layer: backward runs from the head
// down to the embedding), as many as prefetch_layers and the free pool allow, so layer
// l-1's pages are read while layer l is updated and l+1's are written.
//
// Faults: a failed or short read fails that Lease with an error naming the spill file,
// the operation and the offset; the caller never sees a half-read page. A failed write
// keeps the layer's buffers (the only good copy) and makes the tier unhealthy: every
// later Lease returns that error, and health() reports it, so the daemon stops before it
// could publish from bad state. Checkpoints are written from leases, so the last good
// checkpoint is never touched by a spill fault.
//
// Ownership: the ParamStore owns the tier; the tier owns the spill file, the engine and
// the pool. Thread-safety: all public methods are thread-safe; one lease per layer at a
// time (a second Lease of a leased layer waits).
#pragma once

#include <array>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/model_spec.h"
#include "common/status.h"
#include "eps_server/spill_io.h"
#include "eps_server/state_span.h"

namespace l2l::eps {

struct SpillOptions {
  std::string dir;                 // "" = no SSD tier
  std::string job_id = "default";  // names the file l2l-<job_id>.spill
  int queue_depth = 32;
  size_t block_bytes = 1 << 20;
  int prefetch_layers = 2;
  size_t pool_bytes = 0;           // 0 = (prefetch_layers + 1) x largest spilled layer
  bool direct = true;
  std::string faults;              // FaultPlan text ("" = none)
};

// Which arrays of which pages are on SSD. kinds: 0 master, 1 m, 2 v.
struct TierPlan {
  // [layer][page] -> spill slot per kind, -1 when in RAM.
  std::vector<std::vector<std::array<int64_t, 3>>> slot;
  int64_t slots = 0;                    // spilled pages in all
  std::array<int64_t, 3> spilled = {};  // per kind
  std::array<int64_t, 3> total = {};    // pages per kind
  int64_t ram_pages = 0;                // state pages kept in RAM
  int64_t pool_buffers = 0;             // staging buffers (pages)
  int64_t max_layer_slots = 0;          // most spilled pages of any one layer

  // `fixed_bytes`: RAM outside the state pages that the budget must also hold (the
  // published copies + headers). host_bytes 0 = unlimited -> nothing spilled.
  // RESOURCE_EXHAUSTED with the numbers when even spilling everything does not fit
  // (published copies + the smallest pool that holds one layer's spilled pages).
  static Result<TierPlan> Make(const std::vector<LayerLayout>& layouts, size_t page_bytes,
                               size_t host_bytes, size_t fixed_bytes, const SpillOptions& opts);
  bool any() const { return slots > 0; }
  bool layer_spilled(int64_t layer) const;
};

struct TierStats {
  int64_t ram_state_bytes = 0;   // state pages in RAM (excluding the pool)
  int64_t ssd_bytes = 0;         // spilled pages (slots x page_bytes)
  int64_t pool_bytes = 0;        // staging buffers
  IoStats io;
  int64_t lease_hits = 0;        // leases served from cached/prefetched buffers
  int64_t lease_misses = 0;      // leases that had to start their reads
  double lease_wait_s = 0;       // time Lease() spent waiting for reads/buffers (exposed)
};

class SpillTier {
 public:
  // Opens/creates the spill file (preallocated) and the engine and pool.
  static Result<std::unique_ptr<SpillTier>> Create(const std::vector<LayerLayout>& layouts,
                                                   size_t page_bytes, TierPlan plan,
                                                   const SpillOptions& opts);
  ~SpillTier();  // waits for write-behind

  const TierPlan& plan() const { return plan_; }
  const std::string& path() const;

  // The layer's spilled arrays, as spans: `ram` holds the store's spans (pointers of
  // spilled arrays null); on success `out` gets the same spans with every array valid.
  // read=false (overwrite: the caller writes every element) skips the reads.
  // Blocks; errors as in the header comment.
  Status Lease(int64_t layer, const std::vector<StateSpan>& ram, bool read,
               std::vector<StateSpan>* out);
  // Ends the lease; dirty -> write the spilled pages back behind.
  void Unlease(int64_t layer, bool dirty);
  // Waits until every write-behind and every read (prefetches included) finished
  // (checkpoints, shutdown; tests use it for a settled cache). Returns health().
  Status Flush();

  Status health() const;  // OK, or the first write fault (sticky)
  TierStats stats() const;

 private:
  struct Impl;
  SpillTier();
  TierPlan plan_;
  std::unique_ptr<Impl> impl_;
};

}  // namespace l2l::eps
