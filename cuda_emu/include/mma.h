// Emulated <mma.h> (cuda_emu): the warp matrix (WMMA) API of nvcuda::wmma for 16x16x16
// tiles -- fragment<matrix_a | matrix_b | accumulator, 16, 16, 16, T, layout>,
// fill_fragment, load_matrix_sync, store_matrix_sync, mma_sync -- with T = __nv_bfloat16
// (inputs) and float (accumulator), what kernels/cuda/flash_attention.cu uses.
//
// CUDA leaves the fragment's distribution over the lanes unspecified; here every lane
// holds the whole tile, row-major in its logical (row, column) order (num_elements =
// 256), so code that loops over frag.num_elements / frag.x[] elementwise still works.
// load_matrix_sync reads the layout given by the fragment's template argument (matrix_a /
// matrix_b) or by the layout_t argument (accumulator); mma_sync computes d = a*b + c with
// the products and the sums in fp32 (a bf16 x bf16 product is exact in fp32), summing k
// in order. The *_sync functions are warp-collective as on a GPU: each starts with a
// barrier over the full warp, so a divergent call is reported as the emulator reports a
// divergent __syncwarp. CUDA's pointer (256-bit) and ldm (multiple of 16 bytes) alignment
// rules are checked, as a GPU's result would be undefined otherwise: a violation aborts.
//
// Thread-safety: as the other device functions (only inside a kernel under Launch).
#pragma once

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <type_traits>

#include "cuda_bf16.h"
#include "l2l_cuda_emu_device.h"

namespace nvcuda {
namespace wmma {

struct matrix_a {};
struct matrix_b {};
struct accumulator {};
struct row_major {};
struct col_major {};
enum layout_t { mem_row_major, mem_col_major };

namespace detail {

template <class Use, int M, int N, int K>
struct Shape;
template <int M, int N, int K>
struct Shape<matrix_a, M, N, K> {
  static constexpr int kRows = M, kCols = K;
};
template <int M, int N, int K>
struct Shape<matrix_b, M, N, K> {
  static constexpr int kRows = K, kCols = N;
};
template <int M, int N, int K>
struct Shape<accumulator, M, N, K> {
  static constexpr int kRows = M, kCols = N;
};

inline float ToFloat(float v) { return v; }
inline float ToFloat(__nv_bfloat16 v) { return __bfloat162float(v); }
template <class T>
T FromFloat(float v) {
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    return __float2bfloat16_rn(v);
  } else {
    return v;
  }
}

inline void Collective(const char* what) { ::l2l_cuda_emu::detail::WarpBarrier(0xffffffffu, what); }

template <class T>
void CheckAlign(const T* p, unsigned ldm, const char* what) {
  if (reinterpret_cast<uintptr_t>(p) % 32 != 0 || (ldm * sizeof(T)) % 16 != 0) {
    std::fprintf(stderr, "cuda_emu: %s: pointer %p not 256-bit aligned or ldm %u not a multiple of 16 bytes\n",
                 what, static_cast<const void*>(p), ldm);
    std::abort();
  }
}

}  // namespace detail

template <class Use, int M, int N, int K, class T, class Layout = void>
class fragment {
  static_assert(M == 16 && N == 16 && K == 16, "the emulator's WMMA has the 16x16x16 shape only");
  static_assert(std::is_same_v<T, float> || std::is_same_v<T, __nv_bfloat16>,
                "the emulator's WMMA takes __nv_bfloat16 inputs and float accumulators");

 public:
  using element_type = T;
  using storage_element_type = T;
  static constexpr int kRows = detail::Shape<Use, M, N, K>::kRows;
  static constexpr int kCols = detail::Shape<Use, M, N, K>::kCols;
  static constexpr int num_elements = kRows * kCols;
  T x[num_elements];
};

template <class Use, int M, int N, int K, class T, class Layout>
void fill_fragment(fragment<Use, M, N, K, T, Layout>& f, const T& v) {
  for (int i = 0; i < f.num_elements; ++i) f.x[i] = v;
}
// A float fill of a bf16 fragment (CUDA converts through its storage type as well).
template <class Use, int M, int N, int K, class Layout>
void fill_fragment(fragment<Use, M, N, K, __nv_bfloat16, Layout>& f, float v) {
  const __nv_bfloat16 b = __float2bfloat16_rn(v);
  for (int i = 0; i < f.num_elements; ++i) f.x[i] = b;
}

// matrix_a / matrix_b: the layout is the fragment's.
template <class Use, int M, int N, int K, class T, class Layout>
void load_matrix_sync(fragment<Use, M, N, K, T, Layout>& f, const T* p, unsigned ldm) {
  static_assert(std::is_same_v<Layout, row_major> || std::is_same_v<Layout, col_major>,
                "load_matrix_sync without a layout argument needs a row_major / col_major fragment");
  detail::Collective("wmma::load_matrix_sync");
  detail::CheckAlign(p, ldm, "wmma::load_matrix_sync");
  using F = fragment<Use, M, N, K, T, Layout>;
  for (int r = 0; r < F::kRows; ++r) {
    for (int c = 0; c < F::kCols; ++c) {
      f.x[r * F::kCols + c] = std::is_same_v<Layout, row_major> ? p[r * ldm + c] : p[c * ldm + r];
    }
  }
}

// accumulator: the layout is the argument.
template <int M, int N, int K, class T>
void load_matrix_sync(fragment<accumulator, M, N, K, T>& f, const T* p, unsigned ldm, layout_t layout) {
  detail::Collective("wmma::load_matrix_sync");
  detail::CheckAlign(p, ldm, "wmma::load_matrix_sync");
  for (int r = 0; r < M; ++r) {
    for (int c = 0; c < N; ++c) f.x[r * N + c] = layout == mem_row_major ? p[r * ldm + c] : p[c * ldm + r];
  }
}

template <int M, int N, int K, class T>
void store_matrix_sync(T* p, const fragment<accumulator, M, N, K, T>& f, unsigned ldm, layout_t layout) {
  detail::Collective("wmma::store_matrix_sync");
  detail::CheckAlign(p, ldm, "wmma::store_matrix_sync");
  for (int r = 0; r < M; ++r) {
    for (int c = 0; c < N; ++c) {
      (layout == mem_row_major ? p[r * ldm + c] : p[c * ldm + r]) = f.x[r * N + c];
    }
  }
  detail::Collective("wmma::store_matrix_sync");  // every lane has written before any reads
}

// d = a * b + c (d may be c).
template <int M, int N, int K, class TA, class LA, class LB, class TC>
void mma_sync(fragment<accumulator, M, N, K, TC>& d, const fragment<matrix_a, M, N, K, TA, LA>& a,
              const fragment<matrix_b, M, N, K, TA, LB>& b, const fragment<accumulator, M, N, K, TC>& c) {
  detail::Collective("wmma::mma_sync");
  float out[M * N];
  for (int i = 0; i < M; ++i) {
    for (int j = 0; j < N; ++j) {
      float acc = detail::ToFloat(c.x[i * N + j]);
      for (int k = 0; k < K; ++k) acc += detail::ToFloat(a.x[i * K + k]) * detail::ToFloat(b.x[k * N + j]);
      out[i * N + j] = acc;
    }
  }
  for (int i = 0; i < M * N; ++i) d.x[i] = detail::FromFloat<TC>(out[i]);
}

}  // namespace wmma
}  // namespace nvcuda
