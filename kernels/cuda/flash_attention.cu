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

// Whether any query of [i0, i0+rows) sees any key of [j0, j0+16).
__device__ __forceinline__ bool TileLive(const Params& p, int64_t i0, int64_t rows, int64_t j0) {
  if (!p.causal) return true;
  if (j0 > i0 + rows - 1) return false;
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

// The forward's block: kWarps warps, each owning 16 query rows (kFwdRows per block); they
// share each 16-key tile of K and V in shared memory, and everything else (S, the online
// softmax, P, the P V product) is the warp's own, with warp barriers only.
constexpr int kFwdRows = kWarps * kTile;

template <int HD, bool kBf16>
struct FwdSmem {
  alignas(32) In<kBf16> q[kBf16 ? kFwdRows * HD : 1];  // fp32: Q is read from global memory
  alignas(32) In<kBf16> k[kTile * HD];
  alignas(32) In<kBf16> v[kTile * HD];
  alignas(32) float s[kWarps][kTile * kTile];                  // each warp's S tile
  alignas(32) In<kBf16> p[kWarps][kTile * kTile];              // and P tile
  alignas(32) float stage[kWarps][kBf16 ? kTile * kTile : 1];  // a 16 x 16 piece of P V (WMMA)
  float alpha[kWarps][kTile], m[kWarps][kTile], l[kWarps][kTile];
};

// One block per (kFwdRows query rows, head h, batch b); warp w owns rows i0 + 16 w ...
// d_rows == nullptr: writes out and lse (and out's bf16 bits into out_bits, when given).
// Otherwise (the backward's first pass) recomputes the same output rows and writes
// d_rows = rowsum(dout * out) instead. Each lane keeps HD / 2 of its warp's 16 x HD output
// accumulators in registers: column chunk n (16 columns), element e = lane + 32 k (k < 8)
// of the chunk's 16 x 16, row e / 16, column e % 16.
template <int HD, bool kBf16>
__global__ void __launch_bounds__(kFlashThreads)
    FlashForwardKernel(Params p, float* out, float* lse, const float* dout, float* d_rows,
                       __nv_bfloat16* out_bits) {
  using T = In<kBf16>;
  static_assert(sizeof(FwdSmem<HD, kBf16>) <= 48 * 1024, "static shared memory over 48 KiB");
  static_assert(HD % kTile == 0, "head size a multiple of 16");
  __shared__ FwdSmem<HD, kBf16> sm;
  constexpr int kChunks = HD / kTile;
  constexpr int kPerChunk = kTile * kTile / 32;  // accumulators per lane per column chunk
  const int64_t i0 = int64_t{blockIdx.x} * kFwdRows, h = blockIdx.y, b = blockIdx.z;
  const int64_t g = h / (p.NH / p.NKV);
  const float* base = p.qkv + b * p.T * p.W;
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int64_t w0 = i0 + warp * kTile;  // this warp's first row
  if constexpr (kBf16) {
    for (int e = tid; e < kFwdRows * HD; e += kFlashThreads) {
      const int64_t row = i0 + e / HD;
      sm.q[e] = ToIn<T>(row < p.T ? base[row * p.W + h * HD + e % HD] : 0.0f);
    }
  }
  // Row r = lane / 2 of the warp's 16 is the softmax's: its two lanes hold 8 keys each.
  const int sr = lane / 2, shalf = lane % 2;
  float m_run = -INFINITY, l_run = 0.0f;
  float o[kChunks][kPerChunk];  // unrolled loops only: o stays in registers
L2L_UNROLL
  for (int n = 0; n < kChunks; ++n) {
L2L_UNROLL
    for (int k = 0; k < kPerChunk; ++k) o[n][k] = 0.0f;
  }
  float* s_w = sm.s[warp];
  T* p_w = sm.p[warp];
  const int64_t tiles = (p.T + kTile - 1) / kTile;
  for (int64_t jt = 0; jt < tiles; ++jt) {
    const int64_t j0 = jt * kTile;
    if (!TileLive(p, i0, kFwdRows, j0)) continue;  // block-uniform
    __syncthreads();  // the previous tile's readers are done (and Q is in)
    LoadTile<HD>(sm.k, base + (p.NH + g) * HD, p.W, j0, p.T);
    LoadTile<HD>(sm.v, base + (p.NH + p.NKV + g) * HD, p.W, j0, p.T);
    __syncthreads();
    if (!TileLive(p, w0, kTile, j0)) continue;  // warp-uniform: no row of this warp sees it
    // S (16 x 16) = Q K^T of this warp's rows.
    if constexpr (kBf16) {
      namespace wmma = nvcuda::wmma;
      wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc;
      wmma::fill_fragment(acc, 0.0f);
      for (int k0 = 0; k0 < HD; k0 += 16) {
        wmma::fragment<wmma::matrix_a, 16, 16, 16, __nv_bfloat16, wmma::row_major> fa;
        wmma::fragment<wmma::matrix_b, 16, 16, 16, __nv_bfloat16, wmma::col_major> fb;
        wmma::load_matrix_sync(fa, sm.q + warp * kTile * HD + k0, HD);
        wmma::load_matrix_sync(fb, sm.k + k0, HD);
        wmma::mma_sync(acc, fa, fb, acc);
      }
      wmma::store_matrix_sync(s_w, acc, kTile, wmma::mem_row_major);
    } else {
      for (int e = lane; e < kTile * kTile; e += 32) {
        const int64_t row = w0 + e / kTile;
        const float* qr = base + row * p.W + h * HD;
        const float* kr = sm.k + (e % kTile) * HD;
        float acc = 0.0f;
        if (row < p.T) {
          for (int d = 0; d < HD; ++d) acc = fmaf(qr[d], kr[d], acc);
        }
        s_w[e] = acc;
      }
    }
    __syncwarp();
    {  // the online softmax of row sr: keys 8 shalf .. 8 shalf + 7 in this lane
      const int64_t t = w0 + sr;
      float sv[kTile / 2];
      float mx = m_run;
      for (int j = 0; j < kTile / 2; ++j) {
        const int jj = shalf * (kTile / 2) + j;
        sv[j] = Allowed(p, b, t, j0 + jj) ? s_w[sr * kTile + jj] * p.scale : -INFINITY;
        mx = fmaxf(mx, sv[j]);
      }
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
      const float alpha = mx == -INFINITY ? 1.0f : expf(m_run - mx);
      float sum = 0.0f;
      for (int j = 0; j < kTile / 2; ++j) {
        const float e = sv[j] == -INFINITY ? 0.0f : expf(sv[j] - mx);
        sum += e;
        p_w[sr * kTile + shalf * (kTile / 2) + j] = ToIn<T>(e);
      }
      sum += __shfl_xor_sync(0xffffffffu, sum, 1);
      l_run = l_run * alpha + sum;
      m_run = mx;
      if (shalf == 0) sm.alpha[warp][sr] = alpha;
    }
    __syncwarp();
    // o = o * alpha(row) + P V, a 16-column chunk at a time.
L2L_UNROLL
    for (int n = 0; n < kChunks; ++n) {
      if constexpr (kBf16) {
        namespace wmma = nvcuda::wmma;
        wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc;
        wmma::fragment<wmma::matrix_a, 16, 16, 16, __nv_bfloat16, wmma::row_major> fa;
        wmma::fragment<wmma::matrix_b, 16, 16, 16, __nv_bfloat16, wmma::row_major> fb;
        wmma::fill_fragment(acc, 0.0f);
        wmma::load_matrix_sync(fa, p_w, kTile);
        wmma::load_matrix_sync(fb, sm.v + n * kTile, HD);
        wmma::mma_sync(acc, fa, fb, acc);
        wmma::store_matrix_sync(sm.stage[warp], acc, kTile, wmma::mem_row_major);
        __syncwarp();
L2L_UNROLL
        for (int k = 0; k < kPerChunk; ++k) {
          const int e = lane + 32 * k;
          o[n][k] = o[n][k] * sm.alpha[warp][e / kTile] + sm.stage[warp][e];
        }
        __syncwarp();  // the stage is read before the next chunk writes it
      } else {
L2L_UNROLL
        for (int k = 0; k < kPerChunk; ++k) {
          const int e = lane + 32 * k, r = e / kTile, c = n * kTile + e % kTile;
          float acc = 0.0f;
          for (int j = 0; j < kTile; ++j) acc = fmaf(p_w[r * kTile + j], sm.v[j * HD + c], acc);
          o[n][k] = o[n][k] * sm.alpha[warp][r] + acc;
        }
      }
    }
    __syncwarp();  // alpha and P are read before the next tile's softmax writes them
  }
  if (shalf == 0) {
    sm.m[warp][sr] = m_run;
    sm.l[warp][sr] = l_run;
  }
  __syncwarp();
  const int64_t ld = p.NH * HD;
  float dsum = 0.0f;  // d_rows: lane r < 16 sums row r, column chunks in order
L2L_UNROLL
  for (int n = 0; n < kChunks; ++n) {
L2L_UNROLL
    for (int k = 0; k < kPerChunk; ++k) {
      const int e = lane + 32 * k, r = e / kTile, d = n * kTile + e % kTile;
      const int64_t t = w0 + r;
      const float l = sm.l[warp][r];
      const float val = l > 0.0f ? o[n][k] / l : 0.0f;
      if (d_rows == nullptr) {
        if (t < p.T) {
          out[(b * p.T + t) * ld + h * HD + d] = val;
          if (out_bits != nullptr) out_bits[(b * p.T + t) * ld + h * HD + d] = __float2bfloat16_rn(val);
        }
      } else {
        s_w[e] = t < p.T ? val * dout[(b * p.T + t) * ld + h * HD + d] : 0.0f;
      }
    }
    if (d_rows != nullptr) {
      __syncwarp();
      if (lane < kTile) {
        for (int c = 0; c < kTile; ++c) dsum += s_w[lane * kTile + c];
      }
      __syncwarp();
    }
  }
  if (lane < kTile && w0 + lane < p.T) {
    if (d_rows == nullptr) {
      const float l = sm.l[warp][lane];
      lse[(b * p.NH + h) * p.T + w0 + lane] = l > 0.0f ? sm.m[warp][lane] + logf(l) : INFINITY;
    } else {
      d_rows[(b * p.NH + h) * p.T + w0 + lane] = dsum;
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
      if (!TileLive(p, i0, kTile, j0)) continue;
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
    if (!TileLive(p, i0, kTile, j0)) continue;
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
  const dim3 grid(static_cast<unsigned>((s.T + kFwdRows - 1) / kFwdRows), static_cast<unsigned>(s.NH),
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
    const unsigned row_blocks = static_cast<unsigned>((s.T + kFwdRows - 1) / kFwdRows);
    L2L_LAUNCH(d_pass, dim3(row_blocks, static_cast<unsigned>(s.NH), static_cast<unsigned>(s.B)),
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
