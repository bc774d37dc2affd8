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
    if (n <= 0) return nullptr;
    const auto at = reinterpret_cast<uintptr_t>(src);
    for (const Copy& c : copies_) {
      const auto base = reinterpret_cast<uintptr_t>(c.f32);
      if (at < base || (at - base) % sizeof(float) != 0) continue;
      const auto offset = static_cast<int64_t>((at - base) / sizeof(float));
      if (offset + n <= c.n) return c.bits + offset;
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
