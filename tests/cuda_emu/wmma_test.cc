// The emulator's WMMA API (cuda_emu/include/mma.h) against a plain host product: every
// combination of matrix_a / matrix_b layouts, accumulator load and store in both memory
// layouts, chained mma_sync over K = 32 (two 16-deep steps), and elementwise access through
// frag.num_elements / frag.x[]. Inputs are bf16 values; the host sums the exact products
// in double, so the only difference is the fp32 sum (tolerance 1e-5 relative to sum |a b|).
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <mma.h>

#include <catch2/catch.hpp>

#include <cmath>
#include <random>
#include <vector>

#include "tests/cuda_emu/emu_test_util.h"

#define EMU_LAUNCH(kernel, grid, block, smem, stream) \
  ::l2l_cuda_emu::Launch(kernel, #kernel, grid, block, smem, stream)

namespace {

namespace wmma = nvcuda::wmma;

// d (16x16, layout d_layout, ld 16) = a (16x32) * b (32x16) + c (16x16 row-major) + 1,
// with a and b stored in the given layouts (ld: 32 for a row-major, 16 col-major; b
// row-major ld 16, col-major ld 32). One warp; the "+ 1" goes through frag.x[].
template <class LA, class LB>
__global__ void MmaKernel(float* d, const __nv_bfloat16* a, const __nv_bfloat16* b, const float* c,
                          int d_col_major) {
  constexpr bool kARow = std::is_same_v<LA, wmma::row_major>;
  constexpr bool kBRow = std::is_same_v<LB, wmma::row_major>;
  wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc;
  wmma::load_matrix_sync(acc, c, 16, wmma::mem_row_major);
  for (int k0 = 0; k0 < 32; k0 += 16) {
    wmma::fragment<wmma::matrix_a, 16, 16, 16, __nv_bfloat16, LA> fa;
    wmma::fragment<wmma::matrix_b, 16, 16, 16, __nv_bfloat16, LB> fb;
    wmma::load_matrix_sync(fa, kARow ? a + k0 : a + k0 * 16, kARow ? 32 : 16);
    wmma::load_matrix_sync(fb, kBRow ? b + k0 * 16 : b + k0, kBRow ? 16 : 32);
    wmma::mma_sync(acc, fa, fb, acc);
  }
  for (int i = 0; i < acc.num_elements; ++i) acc.x[i] += 1.0f;
  wmma::store_matrix_sync(d, acc, 16, d_col_major ? wmma::mem_col_major : wmma::mem_row_major);
}

// A warp where only lanes 0..15 reach the collective: the launch must fail.
__global__ void DivergentKernel(float* d) {
  if (threadIdx.x < 16) {
    wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc;
    wmma::fill_fragment(acc, 2.0f);
    wmma::store_matrix_sync(d, acc, 16, wmma::mem_row_major);
  }
}

float Bf16Value(std::mt19937& rng) {
  std::uniform_real_distribution<float> u(-2.0f, 2.0f);
  return __bfloat162float(__float2bfloat16_rn(u(rng)));
}

template <class LA, class LB>
void CheckProduct(bool d_col_major) {
  constexpr bool kARow = std::is_same_v<LA, wmma::row_major>;
  constexpr bool kBRow = std::is_same_v<LB, wmma::row_major>;
  CAPTURE(kARow, kBRow, d_col_major);
  std::mt19937 rng(7 + 2 * kARow + kBRow);
  std::vector<float> A(16 * 32), Bm(32 * 16), C(256);  // logical A (16x32), B (32x16), row-major
  for (float& x : A) x = Bf16Value(rng);
  for (float& x : Bm) x = Bf16Value(rng);
  for (float& x : C) x = Bf16Value(rng);
  std::vector<__nv_bfloat16> a(A.size()), b(Bm.size());
  for (int i = 0; i < 16; ++i)
    for (int k = 0; k < 32; ++k) a[kARow ? i * 32 + k : k * 16 + i] = __float2bfloat16_rn(A[i * 32 + k]);
  for (int k = 0; k < 32; ++k)
    for (int j = 0; j < 16; ++j) b[kBRow ? k * 16 + j : j * 32 + k] = __float2bfloat16_rn(Bm[k * 16 + j]);
  emu_test::DevMem da(a.size() * 2), db(b.size() * 2), dc(256 * 4), dd(256 * 4);
  emu_test::Put(da.p, a);
  emu_test::Put(db.p, b);
  emu_test::Put(dc.p, C);
  EMU_LAUNCH((MmaKernel<LA, LB>), dim3(1), dim3(32), 0, nullptr)
  (dd.as<float>(), da.as<__nv_bfloat16>(), db.as<__nv_bfloat16>(), dc.as<float>(), d_col_major ? 1 : 0);
  REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
  const auto got = emu_test::Get<float>(dd.p, 256);
  int bad = 0;
  for (int i = 0; i < 16; ++i) {
    for (int j = 0; j < 16; ++j) {
      double ref = C[i * 16 + j] + 1.0, mag = std::abs(C[i * 16 + j]) + 1.0;
      for (int k = 0; k < 32; ++k) {
        ref += double(A[i * 32 + k]) * Bm[k * 16 + j];
        mag += std::abs(double(A[i * 32 + k]) * Bm[k * 16 + j]);
      }
      const float g = got[d_col_major ? j * 16 + i : i * 16 + j];
      if (!(std::abs(g - ref) <= 1e-5 * mag)) ++bad;
    }
  }
  CHECK(bad == 0);
}

TEST_CASE("wmma bf16 16x16x16 products equal the host product in every layout", "[cuda_emu]") {
  for (bool d_col : {false, true}) {
    CheckProduct<wmma::row_major, wmma::row_major>(d_col);
    CheckProduct<wmma::row_major, wmma::col_major>(d_col);
    CheckProduct<wmma::col_major, wmma::row_major>(d_col);
    CheckProduct<wmma::col_major, wmma::col_major>(d_col);
  }
}

TEST_CASE("wmma fragments expose num_elements and x[] and fill_fragment fills them", "[cuda_emu]") {
  wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc;
  wmma::fill_fragment(acc, 3.0f);
  REQUIRE(acc.num_elements >= 8);
  for (int i = 0; i < acc.num_elements; ++i) CHECK(acc.x[i] == 3.0f);
  wmma::fragment<wmma::matrix_a, 16, 16, 16, __nv_bfloat16, wmma::row_major> fa;
  wmma::fill_fragment(fa, __float2bfloat16_rn(0.5f));
  for (int i = 0; i < fa.num_elements; ++i) CHECK(__bfloat162float(fa.x[i]) == 0.5f);
}

TEST_CASE("a wmma collective reached by half a warp fails the launch", "[cuda_emu]") {
  emu_test::DevMem dd(256 * 4);
  {
    emu_test::Stream s;
    EMU_LAUNCH(DivergentKernel, dim3(1), dim3(32), 0, s.s)(dd.as<float>());
    CHECK(cudaStreamSynchronize(s.s) == cudaErrorLaunchFailure);
  }
  l2l_cuda_emu::ClearStickyErrorForTesting();
}

}  // namespace
