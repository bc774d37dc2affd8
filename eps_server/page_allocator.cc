// Fixed-size page allocator. See page_allocator.h.
#include "eps_server/page_allocator.h"

#include <sys/mman.h>

#include <cerrno>
#include <cstring>
#include <string>

namespace l2l::eps {

PageAllocator::PageAllocator(size_t page_bytes, size_t budget_bytes)
    : page_bytes_(page_bytes), budget_bytes_(budget_bytes) {
  L2L_CHECK(page_bytes > 0 && page_bytes % 4096 == 0) << "page_bytes=" << page_bytes;
}

PageAllocator::~PageAllocator() {
  std::lock_guard<std::mutex> lock(mu_);
  for (void* p : free_) munmap(p, page_bytes_);
  // Pages still in use belong to owners that outlive us only through a bug; leak them
  // rather than unmap memory someone may still touch.
}

Result<void*> PageAllocator::Allocate() {
  std::lock_guard<std::mutex> lock(mu_);
  if (!free_.empty()) {
    void* p = free_.back();
    free_.pop_back();
    std::memset(p, 0, page_bytes_);
    ++in_use_;
    return p;
  }
  if (budget_bytes_ > 0 && mapped_ + page_bytes_ > budget_bytes_) {
    return ResourceExhausted("page allocator: budget of " + std::to_string(budget_bytes_) +
                             " bytes (memory.host_bytes) exhausted: " + std::to_string(in_use_) +
                             " pages of " + std::to_string(page_bytes_) + " bytes in use");
  }
  void* p = mmap(nullptr, page_bytes_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) return ErrnoError("mmap", "page of " + std::to_string(page_bytes_) + " bytes", errno);
  ++in_use_;
  mapped_ += page_bytes_;
  return p;
}

void PageAllocator::Free(void* page) {
  if (page == nullptr) return;
  std::lock_guard<std::mutex> lock(mu_);
  L2L_CHECK(in_use_ > 0) << "PageAllocator::Free with no page in use";
  --in_use_;
  free_.push_back(page);
}

size_t PageAllocator::pages_in_use() const {
  std::lock_guard<std::mutex> lock(mu_);
  return in_use_;
}

size_t PageAllocator::bytes_mapped() const {
  std::lock_guard<std::mutex> lock(mu_);
  return mapped_;
}

}  // namespace l2l::eps
