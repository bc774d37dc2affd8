// Aligned heap allocation behind AlignedBuffer<T>. See common/host_buffer.h.
//
// Thread-safety: malloc's.
#include "common/host_buffer.h"

#include <cstdlib>
#include <cstring>
#include <string>

namespace l2l::internal {

Result<void*> AlignedAlloc(size_t bytes, size_t alignment, bool zero) {
  if (alignment < sizeof(void*) || (alignment & (alignment - 1)) != 0) {
    return InvalidArgument("AlignedBuffer: alignment " + std::to_string(alignment) +
                           " is not a power of two >= " + std::to_string(sizeof(void*)));
  }
  if (bytes == 0) return static_cast<void*>(nullptr);
  if (bytes > static_cast<size_t>(-1) - alignment) {
    return ResourceExhausted("AlignedBuffer: " + std::to_string(bytes) + " bytes is too large");
  }
  const size_t rounded = (bytes + alignment - 1) / alignment * alignment;
  void* p = nullptr;
  const int err = posix_memalign(&p, alignment, rounded);
  if (err != 0 || p == nullptr) {
    return ResourceExhausted("AlignedBuffer: cannot allocate " + std::to_string(rounded) + " bytes (aligned to " +
                             std::to_string(alignment) + "): " + std::strerror(err));
  }
  if (zero) std::memset(p, 0, rounded);
  return p;
}

void AlignedFree(void* p) { std::free(p); }

}  // namespace l2l::internal
