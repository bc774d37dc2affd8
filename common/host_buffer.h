// AlignedBuffer<T>: one owner of a heap array of T aligned to 64 bytes (a cache line,
// enough for AVX-512 loads) or to a page (for O_DIRECT I/O and cudaHostRegister).
// Move-only; built by Create(), which reports allocation failure as a Status instead of
// throwing. Holds trivially copyable T only (floats, uint16_t, bytes): elements are not
// constructed or destroyed, just zero-filled on request.
//
// Thread-safety: none of its own; share the data under the caller's synchronisation.
#pragma once

#include <cstddef>
#include <span>
#include <type_traits>
#include <utility>

#include "common/status.h"

namespace l2l {

inline constexpr size_t kCacheLineAlign = 64;
inline constexpr size_t kPageAlign = 4096;

namespace internal {
// Allocates `bytes` (rounded up to a multiple of `alignment`) aligned to `alignment` (a
// power of two >= sizeof(void*)); zero-fills when asked. bytes == 0 yields nullptr.
Result<void*> AlignedAlloc(size_t bytes, size_t alignment, bool zero);
void AlignedFree(void* p);
}  // namespace internal

template <typename T>
class AlignedBuffer {
  static_assert(std::is_trivially_copyable_v<T>, "AlignedBuffer holds trivially copyable types only");

 public:
  AlignedBuffer() = default;
  // `count` elements of T; contents are uninitialised unless zero is true.
  static Result<AlignedBuffer> Create(size_t count, size_t alignment = kCacheLineAlign, bool zero = false) {
    if (count > static_cast<size_t>(-1) / sizeof(T)) {
      return ResourceExhausted("AlignedBuffer: " + std::to_string(count) + " elements overflow size_t");
    }
    L2L_ASSIGN_OR_RETURN(void* p, internal::AlignedAlloc(count * sizeof(T), alignment, zero));
    return AlignedBuffer(static_cast<T*>(p), count);
  }

  AlignedBuffer(AlignedBuffer&& o) noexcept : data_(std::exchange(o.data_, nullptr)), size_(std::exchange(o.size_, 0)) {}
  AlignedBuffer& operator=(AlignedBuffer&& o) noexcept {
    if (this != &o) {
      internal::AlignedFree(data_);
      data_ = std::exchange(o.data_, nullptr);
      size_ = std::exchange(o.size_, 0);
    }
    return *this;
  }
  AlignedBuffer(const AlignedBuffer&) = delete;
  AlignedBuffer& operator=(const AlignedBuffer&) = delete;
  ~AlignedBuffer() { internal::AlignedFree(data_); }

  T* data() { return data_; }
  const T* data() const { return data_; }
  size_t size() const { return size_; }
  size_t bytes() const { return size_ * sizeof(T); }
  bool empty() const { return size_ == 0; }
  T& operator[](size_t i) { return data_[i]; }
  const T& operator[](size_t i) const { return data_[i]; }
  T* begin() { return data_; }
  T* end() { return data_ + size_; }
  const T* begin() const { return data_; }
  const T* end() const { return data_ + size_; }
  std::span<T> span() { return {data_, size_}; }
  std::span<const T> span() const { return {data_, size_}; }

 private:
  AlignedBuffer(T* data, size_t size) : data_(data), size_(size) {}
  T* data_ = nullptr;
  size_t size_ = 0;
};

}  // namespace l2l
