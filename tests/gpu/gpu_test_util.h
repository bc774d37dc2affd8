// Helpers for the GPU tests (label gpu): the CPU reference backend and the CUDA backend
// side by side, "twin" buffers holding the same bytes on both, and the one comparison
// rule |gpu - cpu| <= atol + rtol * |cpu| (ggml test-backend-ops, llm.c validate_result).
//
// No GPU is a FAILURE here, never a skip: this binary is only run by `ctest -L gpu` on a
// GPU host (CI runs `ctest -LE gpu`), and a GPU host without a usable GPU is broken.
// Thread-safety: test-only, single-threaded.
#pragma once

#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "kernels/backend.h"
#include "kernels/cuda/cuda_backend.h"

namespace l2l::gpu_test {

using kernels::Backend;
using kernels::DeviceBuffer;

struct Backends {
  std::unique_ptr<Backend> cpu;
  std::unique_ptr<Backend> gpu;
  std::string gpu_error;  // why gpu is null
};

// The process-wide pair (created once: backend creation costs ~0.5 s on a GPU).
inline Backends& Both() {
  static Backends* b = [] {
    auto* p = new Backends;
    p->cpu = kernels::CreateCpuBackend(0);
    auto gpu = kernels::CreateCudaBackend(0);
    if (gpu.ok()) {
      p->gpu = std::move(gpu).value();
    } else {
      p->gpu_error = gpu.status().ToString();
    }
    return p;
  }();
  INFO("GPU tests need a CUDA GPU (run them with `ctest -L gpu` on a GPU host): "
       << b->gpu_error);
  REQUIRE(b->gpu != nullptr);
  return *b;
}

inline std::vector<float> RandomVec(std::mt19937& rng, size_t n, float lo = -1.0f, float hi = 1.0f) {
  std::uniform_real_distribution<float> d(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) x = d(rng);
  return v;
}

inline std::vector<int32_t> RandomTokens(std::mt19937& rng, size_t n, int32_t V) {
  std::uniform_int_distribution<int32_t> d(0, V - 1);
  std::vector<int32_t> v(n);
  for (int32_t& x : v) x = d(rng);
  return v;
}

// The same bytes on the CPU and the GPU backend.
struct Twin {
  DeviceBuffer cpu, gpu;
  size_t bytes = 0;

  template <typename T>
  static Twin Of(Backends& b, const std::vector<T>& host) {
    Twin t;
    t.bytes = host.size() * sizeof(T);
    auto c = DeviceBuffer::Create(b.cpu.get(), t.bytes);
    auto g = DeviceBuffer::Create(b.gpu.get(), t.bytes);
    REQUIRE(c.ok());
    REQUIRE(g.ok());
    t.cpu = std::move(c).value();
    t.gpu = std::move(g).value();
    b.cpu->CopyToDevice(t.cpu.data(), host.data(), t.bytes);
    b.gpu->CopyToDevice(t.gpu.data(), host.data(), t.bytes);
    return t;
  }
  float* c() const { return cpu.f32(); }
  float* g() const { return gpu.f32(); }
  int32_t* ci() const { return cpu.i32(); }
  int32_t* gi() const { return gpu.i32(); }

  template <typename T = float>
  std::vector<T> FromCpu(Backends& b) const {
    std::vector<T> v(bytes / sizeof(T));
    b.cpu->CopyToHost(v.data(), cpu.data(), bytes);
    return v;
  }
  template <typename T = float>
  std::vector<T> FromGpu(Backends& b) const {
    std::vector<T> v(bytes / sizeof(T));
    b.gpu->CopyToHost(v.data(), gpu.data(), bytes);
    return v;
  }
};

// Every element must satisfy |got - ref| <= atol + rtol * |ref| (NaN fails); one
// assertion reports the count and the worst element.
template <typename G, typename R>
void ExpectClose(const std::vector<G>& got, const std::vector<R>& ref, double atol, double rtol,
                 const std::string& what) {
  REQUIRE(got.size() == ref.size());
  REQUIRE(!got.empty());
  size_t bad = 0, worst = 0;
  double worst_excess = -1e300;
  for (size_t i = 0; i < got.size(); ++i) {
    const double g = double(got[i]), r = double(ref[i]);
    const double excess = std::abs(g - r) - (atol + rtol * std::abs(r));
    if (!(excess <= 0.0)) ++bad;
    if (!(excess <= worst_excess)) {
      worst_excess = excess;
      worst = i;
    }
  }
  std::ostringstream os;
  os << what << ": " << bad << " of " << got.size() << " elements off; worst [" << worst
     << "] gpu " << double(got[worst]) << " cpu " << double(ref[worst]) << " (atol " << atol
     << ", rtol " << rtol << ")";
  INFO(os.str());
  CHECK(bad == 0);
}

// Compares the GPU copy of `t` against the CPU copy.
inline void ExpectTwinClose(Backends& b, const Twin& t, double atol, double rtol,
                            const std::string& what) {
  ExpectClose(t.FromGpu(b), t.FromCpu(b), atol, rtol, what);
}

}  // namespace l2l::gpu_test
