// CpuBf16Mode: how a test of the CPU backend's bf16 GEMM mode (tests/kernels/
// cpu_bf16_gemm_test.cc, tests/worker/cpu_bf16_train_test.cc, tests/integration/
// worker_compute_test.cc) runs its numerics on this machine, decided once per test case:
//  * kNative: the CPU has AVX512_BF16 and L2L_CPU_ISA does not cap it: oneDNN's
//    AVX512_BF16 / AMX kernels.
//  * kFallback: it has not (or L2L_CPU_ISA caps it): first the mode must be refused
//    (checked: FAILED_PRECONDITION naming AVX512_BF16), then L2L_CPU_BF16_FALLBACK=1 is
//    set for this object's lifetime (child processes see it too) and the same numerics
//    run on oneDNN's AVX-512 emulation of bf16, against the same oracles.
//  * kSkipped: not even that (no AVX-512, or ONEDNN_MAX_CPU_ISA below it): the case says
//    "L2L-SKIPPED: <why>" (a Catch2 WARN, printed for passing cases too) and returns;
//    ctest's SKIP_REGULAR_EXPRESSION (tests/CMakeLists.txt) counts it as skipped, and
//    scripts/test.sh lists it and fails CI on it.
// Every path on any x86 machine with AVX-512: L2L_CPU_ISA=avx2 gives kFallback, with
// ONEDNN_MAX_CPU_ISA=AVX2 added kSkipped.
// Thread-safety: construct on the test's thread (it sets the environment).
#pragma once

#include <catch2/catch.hpp>

#include <optional>
#include <string>

#include "common/status.h"
#include "kernels/backend.h"
#include "tests/testing/scoped_env.h"

namespace l2l::testing {

// What a Catch2 case prints to be counted as skipped by ctest (the regex in
// tests/CMakeLists.txt); scripts/test.sh lists such tests at the end of each stage.
inline constexpr const char* kSkipMarker = "L2L-SKIPPED: ";

class CpuBf16Mode {
 public:
  enum class Path { kNative, kFallback, kSkipped };

  CpuBf16Mode() {
    if (kernels::CpuHasBf16Gemm()) {
      path_ = Path::kNative;
      return;
    }
    {
      ScopedEnv off("L2L_CPU_BF16_FALLBACK", "");
      auto refused = kernels::ResolveCpuGemm(kernels::CpuGemmPrecision::kBf16);
      REQUIRE(!refused.ok());
      CHECK(refused.status().code() == StatusCode::kFailedPrecondition);
      CHECK(refused.status().message().find("AVX512_BF16") != std::string::npos);
    }
    env_.emplace("L2L_CPU_BF16_FALLBACK", "1");
    auto fallback = kernels::ResolveCpuGemm(kernels::CpuGemmPrecision::kBf16);
    if (fallback.ok()) {
      path_ = Path::kFallback;
      WARN("no AVX512_BF16 here: bf16 mode refused (checked); its numerics run on oneDNN's AVX-512 bf16 "
           "emulation (L2L_CPU_BF16_FALLBACK=1)");
      return;
    }
    env_.reset();
    path_ = Path::kSkipped;
    // One short line: Catch2 wraps at 80 columns, and ctest_skips.py shows this line.
    WARN(kSkipMarker << "no AVX512_BF16, no oneDNN bf16 emulation: numerics not run");
    WARN(fallback.status().message());
  }
  CpuBf16Mode(const CpuBf16Mode&) = delete;
  CpuBf16Mode& operator=(const CpuBf16Mode&) = delete;

  bool runs() const { return path_ != Path::kSkipped; }
  bool native() const { return path_ == Path::kNative; }
  Path path() const { return path_; }

 private:
  Path path_ = Path::kSkipped;
  std::optional<ScopedEnv> env_;
};

}  // namespace l2l::testing
