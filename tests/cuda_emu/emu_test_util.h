// Test helpers shared by the emulator's own tests (cublaslt_test_util.h, cub_bf16_test.cc):
// an owned device allocation, host<->device copies that REQUIRE success, an owned stream.
// Ownership: DevMem and Stream own what they create (RAII). Thread-safety: test-only.
#pragma once

#include <cuda_runtime.h>

#include <catch2/catch.hpp>

#include <cstddef>
#include <vector>

namespace emu_test {

struct DevMem {
  void* p = nullptr;
  size_t bytes = 0;
  explicit DevMem(size_t b) : bytes(b) { REQUIRE(cudaMalloc(&p, b) == cudaSuccess); }
  ~DevMem() { (void)cudaFree(p); }
  DevMem(const DevMem&) = delete;
  DevMem& operator=(const DevMem&) = delete;
  template <class T>
  T* as() const {
    return static_cast<T*>(p);
  }
};

template <class T>
inline void Put(void* dst, const std::vector<T>& h) {
  REQUIRE(cudaMemcpy(dst, h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice) == cudaSuccess);
}

template <class T>
std::vector<T> Get(const void* src, size_t n) {
  std::vector<T> h(n);
  REQUIRE(cudaMemcpy(h.data(), src, n * sizeof(T), cudaMemcpyDeviceToHost) == cudaSuccess);
  return h;
}

struct Stream {
  cudaStream_t s = nullptr;
  Stream() { REQUIRE(cudaStreamCreate(&s) == cudaSuccess); }
  ~Stream() { (void)cudaStreamDestroy(s); }
  void Sync() const { REQUIRE(cudaStreamSynchronize(s) == cudaSuccess); }
};

}  // namespace emu_test
