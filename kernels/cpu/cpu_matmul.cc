// oneDNN matmul wrapper with a primitive cache; see cpu_matmul.h.
#include "kernels/cpu/cpu_matmul.h"

#include <dlfcn.h>

#include <cstring>
#include <oneapi/dnnl/dnnl.hpp>
#include <unordered_map>

#include "common/status.h"

namespace l2l::kernels {
namespace {

using dnnl::memory;

// Everything that determines a primitive: 3 dims + 2 batch dims, 3 x 4 strides, alpha
// and beta bits.
using Key = std::array<int64_t, 19>;

struct KeyHash {
  size_t operator()(const Key& k) const {
    uint64_t h = 1469598103934665603ull;
    for (int64_t v : k) {
      h ^= static_cast<uint64_t>(v) + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2);
    }
    return static_cast<size_t>(h);
  }
};

int64_t FloatBits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof(u));
  return u;
}

// A 2-D descriptor when there is no batch (oneDNN picks its best plain-gemm kernels for
// 2-D problems), else 4-D.
memory::desc Desc(bool batched, int64_t B0, int64_t B1, int64_t rows, int64_t cols,
                  const MatStrides& s) {
  if (!batched) {
    return memory::desc(memory::dims{rows, cols}, memory::data_type::f32,
                        memory::dims{s.row, s.col});
  }
  return memory::desc(memory::dims{B0, B1, rows, cols}, memory::data_type::f32,
                      memory::dims{s.b0, s.b1, s.row, s.col});
}

}  // namespace

void SetOmpThreads(int n) {
  using Fn = void (*)(int);
  static Fn fn = reinterpret_cast<Fn>(dlsym(RTLD_DEFAULT, "omp_set_num_threads"));
  if (fn != nullptr && n > 0) fn(n);
}

void GemmStrides(bool trans_a, bool trans_b, int64_t lda, int64_t ldb, int64_t ldc, MatStrides* sa,
                 MatStrides* sb, MatStrides* sc) {
  // op(A)[m][k] = A[m*lda + k], or A[k*lda + m] when transposed; same for B.
  *sa = trans_a ? MatStrides{0, 0, 1, lda} : MatStrides{0, 0, lda, 1};
  *sb = trans_b ? MatStrides{0, 0, 1, ldb} : MatStrides{0, 0, ldb, 1};
  *sc = MatStrides{0, 0, ldc, 1};
}

struct DnnlMatmul::Impl {
  struct Entry {
    dnnl::matmul::primitive_desc pd;
    dnnl::matmul prim;
  };
  int num_threads;
  dnnl::engine engine{dnnl::engine::kind::cpu, 0};
  dnnl::stream stream{engine};
  std::unordered_map<Key, Entry, KeyHash> cache;

  Entry& Get(int64_t B0, int64_t B1, int64_t M, int64_t N, int64_t K, float alpha,
             const MatStrides& sa, const MatStrides& sb, float beta, const MatStrides& sc) {
    const bool batched = B0 != 1 || B1 != 1;
    Key key = {B0,    B1,    M,     N,     K,     sa.b0, sa.b1, sa.row,          sa.col,        sb.b0,
               sb.b1, sb.row, sb.col, sc.b0, sc.b1, sc.row, sc.col, FloatBits(alpha), FloatBits(beta)};
    auto it = cache.find(key);
    if (it != cache.end()) return it->second;
    try {
      dnnl::primitive_attr attr;
      if (alpha != 1.0f) attr.set_output_scales(0, {alpha});
      if (beta != 0.0f) {
        dnnl::post_ops po;
        po.append_sum(beta);
        attr.set_post_ops(po);
      }
      dnnl::matmul::desc d(Desc(batched, B0, B1, M, K, sa), Desc(batched, B0, B1, K, N, sb),
                           Desc(batched, B0, B1, M, N, sc));
      dnnl::matmul::primitive_desc pd(d, attr, engine);
      Entry e{pd, dnnl::matmul(pd)};
      return cache.emplace(key, std::move(e)).first->second;
    } catch (const dnnl::error& err) {
      L2L_CHECK(false) << "oneDNN matmul creation failed (" << err.what() << ") for B0=" << B0
                       << " B1=" << B1 << " M=" << M << " N=" << N << " K=" << K;
    }
    __builtin_unreachable();
  }
};

DnnlMatmul::DnnlMatmul(int num_threads) : impl_(std::make_unique<Impl>()) {
  impl_->num_threads = num_threads;
}

DnnlMatmul::~DnnlMatmul() = default;

size_t DnnlMatmul::cached_primitives() const { return impl_->cache.size(); }

void DnnlMatmul::Run(int64_t B0, int64_t B1, int64_t M, int64_t N, int64_t K, float alpha,
                     const float* A, const MatStrides& sa, const float* B, const MatStrides& sb,
                     float beta, float* C, const MatStrides& sc) {
  L2L_CHECK(B0 >= 0 && B1 >= 0 && M >= 0 && N >= 0 && K >= 0)
      << "negative matmul dims B0=" << B0 << " B1=" << B1 << " M=" << M << " N=" << N << " K=" << K;
  if (B0 == 0 || B1 == 0 || M == 0 || N == 0) return;
  SetOmpThreads(impl_->num_threads);
  if (K == 0) {
    // Empty product: C = beta * C (beta == 0 clears, without reading C).
    for (int64_t i = 0; i < B0; ++i)
      for (int64_t j = 0; j < B1; ++j)
        for (int64_t m = 0; m < M; ++m)
          for (int64_t n = 0; n < N; ++n) {
            float& c = C[i * sc.b0 + j * sc.b1 + m * sc.row + n * sc.col];
            c = beta == 0.0f ? 0.0f : beta * c;
          }
    return;
  }
  Impl::Entry& e = impl_->Get(B0, B1, M, N, K, alpha, sa, sb, beta, sc);
  try {
    memory a_mem(e.pd.src_desc(), impl_->engine, const_cast<float*>(A));
    memory b_mem(e.pd.weights_desc(), impl_->engine, const_cast<float*>(B));
    memory c_mem(e.pd.dst_desc(), impl_->engine, C);
    e.prim.execute(impl_->stream,
                   {{DNNL_ARG_SRC, a_mem}, {DNNL_ARG_WEIGHTS, b_mem}, {DNNL_ARG_DST, c_mem}});
    impl_->stream.wait();
  } catch (const dnnl::error& err) {
    L2L_CHECK(false) << "oneDNN matmul execution failed: " << err.what();
  }
}

std::string DnnlMatmul::ImplName(int64_t B0, int64_t B1, int64_t M, int64_t N, int64_t K,
                                 float alpha, const MatStrides& sa, const MatStrides& sb,
                                 float beta, const MatStrides& sc) {
  SetOmpThreads(impl_->num_threads);
  return impl_->Get(B0, B1, M, N, K, alpha, sa, sb, beta, sc).pd.impl_info_str();
}

}  // namespace l2l::kernels
