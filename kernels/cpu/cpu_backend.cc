// CpuBackend: memory, GEMM, elementwise, embedding, LayerNorm and cross-entropy ops.
// Attention lives in cpu_attention.cc. See cpu_backend.h for the contracts.
#include "kernels/cpu/cpu_backend.h"

#include "common/adamw.h"
#include "common/env.h"
#include "common/name_table.h"
#include "common/rng.h"

#include <tbb/blocked_range.h>
#include <tbb/parallel_for.h>
#include <tbb/parallel_reduce.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <new>
#include <optional>
#include <string>

#include "kernels/cpu/cpu_math.h"
#include "kernels/cpu/cpu_matmul.h"
#include "kernels/cpu/cpu_parallel.h"
#include "kernels/cpu/cpu_pinning.h"

namespace l2l::kernels {

constexpr float kLayerNormEps = 1e-5f;

CpuBackend::CpuBackend(int num_threads, CpuGemmPrecision gemm)
    : num_threads_(num_threads > 0 ? num_threads : tbb::this_task_arena::max_concurrency()),
      gemm_(gemm),
      arena_(num_threads_),
      pinner_(ThreadPinner::FromEnv(arena_)),
      matmul_(std::make_unique<DnnlMatmul>(num_threads_, &arena_, gemm == CpuGemmPrecision::kBf16)) {}

CpuBackend::~CpuBackend() = default;

std::string CpuBackend::name() const {
  return "cpu (oneDNN, " + std::to_string(num_threads_) + " threads" +
         (gemm_ == CpuGemmPrecision::kBf16 ? ", gemm bf16)" : ")");
}

// ---- memory ------------------------------------------------------------------------

Result<void*> CpuBackend::Alloc(size_t bytes) {
  // Beyond the 47-bit user address space no allocator can succeed; refuse up front
  // (also keeps sanitizer allocators, which abort on absurd sizes, out of it).
  constexpr size_t kMaxBytes = size_t{1} << 47;
  const size_t rounded = std::max<size_t>(64, (bytes + 63) / 64 * 64);
  void* p = bytes <= kMaxBytes ? std::aligned_alloc(64, rounded) : nullptr;
  if (p == nullptr) {
    return ResourceExhausted("cpu backend: cannot allocate " + std::to_string(bytes) +
                             " bytes of host memory");
  }
  return p;
}

void CpuBackend::Free(void* p) { std::free(p); }

void CpuBackend::CopyToDevice(void* dst, const void* host_src, size_t bytes) {
  if (bytes > 0) std::memcpy(dst, host_src, bytes);
}
void CpuBackend::CopyToHost(void* host_dst, const void* src, size_t bytes) {
  if (bytes > 0) std::memcpy(host_dst, src, bytes);
}
void CpuBackend::CopyDeviceToDevice(void* dst, const void* src, size_t bytes) {
  if (bytes > 0) std::memmove(dst, src, bytes);
}
void CpuBackend::Zero(void* dst, size_t bytes) {
  if (bytes > 0) std::memset(dst, 0, bytes);
}

// ---- dense algebra ---------------------------------------------------------------

void CpuBackend::Gemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,
                      const float* A, int64_t lda, const float* B, int64_t ldb, float beta,
                      float* C, int64_t ldc) {
  L2L_CHECK(lda >= (trans_a ? M : K) && ldb >= (trans_b ? K : N) && ldc >= N)
      << "Gemm leading dims too small: M=" << M << " N=" << N << " K=" << K << " lda=" << lda
      << " ldb=" << ldb << " ldc=" << ldc << " trans_a=" << trans_a << " trans_b=" << trans_b;
  MatStrides sa, sb, sc;
  GemmStrides(trans_a, trans_b, lda, ldb, ldc, &sa, &sb, &sc);
  matmul_->Run(1, 1, M, N, K, alpha, A, sa, B, sb, beta, C, sc, nullptr, DenseBf16B(B, sb.row, sb.col, M, N, K));
}

void CpuBackend::NoteBf16Copy(const float* f32, const uint16_t* bits, int64_t n) {
  if (TakesBf16Copies() && n > 0) bf16_copies_.Note(f32, bits, n);  // only bf16 GEMMs read them
}

void CpuBackend::ForgetBf16Copy(const float* f32) { bf16_copies_.Forget(f32); }

const uint16_t* CpuBackend::DenseBf16B(const float* B, int64_t row_stride, int64_t col_stride, int64_t M, int64_t N,
                                       int64_t K) {
  if (gemm_ != CpuGemmPrecision::kBf16 || M <= 0 || N <= 0 || K <= 0) return nullptr;
  bf16_stats_.cast_elements += M * K;  // A is always cast
  const uint16_t* bits = row_stride == N && col_stride == 1 ? bf16_copies_.Find(B, K * N) : nullptr;
  if (bits != nullptr) {
    bf16_stats_.reused_elements += K * N;
    return bits;
  }
  bf16_stats_.cast_elements += K * N;
  return nullptr;
}

std::string CpuBackend::GemmImplName(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K) {
  MatStrides sa, sb, sc;
  GemmStrides(trans_a, trans_b, trans_a ? M : K, trans_b ? K : N, N, &sa, &sb, &sc);
  return matmul_->ImplName(1, 1, M, N, K, 1.0f, sa, sb, 0.0f, sc);
}

void CpuBackend::AddBias(float* out, const float* bias, int64_t N, int64_t OC) {
  InArena([&] {
    ParallelFor(N, RowGrain(OC), [&](int64_t r0, int64_t r1) {
      for (int64_t r = r0; r < r1; ++r) AddSpan(out + r * OC, out + r * OC, bias, OC);
    });
  });
}

void CpuBackend::LinearForward(float* y, const float* x, const float* w, bool trans_w,
                               const float* bias, int64_t N, int64_t IC, int64_t OC, float* act,
                               const float* residual) {
  L2L_CHECK(act == nullptr || residual == nullptr) << "LinearForward: act and residual are exclusive";
  MatStrides sa, sb, sc;
  GemmStrides(false, trans_w, IC, trans_w ? IC : OC, OC, &sa, &sb, &sc);
  // The same per-element operations as AddBias, GeluForward and Add, in that order.
  const DnnlMatmul::Epilogue epilogue = [&](int64_t m0, int64_t m1, int64_t n0, int64_t n1) {
    for (int64_t m = m0; m < m1; ++m) {
      float* o = y + m * OC;
      if (bias != nullptr) AddSpan(o + n0, o + n0, bias + n0, n1 - n0);
      if (act != nullptr) GeluForwardSpan(act + m * OC + n0, o + n0, n1 - n0);
      if (residual != nullptr) AddSpan(o + n0, o + n0, residual + m * OC + n0, n1 - n0);
    }
  };
  const bool any = bias != nullptr || act != nullptr || residual != nullptr;
  matmul_->Run(1, 1, N, OC, IC, 1.0f, x, sa, w, sb, 0.0f, y, sc, any ? &epilogue : nullptr,
               DenseBf16B(w, sb.row, sb.col, N, OC, IC));
}

void CpuBackend::BiasBackward(float* dbias, const float* dout, int64_t N, int64_t OC) {
  InArena([&] {
    ReduceRowChunks(&row_partials_, N, OC, {dbias}, [&](int64_t r0, int64_t r1, float* part) {
      for (int64_t r = r0; r < r1; ++r) AddSpan(part, part, dout + r * OC, OC);
    });
  });
}

// ---- elementwise -----------------------------------------------------------------

void CpuBackend::RoundToBf16(float* x, uint16_t* bits, int64_t n) {
  InArena([&] {
    ParallelFor(n, kElemGrain, [&](int64_t i0, int64_t i1) {
      for (int64_t i = i0; i < i1; ++i) {
        const uint16_t b = FloatToBf16(x[i]);
        if (bits != nullptr) bits[i] = b;
        x[i] = Bf16ToFloat(b);
      }
    });
  });
}

void CpuBackend::WidenBf16(float* dst, const uint16_t* src, int64_t n) {
  InArena([&] {
    ParallelFor(n, kElemGrain, [&](int64_t i0, int64_t i1) {
      for (int64_t i = i0; i < i1; ++i) dst[i] = Bf16ToFloat(src[i]);
    });
  });
}

void CpuBackend::Add(float* out, const float* a, const float* b, int64_t n) {
  InArena([&] {
    ParallelFor(n, kElemGrain, [&](int64_t i0, int64_t i1) { AddSpan(out + i0, a + i0, b + i0, i1 - i0); });
  });
}

void CpuBackend::Axpy(float* dst, const float* src, float alpha, int64_t n) {
  InArena([&] {
    ParallelFor(n, kElemGrain, [&](int64_t i0, int64_t i1) {
      for (int64_t i = i0; i < i1; ++i) dst[i] += alpha * src[i];
    });
  });
}

void CpuBackend::AdamW(float* p, const float* g, float* m, float* v, int64_t n, const AdamWStepArgs& args) {
  InArena([&] {
    ParallelFor(n, kElemGrain, [&](int64_t i0, int64_t i1) {
      AdamWStep(p + i0, g + i0, m + i0, v + i0, static_cast<size_t>(i1 - i0), args);
    });
  });
}

void CpuBackend::Scale(float* x, float alpha, int64_t n) {
  InArena([&] {
    ParallelFor(n, kElemGrain, [&](int64_t i0, int64_t i1) {
      for (int64_t i = i0; i < i1; ++i) x[i] *= alpha;
    });
  });
}

void CpuBackend::CounterDropout(float* out, int64_t ldo, const float* x, int64_t ldx, int64_t N, int64_t C,
                                uint64_t stream, uint32_t threshold, float scale, bool accumulate) {
  InArena([&] {
    ParallelFor(N, RowGrain(C), [&](int64_t n0, int64_t n1) {
      for (int64_t n = n0; n < n1; ++n) {
        const float* xr = x + n * ldx;
        float* o = out + n * ldo;
        const uint64_t row = stream + static_cast<uint64_t>(n * C);
        for (int64_t c = 0; c < C; ++c) {
          const float v = DropoutKeep(row, static_cast<uint64_t>(c), threshold) ? xr[c] * scale : 0.0f;
          o[c] = accumulate ? o[c] + v : v;
        }
      }
    });
  });
}

Status CpuBackend::DequantizeBlocks(float* out, const void* blocks, QuantFormat format, int64_t n) {
  L2L_RETURN_IF_ERROR(QuantizedBytes(format, n).status());
  const QuantFormatInfo info = Info(format);
  const auto* in = static_cast<const uint8_t*>(blocks);
  InArena([&] {
    ParallelFor(n / info.block_elems, RowGrain(info.block_elems), [&](int64_t b0, int64_t b1) {
      Dequantize(format, in + b0 * info.block_bytes, (b1 - b0) * info.block_elems, out + b0 * info.block_elems)
          .IgnoreError();  // whole blocks: cannot fail
    });
  });
  return Status::Ok();
}

void CpuBackend::GeluForward(float* out, const float* inp, int64_t n) {
  InArena([&] {
    ParallelFor(n, kElemGrain, [&](int64_t i0, int64_t i1) {
      GeluForwardSpan(out + i0, inp + i0, i1 - i0);
    });
  });
}

void CpuBackend::GeluBackward(float* dinp, const float* inp, const float* dout, int64_t n) {
  InArena([&] {
    ParallelFor(n, kElemGrain, [&](int64_t i0, int64_t i1) {
      GeluBackwardSpan(dinp + i0, inp + i0, dout + i0, i1 - i0);
    });
  });
}

void CpuBackend::GeluBackwardBias(float* dinp, float* dbias, const float* inp, const float* dout, int64_t N,
                                  int64_t F) {
  if (dbias == nullptr) {
    Backend::GeluBackwardBias(dinp, dbias, inp, dout, N, F);
    return;
  }
  InArena([&] {
    ReduceRowChunks(&row_partials_, N, F, {dbias}, [&](int64_t r0, int64_t r1, float* part) {
      for (int64_t r = r0; r < r1; ++r) GeluBackwardSumSpan(dinp + r * F, part, inp + r * F, dout + r * F, F);
    });
  });
}

double CpuBackend::SumSquares(const float* x, int64_t n) {
  double total = 0.0;
  InArena([&] {
    // Deterministic: the split depends only on n and the grain, not on the threads.
    total = tbb::parallel_deterministic_reduce(
        tbb::blocked_range<int64_t>(0, n, kElemGrain), 0.0,
        [&](const tbb::blocked_range<int64_t>& r, double acc) {
          for (int64_t i = r.begin(); i < r.end(); ++i) acc += double(x[i]) * double(x[i]);
          return acc;
        },
        [](double a, double b) { return a + b; });
  });
  return total;
}

// ---- embedding ---------------------------------------------------------------------

void CpuBackend::EmbeddingForward(float* out, const int32_t* tokens, const float* wte,
                                  const float* wpe, int64_t B, int64_t T, int64_t C) {
  InArena([&] {
    ParallelFor(B * T, RowGrain(C), [&](int64_t n0, int64_t n1) {
      for (int64_t n = n0; n < n1; ++n) {
        const int32_t tok = tokens[n];
        L2L_CHECK(tok >= 0) << "EmbeddingForward: token " << tok << " at row " << n << " is negative";
        const float* e = wte + int64_t(tok) * C;
        const float* p = wpe + (n % T) * C;
        float* o = out + n * C;
        for (int64_t c = 0; c < C; ++c) o[c] = e[c] + p[c];
      }
    });
  });
}

void CpuBackend::EmbeddingBackward(float* dwte, float* dwpe, const float* dout,
                                   const int32_t* tokens, int64_t B, int64_t T, int64_t C) {
  InArena([&] {
    // dwte: each task owns a column slice and scatters every row in token order, so two
    // rows with the same token add in a fixed order (deterministic, no atomics).
    ForColumnChunks(C, kColumnChunk, [&](int64_t c0, int64_t c1) {
      for (int64_t n = 0; n < B * T; ++n) {
        float* dw = dwte + int64_t(tokens[n]) * C;
        const float* d = dout + n * C;
        for (int64_t c = c0; c < c1; ++c) dw[c] += d[c];
      }
    });
    // dwpe[t] += sum over b of dout[b, t], batches in order.
    ParallelFor(T, RowGrain(C * B), [&](int64_t t0, int64_t t1) {
      for (int64_t t = t0; t < t1; ++t) {
        float* dp = dwpe + t * C;
        for (int64_t b = 0; b < B; ++b) {
          const float* d = dout + (b * T + t) * C;
          for (int64_t c = 0; c < C; ++c) dp[c] += d[c];
        }
      }
    });
  });
}

// ---- LayerNorm -----------------------------------------------------------------------

void CpuBackend::LayerNormForward(float* out, float* mean, float* rstd, const float* inp,
                                  const float* weight, const float* bias, int64_t N, int64_t C) {
  LayerNormForwardEps(out, mean, rstd, inp, weight, bias, N, C, kLayerNormEps);
}

void CpuBackend::LayerNormBackward(float* dinp, float* dweight, float* dbias, const float* dout,
                                   const float* inp, const float* weight, const float* mean,
                                   const float* rstd, int64_t N, int64_t C) {
  // One pass: each row's dinp, and its dweight/dbias terms into its chunk's partials.
  InArena([&] {
    ReduceRowChunks(&row_partials_, N, C, {dweight, dbias}, [&](int64_t r0, int64_t r1, float* part) {
      for (int64_t n = r0; n < r1; ++n) {
        LayerNormRowBackward(dinp + n * C, part, part + C, inp + n * C, dout + n * C, weight, mean[n], rstd[n],
                             C);
      }
    });
  });
}

void CpuBackend::LayerNormBackwardResidual(float* dinp, float* dweight, float* dbias,
                                           const float* dresid, const float* dout, const float* inp,
                                           const float* weight, const float* mean, const float* rstd,
                                           int64_t N, int64_t C) {
  InArena([&] {
    ReduceRowChunks(&row_partials_, N, C, {dweight, dbias}, [&](int64_t r0, int64_t r1, float* part) {
      for (int64_t n = r0; n < r1; ++n) {
        if (dinp != dresid) std::copy(dresid + n * C, dresid + (n + 1) * C, dinp + n * C);
        LayerNormRowBackward(dinp + n * C, part, part + C, inp + n * C, dout + n * C, weight, mean[n], rstd[n],
                             C);
      }
    });
  });
}

// ---- cross-entropy -------------------------------------------------------------------

namespace {

// One row of the fused softmax + cross-entropy: p (V) = softmax(x) (p may alias x),
// returns -log p[tgt] (0 for kIgnoreTarget).
float CrossEntropyRow(float* p, const float* x, int32_t tgt, int64_t n, int64_t V) {
  L2L_CHECK(tgt == kIgnoreTarget || (tgt >= 0 && tgt < V))
      << "CrossEntropyForward: target " << tgt << " at row " << n << " not in [0," << V << ")";
  const float x_tgt = tgt == kIgnoreTarget ? 0.0f : x[tgt];  // read before p is written
  const float mx = MaxSpan(x, V);
  const double sum = ExpShiftSumSpan(p, x, mx, V);
  ScaleSpan(p, float(1.0 / sum), V);
  // -log softmax[tgt] = log(sum) - (x[tgt] - max): exact even when the prob underflows.
  return tgt == kIgnoreTarget ? 0.0f : float(std::log(sum) - double(x_tgt - mx));
}

// dlogits row from its probabilities (d may alias p): scale * (p - onehot(tgt)), or 0.
void CrossEntropyBackwardRow(float* d, const float* p, int32_t tgt, float scale, int64_t V) {
  if (tgt == kIgnoreTarget) {
    std::memset(d, 0, size_t(V) * sizeof(float));
    return;
  }
  if (d == p) {
    ScaleSpan(d, scale, V);  // p * scale: the same bits as scale * p
  } else {
    for (int64_t v = 0; v < V; ++v) d[v] = scale * p[v];
  }
  d[tgt] -= scale;
}

}  // namespace

void CpuBackend::CrossEntropyForward(float* losses, float* probs, const float* logits,
                                     const int32_t* targets, int64_t N, int64_t V) {
  InArena([&] {
    ParallelFor(N, RowGrain(V), [&](int64_t n0, int64_t n1) {
      for (int64_t n = n0; n < n1; ++n) losses[n] = CrossEntropyRow(probs + n * V, logits + n * V, targets[n], n, V);
    });
  });
}

void CpuBackend::CrossEntropyForwardBackward(float* losses, float* dlogits, const float* logits,
                                             const int32_t* targets, float scale, int64_t N, int64_t V) {
  InArena([&] {
    ParallelFor(N, RowGrain(V), [&](int64_t n0, int64_t n1) {
      for (int64_t n = n0; n < n1; ++n) {
        float* d = dlogits + n * V;
        losses[n] = CrossEntropyRow(d, logits + n * V, targets[n], n, V);
        CrossEntropyBackwardRow(d, d, targets[n], scale, V);
      }
    });
  });
}

void CpuBackend::CrossEntropyBackward(float* dlogits, const float* probs, const int32_t* targets,
                                      float scale, int64_t N, int64_t V) {
  InArena([&] {
    ParallelFor(N, RowGrain(V), [&](int64_t n0, int64_t n1) {
      for (int64_t n = n0; n < n1; ++n) CrossEntropyBackwardRow(dlogits + n * V, probs + n * V, targets[n], scale, V);
    });
  });
}

// ---- factory -------------------------------------------------------------------------

std::unique_ptr<Backend> CreateCpuBackend(int num_threads) {
  return std::make_unique<CpuBackend>(num_threads);
}

constexpr std::pair<CpuGemmPrecision, const char*> kCpuGemmNames[] = {{CpuGemmPrecision::kFp32, "fp32"},
                                                                      {CpuGemmPrecision::kBf16, "bf16"}};
const char* ToString(CpuGemmPrecision p) { return NameOf(kCpuGemmNames, p); }
Result<CpuGemmPrecision> ParseCpuGemmPrecision(std::string_view s) { return ParseName(kCpuGemmNames, s); }

bool CpuHasBf16Gemm() {
#if defined(__x86_64__) || defined(__i386__)
  // Any L2L_CPU_ISA cap (avx512, avx2, base) is below AVX512_BF16; a bad value is
  // ResolveCpuGemm's error, not a cap.
  if (auto cap = EnvEnum(EnvVar::kCpuIsa, ParseMathIsa); cap.ok() && cap->has_value()) return false;
  return __builtin_cpu_supports("avx512bf16");
#else
  return false;
#endif
}

Result<CpuGemmPrecision> ResolveCpuGemm(CpuGemmPrecision requested) {
  L2L_ASSIGN_OR_RETURN(const std::optional<CpuGemmPrecision> env, EnvEnum(EnvVar::kCpuGemm, ParseCpuGemmPrecision));
  L2L_ASSIGN_OR_RETURN(const std::optional<MathIsa> cap, EnvEnum(EnvVar::kCpuIsa, ParseMathIsa));
  const CpuGemmPrecision gemm = env.value_or(requested);
  if (gemm == CpuGemmPrecision::kBf16 && !CpuHasBf16Gemm()) {
    // Tests on CPUs without AVX512_BF16 still run the mode's numerics (slowly) where
    // oneDNN can: its AVX-512 emulation of bf16.
    L2L_ASSIGN_OR_RETURN(const bool fallback, EnvBool(EnvVar::kCpuBf16Fallback));
    if (fallback) {
      if (DnnlHasBf16Matmul()) return gemm;
      return FailedPrecondition(
          "cpu backend: L2L_CPU_BF16_FALLBACK=1 but oneDNN has no bf16 matmul on this CPU (it needs "
          "AVX-512 at least; ONEDNN_MAX_CPU_ISA may cap it): bf16 GEMMs (AVX512_BF16 missing) cannot run here");
    }
    return FailedPrecondition(
        std::string("cpu backend: bf16 GEMMs (L2L_CPU_GEMM=bf16 or --compute bf16) need a CPU with "
                    "AVX512_BF16 (or AMX-BF16); ") +
        (cap.has_value() ? std::string("L2L_CPU_ISA=") + MathIsaName(*cap) + " caps the ISA below it"
                         : "this CPU has neither") +
        ", and oneDNN's fallback would run them many times slower than fp32. Use fp32 "
        "(unset L2L_CPU_GEMM, or --compute fp32) on this machine");
  }
  return gemm;
}

Result<std::unique_ptr<Backend>> CreateCpuBackend(const CpuBackendOptions& options) {
  L2L_ASSIGN_OR_RETURN(CpuGemmPrecision gemm, ResolveCpuGemm(options.gemm));
  return std::unique_ptr<Backend>(std::make_unique<CpuBackend>(options.num_threads, gemm));
}

}  // namespace l2l::kernels
