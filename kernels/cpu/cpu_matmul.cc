// oneDNN matmul wrapper with a primitive cache; see cpu_matmul.h.
#include "kernels/cpu/cpu_matmul.h"

#include <dlfcn.h>

#include <algorithm>
#include <cstring>
#include <oneapi/dnnl/dnnl.hpp>
#include <unordered_map>
#include <vector>

#include <tbb/blocked_range.h>
#include <tbb/parallel_for.h>

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

// A created primitive and its scratchpad size.
struct DnnlMatmul::Plan {
  dnnl::matmul::primitive_desc pd;
  dnnl::matmul prim;
  size_t scratch_bytes = 0;
};

struct DnnlMatmul::Impl {
  using Entry = DnnlMatmul::Plan;
  int num_threads = 1;
  tbb::task_arena* arena = nullptr;
  dnnl::engine engine{dnnl::engine::kind::cpu, 0};
  // Node-based: references to entries stay valid while others are added.
  std::unordered_map<Key, Entry, KeyHash> cache;

  // REQUIRES: called from the thread that owns this object (not from tasks).
  Entry& Get(int64_t B0, int64_t B1, int64_t M, int64_t N, int64_t K, float alpha,
             const MatStrides& sa, const MatStrides& sb, float beta, const MatStrides& sc) {
    const bool batched = B0 != 1 || B1 != 1;
    Key key = {B0,    B1,    M,     N,     K,     sa.b0, sa.b1, sa.row,          sa.col,        sb.b0,
               sb.b1, sb.row, sb.col, sc.b0, sc.b1, sc.row, sc.col, FloatBits(alpha), FloatBits(beta)};
    auto it = cache.find(key);
    if (it != cache.end()) return it->second;
    try {
      SetOmpThreads(1);  // the primitive is tuned for the thread count it will run on
      dnnl::primitive_attr attr;
      attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
      if (alpha != 1.0f) attr.set_output_scales(0, {alpha});
      if (beta != 0.0f) {
        dnnl::post_ops po;
        po.append_sum(beta);
        attr.set_post_ops(po);
      }
      dnnl::matmul::desc d(Desc(batched, B0, B1, M, K, sa), Desc(batched, B0, B1, K, N, sb),
                           Desc(batched, B0, B1, M, N, sc));
      dnnl::matmul::primitive_desc pd(d, attr, engine);
      Entry e{pd, dnnl::matmul(pd), pd.scratchpad_desc().get_size()};
      return cache.emplace(key, std::move(e)).first->second;
    } catch (const dnnl::error& err) {
      L2L_CHECK(false) << "oneDNN matmul creation failed (" << err.what() << ") for B0=" << B0
                       << " B1=" << B1 << " M=" << M << " N=" << N << " K=" << K;
    }
    __builtin_unreachable();
  }

  // Runs one cached primitive on the calling thread (a TBB task or the owner).
  void Exec(const Entry& e, const float* A, const float* B, float* C) {
    thread_local std::vector<char> scratch;
    try {
      SetOmpThreads(1);
      dnnl::stream stream(engine);
      memory a_mem(e.pd.src_desc(), engine, const_cast<float*>(A));
      memory b_mem(e.pd.weights_desc(), engine, const_cast<float*>(B));
      memory c_mem(e.pd.dst_desc(), engine, C);
      std::unordered_map<int, memory> args = {
          {DNNL_ARG_SRC, a_mem}, {DNNL_ARG_WEIGHTS, b_mem}, {DNNL_ARG_DST, c_mem}};
      if (e.scratch_bytes > 0) {
        if (scratch.size() < e.scratch_bytes + 64) scratch.resize(e.scratch_bytes + 64);
        void* p = scratch.data() + (64 - reinterpret_cast<uintptr_t>(scratch.data()) % 64) % 64;
        args.emplace(DNNL_ARG_SCRATCHPAD, memory(e.pd.scratchpad_desc(), engine, p));
      }
      e.prim.execute(stream, args);
      stream.wait();
    } catch (const dnnl::error& err) {
      L2L_CHECK(false) << "oneDNN matmul execution failed: " << err.what();
    }
  }

  // f(i) for i in [0, n), in parallel in the arena when there are threads to use.
  template <typename F>
  void ForEach(int64_t n, const F& f) {
    if (num_threads <= 1 || n <= 1) {
      for (int64_t i = 0; i < n; ++i) f(i);
      return;
    }
    arena->execute([&] {
      tbb::parallel_for(tbb::blocked_range<int64_t>(0, n, 1),
                        [&](const tbb::blocked_range<int64_t>& r) {
                          for (int64_t i = r.begin(); i < r.end(); ++i) f(i);
                        });
    });
  }
};

DnnlMatmul::DnnlMatmul(int num_threads, tbb::task_arena* arena) : impl_(std::make_unique<Impl>()) {
  impl_->num_threads = std::max(1, num_threads);
  impl_->arena = arena;
  L2L_CHECK(arena != nullptr || impl_->num_threads == 1) << "DnnlMatmul needs an arena for threads";
}

DnnlMatmul::~DnnlMatmul() = default;

size_t DnnlMatmul::cached_primitives() const { return impl_->cache.size(); }

void DnnlMatmul::Run(int64_t B0, int64_t B1, int64_t M, int64_t N, int64_t K, float alpha,
                     const float* A, const MatStrides& sa, const float* B, const MatStrides& sb,
                     float beta, float* C, const MatStrides& sc, const Epilogue* epilogue) {
  L2L_CHECK(B0 >= 0 && B1 >= 0 && M >= 0 && N >= 0 && K >= 0)
      << "negative matmul dims B0=" << B0 << " B1=" << B1 << " M=" << M << " N=" << N << " K=" << K;
  L2L_CHECK(epilogue == nullptr || B0 * B1 == 1) << "DnnlMatmul: an epilogue needs a 2-D product";
  if (B0 == 0 || B1 == 0 || M == 0 || N == 0) return;
  if (K == 0) {
    // Empty product: C = beta * C (beta == 0 clears, without reading C).
    for (int64_t i = 0; i < B0; ++i)
      for (int64_t j = 0; j < B1; ++j)
        for (int64_t m = 0; m < M; ++m)
          for (int64_t n = 0; n < N; ++n) {
            float& c = C[i * sc.b0 + j * sc.b1 + m * sc.row + n * sc.col];
            c = beta == 0.0f ? 0.0f : beta * c;
          }
    if (epilogue != nullptr) (*epilogue)(0, M, 0, N);
    return;
  }
  Impl& im = *impl_;
  if (B0 * B1 > 1) {
    // One 2-D product per batch element, the batch spread over tasks.
    const Impl::Entry& e = im.Get(1, 1, M, N, K, alpha, sa, sb, beta, sc);
    im.ForEach(B0 * B1, [&](int64_t idx) {
      const int64_t i = idx / B1, j = idx % B1;
      im.Exec(e, A + i * sa.b0 + j * sa.b1, B + i * sb.b0 + j * sb.b1, C + i * sc.b0 + j * sc.b1);
    });
    return;
  }
  // Split C into blocks of rows (or of columns when C is wide): about two per thread so
  // stealing can even out busy cores, each at least kMinBlock wide.
  constexpr int64_t kMinBlock = 64;
  const bool by_rows = M >= N;
  const int64_t len = by_rows ? M : N;
  const double flops = 2.0 * double(M) * double(N) * double(K);
  int64_t block = (len + 2 * im.num_threads - 1) / (2 * im.num_threads);
  block = std::max(kMinBlock, (block + 15) / 16 * 16);
  if (im.num_threads <= 1 || block >= len || flops < 2e6) {
    im.Exec(im.Get(1, 1, M, N, K, alpha, sa, sb, beta, sc), A, B, C);
    if (epilogue != nullptr) (*epilogue)(0, M, 0, N);
    return;
  }
  const int64_t n_blocks = (len + block - 1) / block;
  const int64_t last = len - (n_blocks - 1) * block;
  const Impl::Entry& full = by_rows ? im.Get(1, 1, block, N, K, alpha, sa, sb, beta, sc)
                                    : im.Get(1, 1, M, block, K, alpha, sa, sb, beta, sc);
  const Impl::Entry& tail = by_rows ? im.Get(1, 1, last, N, K, alpha, sa, sb, beta, sc)
                                    : im.Get(1, 1, M, last, K, alpha, sa, sb, beta, sc);
  im.ForEach(n_blocks, [&](int64_t k) {
    const Impl::Entry& e = k + 1 < n_blocks ? full : tail;
    const int64_t off = k * block;
    const int64_t end = std::min(len, off + block);
    if (by_rows) {
      im.Exec(e, A + off * sa.row, B, C + off * sc.row);
      if (epilogue != nullptr) (*epilogue)(off, end, 0, N);
    } else {
      im.Exec(e, A, B + off * sb.col, C + off * sc.col);
      if (epilogue != nullptr) (*epilogue)(0, M, off, end);
    }
  });
}

const DnnlMatmul::Plan* DnnlMatmul::Prepare(int64_t M, int64_t N, int64_t K, float alpha,
                                            const MatStrides& sa, const MatStrides& sb,
                                            float beta, const MatStrides& sc) {
  L2L_CHECK(M > 0 && N > 0 && K > 0) << "DnnlMatmul::Prepare: empty product M=" << M << " N=" << N
                                     << " K=" << K;
  return &impl_->Get(1, 1, M, N, K, alpha, sa, sb, beta, sc);  // cache entries never move
}

void DnnlMatmul::Execute(const Plan* plan, const float* A, const float* B, float* C) {
  impl_->Exec(*plan, A, B, C);
}

std::string DnnlMatmul::ImplName(int64_t B0, int64_t B1, int64_t M, int64_t N, int64_t K,
                                 float alpha, const MatStrides& sa, const MatStrides& sb,
                                 float beta, const MatStrides& sc) {
  return impl_->Get(B0, B1, M, N, K, alpha, sa, sb, beta, sc).pd.impl_info_str();
}

}  // namespace l2l::kernels
