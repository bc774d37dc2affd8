// Fused attention kernels (FlashAttention-2 style): forward with online softmax, the
// D = rowsum(dO * O) pass, and the dK/dV and dQ passes of the backward. What and why:
// flash_attention.h.
#include "kernels/cuda/flash_attention.h"

#include <cuda_bf16.h>
#include <mma.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <type_traits>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/cuda_common.cuh"

namespace l2l::kernels::cuda {
namespace {

constexpr int kTile = 16;  // query rows and keys per tile (the WMMA shape)
constexpr int kFlashThreads = 128;
constexpr int kWarps = kFlashThreads / 32;

template <bool kBf16>
using In = std::conditional_t<kBf16, __nv_bfloat16, float>;

template <class T>
__device__ __forceinline__ T ToIn(float v) {
  if constexpr (std::is_same_v<T, float>) {
    return v;
  } else {
    return __float2bfloat16_rn(v);
  }
}

struct Params {
  const float* qkv;
  int64_t T, NH, NKV, W, window;
  const int32_t* key_mask;
  float scale;
  bool causal;
};

// Whether query t sees key j (both < T).
__device__ __forceinline__ bool Allowed(const Params& p, int64_t b, int64_t t, int64_t j) {
  if (t >= p.T || j >= p.T) return false;
  if (p.causal) return j <= t && (p.window <= 0 || j > t - p.window);
  return p.key_mask == nullptr || p.key_mask[b * p.T + j] != 0;
}

// Whether any query of [i0, i0+16) sees any key of [j0, j0+16) (block-uniform).
__device__ __forceinline__ bool TileLive(const Params& p, int64_t i0, int64_t j0) {
  if (!p.causal) return true;
  if (j0 > i0 + kTile - 1) return false;
  return p.window <= 0 || j0 + kTile - 1 > i0 - p.window;
}

// dst (16 x HD) = rows row0.. of src (row stride ld), zero past T, rounded to T's type.
template <int HD, class T>
__device__ void LoadTile(T* dst, const float* src, int64_t ld, int64_t row0, int64_t rows) {
  for (int e = threadIdx.x; e < kTile * HD; e += kFlashThreads) {
    const int64_t row = row0 + e / HD;
    dst[e] = ToIn<T>(row < rows ? src[row * ld + e % HD] : 0.0f);
  }
}

// c (16 x N floats, row stride ldc) = A (16 x K) * B (K x N). A row-major: A(i,k) =
// a[i*lda + k], col-major: a[k*lda + i]; B row-major: B(k,j) = b[k*ldb + j], col-major:
// b[j*ldb + k]. fp32: one FMA dot product per element; bf16: WMMA, one warp per 16
// columns. The caller syncs before reading c.
template <int N, int K, bool kARow, bool kBRow, class T>
__device__ void TileProduct(float* c, int ldc, const T* a, int lda, const T* b, int ldb) {
  if constexpr (std::is_same_v<T, float>) {
    for (int e = threadIdx.x; e < kTile * N; e += kFlashThreads) {
      const int i = e / N, j = e % N;
      float acc = 0.0f;
      for (int k = 0; k < K; ++k) {
        const float av = kARow ? a[i * lda + k] : a[k * lda + i];
        const float bv = kBRow ? b[k * ldb + j] : b[j * ldb + k];
        acc = fmaf(av, bv, acc);
      }
      c[i * ldc + j] = acc;
    }
  } else {
    namespace wmma = nvcuda::wmma;
    using LA = std::conditional_t<kARow, wmma::row_major, wmma::col_major>;
    using LB = std::conditional_t<kBRow, wmma::row_major, wmma::col_major>;
    const int warp = threadIdx.x / 32;
    for (int n = warp; n < N / 16; n += kWarps) {  // warp-uniform
      wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc;
      wmma::fill_fragment(acc, 0.0f);
      for (int k0 = 0; k0 < K; k0 += 16) {
        wmma::fragment<wmma::matrix_a, 16, 16, 16, __nv_bfloat16, LA> fa;
        wmma::fragment<wmma::matrix_b, 16, 16, 16, __nv_bfloat16, LB> fb;
        wmma::load_matrix_sync(fa, kARow ? a + k0 : a + k0 * lda, lda);
        wmma::load_matrix_sync(fb, kBRow ? b + k0 * ldb + n * 16 : b + n * 16 * ldb + k0, ldb);
        wmma::mma_sync(acc, fa, fb, acc);
      }
      wmma::store_matrix_sync(c + n * 16, acc, ldc, wmma::mem_row_major);
    }
  }
}

template <int HD, bool kBf16>
struct FwdSmem {
  alignas(32) In<kBf16> q[kTile * HD];
  alignas(32) In<kBf16> k[kTile * HD];
  alignas(32) In<kBf16> v[kTile * HD];
  alignas(32) float s[kTile * kTile];
  alignas(32) In<kBf16> p[kTile * kTile];
  alignas(32) float c[kTile * HD];
  float m[kTile], l[kTile], alpha[kTile];
};

// One block per (16 query rows, head h, batch b). d_rows == nullptr: writes out and lse
// (and out's bf16 bits into out_bits, when given). Otherwise (the backward's first pass)
// recomputes the same output rows and writes d_rows = rowsum(dout * out) instead.
template <int HD, bool kBf16>
__global__ void __launch_bounds__(kFlashThreads)
    FlashForwardKernel(Params p, float* out, float* lse, const float* dout, float* d_rows,
                       __nv_bfloat16* out_bits) {
  using T = In<kBf16>;
  static_assert(sizeof(FwdSmem<HD, kBf16>) <= 48 * 1024, "static shared memory over 48 KiB");
  __shared__ FwdSmem<HD, kBf16> sm;
  constexpr int kPer = kTile * HD / kFlashThreads;
  const int64_t i0 = int64_t{blockIdx.x} * kTile, h = blockIdx.y, b = blockIdx.z;
  const int64_t g = h / (p.NH / p.NKV);
  const float* base = p.qkv + b * p.T * p.W;
  const int tid = threadIdx.x;
  LoadTile<HD>(sm.q, base + h * HD, p.W, i0, p.T);
  if (tid < kTile) {
    sm.m[tid] = -INFINITY;
    sm.l[tid] = 0.0f;
  }
  float o[kPer];
  for (int k = 0; k < kPer; ++k) o[k] = 0.0f;
  const int64_t tiles = (p.T + kTile - 1) / kTile;
  for (int64_t jt = 0; jt < tiles; ++jt) {
    const int64_t j0 = jt * kTile;
    if (!TileLive(p, i0, j0)) continue;
    __syncthreads();  // the previous tile's readers are done
    LoadTile<HD>(sm.k, base + (p.NH + g) * HD, p.W, j0, p.T);
    LoadTile<HD>(sm.v, base + (p.NH + p.NKV + g) * HD, p.W, j0, p.T);
    __syncthreads();
    TileProduct<kTile, HD, true, false>(sm.s, kTile, sm.q, HD, sm.k, HD);  // S = Q K^T
    __syncthreads();
    if (tid < kTile) {  // online softmax of row tid
      const int r = tid;
      const int64_t t = i0 + r;
      float sv[kTile];
      float mx = sm.m[r];
      for (int j = 0; j < kTile; ++j) {
        sv[j] = Allowed(p, b, t, j0 + j) ? sm.s[r * kTile + j] * p.scale : -INFINITY;
        mx = fmaxf(mx, sv[j]);
      }
      const float alpha = mx == -INFINITY ? 1.0f : expf(sm.m[r] - mx);
      float sum = 0.0f;
      for (int j = 0; j < kTile; ++j) {
        const float e = sv[j] == -INFINITY ? 0.0f : expf(sv[j] - mx);
        sum += e;
        sm.p[r * kTile + j] = ToIn<T>(e);
      }
      sm.l[r] = sm.l[r] * alpha + sum;
      sm.m[r] = mx;
      sm.alpha[r] = alpha;
    }
    __syncthreads();
    TileProduct<HD, kTile, true, true>(sm.c, HD, sm.p, kTile, sm.v, HD);  // P V
    __syncthreads();
    for (int k = 0; k < kPer; ++k) {
      const int e = tid + k * kFlashThreads;
      o[k] = o[k] * sm.alpha[e / HD] + sm.c[e];
    }
  }
  __syncthreads();
  const int64_t ld = p.NH * HD;
  for (int k = 0; k < kPer; ++k) {
    const int e = tid + k * kFlashThreads;
    const int r = e / HD, d = e % HD;
    const int64_t t = i0 + r;
    const float l = sm.l[r];
    const float val = l > 0.0f ? o[k] / l : 0.0f;
    if (d_rows == nullptr) {
      if (t < p.T) {
        out[(b * p.T + t) * ld + h * HD + d] = val;
        if (out_bits != nullptr) out_bits[(b * p.T + t) * ld + h * HD + d] = __float2bfloat16_rn(val);
      }
    } else {
      sm.c[e] = t < p.T ? val * dout[(b * p.T + t) * ld + h * HD + d] : 0.0f;
    }
  }
  if (d_rows == nullptr) {
    if (tid < kTile && i0 + tid < p.T) {
      const float l = sm.l[tid];
      lse[(b * p.NH + h) * p.T + i0 + tid] = l > 0.0f ? sm.m[tid] + logf(l) : INFINITY;
    }
  } else {
    __syncthreads();
    if (tid < kTile && i0 + tid < p.T) {
      float sum = 0.0f;
      for (int d = 0; d < HD; ++d) sum += sm.c[tid * HD + d];
      d_rows[(b * p.NH + h) * p.T + i0 + tid] = sum;
    }
  }
}

template <int HD, bool kBf16>
struct BwdSmem {
  alignas(32) In<kBf16> q[kTile * HD];
  alignas(32) In<kBf16> dout[kTile * HD];
  alignas(32) In<kBf16> k[kTile * HD];
  alignas(32) In<kBf16> v[kTile * HD];
  alignas(32) float s[kTile * kTile];
  alignas(32) float dp[kTile * kTile];
  alignas(32) In<kBf16> p[kTile * kTile];
  alignas(32) In<kBf16> ds[kTile * kTile];
  alignas(32) float c[kTile * HD];
  float lse[kTile], d[kTile];
};

struct BwdArgs {
  const float* dout;
  const float* lse;
  const float* d_rows;
  float* dqkv;
  __nv_bfloat16* dqkv_bits;  // or null: dqkv's final values as bf16 too
};

// dqkv[i] += g (each element has one writer), and its bf16 bits when asked.
__device__ inline void AddGradient(const BwdArgs& a, int64_t i, float g) {
  const float v = a.dqkv[i] + g;
  a.dqkv[i] = v;
  if (a.dqkv_bits != nullptr) a.dqkv_bits[i] = __float2bfloat16_rn(v);
}

// Loads the query-side tiles of head h, rows i0..: q, dout, lse, D.
template <int HD, bool kBf16>
__device__ void LoadQuerySide(const Params& p, const BwdArgs& a, BwdSmem<HD, kBf16>& sm, int64_t b,
                              int64_t h, int64_t i0) {
  LoadTile<HD>(sm.q, p.qkv + b * p.T * p.W + h * HD, p.W, i0, p.T);
  LoadTile<HD>(sm.dout, a.dout + b * p.T * p.NH * HD + h * HD, p.NH * HD, i0, p.T);
  if (threadIdx.x < kTile) {
    const int64_t t = i0 + threadIdx.x;
    sm.lse[threadIdx.x] = t < p.T ? a.lse[(b * p.NH + h) * p.T + t] : INFINITY;
    sm.d[threadIdx.x] = t < p.T ? a.d_rows[(b * p.NH + h) * p.T + t] : 0.0f;
  }
}

// With q, dout, lse, D, k, v loaded (and synced): p = P tile, ds = P * (dP - D) (the
// gradient of the scaled scores, before the scale). Ends synced.
template <int HD, bool kBf16>
__device__ void PairTile(const Params& p, BwdSmem<HD, kBf16>& sm, int64_t b, int64_t i0, int64_t j0) {
  TileProduct<kTile, HD, true, false>(sm.s, kTile, sm.q, HD, sm.k, HD);      // S = Q K^T
  TileProduct<kTile, HD, true, false>(sm.dp, kTile, sm.dout, HD, sm.v, HD);  // dP = dO V^T
  __syncthreads();
  for (int e = threadIdx.x; e < kTile * kTile; e += kFlashThreads) {
    const int r = e / kTile, j = e % kTile;
    const float pv = Allowed(p, b, i0 + r, j0 + j) ? expf(sm.s[e] * p.scale - sm.lse[r]) : 0.0f;
    sm.p[e] = ToIn<In<kBf16>>(pv);
    sm.ds[e] = ToIn<In<kBf16>>(pv * (sm.dp[e] - sm.d[r]));
  }
  __syncthreads();
}

// One block per (16 keys, key/value head g, batch b): dK, dV over the group's query heads.
template <int HD, bool kBf16>
__global__ void __launch_bounds__(kFlashThreads) FlashBackwardKvKernel(Params p, BwdArgs a) {
  static_assert(sizeof(BwdSmem<HD, kBf16>) <= 48 * 1024, "static shared memory over 48 KiB");
  __shared__ BwdSmem<HD, kBf16> sm;
  constexpr int kPer = kTile * HD / kFlashThreads;
  const int64_t j0 = int64_t{blockIdx.x} * kTile, g = blockIdx.y, b = blockIdx.z;
  const int64_t rep = p.NH / p.NKV;
  const float* base = p.qkv + b * p.T * p.W;
  const int tid = threadIdx.x;
  LoadTile<HD>(sm.k, base + (p.NH + g) * HD, p.W, j0, p.T);
  LoadTile<HD>(sm.v, base + (p.NH + p.NKV + g) * HD, p.W, j0, p.T);
  float dk[kPer], dv[kPer];
  for (int k = 0; k < kPer; ++k) dk[k] = dv[k] = 0.0f;
  const int64_t tiles = (p.T + kTile - 1) / kTile;
  for (int64_t r = 0; r < rep; ++r) {
    const int64_t h = g * rep + r;
    for (int64_t it = 0; it < tiles; ++it) {
      const int64_t i0 = it * kTile;
      if (!TileLive(p, i0, j0)) continue;
      __syncthreads();
      LoadQuerySide(p, a, sm, b, h, i0);
      __syncthreads();
      PairTile(p, sm, b, i0, j0);
      TileProduct<HD, kTile, false, true>(sm.c, HD, sm.p, kTile, sm.dout, HD);  // P^T dO
      __syncthreads();
      for (int k = 0; k < kPer; ++k) dv[k] += sm.c[tid + k * kFlashThreads];
      __syncthreads();
      TileProduct<HD, kTile, false, true>(sm.c, HD, sm.ds, kTile, sm.q, HD);  // dS^T Q
      __syncthreads();
      for (int k = 0; k < kPer; ++k) dk[k] += sm.c[tid + k * kFlashThreads] * p.scale;
    }
  }
  const int64_t dbase = b * p.T * p.W;
  for (int k = 0; k < kPer; ++k) {
    const int e = tid + k * kFlashThreads;
    const int64_t row = j0 + e / HD;
    if (row >= p.T) continue;
    AddGradient(a, dbase + row * p.W + (p.NH + g) * HD + e % HD, dk[k]);
    AddGradient(a, dbase + row * p.W + (p.NH + p.NKV + g) * HD + e % HD, dv[k]);
  }
}

// One block per (16 query rows, head h, batch b): dQ over the key tiles.
template <int HD, bool kBf16>
__global__ void __launch_bounds__(kFlashThreads) FlashBackwardQKernel(Params p, BwdArgs a) {
  __shared__ BwdSmem<HD, kBf16> sm;
  constexpr int kPer = kTile * HD / kFlashThreads;
  const int64_t i0 = int64_t{blockIdx.x} * kTile, h = blockIdx.y, b = blockIdx.z;
  const int64_t g = h / (p.NH / p.NKV);
  const float* base = p.qkv + b * p.T * p.W;
  const int tid = threadIdx.x;
  LoadQuerySide(p, a, sm, b, h, i0);
  float dq[kPer];
  for (int k = 0; k < kPer; ++k) dq[k] = 0.0f;
  const int64_t tiles = (p.T + kTile - 1) / kTile;
  for (int64_t jt = 0; jt < tiles; ++jt) {
    const int64_t j0 = jt * kTile;
    if (!TileLive(p, i0, j0)) continue;
    __syncthreads();
    LoadTile<HD>(sm.k, base + (p.NH + g) * HD, p.W, j0, p.T);
    LoadTile<HD>(sm.v, base + (p.NH + p.NKV + g) * HD, p.W, j0, p.T);
    __syncthreads();
    PairTile(p, sm, b, i0, j0);
    TileProduct<HD, kTile, true, true>(sm.c, HD, sm.ds, kTile, sm.k, HD);  // dS K
    __syncthreads();
    for (int k = 0; k < kPer; ++k) dq[k] += sm.c[tid + k * kFlashThreads] * p.scale;
  }
  const int64_t dbase = b * p.T * p.W;
  for (int k = 0; k < kPer; ++k) {
    const int e = tid + k * kFlashThreads;
    const int64_t row = i0 + e / HD;
    if (row < p.T) AddGradient(a, dbase + row * p.W + h * HD + e % HD, dq[k]);
  }
}

Params MakeParams(const FlashShape& s, const float* qkv) {
  Params p{};
  p.qkv = qkv;
  p.T = s.T;
  p.NH = s.NH;
  p.NKV = s.NKV;
  p.W = (s.NH + 2 * s.NKV) * s.hs;
  p.window = s.causal ? s.window : 0;
  p.key_mask = s.causal ? nullptr : s.key_mask;
  p.scale = 1.0f / std::sqrt(static_cast<float>(s.hs));
  p.causal = s.causal;
  return p;
}

// Calls f(std::integral_constant<int, HD>, std::bool_constant<bf16>).
template <class F>
void Dispatch(const FlashShape& s, F&& f) {
  auto with = [&](auto hd) {
    if (s.bf16) {
      f(hd, std::true_type{});
    } else {
      f(hd, std::false_type{});
    }
  };
  switch (s.hs) {
    case 64: with(std::integral_constant<int, 64>{}); break;
    case 80: with(std::integral_constant<int, 80>{}); break;
    case 96: with(std::integral_constant<int, 96>{}); break;
    case 128: with(std::integral_constant<int, 128>{}); break;
    default:
      std::fprintf(stderr, "flash attention: head size %lld is not one of 64, 80, 96, 128\n",
                   static_cast<long long>(s.hs));
      std::abort();
  }
}

}  // namespace

bool FlashSupportedHeadSize(int64_t hs) { return hs == 64 || hs == 80 || hs == 96 || hs == 128; }

void FlashAttentionForward(const FlashShape& s, float* out, float* lse, const float* qkv,
                           cudaStream_t stream, uint16_t* out_bits) {
  if (s.B <= 0 || s.T <= 0 || s.NH <= 0) return;
  const Params p = MakeParams(s, qkv);
  const dim3 grid(static_cast<unsigned>((s.T + kTile - 1) / kTile), static_cast<unsigned>(s.NH),
                  static_cast<unsigned>(s.B));
  Dispatch(s, [&](auto hd, auto bf) {
    auto* kernel = &FlashForwardKernel<decltype(hd)::value, decltype(bf)::value>;
    L2L_LAUNCH(kernel, grid, dim3(kFlashThreads), 0, stream)
    (p, out, lse, static_cast<const float*>(nullptr), static_cast<float*>(nullptr),
     reinterpret_cast<__nv_bfloat16*>(out_bits));
    L2L_CUDA_CHECK_LAUNCH();
  });
}

void FlashAttentionBackward(const FlashShape& s, float* dqkv, float* d_rows, const float* dout,
                            const float* qkv, const float* lse, cudaStream_t stream, uint16_t* dqkv_bits) {
  if (s.B <= 0 || s.T <= 0 || s.NH <= 0) return;
  const Params p = MakeParams(s, qkv);
  const unsigned tiles = static_cast<unsigned>((s.T + kTile - 1) / kTile);
  const BwdArgs a{dout, lse, d_rows, dqkv, reinterpret_cast<__nv_bfloat16*>(dqkv_bits)};
  Dispatch(s, [&](auto hd, auto bf) {
    constexpr int HD = decltype(hd)::value;
    constexpr bool kBf16 = decltype(bf)::value;
    auto* d_pass = &FlashForwardKernel<HD, kBf16>;
    L2L_LAUNCH(d_pass, dim3(tiles, static_cast<unsigned>(s.NH), static_cast<unsigned>(s.B)),
               dim3(kFlashThreads), 0, stream)
    (p, static_cast<float*>(nullptr), static_cast<float*>(nullptr), dout, d_rows,
     static_cast<__nv_bfloat16*>(nullptr));
    L2L_CUDA_CHECK_LAUNCH();
    auto* kv_pass = &FlashBackwardKvKernel<HD, kBf16>;
    L2L_LAUNCH(kv_pass, dim3(tiles, static_cast<unsigned>(s.NKV), static_cast<unsigned>(s.B)),
               dim3(kFlashThreads), 0, stream)
    (p, a);
    L2L_CUDA_CHECK_LAUNCH();
    auto* q_pass = &FlashBackwardQKernel<HD, kBf16>;
    L2L_LAUNCH(q_pass, dim3(tiles, static_cast<unsigned>(s.NH), static_cast<unsigned>(s.B)),
               dim3(kFlashThreads), 0, stream)
    (p, a);
    L2L_CUDA_CHECK_LAUNCH();
  });
}

}  // namespace l2l::kernels::cuda
