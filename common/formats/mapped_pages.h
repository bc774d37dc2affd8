// ReleaseMappedPages: after a tensor of a read-only file mapping has been converted, drop
// its pages from this process's resident set (madvise MADV_DONTNEED; later reads fault
// them back in from the file). Keeps an importer's RSS at about one tensor however large
// the model file is. Only for read-only file mappings (MappedFile): there it never loses
// data. Failures are ignored: the pages then stay cached, which is only memory.
//
// Thread-safety: safe from any thread; concurrent readers of the same pages fault them in again.
#pragma once

#include <sys/mman.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>

namespace l2l::formats {

inline void ReleaseMappedPages(const uint8_t* p, size_t n) {
  static const uintptr_t page = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
  if (n == 0) return;
  const uintptr_t begin = reinterpret_cast<uintptr_t>(p) & ~(page - 1);
  const uintptr_t end = reinterpret_cast<uintptr_t>(p) + n;
  ::madvise(reinterpret_cast<void*>(begin), end - begin, MADV_DONTNEED);
}

}  // namespace l2l::formats
