// The daemon's start-up host-memory arithmetic. See host_budget.h.
#include "eps_server/host_budget.h"

#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>

#include "eps_server/update_pipeline.h"

namespace l2l::eps {
namespace {

std::string N(uint64_t v) { return std::to_string(v); }
std::string Gb(uint64_t v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f GB", static_cast<double>(v) / 1e9);
  return buf;
}

}  // namespace

std::string HostBudget::Describe() const {
  std::string s = "host budget for " + N(params) + " params: state (fp32 master + m + v, 12 B/param in pages) " +
                  N(state_bytes) + " B (" + Gb(state_bytes) + "); published copies " + N(published_bytes) + " B (" +
                  Gb(published_bytes) + (frozen_bytes > 0 ? ", of which a frozen LoRA base " + N(frozen_bytes) + " B" : "") +
                  "); staging pool >= " + N(staging_min_bytes) + " B; non-finite guard " +
                  N(guard_bytes) + " B (" + Gb(guard_bytes) + ", undo copies for " + N(undo_layers) +
                  " layers at 12 B/param, the rest deferred at 4 B/param; " +
                  (guard_carved ? "inside" : "beside") + " memory.host_bytes); gradient slots " + N(grad_slot_bytes) +
                  " B; store budget " + (store_host_bytes == 0 ? std::string("unlimited") : N(store_host_bytes) + " B") +
                  "; on SSD >= " + N(spill_bytes) + " B (" + Gb(spill_bytes) + "); RAM <= " + N(ram_bytes) + " B (" +
                  Gb(ram_bytes) + ")";
  return s;
}

Result<HostBudget> PlanHostBudget(const HostBudgetInputs& in) {
  if (in.page_bytes == 0) return InvalidArgument("memory.page_bytes must be > 0");
  HostBudget b;
  const uint64_t page_floats = in.page_bytes / sizeof(float);
  uint64_t pages = 0, max_pages = 0, max_numel = 0;
  for (size_t n : in.layer_numel) {
    const uint64_t p = (n + page_floats - 1) / page_floats;
    pages += p;
    max_pages = std::max(max_pages, p);
    max_numel = std::max<uint64_t>(max_numel, n);
    b.params += n;
  }
  b.state_bytes = 3 * pages * in.page_bytes;
  b.frozen_bytes = in.frozen_bytes;
  b.published_bytes = 2 * b.params * DTypeSize(in.publish_dtype) + in.frozen_bytes;
  b.staging_min_bytes = 3 * max_pages * in.page_bytes;
  b.grad_slot_bytes =
      in.shm ? static_cast<uint64_t>(std::max(in.workers, 0)) * std::max(in.grad_slots, 1) * max_numel * 4 : 0;

  const uint64_t min_guard = UpdatePipeline::MinGuardBytes(in.layer_numel);
  if (in.guard_bytes > 0) {
    if (in.guard_bytes < min_guard) {
      return InvalidArgument("memory.guard_bytes=" + N(in.guard_bytes) + " is below the non-finite guard's least need: " +
                             N(b.params) + " params x 4 B (each layer's reduced gradient, held until the step's " +
                             "verdict) = " + N(min_guard) + " B; raise it (12 B/param = " + N(3 * min_guard) +
                             " gives every layer an undo copy) or set 0 (unbounded undo copies)");
    }
    if (in.host_bytes > 0 && in.guard_bytes >= in.host_bytes) {
      return InvalidArgument("memory.guard_bytes=" + N(in.guard_bytes) + " must be below memory.host_bytes=" +
                             N(in.host_bytes) + " (it is taken out of it)");
    }
    b.pipeline_undo_budget = in.guard_bytes;
    b.guard_carved = in.host_bytes > 0;
  }
  b.guard_bytes = UpdatePipeline::GuardBytes(in.layer_numel, b.pipeline_undo_budget, in.global_clip, &b.undo_layers);
  b.store_host_bytes = in.host_bytes == 0 ? 0 : in.host_bytes - (b.guard_carved ? in.guard_bytes : 0);

  // What the store needs in all; beyond its budget it goes to SSD (with the staging pool
  // inside the budget), or is refused.
  const uint64_t store_need = b.state_bytes + b.published_bytes;
  if (b.store_host_bytes > 0 && store_need > b.store_host_bytes) {
    const uint64_t ram_for_state =
        b.store_host_bytes > b.published_bytes + b.staging_min_bytes
            ? b.store_host_bytes - b.published_bytes - b.staging_min_bytes
            : 0;
    b.spill_bytes = b.state_bytes - std::min(b.state_bytes, ram_for_state);
    const std::string sum = "state " + N(b.state_bytes) + " B + published copies " + N(b.published_bytes) +
                            " B = " + N(store_need) + " B (" + Gb(store_need) + ") against memory.host_bytes " +
                            N(in.host_bytes) + (b.guard_carved ? " - memory.guard_bytes " + N(in.guard_bytes) : "") +
                            " = " + N(b.store_host_bytes) + " B";
    if (!in.spill) {
      return ResourceExhausted("the model does not fit: " + sum + "; set spill.dir to keep " + N(b.spill_bytes) +
                               " B or more of it on SSD, raise memory.host_bytes, or use a smaller model");
    }
    if (b.spill_bytes > in.disk_free_bytes) {
      return ResourceExhausted("the model does not fit in RAM + SSD: " + sum + ", so >= " + N(b.spill_bytes) + " B (" +
                               Gb(b.spill_bytes) + ") of state (after the published copies and a staging pool of " +
                               N(b.staging_min_bytes) + " B) must live in spill.dir, which has " +
                               N(in.disk_free_bytes) + " B (" + Gb(in.disk_free_bytes) +
                               ") free; free disk space, raise memory.host_bytes, or lower memory.guard_bytes");
    }
  }
  const uint64_t held = b.store_host_bytes == 0 ? store_need : std::min<uint64_t>(b.store_host_bytes, store_need);
  b.ram_bytes = held + b.guard_bytes + b.grad_slot_bytes;
  if (in.ram_bytes > 0 && b.ram_bytes > in.ram_bytes) {
    return ResourceExhausted(
        "the daemon would hold " + N(b.ram_bytes) + " B (" + Gb(b.ram_bytes) + ") of RAM: store " + N(held) +
        " B + non-finite guard " + N(b.guard_bytes) + " B (" + N(b.undo_layers) + " layers with 12 B/param undo copies" +
        (b.guard_carved ? "" : ", unbounded: memory.guard_bytes is 0") + ") + gradient slots " +
        N(b.grad_slot_bytes) + " B, but the host has " + N(in.ram_bytes) + " B (" + Gb(in.ram_bytes) +
        "); set memory.host_bytes (with spill.dir) and memory.guard_bytes (>= " + N(min_guard) +
        " B, 4 B/param) so they fit");
  }
  return b;
}

uint64_t PhysicalMemoryBytes() {
  const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
  return pages > 0 && page > 0 ? static_cast<uint64_t>(pages) * static_cast<uint64_t>(page) : 0;
}

uint64_t FreeDiskBytes(const std::string& dir) {
  struct statvfs vfs {};
  if (statvfs(dir.c_str(), &vfs) != 0) return 0;
  return static_cast<uint64_t>(vfs.f_bavail) * vfs.f_frsize;
}

}  // namespace l2l::eps
