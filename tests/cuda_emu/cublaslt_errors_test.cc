// Tests of the emulated cuBLASLt's validation (cuda_emu/cublaslt.cc): every
// refusal of cublasLtMatmul and cublasLtMatmulAlgoGetHeuristic — null or destroyed
// objects, attribute sizes, inconsistent shapes, short leading dimensions, batch counts,
// overlapping outputs, unsupported types and epilogues, operands outside device memory,
// alignment below what the algorithm was chosen for, a missing bias — each beside a
// passing control, and the heuristic refusing what cublasLtMatmul refuses.
// Thread-safety: each test owns its handles, buffers and stream.
#include <cublasLt.h>
#include <cuda_runtime.h>

#include <catch2/catch.hpp>

#include <string>
#include <vector>

#include "tests/cuda_emu/cublaslt_test_util.h"

namespace cublaslt_test {

namespace {

// A valid fp32 problem (8 x 6 x 5) with device buffers big enough for every variant.
struct ErrorFixture {
  Spec s;
  DevMem A{4096}, B{4096}, C{4096}, D{4096}, bias{4096};
  Stream st;
  ErrorFixture() {
    s.m = 8;
    s.n = 6;
    s.k = 5;
    for (DevMem* m : {&A, &B, &C, &D, &bias}) Put(m->p, std::vector<float>(1024, 0.5f));
  }
  cublasStatus_t Run(const Plan& p, const cublasLtMatmulAlgo_t* algo) {
    return p.Matmul(s, A.p, B.p, C.p, D.p, algo, st.s);
  }
};

// The heuristic and cublasLtMatmul (without an algorithm) both refuse with `want`.
void ExpectBothRefuse(ErrorFixture& f, const Plan& p, cublasStatus_t want) {
  Plan::Heur hr = p.Heuristic();
  CHECK(hr.st == want);
  CHECK(hr.count == 0);
  CHECK(f.Run(p, nullptr) == want);
}

}  // namespace

TEST_CASE("cublasLt: the base problem of the error tests is valid", "[cuda_emu][cublaslt]") {
  ErrorFixture f;
  Plan p(f.s);
  Plan::Heur hr = p.Heuristic();
  REQUIRE(hr.st == CUBLAS_STATUS_SUCCESS);
  REQUIRE(hr.count == 1);
  REQUIRE(f.Run(p, &hr.algo) == CUBLAS_STATUS_SUCCESS);
  REQUIRE(f.Run(p, nullptr) == CUBLAS_STATUS_SUCCESS);
  f.st.Sync();
  const std::vector<float> d = Get<float>(f.D.p, 48);
  for (float x : d) REQUIRE(x == 5 * 0.25f);
}

TEST_CASE("cublasLt: null or destroyed handles and descriptors are refused",
          "[cuda_emu][cublaslt]") {
  ErrorFixture f;
  Plan p(f.s);
  Plan::Heur hr = p.Heuristic();
  REQUIRE(hr.count == 1);
  float one = 1.0f, zero = 0.0f;
  CHECK(cublasLtMatmul(nullptr, p.desc, &one, f.A.p, p.a, f.B.p, p.b, &zero, f.C.p, p.c, f.D.p, p.d,
                       &hr.algo, nullptr, 0, f.st.s) == CUBLAS_STATUS_NOT_INITIALIZED);
  CHECK(cublasLtMatmul(p.h, nullptr, &one, f.A.p, p.a, f.B.p, p.b, &zero, f.C.p, p.c, f.D.p, p.d,
                       &hr.algo, nullptr, 0, f.st.s) == CUBLAS_STATUS_INVALID_VALUE);
  CHECK(cublasLtMatmul(p.h, p.desc, &one, f.A.p, nullptr, f.B.p, p.b, &zero, f.C.p, p.c, f.D.p, p.d,
                       &hr.algo, nullptr, 0, f.st.s) == CUBLAS_STATUS_INVALID_VALUE);
  CHECK(cublasLtMatmul(p.h, p.desc, &one, f.A.p, p.a, f.B.p, p.b, &zero, f.C.p, p.c, f.D.p, nullptr,
                       &hr.algo, nullptr, 0, f.st.s) == CUBLAS_STATUS_INVALID_VALUE);
  cublasLtMatmulPreference_t pref;
  REQUIRE(cublasLtMatmulPreferenceCreate(&pref) == CUBLAS_STATUS_SUCCESS);
  cublasLtMatmulHeuristicResult_t r;
  int count = -1;
  CHECK(cublasLtMatmulAlgoGetHeuristic(nullptr, p.desc, p.a, p.b, p.c, p.d, pref, 1, &r, &count) ==
        CUBLAS_STATUS_NOT_INITIALIZED);
  CHECK(cublasLtMatmulAlgoGetHeuristic(p.h, p.desc, p.a, nullptr, p.c, p.d, pref, 1, &r, &count) ==
        CUBLAS_STATUS_INVALID_VALUE);
  CHECK(count == 0);
  CHECK(cublasLtMatmulAlgoGetHeuristic(p.h, p.desc, p.a, p.b, p.c, p.d, pref, 0, &r, &count) ==
        CUBLAS_STATUS_INVALID_VALUE);
  REQUIRE(cublasLtMatmulPreferenceDestroy(pref) == CUBLAS_STATUS_SUCCESS);
  // A destroyed layout is recognised as such.
  cublasLtMatrixLayout_t gone;
  REQUIRE(cublasLtMatrixLayoutCreate(&gone, CUDA_R_32F, 8, 5, 8) == CUBLAS_STATUS_SUCCESS);
  REQUIRE(cublasLtMatrixLayoutDestroy(gone) == CUBLAS_STATUS_SUCCESS);
  CHECK(cublasLtMatrixLayoutDestroy(gone) == CUBLAS_STATUS_INVALID_VALUE);
  CHECK(cublasLtMatmul(p.h, p.desc, &one, f.A.p, gone, f.B.p, p.b, &zero, f.C.p, p.c, f.D.p, p.d,
                       &hr.algo, nullptr, 0, f.st.s) == CUBLAS_STATUS_INVALID_VALUE);
}

TEST_CASE("cublasLt: attribute sizes and values are checked", "[cuda_emu][cublaslt]") {
  cublasLtMatmulDesc_t desc;
  REQUIRE(cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F) == CUBLAS_STATUS_SUCCESS);
  const int64_t wide = CUBLAS_OP_T;
  CHECK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &wide, sizeof(wide)) ==
        CUBLAS_STATUS_INVALID_VALUE);
  const int32_t bad_op = 7;
  CHECK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &bad_op,
                                       sizeof(bad_op)) == CUBLAS_STATUS_INVALID_VALUE);
  const int32_t op = CUBLAS_OP_T;
  CHECK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &op, sizeof(op)) ==
        CUBLAS_STATUS_SUCCESS);
  size_t written = 0;
  CHECK(cublasLtMatmulDescGetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, nullptr, 0, &written) ==
        CUBLAS_STATUS_SUCCESS);
  CHECK(written == sizeof(int32_t));
  int32_t back = -1;
  CHECK(cublasLtMatmulDescGetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &back, sizeof(back),
                                       &written) == CUBLAS_STATUS_SUCCESS);
  CHECK(back == CUBLAS_OP_T);
  int32_t bias_type = 0;
  CHECK(cublasLtMatmulDescGetAttribute(desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bias_type,
                                       sizeof(bias_type), nullptr) == CUBLAS_STATUS_SUCCESS);
  CHECK(bias_type == -1);
  const uint16_t small = 1;
  CHECK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &small,
                                       sizeof(small)) == CUBLAS_STATUS_INVALID_VALUE);
  const void* ptr = nullptr;
  CHECK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &ptr, 4) ==
        CUBLAS_STATUS_INVALID_VALUE);
  REQUIRE(cublasLtMatmulDescDestroy(desc) == CUBLAS_STATUS_SUCCESS);

  cublasLtMatrixLayout_t l;
  REQUIRE(cublasLtMatrixLayoutCreate(&l, CUDA_R_32F, 4, 3, 5) == CUBLAS_STATUS_SUCCESS);
  const int64_t batch64 = 2;
  CHECK(cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &batch64,
                                         sizeof(batch64)) == CUBLAS_STATUS_INVALID_VALUE);
  const int32_t stride32 = 20;
  CHECK(cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride32,
                                         sizeof(stride32)) == CUBLAS_STATUS_INVALID_VALUE);
  uint64_t rows = 0;
  CHECK(cublasLtMatrixLayoutGetAttribute(l, CUBLASLT_MATRIX_LAYOUT_ROWS, &rows, sizeof(rows),
                                         &written) == CUBLAS_STATUS_SUCCESS);
  CHECK(rows == 4);
  int64_t ld = 0;
  CHECK(cublasLtMatrixLayoutGetAttribute(l, CUBLASLT_MATRIX_LAYOUT_LD, &ld, sizeof(ld), &written) ==
        CUBLAS_STATUS_SUCCESS);
  CHECK(ld == 5);
  REQUIRE(cublasLtMatrixLayoutDestroy(l) == CUBLAS_STATUS_SUCCESS);

  cublasLtMatmulPreference_t pref;
  REQUIRE(cublasLtMatmulPreferenceCreate(&pref) == CUBLAS_STATUS_SUCCESS);
  const uint32_t ws32 = 1024;
  CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws32,
                                             sizeof(ws32)) == CUBLAS_STATUS_INVALID_VALUE);
  const uint64_t align64 = 16;
  CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES,
                                             &align64,
                                             sizeof(align64)) == CUBLAS_STATUS_INVALID_VALUE);
  REQUIRE(cublasLtMatmulPreferenceDestroy(pref) == CUBLAS_STATUS_SUCCESS);
  CHECK(std::string(cublasLtGetStatusName(CUBLAS_STATUS_NOT_SUPPORTED)) ==
        "CUBLAS_STATUS_NOT_SUPPORTED");
  CHECK(std::string(cublasLtGetStatusString(CUBLAS_STATUS_SUCCESS)) == "success");
}

TEST_CASE("cublasLt: inconsistent shapes, short leading dimensions and batch counts",
          "[cuda_emu][cublaslt]") {
  ErrorFixture f;
  SECTION("k of A differs from k of B") {
    Plan p(f.s);
    const uint64_t rows = 4;  // B is k x n = 5 x 6; make it 4 x 6
    REQUIRE(cublasLtMatrixLayoutSetAttribute(p.b, CUBLASLT_MATRIX_LAYOUT_ROWS, &rows,
                                             sizeof(rows)) == CUBLAS_STATUS_SUCCESS);
    ExpectBothRefuse(f, p, CUBLAS_STATUS_INVALID_VALUE);
  }
  SECTION("C's shape differs from D's") {
    Plan p(f.s);
    const uint64_t cols = 5;
    REQUIRE(cublasLtMatrixLayoutSetAttribute(p.c, CUBLASLT_MATRIX_LAYOUT_COLS, &cols,
                                             sizeof(cols)) == CUBLAS_STATUS_SUCCESS);
    ExpectBothRefuse(f, p, CUBLAS_STATUS_INVALID_VALUE);
  }
  SECTION("transposing A without describing it transposed") {
    Plan p(f.s);
    const int32_t t = CUBLAS_OP_T;
    REQUIRE(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_TRANSA, &t, sizeof(t)) ==
            CUBLAS_STATUS_SUCCESS);
    ExpectBothRefuse(f, p, CUBLAS_STATUS_INVALID_VALUE);
  }
  SECTION("ld < rows") {
    Plan p(f.s);
    const int64_t ld = 7;  // A is 8 x 5
    REQUIRE(cublasLtMatrixLayoutSetAttribute(p.a, CUBLASLT_MATRIX_LAYOUT_LD, &ld, sizeof(ld)) ==
            CUBLAS_STATUS_SUCCESS);
    ExpectBothRefuse(f, p, CUBLAS_STATUS_INVALID_VALUE);
  }
  SECTION("batch counts differ") {
    Plan p(f.s);
    const int32_t batch = 2;
    const int64_t stride = 64;
    for (cublasLtMatrixLayout_t l : {p.a, p.b, p.c}) {
      REQUIRE(cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &batch,
                                               sizeof(batch)) == CUBLAS_STATUS_SUCCESS);
      REQUIRE(cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET,
                                               &stride, sizeof(stride)) == CUBLAS_STATUS_SUCCESS);
    }
    ExpectBothRefuse(f, p, CUBLAS_STATUS_INVALID_VALUE);
  }
  SECTION("overlapping output matrices") {
    Spec s = f.s;
    s.batch = 2;
    s.sa = 40;
    s.sb = 30;
    s.sc = 4;  // < rows: the two D matrices share elements
    Plan p(s);
    ExpectBothRefuse(f, p, CUBLAS_STATUS_INVALID_VALUE);
  }
}

TEST_CASE("cublasLt: unsupported configurations are NOT_SUPPORTED", "[cuda_emu][cublaslt]") {
  ErrorFixture f;
  SECTION("fp16 inputs") {
    Spec s = f.s;
    s.ab = CUDA_R_16F;
    s.cd = CUDA_R_16F;
    ExpectBothRefuse(f, Plan(s), CUBLAS_STATUS_NOT_SUPPORTED);
  }
  SECTION("fp32 inputs with a bf16 output") {
    Spec s = f.s;
    s.cd = CUDA_R_16BF;
    ExpectBothRefuse(f, Plan(s), CUBLAS_STATUS_NOT_SUPPORTED);
  }
  SECTION("bf16 inputs with TF32 compute") {
    Spec s = f.s;
    s.ab = CUDA_R_16BF;
    s.compute = CUBLAS_COMPUTE_32F_FAST_TF32;
    ExpectBothRefuse(f, Plan(s), CUBLAS_STATUS_NOT_SUPPORTED);
  }
  SECTION("C and D of different types") {
    Spec s = f.s;
    s.ab = CUDA_R_16BF;
    Plan p(s);
    const uint32_t t = CUDA_R_16BF;
    REQUIRE(cublasLtMatrixLayoutSetAttribute(p.c, CUBLASLT_MATRIX_LAYOUT_TYPE, &t, sizeof(t)) ==
            CUBLAS_STATUS_SUCCESS);
    ExpectBothRefuse(f, p, CUBLAS_STATUS_NOT_SUPPORTED);
  }
  SECTION("fp64 scale type") {
    Plan p(f.s);
    const int32_t t = CUDA_R_64F;
    REQUIRE(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_SCALE_TYPE, &t,
                                           sizeof(t)) == CUBLAS_STATUS_SUCCESS);
    ExpectBothRefuse(f, p, CUBLAS_STATUS_NOT_SUPPORTED);
  }
  SECTION("device pointer mode") {
    Plan p(f.s);
    const int32_t mode = CUBLASLT_POINTER_MODE_DEVICE;
    REQUIRE(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_POINTER_MODE, &mode,
                                           sizeof(mode)) == CUBLAS_STATUS_SUCCESS);
    ExpectBothRefuse(f, p, CUBLAS_STATUS_NOT_SUPPORTED);
  }
  SECTION("row-major order") {
    Plan p(f.s);
    const int32_t order = CUBLASLT_ORDER_ROW;
    REQUIRE(cublasLtMatrixLayoutSetAttribute(p.d, CUBLASLT_MATRIX_LAYOUT_ORDER, &order,
                                             sizeof(order)) == CUBLAS_STATUS_SUCCESS);
    ExpectBothRefuse(f, p, CUBLAS_STATUS_NOT_SUPPORTED);
  }
  SECTION("an epilogue with a batch") {
    Spec s = f.s;
    s.epi = CUBLASLT_EPILOGUE_GELU;
    s.batch = 2;
    s.sa = 40;
    s.sb = 30;
    s.sc = 48;
    ExpectBothRefuse(f, Plan(s), CUBLAS_STATUS_NOT_SUPPORTED);
  }
  SECTION("an epilogue not emulated (DGELU)") {
    Spec s = f.s;
    s.epi = CUBLASLT_EPILOGUE_DGELU;
    ExpectBothRefuse(f, Plan(s), CUBLAS_STATUS_NOT_SUPPORTED);
  }
  SECTION("a bias of another type than D") {
    Spec s = f.s;
    s.epi = CUBLASLT_EPILOGUE_BIAS;
    Plan p(s);
    p.SetBias(f.bias.p);
    const int32_t t = CUDA_R_16BF;
    REQUIRE(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &t,
                                           sizeof(t)) == CUBLAS_STATUS_SUCCESS);
    ExpectBothRefuse(f, p, CUBLAS_STATUS_NOT_SUPPORTED);
  }
}

TEST_CASE("cublasLt: operands outside device memory are refused", "[cuda_emu][cublaslt]") {
  ErrorFixture f;
  Plan p(f.s);
  Plan::Heur hr = p.Heuristic();
  REQUIRE(hr.count == 1);
  const float one = 1.0f, half = 0.5f;
  // D (8 x 6, ld 8) spans exactly 48 floats: 48 fit, 47 do not.
  DevMem exact(48 * 4), short_d(47 * 4);
  CHECK(p.Matmul(f.s, f.A.p, f.B.p, f.C.p, exact.p, &hr.algo, f.st.s) == CUBLAS_STATUS_SUCCESS);
  CHECK(p.Matmul(f.s, f.A.p, f.B.p, f.C.p, short_d.p, &hr.algo, f.st.s) ==
        CUBLAS_STATUS_INVALID_VALUE);
  // A in host memory.
  std::vector<float> host_a(64, 1.0f);
  CHECK(p.Matmul(f.s, host_a.data(), f.B.p, f.C.p, f.D.p, &hr.algo, f.st.s) ==
        CUBLAS_STATUS_INVALID_VALUE);
  // C is read only when beta != 0: a C that does not fit is refused only then.
  CHECK(cublasLtMatmul(p.h, p.desc, &one, f.A.p, p.a, f.B.p, p.b, &half, short_d.p, p.c, f.D.p, p.d,
                       &hr.algo, nullptr, 0, f.st.s) == CUBLAS_STATUS_INVALID_VALUE);
  // A workspace outside device memory.
  std::vector<char> host_ws(256);
  CHECK(cublasLtMatmul(p.h, p.desc, &one, f.A.p, p.a, f.B.p, p.b, &half, f.C.p, p.c, f.D.p, p.d,
                       &hr.algo, host_ws.data(), host_ws.size(),
                       f.st.s) == CUBLAS_STATUS_INVALID_VALUE);
  // A batch whose last matrix runs past the allocation.
  Spec s = f.s;
  s.batch = 3;
  s.sa = 64;
  s.sb = 64;
  s.sc = 64;  // D spans 2 * 64 + 48 = 176 floats
  Plan pb(s);
  DevMem fits(176 * 4), one_short(175 * 4);
  Plan::Heur hb = pb.Heuristic();
  REQUIRE(hb.count == 1);
  CHECK(pb.Matmul(s, f.A.p, f.B.p, f.C.p, fits.p, &hb.algo, f.st.s) == CUBLAS_STATUS_SUCCESS);
  CHECK(pb.Matmul(s, f.A.p, f.B.p, f.C.p, one_short.p, &hb.algo, f.st.s) ==
        CUBLAS_STATUS_INVALID_VALUE);
  // The same batch with a stride that breaks the 256-byte alignment of the algorithm.
  Spec s2 = s;
  s2.sa = 40;
  Plan pa(s2);
  Plan::Heur ha = pa.Heuristic();
  CHECK(pa.Matmul(s2, f.A.p, f.B.p, f.C.p, fits.p, &ha.algo, f.st.s) ==
        CUBLAS_STATUS_INVALID_VALUE);
  Plan::Heur ha32 = pa.Heuristic(32);
  CHECK(pa.Matmul(s2, f.A.p, f.B.p, f.C.p, fits.p, &ha32.algo, f.st.s) == CUBLAS_STATUS_SUCCESS);
  f.st.Sync();
}

TEST_CASE("cublasLt: pointers must meet the alignment the algorithm was chosen for",
          "[cuda_emu][cublaslt]") {
  ErrorFixture f;
  Plan p(f.s);
  const float* a = f.A.as<float>();
  Plan::Heur h16 = p.Heuristic(16);
  REQUIRE(h16.count == 1);
  CHECK(p.Matmul(f.s, a + 4, f.B.p, f.C.p, f.D.p, &h16.algo, f.st.s) == CUBLAS_STATUS_SUCCESS);
  CHECK(p.Matmul(f.s, a + 1, f.B.p, f.C.p, f.D.p, &h16.algo, f.st.s) ==
        CUBLAS_STATUS_INVALID_VALUE);
  Plan::Heur hdef = p.Heuristic();  // default preference: 256 bytes
  CHECK(p.Matmul(f.s, a + 4, f.B.p, f.C.p, f.D.p, &hdef.algo, f.st.s) ==
        CUBLAS_STATUS_INVALID_VALUE);
  Plan::Heur h4 = p.Heuristic(4);
  CHECK(p.Matmul(f.s, a + 1, f.B.p, f.C.p, f.D.p, &h4.algo, f.st.s) == CUBLAS_STATUS_SUCCESS);
  // Below the element size no algorithm exists.
  Plan::Heur h2 = p.Heuristic(2);
  CHECK(h2.st == CUBLAS_STATUS_NOT_SUPPORTED);
  CHECK(h2.count == 0);
  // Without an algorithm: natural alignment only.
  CHECK(p.Matmul(f.s, a + 1, f.B.p, f.C.p, f.D.p, nullptr, f.st.s) == CUBLAS_STATUS_SUCCESS);
  CHECK(p.Matmul(f.s, reinterpret_cast<const char*>(a) + 2, f.B.p, f.C.p, f.D.p, nullptr, f.st.s) ==
        CUBLAS_STATUS_INVALID_VALUE);
  // An algorithm from another configuration (bf16) is refused.
  Spec sb = f.s;
  sb.ab = CUDA_R_16BF;
  Plan pb(sb);
  Plan::Heur hb = pb.Heuristic();
  REQUIRE(hb.count == 1);
  CHECK(p.Matmul(f.s, f.A.p, f.B.p, f.C.p, f.D.p, &hb.algo, f.st.s) == CUBLAS_STATUS_INVALID_VALUE);
  f.st.Sync();
}

TEST_CASE("cublasLt: bias epilogues need a bias in device memory", "[cuda_emu][cublaslt]") {
  ErrorFixture f;
  for (cublasLtEpilogue_t epi : {CUBLASLT_EPILOGUE_BIAS, CUBLASLT_EPILOGUE_GELU_BIAS}) {
    Spec s = f.s;
    s.epi = epi;
    Plan p(s);
    Plan::Heur hr = p.Heuristic();
    REQUIRE(hr.count == 1);
    CHECK(p.Matmul(s, f.A.p, f.B.p, f.C.p, f.D.p, &hr.algo, f.st.s) == CUBLAS_STATUS_INVALID_VALUE);
    std::vector<float> host_bias(8, 1.0f);
    p.SetBias(host_bias.data());
    CHECK(p.Matmul(s, f.A.p, f.B.p, f.C.p, f.D.p, &hr.algo, f.st.s) == CUBLAS_STATUS_INVALID_VALUE);
    DevMem short_bias(7 * 4);
    p.SetBias(short_bias.p);
    CHECK(p.Matmul(s, f.A.p, f.B.p, f.C.p, f.D.p, &hr.algo, f.st.s) == CUBLAS_STATUS_INVALID_VALUE);
    p.SetBias(f.bias.p);
    CHECK(p.Matmul(s, f.A.p, f.B.p, f.C.p, f.D.p, &hr.algo, f.st.s) == CUBLAS_STATUS_SUCCESS);
    f.st.Sync();
  }
}

TEST_CASE("cublasLt: in-place needs C and D described alike", "[cuda_emu][cublaslt]") {
  ErrorFixture f;
  Spec s = f.s;
  s.beta = 1.0f;
  Plan p(s);
  const int64_t ld = 9;
  REQUIRE(cublasLtMatrixLayoutSetAttribute(p.c, CUBLASLT_MATRIX_LAYOUT_LD, &ld, sizeof(ld)) ==
          CUBLAS_STATUS_SUCCESS);
  CHECK(p.Matmul(s, f.A.p, f.B.p, f.D.p, f.D.p, nullptr, f.st.s) == CUBLAS_STATUS_INVALID_VALUE);
  CHECK(p.Matmul(s, f.A.p, f.B.p, f.C.p, f.D.p, nullptr, f.st.s) == CUBLAS_STATUS_SUCCESS);
  f.st.Sync();
}

}  // namespace cublaslt_test
