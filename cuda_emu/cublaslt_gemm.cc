// The CPU GEMM of the emulated cuBLASLt: see cublaslt_gemm.h.
#include "cuda_emu/cublaslt_gemm.h"

#include <cuda_bf16.h>
#include <tbb/blocked_range.h>
#include <tbb/blocked_range2d.h>
#include <tbb/parallel_for.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <exception>
#include <new>
#include <string>

#include "l2l_cuda_emu.h"

namespace l2l_cuda_emu::lt {
namespace {

typedef float V4 __attribute__((vector_size(16)));

float LoadElem(const void* base, uint32_t type, int64_t idx) {
  if (type == CUDA_R_16BF) return __bfloat162float(static_cast<const __nv_bfloat16*>(base)[idx]);
  return static_cast<const float*>(base)[idx];
}

void StoreElem(void* base, uint32_t type, int64_t idx, float v) {
  if (type == CUDA_R_16BF) {
    static_cast<__nv_bfloat16*>(base)[idx] = __float2bfloat16_rn(v);
  } else {
    static_cast<float*>(base)[idx] = v;
  }
}

// fp32 -> TF32 (10 explicit mantissa bits), round to nearest even; NaN stays NaN.
float RoundTf32(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof(u));
  if ((u & 0x7fffffffu) > 0x7f800000u) {
    u |= 0x00400000u;
  } else {
    u += 0xfffu + ((u >> 13) & 1u);
  }
  u &= ~0x1fffu;
  std::memcpy(&f, &u, sizeof(f));
  return f;
}

// Packs `count` vectors of length k into dst (count x kp, zero-padded): vector v element l
// is src[v * vec_stride + l * elem_stride].
void Pack(float* dst, int64_t kp, const void* src, uint32_t type, bool tf32, int64_t count,
          int64_t k, int64_t vec_stride, int64_t elem_stride) {
  tbb::parallel_for(tbb::blocked_range<int64_t>(0, count, 32),
                    [&](const tbb::blocked_range<int64_t>& r) {
                      // Contiguous elements along the vector: read along l; otherwise along v, so
                      // the strided side is the write into the small packed block.
                      if (elem_stride == 1) {
                        for (int64_t v = r.begin(); v < r.end(); ++v) {
                          float* out = dst + v * kp;
                          for (int64_t l = 0; l < k; ++l)
                            out[l] = LoadElem(src, type, v * vec_stride + l);
                        }
                      } else {
                        for (int64_t l = 0; l < k; ++l) {
                          for (int64_t v = r.begin(); v < r.end(); ++v) {
                            dst[v * kp + l] = LoadElem(src, type, v * vec_stride + l * elem_stride);
                          }
                        }
                      }
                      for (int64_t v = r.begin(); v < r.end(); ++v) {
                        float* out = dst + v * kp;
                        if (tf32) {
                          for (int64_t l = 0; l < k; ++l) out[l] = RoundTf32(out[l]);
                        }
                        for (int64_t l = k; l < kp; ++l) out[l] = 0.0f;
                      }
                    });
}

// RI rows of packed op(A) times RJ columns of packed op(B): out[r][c] = dot products, each
// accumulated in 4 lanes and summed in the same order whatever RI and RJ are.
template <int RI, int RJ>
inline void MicroKernel(const float* a, const float* b, int64_t kp, float (*out)[2]) {
  V4 acc[RI][RJ];
#pragma GCC unroll 4
  for (int r = 0; r < RI; ++r) {
#pragma GCC unroll 4
    for (int c = 0; c < RJ; ++c) acc[r][c] = V4{0.0f, 0.0f, 0.0f, 0.0f};
  }
  for (int64_t l = 0; l < kp; l += 4) {
    V4 av[RI], bv[RJ];
#pragma GCC unroll 4
    for (int r = 0; r < RI; ++r) std::memcpy(&av[r], a + r * kp + l, sizeof(V4));
#pragma GCC unroll 4
    for (int c = 0; c < RJ; ++c) std::memcpy(&bv[c], b + c * kp + l, sizeof(V4));
#pragma GCC unroll 4
    for (int r = 0; r < RI; ++r) {
#pragma GCC unroll 4
      for (int c = 0; c < RJ; ++c) acc[r][c] += av[r] * bv[c];
    }
  }
  for (int r = 0; r < RI; ++r) {
    for (int c = 0; c < RJ; ++c)
      out[r][c] = (acc[r][c][0] + acc[r][c][1]) + (acc[r][c][2] + acc[r][c][3]);
  }
}
float Epilogue(float v, uint32_t e) {
  if (HasRelu(e)) return v > 0.0f ? v : 0.0f;
  if (HasGelu(e)) {
    constexpr float kSqrt2OverPi = 0.7978845608028654f;
    return 0.5f * v * (1.0f + std::tanh(kSqrt2OverPi * (v + 0.044715f * v * v * v)));
  }
  return v;
}

}  // namespace

void MatmulWork::OneBatch(int64_t batch, std::vector<float>& ap, std::vector<float>& bp) const {
  const int64_t m = p.m, n = p.n, k = p.k, kp = (k + 3) / 4 * 4;
  const size_t ab = TypeBytes(p.ab_type), cd = TypeBytes(p.cd_type);
  const char* a_base = static_cast<const char*>(a) + batch * p.stride_a * static_cast<int64_t>(ab);
  const char* b_base = static_cast<const char*>(b) + batch * p.stride_b * static_cast<int64_t>(ab);
  const char* c_base =
      c ? static_cast<const char*>(c) + batch * p.stride_c * static_cast<int64_t>(cd) : nullptr;
  char* d_base = static_cast<char*>(d) + batch * p.stride_d * static_cast<int64_t>(cd);
  // op(A) row i: stored A (m x k, N) holds it at i + l*lda; (k x m, T) at l + i*lda.
  if (kp > 0) {
    Pack(ap.data(), kp, a_base, p.ab_type, p.tf32, m, k, p.trans_a ? p.lda : 1,
         p.trans_a ? 1 : p.lda);
    // op(B) column j: stored B (k x n, N) holds it at l + j*ldb; (n x k, T) at j + l*ldb.
    Pack(bp.data(), kp, b_base, p.ab_type, p.tf32, n, k, p.trans_b ? 1 : p.ldb,
         p.trans_b ? p.ldb : 1);
  }
  const float* apk = ap.data();
  const float* bpk = bp.data();
  auto body = [&](const tbb::blocked_range2d<int64_t>& r) {
    for (int64_t j0 = r.cols().begin(); j0 < r.cols().end(); j0 += 2) {
      const int64_t nj = std::min<int64_t>(2, r.cols().end() - j0);
      for (int64_t i0 = r.rows().begin(); i0 < r.rows().end(); i0 += 4) {
        const int64_t ni = std::min<int64_t>(4, r.rows().end() - i0);
        float acc[4][2] = {};
        if (kp > 0) {
          if (ni == 4 && nj == 2) {
            MicroKernel<4, 2>(apk + i0 * kp, bpk + j0 * kp, kp, acc);
          } else {
            for (int64_t ii = 0; ii < ni; ++ii) {
              for (int64_t jj = 0; jj < nj; ++jj) {
                float one[4][2];
                MicroKernel<1, 1>(apk + (i0 + ii) * kp, bpk + (j0 + jj) * kp, kp, one);
                acc[ii][jj] = one[0][0];
              }
            }
          }
        }
        for (int64_t jj = 0; jj < nj; ++jj) {
          for (int64_t ii = 0; ii < ni; ++ii) {
            const int64_t i = i0 + ii, j = j0 + jj;
            float v = alpha * acc[ii][jj];
            if (beta != 0.0f) v += beta * LoadElem(c_base, p.cd_type, i + j * p.ldc);
            if (HasBias(p.epilogue)) v += LoadElem(bias, p.bias_type, i);
            StoreElem(d_base, p.cd_type, i + j * p.ldd, Epilogue(v, p.epilogue));
          }
        }
      }
    }
  };
  // Tiles of 64 x 64 outputs: the packed rows and columns they read (2 x 64 x kp floats)
  // stay in a core's L2 for kp up to ~1000.
  tbb::parallel_for(tbb::blocked_range2d<int64_t>(0, m, 64, 0, n, 64), body);
}

void MatmulWork::operator()() const {
  try {
    const int64_t kp = (p.k + 3) / 4 * 4;
    std::vector<float> ap(static_cast<size_t>(p.m * kp)), bp(static_cast<size_t>(p.n * kp));
    for (int64_t i = 0; i < p.batch; ++i) OneBatch(i, ap, bp);
  } catch (const std::bad_alloc&) {
    l2l_cuda_emu::ReportAsyncError(cudaErrorMemoryAllocation, "cublasLtMatmul: out of host memory");
  } catch (const std::exception& ex) {
    l2l_cuda_emu::ReportAsyncError(cudaErrorLaunchFailure,
                                   std::string("cublasLtMatmul: ") + ex.what());
  }
}

}  // namespace l2l_cuda_emu::lt
