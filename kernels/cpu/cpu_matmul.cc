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
#include "kernels/cpu/cpu_math.h"
#include "kernels/cpu/cpu_parallel.h"

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
                  const MatStrides& s, memory::data_type dt = memory::data_type::f32) {
  if (!batched) {
    return memory::desc(memory::dims{rows, cols}, dt, memory::dims{s.row, s.col});
  }
  return memory::desc(memory::dims{B0, B1, rows, cols}, dt,
                      memory::dims{s.b0, s.b1, s.row, s.col});
}

}  // namespace

void SetOmpThreads(int n) {
  using Fn = void (*)(int);
  static Fn fn = reinterpret_cast<Fn>(dlsym(RTLD_DEFAULT, "omp_set_num_threads"));
  if (fn != nullptr && n > 0) fn(n);
}

bool DnnlHasBf16Matmul() {
  try {
    const dnnl::engine engine(dnnl::engine::kind::cpu, 0);
    const memory::desc a({16, 16}, memory::data_type::bf16, memory::format_tag::ab);
    const memory::desc c({16, 16}, memory::data_type::f32, memory::format_tag::ab);
    dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(a, a, c), engine);
    return true;
  } catch (const dnnl::error&) {
    return false;  // unimplemented: no bf16 support at this ISA
  }
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
  bool bf16 = false;  // src and weights are bf16
};

struct DnnlMatmul::Impl {
  using Entry = DnnlMatmul::Plan;
  int num_threads = 1;
  tbb::task_arena* arena = nullptr;
  bool bf16 = false;
  std::vector<uint16_t> slots[4];  // bf16 operand copies: Run's A, B; Bf16Slot's 2, 3
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
      const memory::data_type in = bf16 ? memory::data_type::bf16 : memory::data_type::f32;
      dnnl::matmul::desc d(Desc(batched, B0, B1, M, K, sa, in), Desc(batched, B0, B1, K, N, sb, in),
                           Desc(batched, B0, B1, M, N, sc));
      dnnl::matmul::primitive_desc pd(d, attr, engine);
      Entry e{pd, dnnl::matmul(pd), pd.scratchpad_desc().get_size(), bf16};
      return cache.emplace(key, std::move(e)).first->second;
    } catch (const dnnl::error& err) {
      L2L_CHECK(false) << "oneDNN matmul creation failed (" << err.what() << ") for B0=" << B0
                       << " B1=" << B1 << " M=" << M << " N=" << N << " K=" << K;
    }
    __builtin_unreachable();
  }

  // Runs one cached primitive on the calling thread (a TBB task or the owner).
  // A and B are fp32, or bf16 bits when e.bf16.
  void Exec(const Entry& e, const void* A, const void* B, float* C) {
    thread_local std::vector<char> scratch;
    try {
      SetOmpThreads(1);
      dnnl::stream stream(engine);
      memory a_mem(e.pd.src_desc(), engine, const_cast<void*>(A));
      memory b_mem(e.pd.weights_desc(), engine, const_cast<void*>(B));
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

  uint16_t* Slot(int slot, int64_t elems) {
    std::vector<uint16_t>& v = slots[slot];
    if (int64_t(v.size()) < elems) v.resize(elems);
    return v.data();
  }

  void ToBf16(uint16_t* dst, const float* src, int64_t n) {
    if (num_threads <= 1 || n <= kElemGrain) {
      FloatToBf16Span(dst, src, n);
      return;
    }
    arena->execute([&] {
      ParallelFor(n, kElemGrain, [&](int64_t i0, int64_t i1) { FloatToBf16Span(dst + i0, src + i0, i1 - i0); });
    });
  }

  // dst = the (B0, B1, rows, cols) operand at src with strides s, as dense row-major
  // bf16. Rows with unit column stride cast as spans; a column-major operand (unit row
  // stride) goes through 32 x 32 tiles: each tile column is a contiguous span of src,
  // cast, then transposed in cache.
  void Pack(uint16_t* dst, const float* src, int64_t B0, int64_t B1, int64_t rows, int64_t cols,
            const MatStrides& s) {
    constexpr int64_t kTile = 32;
    const int64_t row_blocks = (rows + kTile - 1) / kTile;
    auto block = [&](int64_t task) {
      const int64_t mat = task / row_blocks, r0 = (task % row_blocks) * kTile;
      const int64_t rn = std::min(kTile, rows - r0);
      const float* x = src + (mat / B1) * s.b0 + (mat % B1) * s.b1;
      uint16_t* y = dst + mat * rows * cols;
      if (s.col == 1) {
        for (int64_t r = r0; r < r0 + rn; ++r) FloatToBf16Span(y + r * cols, x + r * s.row, cols);
      } else if (s.row == 1) {
        uint16_t tile[kTile][kTile];
        for (int64_t c0 = 0; c0 < cols; c0 += kTile) {
          const int64_t cn = std::min(kTile, cols - c0);
          for (int64_t c = 0; c < cn; ++c) FloatToBf16Span(tile[c], x + (c0 + c) * s.col + r0, rn);
          for (int64_t r = 0; r < rn; ++r)
            for (int64_t c = 0; c < cn; ++c) y[(r0 + r) * cols + c0 + c] = tile[c][r];
        }
      } else {
        for (int64_t r = r0; r < r0 + rn; ++r)
          for (int64_t c = 0; c < cols; ++c) FloatToBf16Span(y + r * cols + c, x + r * s.row + c * s.col, 1);
      }
    };
    const int64_t tasks = B0 * B1 * row_blocks;
    if (num_threads <= 1 || B0 * B1 * rows * cols <= kElemGrain) {
      for (int64_t t = 0; t < tasks; ++t) block(t);
      return;
    }
    const int64_t grain = std::max<int64_t>(1, kElemGrain / (kTile * cols));
    arena->execute([&] {
      ParallelFor(tasks, grain, [&](int64_t t0, int64_t t1) {
        for (int64_t t = t0; t < t1; ++t) block(t);
      });
    });
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

DnnlMatmul::DnnlMatmul(int num_threads, tbb::task_arena* arena, bool bf16)
    : impl_(std::make_unique<Impl>()) {
  impl_->num_threads = std::max(1, num_threads);
  impl_->arena = arena;
  impl_->bf16 = bf16;
  L2L_CHECK(arena != nullptr || impl_->num_threads == 1) << "DnnlMatmul needs an arena for threads";
}

DnnlMatmul::~DnnlMatmul() = default;

size_t DnnlMatmul::cached_primitives() const { return impl_->cache.size(); }
bool DnnlMatmul::bf16() const { return impl_->bf16; }

void DnnlMatmul::ToBf16(uint16_t* dst, const float* src, int64_t n) { impl_->ToBf16(dst, src, n); }

uint16_t* DnnlMatmul::Bf16Slot(int slot, int64_t elems) {
  L2L_CHECK(slot == 2 || slot == 3) << "DnnlMatmul::Bf16Slot: slot " << slot << " (2 or 3)";
  return impl_->Slot(slot, elems);
}

void DnnlMatmul::Run(int64_t B0, int64_t B1, int64_t M, int64_t N, int64_t K, float alpha,
                     const float* A, const MatStrides& sa, const float* B, const MatStrides& sb,
                     float beta, float* C, const MatStrides& sc, const Epilogue* epilogue,
                     const uint16_t* b_bf16) {
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
  // The operands the primitives read: A and B themselves, or (bf16 mode) dense
  // row-major bf16 copies, (B0*B1, M, K) and (B0*B1, K, N), whatever the callers'
  // strides: a transposed operand becomes plain, which oneDNN's AMX kernels want, and
  // every call of a shape shares one primitive. at(p, off) is operand p advanced by
  // `off` elements; ua, ub their strides.
  const void* a = A;
  const void* b = B;
  MatStrides ua = sa, ub = sb;
  size_t esz = sizeof(float);
  if (im.bf16) {
    uint16_t* a16 = im.Slot(0, B0 * B1 * M * K);
    im.Pack(a16, A, B0, B1, M, K, sa);
    a = a16;
    if (b_bf16 != nullptr && B0 * B1 == 1) {
      b = b_bf16;  // the caller's bf16 copy, already dense (K, N)
    } else {
      uint16_t* b16 = im.Slot(1, B0 * B1 * K * N);
      im.Pack(b16, B, B0, B1, K, N, sb);
      b = b16;
    }
    ua = MatStrides{B1 * M * K, M * K, K, 1};
    ub = MatStrides{B1 * K * N, K * N, N, 1};
    esz = sizeof(uint16_t);
  }
  auto at = [esz](const void* p, int64_t off) -> const void* {
    return static_cast<const char*>(p) + off * int64_t(esz);
  };
  if (B0 * B1 > 1) {
    // One 2-D product per batch element, the batch spread over tasks.
    const Impl::Entry& e = im.Get(1, 1, M, N, K, alpha, ua, ub, beta, sc);
    im.ForEach(B0 * B1, [&](int64_t idx) {
      const int64_t i = idx / B1, j = idx % B1;
      im.Exec(e, at(a, i * ua.b0 + j * ua.b1), at(b, i * ub.b0 + j * ub.b1), C + i * sc.b0 + j * sc.b1);
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
    im.Exec(im.Get(1, 1, M, N, K, alpha, ua, ub, beta, sc), a, b, C);
    if (epilogue != nullptr) (*epilogue)(0, M, 0, N);
    return;
  }
  const int64_t n_blocks = (len + block - 1) / block;
  const int64_t last = len - (n_blocks - 1) * block;
  const Impl::Entry& full = by_rows ? im.Get(1, 1, block, N, K, alpha, ua, ub, beta, sc)
                                    : im.Get(1, 1, M, block, K, alpha, ua, ub, beta, sc);
  const Impl::Entry& tail = by_rows ? im.Get(1, 1, last, N, K, alpha, ua, ub, beta, sc)
                                    : im.Get(1, 1, M, last, K, alpha, ua, ub, beta, sc);
  im.ForEach(n_blocks, [&](int64_t k) {
    const Impl::Entry& e = k + 1 < n_blocks ? full : tail;
    const int64_t off = k * block;
    const int64_t end = std::min(len, off + block);
    if (by_rows) {
      im.Exec(e, at(a, off * ua.row), b, C + off * sc.row);
      if (epilogue != nullptr) (*epilogue)(off, end, 0, N);
    } else {
      im.Exec(e, a, at(b, off * ub.col), C + off * sc.col);
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
  L2L_CHECK(!plan->bf16) << "DnnlMatmul::Execute: fp32 operands for a bf16 plan";
  impl_->Exec(*plan, A, B, C);
}

void DnnlMatmul::Execute(const Plan* plan, const uint16_t* A, const uint16_t* B, float* C) {
  L2L_CHECK(plan->bf16) << "DnnlMatmul::Execute: bf16 operands for an fp32 plan";
  impl_->Exec(*plan, A, B, C);
}

std::string DnnlMatmul::ImplName(int64_t B0, int64_t B1, int64_t M, int64_t N, int64_t K,
                                 float alpha, const MatStrides& sa, const MatStrides& sb,
                                 float beta, const MatStrides& sc) {
  if (impl_->bf16) {  // Run's dense bf16 copies
    return impl_->Get(B0, B1, M, N, K, alpha, MatStrides{B1 * M * K, M * K, K, 1},
                      MatStrides{B1 * K * N, K * N, N, 1}, beta, sc)
        .pd.impl_info_str();
  }
  return impl_->Get(B0, B1, M, N, K, alpha, sa, sb, beta, sc).pd.impl_info_str();
}

}  // namespace l2l::kernels
