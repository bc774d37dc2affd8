// Bf16Copies: the bf16 copies of fp32 tensors a backend was told of (Backend::NoteBf16Copy:
// a layer published as bf16 whose widening is the fp32 tensor), and where an operand
// extent lies inside one. Shared by the backends whose GEMMs cast operands to bf16 (CUDA,
// the CPU's bf16 mode) and by the test doubles that check those notes. A handful of
// entries at a time (the resident layer slots), so lookups are a linear scan.
// Thread-safety: none; used by the backend's compute thread.
#pragma once

#include <cstdint>
#include <vector>

namespace l2l::kernels {

// The element offset at which [at, at + n) lies inside [base, base + base_n) (fp32
// elements; at a whole element of base), or -1 when it does not.
inline int64_t ElementOffset(const float* base, int64_t base_n, const float* at, int64_t n) {
  const auto a = reinterpret_cast<uintptr_t>(at), b = reinterpret_cast<uintptr_t>(base);
  if (base == nullptr || n <= 0 || a < b || (a - b) % sizeof(float) != 0) return -1;
  const auto offset = static_cast<int64_t>((a - b) / sizeof(float));
  return offset + n <= base_n ? offset : -1;
}

class Bf16Copies {
 public:
  // Noting f32 again replaces its copy.
  void Note(const float* f32, const uint16_t* bits, int64_t n) {
    Forget(f32);
    copies_.push_back({f32, bits, n});
  }
  void Forget(const float* f32) {
    std::erase_if(copies_, [f32](const Copy& c) { return c.f32 == f32; });
  }
  size_t size() const { return copies_.size(); }
  // The bits of elements [src, src + n) when they lie inside one noted copy (element i of
  // src is element i of the result), else null.
  const uint16_t* Find(const float* src, int64_t n) const {
    for (const Copy& c : copies_) {
      const int64_t offset = ElementOffset(c.f32, c.n, src, n);
      if (offset >= 0) return c.bits + offset;
    }
    return nullptr;
  }

 private:
  struct Copy {
    const float* f32;
    const uint16_t* bits;
    int64_t n;
  };
  std::vector<Copy> copies_;
};

}  // namespace l2l::kernels
