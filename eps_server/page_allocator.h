// PageAllocator: the EPS's fixed-size pages for fp32 master weights and AdamW moments
// (all optimizer state lives in equal pages, so the store can
// move any page between RAM and SSD without fragmentation). Pages are page_bytes
// (default 4 MiB, a multiple of 4096), 4096-aligned, zero-filled on allocation, taken
// from the OS with mmap and reused through a free list. The allocator enforces a byte
// budget (memory.host_bytes): Allocate fails with RESOURCE_EXHAUSTED, naming the
// numbers, rather than letting the kernel kill the daemon.
//
// Ownership: the allocator owns every page it handed out; Free returns one to the free
// list; the destructor unmaps all. Thread-safety: all methods are thread-safe (mutex).
#pragma once

#include <cstddef>
#include <cstdint>
#include <mutex>
#include <vector>

#include "common/status.h"
#include "common/thread_annotations.h"

namespace l2l::eps {

inline constexpr size_t kDefaultPageBytes = size_t{4} << 20;

class PageAllocator {
 public:
  // REQUIRES: page_bytes is a positive multiple of 4096. budget_bytes 0 = unlimited.
  PageAllocator(size_t page_bytes, size_t budget_bytes);
  ~PageAllocator();
  PageAllocator(const PageAllocator&) = delete;
  PageAllocator& operator=(const PageAllocator&) = delete;

  // A zero-filled page of page_bytes().
  Result<void*> Allocate();
  void Free(void* page);

  size_t page_bytes() const { return page_bytes_; }
  size_t budget_bytes() const { return budget_bytes_; }
  size_t pages_in_use() const;
  size_t bytes_mapped() const;  // in use + free list

 private:
  const size_t page_bytes_;
  const size_t budget_bytes_;
  mutable std::mutex mu_;
  std::vector<void*> free_ GUARDED_BY(mu_);
  size_t in_use_ GUARDED_BY(mu_) = 0;
  size_t mapped_ GUARDED_BY(mu_) = 0;
};

}  // namespace l2l::eps
