// HostBudget: the daemon's start-up arithmetic of every host buffer that grows with the
// model, checked against memory.host_bytes, memory.guard_bytes, the host's RAM and the
// free space of spill.dir BEFORE anything is allocated, so a state that cannot fit is
// refused up front with the numbers (docs/architecture.md "Host memory budget" has the
// table). Per buffer:
//   state        master + AdamW m + v, fp32, in page_bytes pages (12 B/param): RAM pages
//                inside host_bytes, the rest on SSD (spill.dir)
//   published    two copies per layer in the publish dtype (2 x 2 B/param bf16, 2 x 4
//                fp32): the shm weight segment, always RAM, inside host_bytes; a LoRA
//                job's frozen base records are in it too (one copy, common/lora_frozen.h:
//                4 / 2 / 0.5625 / 1.0625 B per frozen param), and its state, published
//                copies and guard count the trainable parameters only
//   staging      the SSD tier's pool (>= one layer's spilled pages), inside host_bytes
//   guard        the non-finite guard (update_pipeline.h): 12 B/param of undo copies when
//                memory.guard_bytes is 0 (beside host_bytes; 16 with global clip, whose
//                reduced gradients are held until the last norm); with guard_bytes > 0 at
//                most guard_bytes (>= 4 B/param), taken out of host_bytes
//   grad slots   per shm worker grad_slots x the largest layer x 4 B (beside host_bytes)
// Refusals (RESOURCE_EXHAUSTED / INVALID_ARGUMENT, the message has the sum):
//   * guard_bytes > 0 below 4 B/param, or not below host_bytes;
//   * the state + published copies + staging + a carved guard beyond host_bytes does
//     not fit spill.dir's free space (or there is no spill.dir and it does not fit RAM);
//   * the RAM the daemon would hold (min(host_bytes, what it needs) + an unbounded
//     guard + gradient slots) exceeds the host's physical memory.
// Pure (the caller passes RAM size and free disk); thread-safety: a function.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "common/dtype.h"
#include "common/status.h"

namespace l2l::eps {

struct HostBudgetInputs {
  std::vector<size_t> layer_numel;  // parameters per layer that train (all without LoRA)
  uint64_t frozen_bytes = 0;        // a LoRA job's frozen records, all layers (4096-rounded)
  size_t page_bytes = 4 << 20;
  DType publish_dtype = DType::kBF16;
  size_t host_bytes = 0;            // memory.host_bytes (0 = unlimited)
  size_t guard_bytes = 0;           // memory.guard_bytes (0 = unbounded undo, beside host_bytes)
  int workers = 1;
  int grad_slots = 4;               // per shm worker
  bool shm = true;                  // gradient segments exist (not with the grpc transport)
  bool global_clip = false;         // train.clip global: undo layers also hold their reduced gradient
  bool spill = false;               // spill.dir set
  uint64_t disk_free_bytes = 0;     // statvfs of spill.dir
  uint64_t ram_bytes = 0;           // physical memory (0 = unknown: not checked)
};

struct HostBudget {
  uint64_t params = 0;
  uint64_t state_bytes = 0;       // 3 x pages x page_bytes
  uint64_t published_bytes = 0;   // both copies + frozen records (headers left out: < 1 page per layer)
  uint64_t frozen_bytes = 0;      // of which a LoRA job's frozen base
  uint64_t staging_min_bytes = 0; // the smallest pool that holds the largest layer
  uint64_t guard_bytes = 0;       // what the guard will hold (plan of update_pipeline.h)
  int64_t undo_layers = 0;        // layers with an undo copy (the rest deferred)
  bool guard_carved = false;      // guard_bytes taken out of host_bytes
  uint64_t grad_slot_bytes = 0;   // all workers' gradient segments
  uint64_t store_host_bytes = 0;  // the ParamStore's budget (host_bytes - carved guard; 0 = unlimited)
  uint64_t spill_bytes = 0;       // state that must live on SSD (at least)
  uint64_t ram_bytes = 0;         // RAM the daemon holds at most
  size_t pipeline_undo_budget = SIZE_MAX;  // UpdatePipeline's undo_budget_bytes
  // The per-buffer arithmetic, one line ("state 7615616512 params x 12 B = ...").
  std::string Describe() const;
};

Result<HostBudget> PlanHostBudget(const HostBudgetInputs& in);

// The host's physical memory (sysconf), 0 when unknown.
uint64_t PhysicalMemoryBytes();
// Free bytes of the filesystem holding `dir` (statvfs), 0 when it cannot be read.
uint64_t FreeDiskBytes(const std::string& dir);

}  // namespace l2l::eps
